// Host-only tests of the basic ops: what their arguments must be (every bad
// call refused before anything launches), the host's small-rows GEMM, Copy's
// overlap rule, out-of-range gathers and graph capture of the ops. Their
// numerical cases, on every backend, are in tests/ops/cases_basic.cc and
// cases_linear.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "kernels/host/gemm.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"
#include "tests/error_report.h"
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
using ::mlag::testing::SkipUnlessRequestedIsa;

constexpr double kF32Tol = 1e-5;

using ::mlag::testing::RecordError;  // max_rel_err lines at exit

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

// The status is InvalidArgument and its message names `arg`.
void ExpectInvalid(const absl::Status& s, const std::string& arg) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(arg), std::string::npos)
      << "message does not name '" << arg << "': " << s.message();
}

// ---- GatherRows / Embedding ------------------------------------------------------------

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

// Reference for one normalised row `v` (values already in `norm_dtype`).
// Copy: rows of strided views bit for bit, the bytes between rows left
// alone; overlapping views and mismatched dtypes refused.
TEST(CopyTest, CopiesRowsAndRefusesOverlap) {
  Owned src = Make(DType::kBF16, {5, 9});
  FillRandom(src, NextSeed());
  Owned dst = Make(DType::kBF16, {5, 12});
  PoisonNaN(dst);
  const Tensor s = src.t.Slice(1, 2, 9);   // [5, 7], row stride 9
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
  ExpectInvalid(RmsNorm(st, x.t, w.t, 1e-6f, Tensor(x.t.data(), DType::kBF16, {3, 8})), "y");
  ExpectInvalid(AddRmsNorm(st, x.t, wide_res.t, w.t, 1e-6f, y.t), "residual");
  ExpectInvalid(AddRmsNorm(st, f16_x.t, res.t, w.t, 1e-6f, y.t), "x");
  ExpectInvalid(AddRmsNorm(st, x.t, res.t, short_w.t, 1e-6f, y.t), "weight");
  ExpectInvalid(AddRmsNorm(st, x.t, res.t, w.t, 1e-6f, res.t), "y");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
}

// ---- Linear ---------------------------------------------------------------------------------

// The host GEMM directly, for each weight dtype and both storage forms
// (row-major, and packed in row groups by PackGemmRowGroups), on row counts
// around its row blocks and panel, widths around the vector lengths (16, 8,
// 4 lanes) and the 64-row groups (partial groups, rows after the last whole
// one), k past one fp8 block, with strided x and y:
//   - against a double-precision product of the dequantized weights;
//   - each row's result independent of the other rows present (computed
//     alone, it is the same bits): batch invariance;
//   - the same bits for the outputs of a column range (from a later row of
//     w on, or fewer rows): how Linear splits n over threads;
//   - bf16 and fp8 weights give the bits of their f32 dequantized values
//     stored the same way;
//   - packing moves the bytes, and unpacking restores them.
// Skips when MLAG_HOST_ISA asks for a variant this CPU cannot run.
// A copy of `w` (n x k, contiguous) and its GemmWeights, packed or not.
struct StoredWeights {
  StoredWeights(const host::GemmWeights& w, int64_t n, int64_t k, bool pack)
      : bytes(static_cast<const char*>(w.data),
              static_cast<const char*>(w.data) + n * k * DTypeSize(w.dtype)),
        gemm(w) {
    gemm.data = bytes.data();
    if (pack) gemm.packed_rows = host::PackGemmRowGroups(bytes.data(), w.dtype, n, k);
  }
  std::vector<char> bytes;
  host::GemmWeights gemm;
};

TEST(GemmTest, MatchesReferenceAndIsIndependentOfBatchAndDtype) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  const int64_t g = host::kGemmGroupRows;
  // 300 (and for fp8, 131): more than one of the long chunks that panels of
  // many rows take on AVX2 and SSE2 (kLongChunkRows: f32 from 16 rows, fp8
  // from 32, bf16 from 40), multiplied part-major (256 elements of f32 and
  // bf16, 128 of converted fp8), and a tail.
  for (int64_t k : {1, 5, 16, 31, 100, 131, 300}) {
    for (int64_t n : {1, 3, 9, 37, 64, 67, 130}) {
      // 3, 4, 7, 8, 9, 13: the rows AVX2 leaves after its blocks of many
      // rows, in each of its left-over blockings (kSlabBlockingLeft). 70 and
      // 261: more than one panel of rows (64; fp8 256) and a short one.
      for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 31, 64, 70, 261}) {
        if (rows > 70 && (n < 64 || k < 100)) continue;  // a few shapes suffice
        const int64_t ldx = k + 3, ldy = n + 2;
        const std::vector<float> x =
            testing::RandomFloats(static_cast<size_t>(rows * ldx), NextSeed());
        const std::vector<float> w_src =
            testing::RandomFloats(static_cast<size_t>(n * k), NextSeed(), -3.0f, 3.0f);
        // The three forms of one weight matrix, each with its f32 value.
        std::vector<uint16_t> w_bf16(w_src.size());
        ConvertFromF32(w_src.data(), DType::kBF16, w_bf16.data(), w_src.size());
        std::vector<float> bf16_value(w_src.size());
        ConvertToF32(DType::kBF16, w_bf16.data(), bf16_value.data(), w_src.size());
        std::vector<uint8_t> w_fp8(w_src.size());
        std::vector<float> block_scales(static_cast<size_t>(Fp8Blocks(n) * Fp8Blocks(k)));
        QuantizeFp8Blocks(w_src.data(), n, k, w_fp8.data(), block_scales.data());
        std::vector<float> row_scales(static_cast<size_t>(n * Fp8Blocks(k)));
        ExpandFp8RowScales(block_scales.data(), n, k, row_scales.data());
        std::vector<float> fp8_value(w_src.size());
        DequantizeFp8Blocks(w_fp8.data(), block_scales.data(), n, k, fp8_value.data());

        struct Form {
          const char* name;
          host::GemmWeights w;
          const std::vector<float>* value;
        };
        const host::GemmWeights f32{w_src.data(), DType::kF32, k};
        const host::GemmWeights bf16{w_bf16.data(), DType::kBF16, k};
        const host::GemmWeights fp8{w_fp8.data(), DType::kF8E4M3, k, row_scales.data(),
                                    Fp8Blocks(k)};
        const host::GemmWeights bf16_as_f32{bf16_value.data(), DType::kF32, k};
        const host::GemmWeights fp8_as_f32{fp8_value.data(), DType::kF32, k};
        const Form forms[] = {
            {"f32", f32, &w_src}, {"bf16", bf16, &bf16_value}, {"fp8", fp8, &fp8_value}};
        for (bool pack : {false, true}) {
          for (const Form& form : forms) {
            SCOPED_TRACE(::testing::Message() << form.name << (pack ? " packed " : " ") << rows
                                              << " x " << n << " x " << k);
            const StoredWeights stored(form.w, n, k, pack);
            const host::GemmWeights& w = stored.gemm;
            if (pack) {
              EXPECT_EQ(w.packed_rows, n / g * g);
              if (w.packed_rows > 0 && k > 1) {
                EXPECT_NE(std::memcmp(stored.bytes.data(), form.w.data, stored.bytes.size()), 0)
                    << "packing moved nothing";
              }
              std::vector<char> unpacked = stored.bytes;
              host::UnpackGemmRowGroups(unpacked.data(), w.dtype, n, k);
              EXPECT_EQ(std::memcmp(unpacked.data(), form.w.data, unpacked.size()), 0)
                  << "unpacked";
            }
            std::vector<float> y(static_cast<size_t>(rows * ldy), -7.0f);
            host::GemmNT(rows, n, k, x.data(), ldx, w, y.data(), ldy);
            double err = 0.0, ref = 0.0;
            for (int64_t m = 0; m < rows; ++m) {
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (int64_t p = 0; p < k; ++p) {
                  acc += static_cast<double>(x[m * ldx + p]) * (*form.value)[j * k + p];
                }
                err = std::max(err, std::abs(acc - y[m * ldy + j]));
                ref = std::max(ref, std::abs(acc));
              }
              EXPECT_EQ(y[m * ldy + n], -7.0f) << "wrote past the row";
            }
            EXPECT_LE(err / std::max(ref, 1e-30), kF32Tol);
            RecordError(pack ? "host gemm, packed" : "host gemm", err / std::max(ref, 1e-30));
            // The last row alone gives the same bits as inside the batch.
            std::vector<float> alone(static_cast<size_t>(n));
            host::GemmNT(1, n, k, x.data() + (rows - 1) * ldx, ldx, w, alone.data(), n);
            EXPECT_EQ(std::memcmp(alone.data(), y.data() + (rows - 1) * ldy, n * sizeof(float)), 0);
            // Rows [1, rows) of x, the outputs of w rows [c0, c1): the same
            // bits again. c0 is a group boundary in the packed rows.
            const int64_t c0 = pack ? (n > g ? g : 0) : 1;
            const int64_t c1 = n - 1;
            if (rows > 1 && c1 > c0) {
              const int64_t width = c1 - c0;
              std::vector<float> part(static_cast<size_t>((rows - 1) * width));
              host::GemmNT(rows - 1, width, k, x.data() + ldx, ldx, w.FromRow(c0), part.data(),
                           width);
              for (int64_t m = 1; m < rows; ++m) {
                EXPECT_EQ(std::memcmp(part.data() + (m - 1) * width, y.data() + m * ldy + c0,
                                      width * sizeof(float)),
                          0)
                    << "rows of w [" << c0 << ", " << c1 << "), row " << m;
              }
            }
            // The same bits as the dequantized weights in f32, stored alike.
            if (form.value != &w_src) {
              const StoredWeights value(form.value == &bf16_value ? bf16_as_f32 : fp8_as_f32, n, k,
                                        pack);
              std::vector<float> y32(static_cast<size_t>(rows * ldy), -7.0f);
              host::GemmNT(rows, n, k, x.data(), ldx, value.gemm, y32.data(), ldy);
              EXPECT_EQ(std::memcmp(y32.data(), y.data(), y.size() * sizeof(float)), 0);
            }
          }
        }
      }
    }
  }
}

// y += x w with w's rows given by pointer (attention's probabilities times
// value rows, and its scores): against a double reference, each row of y the
// same bits whatever rows share the call, and the same bits with a prefetch
// span as without.
TEST(GemmTest, AccumulateMatchesReferenceAndIsIndependentOfBatch) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  for (int64_t k : {1, 3, 16, 33}) {
    for (int64_t n : {1, 7, 16, 70, 512, 517}) {
      for (int64_t rows : {1, 2, 3, 4, 5, 9, 17}) {
        SCOPED_TRACE(::testing::Message() << rows << " x " << n << " x " << k);
        const int64_t ldx = k + 1, ldy = n + 3, ldw = n + 5;
        const std::vector<float> x =
            testing::RandomFloats(static_cast<size_t>(rows * ldx), NextSeed());
        // w rows out of order in their buffer, as cache rows are.
        const std::vector<float> w_buf =
            testing::RandomFloats(static_cast<size_t>(k * ldw), NextSeed(), -3.0f, 3.0f);
        std::vector<const float*> w_rows(static_cast<size_t>(k));
        for (int64_t p = 0; p < k; ++p) w_rows[p] = w_buf.data() + ((p * 5) % k) * ldw;
        const std::vector<float> y0 =
            testing::RandomFloats(static_cast<size_t>(rows * ldy), NextSeed());
        std::vector<float> y = y0;
        host::GemmNNAccumulate(rows, n, k, x.data(), ldx, w_rows.data(), y.data(), ldy);
        // Prefetching fewer cache lines than there are steps, and more (the
        // excess goes out before the steps).
        for (int64_t span_bytes : {int64_t{200}, 64 * (k + 40)}) {
          const std::vector<float> span(static_cast<size_t>(span_bytes / 4), 1.0f);
          std::vector<float> y_pf = y0;
          host::GemmNNAccumulate(rows, n, k, x.data(), ldx, w_rows.data(), y_pf.data(), ldy,
                                 span.data(), span_bytes);
          EXPECT_EQ(std::memcmp(y_pf.data(), y.data(), y.size() * sizeof(float)), 0)
              << "prefetching " << span_bytes << " bytes";
        }
        double err = 0.0, ref = 0.0;
        for (int64_t m = 0; m < rows; ++m) {
          for (int64_t c = 0; c < n; ++c) {
            double acc = y0[m * ldy + c];
            for (int64_t p = 0; p < k; ++p) {
              acc += static_cast<double>(x[m * ldx + p]) * w_rows[p][c];
            }
            err = std::max(err, std::abs(acc - y[m * ldy + c]));
            ref = std::max(ref, std::abs(acc));
          }
          EXPECT_EQ(y[m * ldy + n], y0[m * ldy + n]) << "wrote past the row";
        }
        EXPECT_LE(err / std::max(ref, 1e-30), kF32Tol);
        RecordError("host gemm accumulate", err / std::max(ref, 1e-30));
        for (int64_t m = 0; m < rows; ++m) {
          std::vector<float> alone(y0.begin() + m * ldy, y0.begin() + m * ldy + n);
          host::GemmNNAccumulate(1, n, k, x.data() + m * ldx, ldx, w_rows.data(), alone.data(), n);
          EXPECT_EQ(std::memcmp(alone.data(), y.data() + m * ldy, n * sizeof(float)), 0)
              << "row " << m;
        }
      }
    }
  }
}

// The peak probe reports the multiply-adds it ran: a whole number of
// vectors per step, in proportion to the steps, none for none.
TEST(GemmTest, PeakProbeCountsItsMultiplyAdds) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  const int64_t per_step = host::GemmPeakProbe(1);
  EXPECT_GT(per_step, 0);
  EXPECT_EQ(per_step % 4, 0);  // whole vectors of 4, 8 or 16 lanes
  EXPECT_EQ(host::GemmPeakProbe(1000), 1000 * per_step);
  EXPECT_EQ(host::GemmPeakProbe(0), 0);
  EXPECT_EQ(host::GemmPeakProbe(-5), 0);
}

TEST(LinearTest, RejectsBadArguments) {
  Owned x = Make(DType::kF32, {3, 8});
  Owned w = Make(DType::kF32, {5, 8});
  Owned y = Make(DType::kF32, {3, 5});
  Owned f16_w = Make(DType::kF16, {5, 8});
  Owned fp8_w = Make(DType::kF8E4M3, {5, 8});
  Owned fp8_scales = Make(DType::kF32, {5, 1});
  Owned wrong_scales = Make(DType::kF32, {1, 1});
  Owned bf16_x = Make(DType::kBF16, {3, 8});
  Owned narrow_w = Make(DType::kF32, {5, 7});
  Owned wrong_y = Make(DType::kF32, {3, 6});
  Stream& st = HostStream();
  const uint64_t launches = st.launches();
  ExpectInvalid(Linear(st, x.t, f16_w.t, y.t), "weight");
  // fp8 needs its per-row block scales, [out, ceil(in / 128)].
  ExpectInvalid(Linear(st, x.t, fp8_w.t, y.t), "weight.scales");
  ExpectInvalid(Linear(st, x.t, LinearWeight(fp8_w.t, wrong_scales.t), y.t), "weight.scales");
  ExpectInvalid(Linear(st, bf16_x.t, w.t, y.t), "x");
  ExpectInvalid(Linear(st, x.t, narrow_w.t, y.t), "weight");
  ExpectInvalid(Linear(st, x.t, w.t, wrong_y.t), "y");
  // Rows that overlap are no valid BLAS operand.
  Tensor overlapping_x = Tensor::Strided(x.t.data(), DType::kF32, {3, 8}, {4, 1});
  ExpectInvalid(Linear(st, overlapping_x, w.t, y.t), "x");
  Tensor col_major_x = Tensor::Strided(x.t.data(), DType::kF32, {3, 8}, {1, 3});
  ExpectInvalid(Linear(st, col_major_x, w.t, y.t), "x");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
  EXPECT_OK(Linear(st, x.t, LinearWeight(fp8_w.t, fp8_scales.t), y.t));
}

// ---- HeadMatmul -----------------------------------------------------------------------------

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
  // Weights packed per head: only the transposed layout reads them.
  LinearWeight packed_w(w.t), packed_w_t(w_t.t);
  ASSERT_OK(PackForLinear(st.device(), packed_w));
  ASSERT_OK(PackForLinear(st.device(), packed_w_t));
  ExpectInvalid(HeadMatmul(st, x.t, packed_w, false, out.t), "weight");
  EXPECT_EQ(st.launches(), launches) << "a rejected call launched something";
  // Both layouts accepted with matching shapes.
  EXPECT_OK(HeadMatmul(st, x.t, w.t, false, out.t));
  EXPECT_OK(HeadMatmul(st, x.t, w_t.t, true, out.t));
  EXPECT_OK(HeadMatmul(st, x.t, packed_w_t, true, out.t));
}

// ---- SiluAndMul -----------------------------------------------------------------------------

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
      {"embedding", OpKind::kKernel}, {"gather_rows", OpKind::kKernel},
      {"rms_norm", OpKind::kKernel},  {"add_rms_norm", OpKind::kKernel},
      {"linear", OpKind::kGemm},      {"silu_and_mul", OpKind::kKernel},
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
