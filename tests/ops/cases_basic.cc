// Cases of the basic ops, each against a double-precision reference written
// here: RmsNorm and AddRmsNorm, SiluAndMul, GatherRows and Embedding,
// ApplyRope, and the elementwise Fill, Scale, Add and Copy.
//
// Tolerances (see Tolerance in harness.h): all-f32 paths within 1e-5
// normwise (rope 1e-6); bf16 outputs within an ulp or two of the reference
// rounded to bf16; where the op rounds to bf16 inside (a bf16 input's
// normalised value), Tolerance::Bf16Inside; gathers, copies and fills exact.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "tests/ops/harness.h"
#include "tests/status_matchers.h"

namespace mlag::ops_test {
namespace {

const DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16;

std::string Str(DType d) { return std::string(DTypeName(d)); }

// ---- RmsNorm / AddRmsNorm --------------------------------------------------------

struct NormCase {
  int64_t rows, dim;
  DType x, w, y;
  float eps;
  int64_t pad;    // row padding of x (and the residual)
  bool in_place;  // y is x (equal dtypes)
};

std::string Name(const NormCase& c) {
  return absl::StrCat(c.rows, "x", c.dim, " x ", Str(c.x), " w ", Str(c.w), " y ", Str(c.y),
                      " eps ", c.eps, " pad ", c.pad, c.in_place ? " in place" : "");
}

std::vector<NormCase> NormCases() {
  std::vector<NormCase> cases;
  const DType combos[][3] = {
      {kF32, kF32, kF32}, {kBF16, kBF16, kBF16}, {kBF16, kF32, kF32}, {kF32, kBF16, kBF16}};
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
  // Model widths and many rows.
  cases.push_back({4, 7168, kF32, kBF16, kBF16, 1e-6f, 0, false});
  cases.push_back({17, 2048, kBF16, kF32, kF32, 1e-6f, 0, false});
  cases.push_back({9, 1536, kBF16, kBF16, kBF16, 1e-6f, 0, true});
  cases.push_back({300, 96, kBF16, kBF16, kF32, 1e-6f, 1, false});
  return cases;
}

// One normalised row `v` (values as stored in `norm_dtype`): y = w *
// round_norm(v / rms), rounded to y's dtype.
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

Tolerance NormTolerance(DType norm_dtype) {
  return norm_dtype == kF32 ? Tolerance{} : Tolerance::Bf16Inside();
}

void RmsNormCase(Context& ctx, const NormCase& c) {
  Buf& x = ctx.Make("x", c.x, {c.rows, c.dim}, c.pad, 1, 1);
  ctx.Randomize(x, -2.0, 2.0);
  Buf& w = ctx.Make("weight", c.w, {c.dim});
  ctx.Randomize(w, 0.6, 1.4);
  const std::vector<double> xv = x.Values(), wv = w.Values();
  Buf& y = c.in_place ? x : ctx.Output("y", c.y, {c.rows, c.dim}, c.pad + 1);
  ctx.RunOp(
      {&y}, [&](Stream& s) { return RmsNorm(s, x.t, w.t, c.eps, y.t); }, true,
      c.in_place ? std::initializer_list<Buf*>{&x} : std::initializer_list<Buf*>{});
  std::vector<double> want;
  for (int64_t r = 0; r < c.rows; ++r) RefNormRow(Row(xv, r, c.dim), wv, c.eps, c.x, c.y, &want);
  ctx.ExpectClose(y, want, NormTolerance(c.x));
}

void AddRmsNormCase(Context& ctx, const NormCase& c) {
  // The residual in x's dtype; the added x in the other float dtype for
  // half of the cases.
  const DType res_dtype = c.x;
  const DType add_dtype = (c.rows * c.dim) % 2 == 0 ? c.x : c.y;
  const bool in_place = c.in_place && add_dtype == c.y;
  Buf& x = ctx.Make("x", add_dtype, {c.rows, c.dim}, c.pad, 2, 1);
  ctx.Randomize(x, -1.0, 1.0);
  Buf& residual = ctx.Make("residual", res_dtype, {c.rows, c.dim}, c.pad + 2, 0, 3);
  ctx.Randomize(residual, -2.0, 2.0);
  Buf& w = ctx.Make("weight", c.w, {c.dim});
  ctx.Randomize(w, 0.6, 1.4);
  const std::vector<double> xv = x.Values(), rv = residual.Values(), wv = w.Values();
  Buf& y = in_place ? x : ctx.Output("y", c.y, {c.rows, c.dim}, c.pad);
  ctx.RunOp(
      {&y, &residual}, [&](Stream& s) { return AddRmsNorm(s, x.t, residual.t, w.t, c.eps, y.t); },
      true,
      in_place ? std::initializer_list<Buf*>{&x, &residual}
               : std::initializer_list<Buf*>{&residual});
  // residual += x in the residual's dtype (the f32 sum, rounded once).
  std::vector<double> sum(rv.size());
  for (size_t i = 0; i < rv.size(); ++i) {
    sum[i] = RoundTo(res_dtype, static_cast<float>(rv[i]) + static_cast<float>(xv[i]));
  }
  std::vector<double> want;
  for (int64_t r = 0; r < c.rows; ++r)
    RefNormRow(Row(sum, r, c.dim), wv, c.eps, res_dtype, c.y, &want);
  ctx.ExpectClose(residual, sum, Tolerance::Exact());
  ctx.ExpectClose(y, want, NormTolerance(res_dtype));
}

// ---- SiluAndMul ----------------------------------------------------------------------

void SiluAndMulCase(Context& ctx, int64_t rows, int64_t inter, DType in, DType out_dtype,
                    int64_t pad) {
  Buf& gate_up = ctx.Make("gate_up", in, {rows, 2 * inter}, pad, 0, 1);
  ctx.Randomize(gate_up, -6.0, 6.0);  // the whole bend of silu, both tails
  Buf& out = ctx.Output("out", out_dtype, {rows, inter}, pad, pad);
  ctx.RunOp({&out}, [&](Stream& s) { return SiluAndMul(s, gate_up.t, out.t); });
  const std::vector<double> gu = gate_up.Values();
  std::vector<double> want;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < inter; ++j) {
      const double g = gu[static_cast<size_t>(t * 2 * inter + j)];
      const double u = gu[static_cast<size_t>(t * 2 * inter + inter + j)];
      want.push_back(RoundTo(out_dtype, g / (1.0 + std::exp(-g)) * u));
    }
  }
  ctx.ExpectClose(out, want, Tolerance{});
}

// ---- GatherRows / Embedding ------------------------------------------------------------

struct GatherCase {
  int64_t rows, table_rows, dim;
  DType index_dtype, table_dtype, out_dtype;
  int64_t pad;
};

void GatherCaseRun(Context& ctx, const GatherCase& c, bool embedding) {
  Buf& indices = ctx.Make("indices", c.index_dtype, {c.rows}, 0, 1, 2);
  std::mt19937 rng(ctx.NextSeed());
  std::vector<int64_t> ids(static_cast<size_t>(c.rows));
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint32_t>(c.table_rows));
  if (c.rows >= 3) {  // out of range on both sides, and a repeated id
    ids[0] = -1;
    ids[static_cast<size_t>(c.rows - 1)] = c.table_rows;
    ids[1] = ids[2];
  }
  for (int64_t t = 0; t < c.rows; ++t)
    indices.Set(t, static_cast<double>(ids[static_cast<size_t>(t)]));
  ctx.Upload(indices);
  Buf& table = ctx.Make("table", c.table_dtype, {c.table_rows, c.dim}, 2 * c.pad, c.pad);
  ctx.Randomize(table);
  Buf& out = ctx.Output("out", c.out_dtype, {c.rows, c.dim}, c.pad, c.pad, 2 * c.pad);
  ctx.RunOp({&out}, [&](Stream& s) {
    return embedding ? Embedding(s, indices.t, table.t, out.t)
                     : GatherRows(s, indices.t, table.t, out.t);
  });
  const std::vector<double> tv = table.Values();
  std::vector<double> want;
  for (int64_t t = 0; t < c.rows; ++t) {
    const int64_t id = ids[static_cast<size_t>(t)];
    const bool in_range = id >= 0 && id < c.table_rows;
    for (int64_t i = 0; i < c.dim; ++i) {
      // Out of range: a row of zeros, never a read out of bounds.
      want.push_back(in_range ? RoundTo(c.out_dtype, tv[static_cast<size_t>(id * c.dim + i)])
                              : 0.0);
    }
  }
  ctx.ExpectClose(out, want, Tolerance::Exact());
}

// ---- ApplyRope ---------------------------------------------------------------------------

struct RopeCase {
  int64_t tokens, heads, dr;
  bool yarn;
};

void RopeCaseRun(Context& ctx, const RopeCase& c) {
  RopeParams params;
  params.rotary_dim = static_cast<int>(c.dr);
  params.yarn = c.yarn;
  params.factor = 40.0;
  params.mscale = 0.707;
  params.mscale_all_dim = 0.707;
  const int64_t positions = 300;
  // The table is made on the host (FillRopeTable) and uploaded.
  Buf& table = ctx.Make("table", kF32, {positions, c.dr});
  std::vector<float> host_table(static_cast<size_t>(positions * c.dr));
  ASSERT_OK(FillRopeTable(params, Tensor(host_table.data(), kF32, {positions, c.dr})));
  for (int64_t i = 0; i < positions * c.dr; ++i) table.Set(i, host_table[static_cast<size_t>(i)]);
  ctx.Upload(table);
  // q_pe: the rope part of q [T, H, dn + dr]; k_pe: the rope part of the
  // latent row [T, Rkv + dr]: strided views, as in MLA.
  const int64_t dn = 24, rkv = 40;
  Buf& q = ctx.MakeStrided("q_pe", kF32, {c.tokens, c.heads, c.dr},
                           {c.heads * (dn + c.dr), dn + c.dr, 1}, dn);
  Buf& k = ctx.MakeStrided("k_pe", kF32, {c.tokens, c.dr}, {rkv + c.dr, 1}, rkv);
  ctx.Randomize(q, -2.0, 2.0);
  ctx.Randomize(k, -2.0, 2.0);
  Buf& pos = ctx.MakeStrided("positions", DType::kI32, {c.tokens}, {3}, 2);
  std::mt19937 rng(ctx.NextSeed());
  std::vector<int32_t> p(static_cast<size_t>(c.tokens));
  for (int64_t t = 0; t < c.tokens; ++t) {
    p[static_cast<size_t>(t)] = static_cast<int32_t>(rng() % positions);
    // Out of range on both sides: the row is left as it is.
    if (t % 5 == 2) p[static_cast<size_t>(t)] = (t % 2) ? -1 : static_cast<int32_t>(positions + t);
    pos.Set(t, p[static_cast<size_t>(t)]);
  }
  ctx.Upload(pos);
  const std::vector<double> q0 = q.Values(), k0 = k.Values();
  ctx.RunOp({&q, &k}, [&](Stream& s) { return ApplyRope(s, pos.t, table.t, q.t, k.t); }, true,
            {&q, &k});
  const std::vector<float> inv = ComputeInvFreq(params);
  const double scale = RopeCosSinScale(params);
  auto rotate = [&](std::vector<double>& x, size_t base, int32_t position) {
    if (position < 0 || position >= positions) return;
    for (int64_t i = 0; i < c.dr / 2; ++i) {
      // The angle as the kernels take it: f32(p) * inv_freq[i], in f32.
      const double angle =
          static_cast<float>(static_cast<float>(position) * inv[static_cast<size_t>(i)]);
      const double cs = std::cos(angle) * scale, sn = std::sin(angle) * scale;
      const double x0 = x[base + 2 * i], x1 = x[base + 2 * i + 1];
      x[base + 2 * i] = x0 * cs - x1 * sn;
      x[base + 2 * i + 1] = x0 * sn + x1 * cs;
    }
  };
  std::vector<double> q_want = q0, k_want = k0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < c.heads; ++h) {
      rotate(q_want, static_cast<size_t>((t * c.heads + h) * c.dr), p[static_cast<size_t>(t)]);
    }
    rotate(k_want, static_cast<size_t>(t * c.dr), p[static_cast<size_t>(t)]);
  }
  ctx.ExpectClose(q, q_want, Tolerance::F32(1e-6));
  ctx.ExpectClose(k, k_want, Tolerance::F32(1e-6));
  // Rows at positions out of range: bit for bit what they were.
  const std::vector<double> q_got = ctx.DeviceValues(q), k_got = ctx.DeviceValues(k);
  for (int64_t t = 0; t < c.tokens; ++t) {
    if (p[static_cast<size_t>(t)] >= 0 && p[static_cast<size_t>(t)] < positions) continue;
    for (int64_t i = 0; i < c.heads * c.dr; ++i) {
      const size_t at = static_cast<size_t>(t * c.heads * c.dr + i);
      ASSERT_EQ(q_got[at], q0[at]) << "token " << t;
    }
    for (int64_t i = 0; i < c.dr; ++i) {
      const size_t at = static_cast<size_t>(t * c.dr + i);
      ASSERT_EQ(k_got[at], k0[at]) << "token " << t;
    }
  }
}

// ---- Elementwise -------------------------------------------------------------------------

void ElementwiseCase(Context& ctx, DType dtype, int64_t n) {
  Buf& a = ctx.Make("a", dtype, {n});
  Buf& b = ctx.Make("b", dtype, {n});
  ctx.Randomize(a);
  ctx.Randomize(b);
  const std::vector<double> av = a.Values(), bv = b.Values();
  Buf& sum = ctx.Output("a + b", dtype, {n});
  ctx.RunOp({&sum}, [&](Stream& s) { return Add(s, a.t, b.t, sum.t); });
  Buf& scaled = ctx.Output("-0.37 a", dtype, {n});
  ctx.RunOp({&scaled}, [&](Stream& s) { return Scale(s, a.t, -0.37f, scaled.t); });
  Buf& filled = ctx.Output("fill 2.75", dtype, {n});
  ctx.RunOp({&filled}, [&](Stream& s) { return Fill(s, filled.t, 2.75); });
  std::vector<double> want_sum, want_scaled,
      want_fill(static_cast<size_t>(n), RoundTo(dtype, 2.75));
  for (size_t i = 0; i < av.size(); ++i) {
    // f32 arithmetic rounded once: exact against the same in double.
    want_sum.push_back(RoundTo(dtype, static_cast<float>(av[i]) + static_cast<float>(bv[i])));
    want_scaled.push_back(RoundTo(dtype, -0.37f * static_cast<float>(av[i])));
  }
  ctx.ExpectClose(sum, want_sum, Tolerance::Exact());
  ctx.ExpectClose(scaled, want_scaled, Tolerance::Exact());
  ctx.ExpectClose(filled, want_fill, Tolerance::Exact());
}

void FillIntsCase(Context& ctx, DType dtype) {
  Buf& t = ctx.Output("t", dtype, {37});
  ctx.RunOp({&t}, [&](Stream& s) { return Fill(s, t.t, -3.0); });
  ctx.ExpectInts(t, std::vector<int64_t>(37, -3));
}

// Copy of strided rows: exactly the source, nothing written between rows.
void CopyCase(Context& ctx, DType dtype, int64_t rows, int64_t cols, int64_t src_pad,
              int64_t dst_pad) {
  Buf& src = ctx.Make("src", dtype, {rows, cols}, src_pad, 2);
  ctx.Randomize(src);
  Buf& dst = ctx.Output("dst", dtype, {rows, cols}, dst_pad, 3, 1);
  ctx.RunOp({&dst}, [&](Stream& s) { return Copy(s, src.t, dst.t); });
  ctx.ExpectClose(dst, src.Values(), Tolerance::Exact());
}

}  // namespace

void AddBasicCases(CaseList& cases) {
  for (const NormCase& c : NormCases()) {
    cases.Add("rms_norm", Name(c), [c](Context& ctx) { RmsNormCase(ctx, c); });
    cases.Add("add_rms_norm", Name(c), [c](Context& ctx) { AddRmsNormCase(ctx, c); });
  }
  const DType act[][2] = {{kF32, kF32}, {kBF16, kBF16}, {kBF16, kF32}, {kF32, kBF16}};
  int i = 0;
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t inter : {7, 64, 129}) {
      for (const auto& d : act) {
        const int64_t pad = i++ % 3;
        cases.Add("silu_and_mul",
                  absl::StrCat(rows, "x", inter, " ", Str(d[0]), "->", Str(d[1]), " pad ", pad),
                  [=](Context& ctx) { SiluAndMulCase(ctx, rows, inter, d[0], d[1], pad); });
      }
    }
  }
  cases.Add("silu_and_mul", "300x1408 bf16->bf16",
            [](Context& ctx) { SiluAndMulCase(ctx, 300, 1408, kBF16, kBF16, 0); });
  const GatherCase gathers[] = {
      {1, 5, 7, DType::kI32, kF32, kF32, 0},      {3, 11, 64, DType::kI64, kBF16, kBF16, 3},
      {17, 33, 129, DType::kI32, kBF16, kF32, 1}, {17, 9, 7, DType::kI64, kF32, kBF16, 2},
      {3, 4, 129, DType::kI32, kF16, kF32, 0},    {40, 1000, 2048, DType::kI32, kBF16, kF32, 0},
  };
  for (const GatherCase& c : gathers) {
    const std::string name =
        absl::StrCat(c.rows, " of ", c.table_rows, "x", c.dim, " ", Str(c.index_dtype), " ",
                     Str(c.table_dtype), "->", Str(c.out_dtype), " pad ", c.pad);
    cases.Add("gather_rows", name, [c](Context& ctx) { GatherCaseRun(ctx, c, false); });
    cases.Add("embedding", name, [c](Context& ctx) { GatherCaseRun(ctx, c, true); });
  }
  const RopeCase ropes[] = {{1, 1, 2, false},
                            {5, 3, 16, true},
                            {33, 16, 64, true},
                            {7, 128, 64, true},
                            {200, 2, 32, false}};
  for (const RopeCase& c : ropes) {
    cases.Add(
        "apply_rope",
        absl::StrCat(c.tokens, " tokens ", c.heads, " heads dr ", c.dr, c.yarn ? " yarn" : ""),
        [c](Context& ctx) { RopeCaseRun(ctx, c); });
  }
  for (DType dtype : {kF32, kBF16, kF16}) {
    for (int64_t n : {1, 1000, 4099}) {
      cases.Add("elementwise", absl::StrCat(Str(dtype), " n ", n),
                [=](Context& ctx) { ElementwiseCase(ctx, dtype, n); });
    }
    cases.Add("copy", absl::StrCat(Str(dtype), " 5x7 strided"),
              [=](Context& ctx) { CopyCase(ctx, dtype, 5, 7, 2, 5); });
  }
  cases.Add("copy", "i32 1x300", [](Context& ctx) { CopyCase(ctx, DType::kI32, 1, 300, 0, 0); });
  cases.Add("copy", "i64 33x3 strided",
            [](Context& ctx) { CopyCase(ctx, DType::kI64, 33, 3, 1, 4); });
  for (DType dtype : {DType::kI32, DType::kI64}) {
    cases.Add("fill", Str(dtype), [=](Context& ctx) { FillIntsCase(ctx, dtype); });
  }
}

}  // namespace mlag::ops_test
