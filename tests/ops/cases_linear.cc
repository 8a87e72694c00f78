// Cases of Linear (y = x W^T) and HeadMatmul (the per-head matmuls of MLA
// weight absorption), against products summed in double. f32 throughout:
// within 1e-5 normwise (their rounding error is ~1e-7 at these sizes).
//
// Row counts cover the host GEMM's row blocks and panels and the CUDA
// cuBLASLt path; x and y are column slices of wider buffers in most cases.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "kernels/linear.h"
#include "mlag_config.h"
#include "runtime/core/fp8_blocks.h"
#include "tests/ops/harness.h"
#include "tests/status_matchers.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_blas.h"
#endif

namespace mlag::ops_test {
namespace {

// y = x W^T in double: x [rows, in], W [out, in].
std::vector<double> RefLinear(const std::vector<double>& xv, const std::vector<double>& wv,
                              int64_t rows, int64_t in, int64_t out) {
  std::vector<double> want;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (int64_t k = 0; k < in; ++k)
        acc += xv[static_cast<size_t>(t * in + k)] * wv[static_cast<size_t>(o * in + k)];
      want.push_back(acc);
    }
  }
  return want;
}

// `pack`: the weight as the model holds it, PackForLinear (on the host,
// packed in the GEMM's row groups; on CUDA, unchanged).
void LinearCase(Context& ctx, int64_t rows, int64_t in, int64_t out, int64_t x_pad, int64_t y_pad,
                bool pack) {
  Buf& x = ctx.Make("x", DType::kF32, {rows, in}, x_pad + 1, x_pad);
  ctx.Randomize(x);
  Buf& w = ctx.Make("weight", DType::kF32, {out, in});
  ctx.Randomize(w);
  const std::vector<double> wv = w.Values();
  LinearWeight weight(w.t);
  if (pack) {
    ASSERT_OK(PackForLinear(ctx.stream().device(), weight));
  }
  Buf& y = ctx.Output("y", DType::kF32, {rows, out}, 2 * y_pad, y_pad);
  ctx.RunOp({&y}, [&](Stream& s) { return Linear(s, x.t, weight, y.t); });
  ctx.ExpectClose(y, RefLinear(x.Values(), wv, rows, in, out), Tolerance{});
}

// x as CUDA's FP8 GEMM sees it: each row quantized per 128-column block
// (QuantizeFp8Blocks on one row: scale = amax / 448), each value the e4m3
// value times its scale, exactly (in double).
std::vector<double> QuantizedRows(const std::vector<double>& xv, int64_t rows, int64_t in) {
  std::vector<double> out(xv.size());
  std::vector<float> row(static_cast<size_t>(in));
  std::vector<uint8_t> q(static_cast<size_t>(in));
  std::vector<float> s(static_cast<size_t>(Fp8Blocks(in)));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t k = 0; k < in; ++k)
      row[k] = static_cast<float>(xv[static_cast<size_t>(t * in + k)]);
    QuantizeFp8Blocks(row.data(), 1, in, q.data(), s.data());
    for (int64_t k = 0; k < in; ++k) {
      out[static_cast<size_t>(t * in + k)] =
          static_cast<double>(F8E4M3ToF32(q[k])) * static_cast<double>(s[k / kFp8BlockSize]);
    }
  }
  return out;
}

// The fp8 GEMM's reference: y from the quantized x (exact) and the weights'
// values `wv`, each element with TensorCoreDotBound of its products.
BoundedRef RefFp8Linear(const std::vector<double>& xq, const std::vector<double>& wv, int64_t rows,
                        int64_t in, int64_t out) {
  BoundedRef ref{RefLinear(xq, wv, rows, in, out), {}};
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double abs_sum = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        abs_sum +=
            std::abs(xq[static_cast<size_t>(t * in + k)] * wv[static_cast<size_t>(o * in + k)]);
      }
      ref.bound.push_back(TensorCoreDotBound(DType::kF8E4M3, in, abs_sum));
    }
  }
  return ref;
}

// bf16 and fp8 weights (fp8: e4m3 values with per-row 128-column block
// scales), against the product of x and the weights' f32 values summed in
// double. The host is as exact as f32 (it converts weights in registers).
// CUDA rounds x to bf16 for a bf16 matmul (about 2^-9 relative); for fp8 it
// quantizes x to e4m3 per row and 128-column block, and is checked against
// that quantized x exactly within the tensor cores' documented accumulation
// (TensorCoreDotBound, per element), and against the unquantized x within
// e4m3's rounding (2^-4 relative per element). `positive`: x and the weights
// drawn positive (no cancellation, so the bound is tight), and a reference
// with two rows' block-0 scales exchanged must fall outside the bound: the
// check catches a misplaced scale. `cublaslt`: a shape meant for
// cuBLASLt's block-scaled FP8 (in / 128 blocks a multiple of 4), which must
// take that path on an sm_90 GPU (the emulation's default).
void LinearWeightDtypeCase(Context& ctx, DType dtype, int64_t rows, int64_t in, int64_t out,
                           bool pack, bool positive = false, bool cublaslt = false) {
  if (dtype == DType::kF8E4M3) {
    ASSERT_OK_AND_ASSIGN(const bool fp8, Fp8LinearSupported(ctx.stream().device()));
    if (!fp8) GTEST_SKIP() << "no fp8 Linear on this GPU (the loader keeps bf16 there)";
  }
  Buf& x = ctx.Make("x", DType::kF32, {rows, in}, 3, 1);
  ctx.Randomize(x, positive ? 0.1 : -1.0, 1.0);
  Buf& w = ctx.Make("weight", dtype, {out, in});
  ctx.Randomize(w, positive ? 0.1 : -3.0, 3.0);
  std::vector<double> wv = w.Values();
  LinearWeight weight(w.t);
  std::vector<double> sv;
  if (dtype == DType::kF8E4M3) {
    Buf& scales = ctx.Make("scales", DType::kF32, {out, Fp8Blocks(in)});
    ctx.Randomize(scales, 0.01, 2.0);
    if (cublaslt) {
      // A checkpoint's scales: one per 128 x 128 block, repeated on its
      // rows, and the same blocks as block_scales (padding zero).
      Buf& blocks = ctx.Make("block_scales", DType::kF32, {Fp8Blocks(out), BlockScaleLd(in)});
      const std::vector<double> row = scales.Values();
      for (int64_t br = 0; br < Fp8Blocks(out); ++br) {
        for (int64_t kb = 0; kb < BlockScaleLd(in); ++kb) {
          const double v =
              kb < Fp8Blocks(in) ? row[static_cast<size_t>(br * 128 * Fp8Blocks(in) + kb)] : 0.0;
          blocks.Set(br * BlockScaleLd(in) + kb, v);
          for (int64_t r = br * 128; r < std::min(out, br * 128 + 128) && kb < Fp8Blocks(in); ++r) {
            scales.Set(r * Fp8Blocks(in) + kb, v);
          }
        }
      }
      ctx.Upload(blocks);
      ctx.Upload(scales);
      weight.block_scales = blocks.t;
    }
    sv = scales.Values();
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < in; ++k) {
        double& v = wv[static_cast<size_t>(o * in + k)];
        v = Fp8Dequantize(F32ToF8E4M3(static_cast<float>(v)),
                          static_cast<float>(sv[static_cast<size_t>(o * Fp8Blocks(in) + k / 128)]));
      }
    }
    weight.scales = scales.t;
  }
  if (pack) {
    ASSERT_OK(PackForLinear(ctx.stream().device(), weight));
  }
  Buf& y = ctx.Output("y", DType::kF32, {rows, out}, 2, 1);
#if MLAG_HAVE_CUDA
  const size_t lt_before = ctx.is_cuda() ? cuda_blas::CublasLtFp8Matmuls(ctx.stream()) : 0;
#endif
  ctx.RunOp({&y}, [&](Stream& s) { return Linear(s, x.t, weight, y.t); });
#if MLAG_HAVE_CUDA
  if (ctx.is_cuda() && cublaslt) {
    int major = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                     ctx.stream().device().index()),
              cudaSuccess);
    if (major == 9) {
      EXPECT_GT(cuda_blas::CublasLtFp8Matmuls(ctx.stream()), lt_before)
          << "an sm_90 GPU took the tensor-core GEMM, not cuBLASLt's block scaling";
    }
  }
#endif
  if (ctx.is_cuda() && dtype == DType::kF8E4M3) {
    const std::vector<double> xq = QuantizedRows(x.Values(), rows, in);
    const std::vector<double> got = ctx.DeviceValues(y);
    std::string what;
    EXPECT_EQ(OutsideBound(got, RefFp8Linear(xq, wv, rows, in, out), &what), 0)
        << "outside the tensor-core bound:" << what;
    ctx.ExpectClose(y, RefLinear(x.Values(), wv, rows, in, out), Tolerance::F32(0.1));
    // Two rows (with block scales: two 128-row blocks) exchange their
    // block-0 scales in the reference.
    const int64_t r1 = cublaslt ? kFp8BlockSize : 1;
    if (positive && out >= r1 + 1) {
      std::vector<double> swapped = wv;
      const int64_t blocks = Fp8Blocks(in);
      const double s0 = sv[0], s1 = sv[static_cast<size_t>(r1 * blocks)];
      for (int64_t r = 0; r < std::min(r1, out - r1); ++r) {
        for (int64_t k = 0; k < std::min<int64_t>(in, kFp8BlockSize); ++k) {
          swapped[static_cast<size_t>(r * in + k)] *= s1 / s0;
          swapped[static_cast<size_t>((r1 + r) * in + k)] *= s0 / s1;
        }
      }
      EXPECT_GT(OutsideBound(got, RefFp8Linear(xq, swapped, rows, in, out), nullptr), 0)
          << "a reference with two rows' block scales exchanged holds the output too: the "
             "bound cannot catch a misplaced scale";
    }
    return;
  }
  ctx.ExpectClose(y, RefLinear(x.Values(), wv, rows, in, out),
                  ctx.is_cuda() ? Tolerance::F32(1e-2) : Tolerance{});
}

struct HeadCase {
  int64_t rows, heads, k, n;
  int64_t x_pad;    // extra columns around each head's K values (q_nope inside q)
  int64_t out_pad;  // extra columns after each head's N values
  bool head_major;  // x stored [H, T, K] and viewed as [T, H, K]
};

void HeadMatmulCase(Context& ctx, const HeadCase& c, bool transpose_w, bool pack) {
  const int64_t row = c.k + c.x_pad + 1;
  Buf& x = c.head_major ? ctx.MakeStrided("x", DType::kF32, {c.rows, c.heads, c.k},
                                          {row, c.rows * row, 1}, c.x_pad, 1)
                        : ctx.MakeStrided("x", DType::kF32, {c.rows, c.heads, c.k},
                                          {c.heads * row, row, 1}, c.x_pad, 1);
  ctx.Randomize(x);
  Buf& w = transpose_w ? ctx.Make("weight", DType::kF32, {c.heads, c.n, c.k})
                       : ctx.Make("weight", DType::kF32, {c.heads, c.k, c.n});
  ctx.Randomize(w);
  const std::vector<double> xv = x.Values(), wv = w.Values();  // x as [T, H, K]
  LinearWeight weight(w.t);
  if (pack) {
    ASSERT_OK(PackForLinear(ctx.stream().device(), weight));
  }
  Buf& out = ctx.Output("out", DType::kF32, {c.rows, c.heads, c.n}, c.out_pad);
  ctx.RunOp({&out}, [&](Stream& s) { return HeadMatmul(s, x.t, weight, transpose_w, out.t); });
  std::vector<double> want;
  for (int64_t t = 0; t < c.rows; ++t) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0.0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double wval = transpose_w ? wv[static_cast<size_t>((h * c.n + j) * c.k + kk)]
                                          : wv[static_cast<size_t>((h * c.k + kk) * c.n + j)];
          acc += xv[static_cast<size_t>((t * c.heads + h) * c.k + kk)] * wval;
        }
        want.push_back(acc);
      }
    }
  }
  ctx.ExpectClose(out, want, Tolerance{});
}

}  // namespace

void AddLinearCases(CaseList& cases) {
  int i = 0;
  for (int64_t rows : {1, 2, 7, 17, 24, 25, 40, 64}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{7, 5}, {64, 33}, {129, 70}, {37, 53}}) {
      const int64_t x_pad = (i % 3 == 0) ? 0 : 2 + i % 3;
      const int64_t y_pad = (i % 2 == 0) ? 1 : 0;
      ++i;
      cases.Add("linear", absl::StrCat(rows, "x", in, " -> ", out, " pads ", x_pad, " ", y_pad),
                [=](Context& ctx) { LinearCase(ctx, rows, in, out, x_pad, y_pad, false); });
    }
  }
  // Packed weights: whole 64-row groups, then row-major rows after them.
  for (int64_t rows : {1, 6, 25, 64}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{129, 70}, {200, 130}, {33, 256}}) {
      cases.Add("linear", absl::StrCat(rows, "x", in, " -> ", out, " packed"),
                [=](Context& ctx) { LinearCase(ctx, rows, in, out, 1, 1, true); });
    }
  }
  cases.Add(
      "linear", "fp8 weights 5x300 -> 70 positive, exchanged scales outside the bound",
      [](Context& ctx) { LinearWeightDtypeCase(ctx, DType::kF8E4M3, 5, 300, 70, false, true); });
  // Long K and few outputs: the CUDA fp8 GEMM splits K (4 slices of 4 blocks,
  // the last short; 2 slices, rows not 16-byte aligned).
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{3, 2000, 70}, {5, 1100, 33}}) {
    cases.Add(
        "linear", absl::StrCat("fp8 weights ", rows, "x", in, " -> ", out, " split K"),
        [=](Context& ctx) { LinearWeightDtypeCase(ctx, DType::kF8E4M3, rows, in, out, false); });
  }
  // cuBLASLt's block-scaled FP8 on sm_90 (weights with block scales): odd
  // rows (VEC128's padded scale rows), K block counts not a multiple of 4
  // (BLK128x128's padding), partial 128-row weight blocks, and an
  // exchanged-scale case.
  cases.Add("linear",
            "fp8 weights 5x304 -> 257 cuBLASLt positive, exchanged scales outside the bound",
            [](Context& ctx) {
              LinearWeightDtypeCase(ctx, DType::kF8E4M3, 5, 304, 257, false, true, true);
            });
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 512, 130},
                               {3, 1040, 33},
                               {13, 1536, 5},
                               {33, 400, 257},
                               {70, 2048, 70},
                               {8, 16, 3}}) {
    cases.Add("linear", absl::StrCat("fp8 weights ", rows, "x", in, " -> ", out, " cuBLASLt"),
              [=](Context& ctx) {
                LinearWeightDtypeCase(ctx, DType::kF8E4M3, rows, in, out, false, false, true);
              });
  }
  // Rows: every row-tile height of the CUDA fp8 GEMM (8, 16, 32, 64).
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    for (int64_t rows : {1, 3, 8, 13, 20, 33, 70}) {
      for (auto [in, out] :
           {std::pair<int64_t, int64_t>{37, 5}, {300, 70}, {129, 33}, {256, 17}, {140, 130}}) {
        for (bool pack : {false, true}) {
          if (pack && out < 64) continue;
          cases.Add("linear",
                    absl::StrCat(DTypeName(dtype), " weights ", rows, "x", in, " -> ", out,
                                 pack ? " packed" : ""),
                    [=](Context& ctx) { LinearWeightDtypeCase(ctx, dtype, rows, in, out, pack); });
        }
      }
    }
  }
  const HeadCase heads[] = {
      {1, 1, 7, 9, 0, 0, false},     {1, 5, 32, 24, 3, 1, false},   {3, 2, 33, 65, 1, 0, true},
      {17, 5, 7, 129, 2, 2, false},  {17, 3, 129, 129, 0, 1, true}, {33, 3, 19, 24, 2, 3, false},
      {5, 4, 128, 512, 0, 0, false}, {7, 2, 512, 128, 1, 0, true},
  };
  for (const HeadCase& c : heads) {
    for (bool transpose_w : {false, true}) {
      // Packed per head (as the model's absorbed matrices): W^T only.
      for (bool pack : {false, true}) {
        if (pack && !transpose_w) continue;
        cases.Add("head_matmul",
                  absl::StrCat(c.rows, " tokens ", c.heads, " heads ", c.k, "x", c.n, " pads ",
                               c.x_pad, " ", c.out_pad, c.head_major ? " head-major" : "",
                               transpose_w ? " W^T" : " W", pack ? " packed" : ""),
                  [=](Context& ctx) { HeadMatmulCase(ctx, c, transpose_w, pack); });
      }
    }
  }
}

}  // namespace mlag::ops_test
