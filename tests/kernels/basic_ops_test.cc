// Host tests of the basic ops: GatherRows/Embedding, RmsNorm/AddRmsNorm,
// Linear/HeadMatmul and SiluAndMul, each against a double-precision reference
// written here, on fresh random inputs, odd sizes included.
//
// Every output is poisoned with NaN before a run and checked to be written in
// full; where an output is a view into a wider buffer, the padding around it
// is checked to still hold its poison. The worst relative error seen per op
// is printed at the end of the run ("max_rel_err <op> <value>").
//
// Tolerances. All-f32 paths: normwise relative error <= 1e-5 (their f32
// rounding error is ~1e-7 at these sizes). Where the spec rounds to bf16 (a
// bf16 input's normalised value, a bf16 output), the reference applies the
// same roundings in double, so the kernel matches it except where its f32
// value and the reference's fall on either side of a bf16 rounding midpoint:
// such a flip costs one bf16 ulp (2^-7 relative, at most) and happens to about
// one element in 10^4. These outputs must therefore match to 1e-5 in all but
// 1% (+1) of their elements and to 2^-6 everywhere; skipping a rounding the
// spec prescribes leaves most elements off by up to half an ulp and fails.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/host/small_gemm.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "runtime/core/status.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using ::mlag::testing::CountNaN;
using ::mlag::testing::FillRandom;
using ::mlag::testing::HostStream;
using ::mlag::testing::Make;
using ::mlag::testing::Owned;
using ::mlag::testing::PoisonNaN;

constexpr double kF32Tol = 1e-5;
constexpr double kBf16FlipTol = 1.0 / 64;  // one bf16 ulp (2^-7) with margin

// ---- Error bookkeeping ----------------------------------------------------------

std::map<std::string, double>& MaxErrors() {
  static std::map<std::string, double> errors;
  return errors;
}

void Record(const std::string& op, double err) {
  double& e = MaxErrors()[op];
  e = std::max(e, err);
}

class ErrorReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [op, err] : MaxErrors()) std::printf("max_rel_err %s %.3g\n", op.c_str(), err);
  }
};
::testing::Environment* const kErrorReport =
    ::testing::AddGlobalTestEnvironment(new ErrorReport);

// ---- Tensors and references --------------------------------------------------------

uint32_t NextSeed() {
  static uint32_t seed = 20240601;
  return seed++;
}

// An owned buffer and the view under test inside it.
struct View {
  Owned buf;
  Tensor t;
};

// A [rows, cols] view whose rows start at column `pad_front` of a buffer
// `pad_front + pad_back` columns wider: strided rows unless both pads are 0.
View MakeRows(DType dtype, int64_t rows, int64_t cols, int64_t pad_front = 0,
              int64_t pad_back = 0) {
  View v;
  v.buf = Make(dtype, {rows, cols + pad_front + pad_back});
  v.t = v.buf.t.Slice(1, pad_front, pad_front + cols);
  return v;
}

// The same for a [d0, d1, d2] view padded in its last dimension.
View Make3D(DType dtype, int64_t d0, int64_t d1, int64_t d2, int64_t pad_front = 0,
            int64_t pad_back = 0) {
  View v;
  v.buf = Make(dtype, {d0, d1, d2 + pad_front + pad_back});
  v.t = v.buf.t.Slice(2, pad_front, pad_front + d2);
  return v;
}

// Random values in the whole buffer (padding included).
void Randomize(const View& v, float lo = -1.0f, float hi = 1.0f) {
  FillRandom(v.buf, NextSeed(), lo, hi);
}

// The view's elements in row-major order, as stored (after dtype rounding).
std::vector<double> Values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(static_cast<size_t>(t.ndim()), 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t rem = i;
    for (int d = t.ndim() - 1; d >= 0; --d) {
      idx[d] = rem % t.size(d);
      rem /= t.size(d);
    }
    out.push_back(LoadAsF32(t.dtype(), t.ElementPtr(idx), 0));
  }
  return out;
}

// `v` rounded as storing it in `dtype` would.
double RoundTo(DType dtype, double v) {
  const float f = static_cast<float>(v);
  switch (dtype) {
    case DType::kBF16: return Bf16ToF32(F32ToBf16(f));
    case DType::kF16: return F16ToF32(F32ToF16(f));
    default: return f;
  }
}

// Normwise relative error of the view against `want` (inf if any NaN).
double RelError(const Tensor& got, const std::vector<double>& want) {
  std::vector<double> g = Values(got);
  EXPECT_EQ(g.size(), want.size());
  std::vector<float> gf(g.begin(), g.end());
  return ::mlag::testing::MaxRelError(gf.data(), want.data(), std::min(gf.size(), want.size()));
}

// Elements off by more than tol * max|want|.
int64_t Mismatches(const Tensor& got, const std::vector<double>& want, double tol) {
  std::vector<double> g = Values(got);
  double max_ref = 1e-30;
  for (double w : want) max_ref = std::max(max_ref, std::abs(w));
  int64_t n = 0;
  for (size_t i = 0; i < g.size() && i < want.size(); ++i) {
    n += !(std::abs(g[i] - want[i]) <= tol * max_ref);
  }
  return n;
}

int64_t NaNsIn(const Tensor& t) {
  int64_t n = 0;
  for (double v : Values(t)) n += std::isnan(v) ? 1 : 0;
  return n;
}

// Poison (NaN) was replaced in the whole view and nowhere around it.
void ExpectWrittenExactly(const View& v, const std::string& what) {
  EXPECT_EQ(NaNsIn(v.t), 0) << what << ": elements left unwritten";
  EXPECT_EQ(CountNaN(v.buf), v.buf.numel() - v.t.numel()) << what << ": padding overwritten";
}

// Checks `got` against `want`: strictly (kF32Tol) when `all_f32`, else as an
// output that went through bf16 rounding (see the top of the file).
void ExpectClose(const std::string& op, bool all_f32, const Tensor& got,
                 const std::vector<double>& want, const std::string& what) {
  const double err = RelError(got, want);
  Record(op + (all_f32 ? " f32" : " bf16"), err);
  if (all_f32) {
    EXPECT_LE(err, kF32Tol) << what;
  } else {
    EXPECT_LE(err, kBf16FlipTol) << what;
    EXPECT_LE(Mismatches(got, want, kF32Tol), 1 + got.numel() / 100) << what;
  }
}

std::string Str(DType d) { return std::string(DTypeName(d)); }

// The status is InvalidArgument and its message names `arg`.
void ExpectInvalid(const absl::Status& s, const std::string& arg) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(arg), std::string::npos)
      << "message does not name '" << arg << "': " << s.message();
}

// ---- GatherRows / Embedding ------------------------------------------------------------

struct GatherCase {
  int64_t rows, table_rows, dim;
  DType index_dtype, table_dtype, out_dtype;
  int64_t pad;  // padding of table and out rows
};

void RunGather(const GatherCase& c, bool embedding) {
  const std::string what = absl::StrCat(embedding ? "embedding" : "gather_rows", " T=", c.rows,
                                        " N=", c.table_rows, " D=", c.dim, " ",
                                        Str(c.table_dtype), "->", Str(c.out_dtype));
  SCOPED_TRACE(what);
  Owned indices = Make(c.index_dtype, {c.rows});
  std::mt19937 rng(NextSeed());
  std::vector<int64_t> ids(static_cast<size_t>(c.rows));
  for (int64_t t = 0; t < c.rows; ++t) {
    ids[t] = static_cast<int64_t>(rng() % static_cast<uint32_t>(c.table_rows));
  }
  if (c.rows >= 3) {  // out of range on both sides, and a repeated id
    ids[0] = -1;
    ids[c.rows - 1] = c.table_rows;
    ids[1] = ids[2];
  }
  for (int64_t t = 0; t < c.rows; ++t) {
    if (c.index_dtype == DType::kI32) {
      indices.data<int32_t>()[t] = static_cast<int32_t>(ids[t]);
    } else {
      indices.data<int64_t>()[t] = ids[t];
    }
  }
  View table = MakeRows(c.table_dtype, c.table_rows, c.dim, c.pad, c.pad);
  Randomize(table);
  View out = MakeRows(c.out_dtype, c.rows, c.dim, c.pad, 2 * c.pad);
  PoisonNaN(out.buf);

  absl::Status s = embedding ? Embedding(HostStream(), indices.t, table.t, out.t)
                             : GatherRows(HostStream(), indices.t, table.t, out.t);
  ASSERT_OK(s);

  std::vector<double> want;
  for (int64_t t = 0; t < c.rows; ++t) {
    const bool in_range = ids[t] >= 0 && ids[t] < c.table_rows;
    for (int64_t i = 0; i < c.dim; ++i) {
      want.push_back(in_range ? RoundTo(c.out_dtype, LoadAsF32(c.table_dtype,
                                                               table.t.ElementPtr({ids[t], i}), 0))
                              : 0.0);
    }
  }
  ExpectWrittenExactly(out, what);
  // A gather copies or converts exactly: no error at all.
  const double err = RelError(out.t, want);
  Record(embedding ? "embedding" : "gather_rows", err);
  EXPECT_EQ(err, 0.0);
  EXPECT_EQ(Mismatches(out.t, want, 0.0), 0);
}

std::vector<GatherCase> GatherCases() {
  return {
      {1, 5, 7, DType::kI32, DType::kF32, DType::kF32, 0},
      {3, 11, 64, DType::kI64, DType::kBF16, DType::kBF16, 3},
      {17, 33, 129, DType::kI32, DType::kBF16, DType::kF32, 1},
      {17, 9, 7, DType::kI64, DType::kF32, DType::kBF16, 2},
      {3, 4, 129, DType::kI32, DType::kF16, DType::kF32, 0},
  };
}

TEST(GatherRowsTest, MatchesReference) {
  for (const GatherCase& c : GatherCases()) RunGather(c, /*embedding=*/false);
}

TEST(EmbeddingTest, MatchesReference) {
  for (const GatherCase& c : GatherCases()) RunGather(c, /*embedding=*/true);
}

TEST(GatherRowsTest, OutOfRangeIndexWritesZeros) {
  constexpr int64_t kN = 6, kD = 9;
  Owned indices = Make(DType::kI64, {5});
  const int64_t ids[5] = {kN, -1, 2, std::numeric_limits<int64_t>::max(), -kN};
  for (int i = 0; i < 5; ++i) indices.data<int64_t>()[i] = ids[i];
  View table = MakeRows(DType::kF32, kN, kD);
  Randomize(table, 1.0f, 2.0f);  // no zeros in the table
  View out = MakeRows(DType::kF32, 5, kD);
  PoisonNaN(out.buf);
  ASSERT_OK(GatherRows(HostStream(), indices.t, table.t, out.t));
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t i = 0; i < kD; ++i) {
      const float got = out.buf.get(t * kD + i);
      if (t == 2) {
        EXPECT_EQ(got, table.buf.get(2 * kD + i));
      } else {
        EXPECT_EQ(got, 0.0f) << "row " << t;
        EXPECT_FALSE(std::signbit(got)) << "row " << t;
      }
    }
  }
}

TEST(GatherRowsTest, RejectsBadArguments) {
  Owned ids = Make(DType::kI32, {3});
  Owned table = Make(DType::kF32, {10, 8});
  Owned out = Make(DType::kF32, {3, 8});
  Owned bad_ids = Make(DType::kF32, {3});
  Owned int_table = Make(DType::kI32, {10, 8});
  Owned short_out = Make(DType::kF32, {3, 7});
  Owned long_out = Make(DType::kF32, {4, 8});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  ExpectInvalid(GatherRows(st, bad_ids.t, table.t, out.t), "indices");
  ExpectInvalid(Embedding(st, bad_ids.t, table.t, out.t), "token_ids");
  ExpectInvalid(GatherRows(st, ids.t, int_table.t, out.t), "table");
  ExpectInvalid(GatherRows(st, ids.t, table.t, short_out.t), "out");
  ExpectInvalid(Embedding(st, ids.t, table.t, long_out.t), "out");
  Tensor ids_2d = Tensor(ids.t.data(), DType::kI32, {3, 1});
  ExpectInvalid(GatherRows(st, ids_2d, table.t, out.t), "indices");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
}

// ---- RmsNorm / AddRmsNorm ------------------------------------------------------------------

struct NormCase {
  int64_t rows, dim;
  DType x_dtype, w_dtype, y_dtype;
  float eps;
  int64_t pad;    // row padding of x (and residual)
  bool in_place;  // y is x (needs equal dtypes)
};

std::vector<NormCase> NormCases() {
  std::vector<NormCase> cases;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  const DType combos[][3] = {{f32, f32, f32}, {bf16, bf16, bf16}, {bf16, f32, f32},
                             {f32, bf16, bf16}};
  int shape = 0;
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {7, 64, 129}) {
      for (int combo = 0; combo < 4; ++combo) {
        const DType* d = combos[combo];
        const int mix = shape + combo;
        // eps large enough in half the cases that dropping it would show.
        const float eps = (mix % 2 == 0) ? 1e-6f : 0.25f;
        const int64_t pad = (mix % 3 == 0) ? 0 : 1 + mix % 4;
        const bool in_place = d[0] == d[2] && shape % 2 == 1;
        cases.push_back({rows, dim, d[0], d[1], d[2], eps, pad, in_place});
      }
      ++shape;
    }
  }
  return cases;
}

// Reference for one normalised row `v` (values already in `norm_dtype`).
void RefNormRow(const std::vector<double>& v, const std::vector<double>& w, float eps,
                DType norm_dtype, DType y_dtype, std::vector<double>* out) {
  double sum_sq = 0.0;
  for (double e : v) sum_sq += e * e;
  const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(v.size()) + eps);
  for (size_t i = 0; i < v.size(); ++i) {
    out->push_back(RoundTo(y_dtype, w[i] * RoundTo(norm_dtype, v[i] * inv_rms)));
  }
}

std::vector<double> Row(const std::vector<double>& all, int64_t row, int64_t dim) {
  return std::vector<double>(all.begin() + row * dim, all.begin() + (row + 1) * dim);
}

std::string NormName(const NormCase& c) {
  return absl::StrCat("T=", c.rows, " D=", c.dim, " x ", Str(c.x_dtype), " w ", Str(c.w_dtype),
                      " y ", Str(c.y_dtype), " eps ", c.eps, " pad ", c.pad,
                      c.in_place ? " in-place" : "");
}

TEST(RmsNormTest, MatchesReference) {
  for (const NormCase& c : NormCases()) {
    const std::string what = NormName(c);
    SCOPED_TRACE(what);
    View x = MakeRows(c.x_dtype, c.rows, c.dim, c.pad, 1);
    Randomize(x, -2.0f, 2.0f);
    Owned weight = Make(c.w_dtype, {c.dim});
    std::vector<double> w = FillRandom(weight, NextSeed(), 0.6f, 1.4f);
    const std::vector<double> xv = Values(x.t);

    View y_own;
    const View* y = &x;
    if (!c.in_place) {
      y_own = MakeRows(c.y_dtype, c.rows, c.dim, 0, c.pad);
      PoisonNaN(y_own.buf);
      y = &y_own;
    }
    ASSERT_OK(RmsNorm(HostStream(), x.t, weight.t, c.eps, y->t));

    std::vector<double> want;
    for (int64_t r = 0; r < c.rows; ++r) {
      RefNormRow(Row(xv, r, c.dim), w, c.eps, c.x_dtype, c.y_dtype, &want);
    }
    if (!c.in_place) ExpectWrittenExactly(*y, what);
    const bool all_f32 = c.x_dtype == DType::kF32 && c.y_dtype == DType::kF32 &&
                         c.w_dtype == DType::kF32;
    ExpectClose("rms_norm", all_f32, y->t, want, what);
  }
}

// Copy: rows of strided views bit for bit, the bytes between rows left
// alone; overlapping views and mismatched dtypes refused.
TEST(CopyTest, CopiesRowsAndRefusesOverlap) {
  Owned src = Make(DType::kBF16, {5, 9});
  FillRandom(src, NextSeed());
  Owned dst = Make(DType::kBF16, {5, 12});
  PoisonNaN(dst);
  const Tensor s = src.t.Slice(1, 2, 9);  // [5, 7], row stride 9
  const Tensor d = dst.t.Slice(1, 3, 10);  // [5, 7], row stride 12
  ASSERT_OK(Copy(HostStream(), s, d));
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 12; ++c) {
      const float got = dst.get(r * 12 + c);
      if (c >= 3 && c < 10) {
        EXPECT_EQ(got, src.get(r * 9 + c - 1)) << r << " " << c;
      } else {
        EXPECT_TRUE(std::isnan(got)) << r << " " << c << ": written outside the view";
      }
    }
  }
  // Overlap: the same buffer shifted by one row, and one element.
  Owned buf = Make(DType::kF32, {6, 4});
  absl::Status st = Copy(HostStream(), buf.t.Slice(0, 0, 5), buf.t.Slice(0, 1, 6));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("overlap"));
  st = Copy(HostStream(), buf.t.Slice(1, 0, 3), buf.t.Slice(1, 1, 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // Disjoint halves of one buffer are fine.
  EXPECT_OK(Copy(HostStream(), buf.t.Slice(0, 0, 3), buf.t.Slice(0, 3, 6)));
  Owned other = Make(DType::kF32, {5, 7});
  st = Copy(HostStream(), s, other.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(AddRmsNormTest, MatchesReference) {
  for (const NormCase& c : NormCases()) {
    // The residual carries the x/y dtype pair's roles: residual in x_dtype,
    // the added x in the other float dtype for half of the cases.
    const DType res_dtype = c.x_dtype;
    const DType add_dtype = (c.rows * c.dim) % 2 == 0 ? c.x_dtype : c.y_dtype;
    const bool in_place = c.in_place && add_dtype == c.y_dtype;
    const std::string what = absl::StrCat(NormName(c), " added x ", Str(add_dtype));
    SCOPED_TRACE(what);
    View x = MakeRows(add_dtype, c.rows, c.dim, c.pad, 0);
    Randomize(x, -1.0f, 1.0f);
    View residual = MakeRows(res_dtype, c.rows, c.dim, 0, c.pad);
    Randomize(residual, -2.0f, 2.0f);
    Owned weight = Make(c.w_dtype, {c.dim});
    std::vector<double> w = FillRandom(weight, NextSeed(), 0.6f, 1.4f);
    const std::vector<double> xv = Values(x.t);
    const std::vector<double> rv = Values(residual.t);
    const std::vector<double> res_pad_before = Values(residual.buf.t);

    View y_own;
    const View* y = &x;
    if (!in_place) {
      y_own = MakeRows(c.y_dtype, c.rows, c.dim, c.pad, c.pad);
      PoisonNaN(y_own.buf);
      y = &y_own;
    }
    ASSERT_OK(AddRmsNorm(HostStream(), x.t, residual.t, weight.t, c.eps, y->t));

    // residual += x in residual's dtype: the f32 sum, rounded once.
    std::vector<double> sum(rv.size());
    for (size_t i = 0; i < rv.size(); ++i) {
      sum[i] = RoundTo(res_dtype, static_cast<float>(rv[i]) + static_cast<float>(xv[i]));
    }
    std::vector<double> want;
    for (int64_t r = 0; r < c.rows; ++r) {
      RefNormRow(Row(sum, r, c.dim), w, c.eps, res_dtype, c.y_dtype, &want);
    }
    EXPECT_EQ(Mismatches(residual.t, sum, 0.0), 0) << "residual is not residual + x";
    // The residual's padding is untouched.
    const std::vector<double> res_buf_after = Values(residual.buf.t);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = c.dim; i < c.dim + c.pad; ++i) {
        const size_t k = static_cast<size_t>(r * (c.dim + c.pad) + i);
        EXPECT_EQ(res_buf_after[k], res_pad_before[k]);
      }
    }
    if (!in_place) ExpectWrittenExactly(*y, what);
    const bool all_f32 = res_dtype == DType::kF32 && c.y_dtype == DType::kF32 &&
                         c.w_dtype == DType::kF32 && add_dtype == DType::kF32;
    ExpectClose("add_rms_norm", all_f32, y->t, want, what);
  }
}

TEST(RmsNormTest, RejectsBadArguments) {
  Owned x = Make(DType::kF32, {3, 8});
  Owned w = Make(DType::kF32, {8});
  Owned y = Make(DType::kF32, {3, 8});
  Owned res = Make(DType::kF32, {3, 8});
  Owned short_w = Make(DType::kF32, {7});
  Owned f16_x = Make(DType::kF16, {3, 8});
  Owned i32_w = Make(DType::kI32, {8});
  Owned tall_y = Make(DType::kF32, {4, 8});
  Owned wide_res = Make(DType::kF32, {3, 9});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  ExpectInvalid(RmsNorm(st, x.t, short_w.t, 1e-6f, y.t), "weight");
  ExpectInvalid(RmsNorm(st, x.t, i32_w.t, 1e-6f, y.t), "weight");
  ExpectInvalid(RmsNorm(st, f16_x.t, w.t, 1e-6f, y.t), "x");
  ExpectInvalid(RmsNorm(st, x.t, w.t, 1e-6f, tall_y.t), "y");
  ExpectInvalid(RmsNorm(st, x.t, w.t, -1.0f, y.t), "eps");
  ExpectInvalid(RmsNorm(st, x.t, w.t, std::nanf(""), y.t), "eps");
  // In place needs the same view; the same memory as bf16 would be garbage.
  ExpectInvalid(RmsNorm(st, x.t, w.t, 1e-6f,
                        Tensor(x.t.data(), DType::kBF16, {3, 8})), "y");
  ExpectInvalid(AddRmsNorm(st, x.t, wide_res.t, w.t, 1e-6f, y.t), "residual");
  ExpectInvalid(AddRmsNorm(st, f16_x.t, res.t, w.t, 1e-6f, y.t), "x");
  ExpectInvalid(AddRmsNorm(st, x.t, res.t, short_w.t, 1e-6f, y.t), "weight");
  ExpectInvalid(AddRmsNorm(st, x.t, res.t, w.t, 1e-6f, res.t), "y");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
}

// ---- Linear ---------------------------------------------------------------------------------

TEST(LinearTest, MatchesReference) {
  struct Dims {
    int64_t in, out;
  };
  int i = 0;
  // 1 row: sgemv; 2-24: the small-rows kernel; above: sgemm.
  for (int64_t rows : {1, 2, 7, 17, 24, 25, 40}) {
    for (Dims d : {Dims{7, 5}, Dims{64, 33}, Dims{129, 70}}) {
      // x and y as column slices of wider buffers in most cases.
      const int64_t x_pad = (i % 3 == 0) ? 0 : 2 + i % 3;
      const int64_t y_pad = (i % 2 == 0) ? 1 : 0;
      ++i;
      const std::string what = absl::StrCat("T=", rows, " in=", d.in, " out=", d.out,
                                            " x pad ", x_pad, " y pad ", y_pad);
      SCOPED_TRACE(what);
      View x = MakeRows(DType::kF32, rows, d.in, x_pad, 1);
      Randomize(x);
      Owned weight = Make(DType::kF32, {d.out, d.in});
      std::vector<double> w = FillRandom(weight, NextSeed());
      View y = MakeRows(DType::kF32, rows, d.out, y_pad, y_pad);
      PoisonNaN(y.buf);
      ASSERT_OK(Linear(HostStream(), x.t, weight.t, y.t));

      const std::vector<double> xv = Values(x.t);
      std::vector<double> want;
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t o = 0; o < d.out; ++o) {
          double acc = 0.0;
          for (int64_t k = 0; k < d.in; ++k) acc += xv[t * d.in + k] * w[o * d.in + k];
          want.push_back(acc);
        }
      }
      if (y_pad > 0) {
        ExpectWrittenExactly(y, what);
      } else {
        EXPECT_EQ(CountNaN(y.buf), 0) << what;
      }
      const double err = RelError(y.t, want);
      Record(rows == 1 ? "linear (T=1, sgemv)"
                       : rows <= 24 ? "linear (2<=T<=24, small rows)" : "linear (T>24, sgemm)",
             err);
      EXPECT_LE(err, kF32Tol) << what;
    }
  }
}

// The small-rows kernel directly, on every row count it takes and widths
// around the vector lengths (16, 8, 4 lanes; partial groups of w rows), with
// strided x and y: against a double-precision product, and each row's result
// independent of the other rows present (computed alone, it is the same bits).
TEST(SmallRowsGemmTest, MatchesReferenceAndIsIndependentOfTheBatch) {
  SCOPED_TRACE(host::SmallGemmIsa());
  for (int64_t k : {1, 5, 16, 31, 64, 100}) {
    for (int64_t n : {1, 3, 4, 9, 37}) {
      for (int64_t rows = 1; rows <= host::kSmallGemmMaxRows; rows += (rows < 8 ? 1 : 5)) {
        const int64_t ldx = k + 3, ldy = n + 2;
        const std::vector<float> x = testing::RandomFloats(static_cast<size_t>(rows * ldx), NextSeed());
        const std::vector<float> w = testing::RandomFloats(static_cast<size_t>(n * k), NextSeed());
        std::vector<float> y(static_cast<size_t>(rows * ldy), -7.0f);
        host::SmallRowsGemmNT(rows, n, k, x.data(), ldx, w.data(), k, y.data(), ldy);
        double err = 0.0, ref = 0.0;
        for (int64_t m = 0; m < rows; ++m) {
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(x[m * ldx + p]) * w[j * k + p];
            err = std::max(err, std::abs(acc - y[m * ldy + j]));
            ref = std::max(ref, std::abs(acc));
          }
          EXPECT_EQ(y[m * ldy + n], -7.0f) << "wrote past the row";
        }
        EXPECT_LE(err / std::max(ref, 1e-30), kF32Tol) << rows << " x " << n << " x " << k;
        Record("small-rows gemm", err / std::max(ref, 1e-30));
        // The last row alone gives the same bits as inside the batch.
        std::vector<float> alone(static_cast<size_t>(n));
        host::SmallRowsGemmNT(1, n, k, x.data() + (rows - 1) * ldx, ldx, w.data(), k,
                              alone.data(), n);
        EXPECT_EQ(std::memcmp(alone.data(), y.data() + (rows - 1) * ldy, n * sizeof(float)), 0)
            << rows << " x " << n << " x " << k;
      }
    }
  }
}

TEST(LinearTest, RejectsBadArguments) {
  Owned x = Make(DType::kF32, {3, 8});
  Owned w = Make(DType::kF32, {5, 8});
  Owned y = Make(DType::kF32, {3, 5});
  Owned bf16_w = Make(DType::kBF16, {5, 8});
  Owned bf16_x = Make(DType::kBF16, {3, 8});
  Owned narrow_w = Make(DType::kF32, {5, 7});
  Owned wrong_y = Make(DType::kF32, {3, 6});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  absl::Status s = Linear(st, x.t, bf16_w.t, y.t);
  ExpectInvalid(s, "weight");
  EXPECT_NE(std::string(s.message()).find("load"), std::string::npos) << s;
  ExpectInvalid(Linear(st, bf16_x.t, w.t, y.t), "x");
  ExpectInvalid(Linear(st, x.t, narrow_w.t, y.t), "weight");
  ExpectInvalid(Linear(st, x.t, w.t, wrong_y.t), "y");
  // Rows that overlap are no valid BLAS operand.
  Tensor overlapping_x = Tensor::Strided(x.t.data(), DType::kF32, {3, 8}, {4, 1});
  ExpectInvalid(Linear(st, overlapping_x, w.t, y.t), "x");
  Tensor col_major_x = Tensor::Strided(x.t.data(), DType::kF32, {3, 8}, {1, 3});
  ExpectInvalid(Linear(st, col_major_x, w.t, y.t), "x");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
}

// ---- HeadMatmul -----------------------------------------------------------------------------

struct HeadCase {
  int64_t rows, heads, k, n;
  int64_t x_pad;     // extra columns around each head's K values (q_nope inside q)
  int64_t out_pad;   // extra columns after each head's N values
  bool head_major;   // x stored [H, T, K] and viewed as [T, H, K]
};

TEST(HeadMatmulTest, MatchesReference) {
  const HeadCase cases[] = {
      {1, 1, 7, 9, 0, 0, false},
      {1, 5, 32, 24, 3, 1, false},  // decode: heads spread over threads
      {3, 2, 33, 65, 1, 0, true},
      {17, 5, 7, 129, 2, 2, false},
      {17, 3, 129, 129, 0, 1, true},  // m*n*k > 2^18: OpenBLAS threads per head
  };
  for (const HeadCase& c : cases) {
    for (bool transpose_w : {false, true}) {
      const std::string what =
          absl::StrCat("T=", c.rows, " H=", c.heads, " K=", c.k, " N=", c.n, " x pad ", c.x_pad,
                       c.head_major ? " head-major" : "", transpose_w ? " W^T" : " W");
      SCOPED_TRACE(what);
      View x;
      if (c.head_major) {
        View storage = Make3D(DType::kF32, c.heads, c.rows, c.k, c.x_pad, 1);
        x.buf = std::move(storage.buf);
        const int64_t row = c.k + c.x_pad + 1;
        x.t = Tensor::Strided(static_cast<float*>(x.buf.t.data()) + c.x_pad, DType::kF32,
                              {c.rows, c.heads, c.k}, {row, c.rows * row, 1});
      } else {
        x = Make3D(DType::kF32, c.rows, c.heads, c.k, c.x_pad, 2);
      }
      Randomize(x);
      Owned weight = transpose_w ? Make(DType::kF32, {c.heads, c.n, c.k})
                                 : Make(DType::kF32, {c.heads, c.k, c.n});
      std::vector<double> w = FillRandom(weight, NextSeed());
      View out = Make3D(DType::kF32, c.rows, c.heads, c.n, 0, c.out_pad);
      PoisonNaN(out.buf);
      ASSERT_OK(HeadMatmul(HostStream(), x.t, weight.t, transpose_w, out.t));

      const std::vector<double> xv = Values(x.t);  // [T, H, K]
      std::vector<double> want;
      for (int64_t t = 0; t < c.rows; ++t) {
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t j = 0; j < c.n; ++j) {
            double acc = 0.0;
            for (int64_t kk = 0; kk < c.k; ++kk) {
              const double wv = transpose_w ? w[(h * c.n + j) * c.k + kk]
                                            : w[(h * c.k + kk) * c.n + j];
              acc += xv[(t * c.heads + h) * c.k + kk] * wv;
            }
            want.push_back(acc);
          }
        }
      }
      ExpectWrittenExactly(out, what);
      const double err = RelError(out.t, want);
      Record("head_matmul", err);
      EXPECT_LE(err, kF32Tol) << what;
    }
  }
}

TEST(HeadMatmulTest, RejectsBadArguments) {
  Owned x = Make(DType::kF32, {3, 4, 8});
  Owned w = Make(DType::kF32, {4, 8, 6});    // untransposed: [H, K, N]
  Owned w_t = Make(DType::kF32, {4, 6, 8});  // transposed: [H, N, K]
  Owned out = Make(DType::kF32, {3, 4, 6});
  Owned wrong_out = Make(DType::kF32, {3, 4, 5});
  Owned bf16_w = Make(DType::kBF16, {4, 8, 6});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  ExpectInvalid(HeadMatmul(st, x.t, w_t.t, /*transpose_w=*/false, out.t), "weight");
  ExpectInvalid(HeadMatmul(st, x.t, w.t, /*transpose_w=*/true, out.t), "weight");
  ExpectInvalid(HeadMatmul(st, x.t, bf16_w.t, false, out.t), "weight");
  ExpectInvalid(HeadMatmul(st, x.t, w.t, false, wrong_out.t), "out");
  ExpectInvalid(HeadMatmul(st, Tensor(x.t.data(), DType::kF32, {12, 8}), w.t, false, out.t), "x");
  // Heads of out that share memory.
  Tensor aliased_heads = Tensor::Strided(out.t.data(), DType::kF32, {3, 4, 6}, {24, 3, 1});
  ExpectInvalid(HeadMatmul(st, x.t, w.t, false, aliased_heads), "out");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
  // Both layouts accepted with matching shapes.
  EXPECT_OK(HeadMatmul(st, x.t, w.t, false, out.t));
  EXPECT_OK(HeadMatmul(st, x.t, w_t.t, true, out.t));
}

// ---- SiluAndMul -----------------------------------------------------------------------------

TEST(SiluAndMulTest, MatchesReference) {
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  const DType combos[][2] = {{f32, f32}, {bf16, bf16}, {bf16, f32}, {f32, bf16}};
  int i = 0;
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t inter : {7, 64, 129}) {
      for (const auto& d : combos) {
        const int64_t pad = i % 3;
        ++i;
        const std::string what = absl::StrCat("T=", rows, " I=", inter, " ", Str(d[0]), "->",
                                              Str(d[1]), " pad ", pad);
        SCOPED_TRACE(what);
        View gate_up = MakeRows(d[0], rows, 2 * inter, pad, 1);
        Randomize(gate_up, -6.0f, 6.0f);  // the whole bend of silu, both tails
        View out = MakeRows(d[1], rows, inter, pad, pad);
        PoisonNaN(out.buf);
        ASSERT_OK(SiluAndMul(HostStream(), gate_up.t, out.t));

        const std::vector<double> gu = Values(gate_up.t);
        std::vector<double> want;
        for (int64_t t = 0; t < rows; ++t) {
          for (int64_t j = 0; j < inter; ++j) {
            const double g = gu[t * 2 * inter + j];
            const double u = gu[t * 2 * inter + inter + j];
            want.push_back(RoundTo(d[1], g / (1.0 + std::exp(-g)) * u));
          }
        }
        ExpectWrittenExactly(out, what);
        ExpectClose("silu_and_mul", d[1] == f32, out.t, want, what);
      }
    }
  }
}

TEST(SiluAndMulTest, RejectsBadArguments) {
  Owned gate_up = Make(DType::kF32, {3, 10});
  Owned out = Make(DType::kF32, {3, 5});
  Owned odd = Make(DType::kF32, {3, 9});
  Owned wrong_out = Make(DType::kF32, {3, 4});
  Owned f16_in = Make(DType::kF16, {3, 10});
  Owned i32_out = Make(DType::kI32, {3, 5});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  ExpectInvalid(SiluAndMul(st, odd.t, out.t), "gate_up");
  ExpectInvalid(SiluAndMul(st, f16_in.t, out.t), "gate_up");
  ExpectInvalid(SiluAndMul(st, gate_up.t, wrong_out.t), "out");
  ExpectInvalid(SiluAndMul(st, gate_up.t, i32_out.t), "out");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
}

// ---- Capture and replay -------------------------------------------------------------------

// Every op records one node with its kernel name and kind, and a replay reads
// the inputs' current contents through the captured views.
TEST(BasicOpsGraphTest, CaptureNamesKindsAndReplay) {
  constexpr int64_t kT = 3, kD = 16, kH = 2, kK = 8, kN = 5, kV = 11;
  Owned ids = Make(DType::kI32, {kT});
  for (int64_t t = 0; t < kT; ++t) ids.data<int32_t>()[t] = static_cast<int32_t>(2 * t + 1);
  Owned table = Make(DType::kF32, {kV, kD});
  Owned emb = Make(DType::kF32, {kT, kD});
  Owned gathered = Make(DType::kF32, {kT, kD});
  Owned norm_w = Make(DType::kF32, {kD});
  Owned normed = Make(DType::kF32, {kT, kD});
  Owned residual = Make(DType::kF32, {kT, kD});
  Owned normed2 = Make(DType::kF32, {kT, kD});
  Owned lin_w = Make(DType::kF32, {2 * kD, kD});
  Owned gate_up = Make(DType::kF32, {kT, 2 * kD});
  Owned act = Make(DType::kF32, {kT, kD});
  Owned head_x = Make(DType::kF32, {kT, kH, kK});
  Owned head_w = Make(DType::kF32, {kH, kK, kN});
  Owned head_out = Make(DType::kF32, {kT, kH, kN});
  FillRandom(table, NextSeed());
  FillRandom(norm_w, NextSeed(), 0.5f, 1.5f);
  FillRandom(lin_w, NextSeed());
  FillRandom(head_x, NextSeed());
  FillRandom(head_w, NextSeed());
  const Owned* outputs[] = {&emb, &gathered, &normed, &normed2, &gate_up, &act, &head_out};

  Stream& st = HostStream();
  auto launch_all = [&]() -> absl::Status {
    MLAG_RETURN_IF_ERROR(Embedding(st, ids.t, table.t, emb.t));
    MLAG_RETURN_IF_ERROR(GatherRows(st, ids.t, table.t, gathered.t));
    MLAG_RETURN_IF_ERROR(RmsNorm(st, emb.t, norm_w.t, 1e-6f, normed.t));
    MLAG_RETURN_IF_ERROR(AddRmsNorm(st, gathered.t, residual.t, norm_w.t, 1e-6f, normed2.t));
    MLAG_RETURN_IF_ERROR(Linear(st, normed2.t, lin_w.t, gate_up.t));
    MLAG_RETURN_IF_ERROR(SiluAndMul(st, gate_up.t, act.t));
    return HeadMatmul(st, head_x.t, head_w.t, false, head_out.t);
  };
  auto snapshot = [&] {
    std::vector<std::vector<double>> v;
    for (const Owned* o : outputs) v.push_back(Values(o->t));
    return v;
  };

  // Eager run first; the replay below starts from the same residual.
  const std::vector<double> residual0 = FillRandom(residual, NextSeed());
  ASSERT_OK(launch_all());
  const auto eager = snapshot();

  ASSERT_OK(st.BeginCapture());
  absl::Status captured = launch_all();
  auto graph = st.EndCapture();
  ASSERT_OK(captured);
  ASSERT_OK(graph);
  const std::vector<std::pair<std::string, OpKind>> expected = {
      {"embedding", OpKind::kKernel},    {"gather_rows", OpKind::kKernel},
      {"rms_norm", OpKind::kKernel},     {"add_rms_norm", OpKind::kKernel},
      {"linear", OpKind::kGemm},         {"silu_and_mul", OpKind::kKernel},
      {"head_matmul", OpKind::kGemm}};
  const auto& nodes = (*graph)->nodes();
  ASSERT_EQ(nodes.size(), expected.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(nodes[i].name, expected[i].first);
    EXPECT_EQ(nodes[i].kind, expected[i].second) << nodes[i].name;
  }

  // Same inputs again (the residual was updated in place), poisoned outputs.
  for (size_t i = 0; i < residual0.size(); ++i) residual.set(static_cast<int64_t>(i), residual0[i]);
  for (const Owned* o : outputs) PoisonNaN(*o);
  ASSERT_OK((*graph)->Replay(st));
  const auto replayed = snapshot();
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(replayed[i], eager[i]) << "output " << i << " differs on replay";
  }
}

}  // namespace
}  // namespace mlag
