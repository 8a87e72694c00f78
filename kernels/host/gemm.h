// The host GEMM: y = x w^T, with w in f32, bf16 or block-scaled fp8 (e4m3),
// converted to f32 in registers. Every projection, expert and per-head
// matmul of the host backend runs through it.
//
// Batch invariance by construction: every y[m][n] is summed in one fixed
// order (kLanes partial sums striped over k, a fixed lane reduction, then the
// scalar k tail) that depends only on k and the CPU's vector width, never on
// the number of rows, which other rows are present, how n is split over
// threads, or the weight dtype. So a request's result does not depend on the
// batch it runs in, and an fp8 or bf16 weight gives the bits of its
// dequantized f32 value (runtime/core/fp8_blocks.h).
//
// Memory traffic: w is read from memory once per panel of kGemmPanelRows rows
// of x (each group of w rows is then reused from cache for every row block),
// so a decode step streams its weights once at any batch up to the panel.
#pragma once

#include <cstdint>

#include "runtime/core/scalar_types.h"

namespace mlag::host {

// Rows of x that share one pass over w. A decode batch up to this size
// streams every weight once.
inline constexpr int64_t kGemmPanelRows = 64;

// The weight operand: n rows of k elements.
struct GemmWeights {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32, kBF16 or kF8E4M3
  int64_t ld = 0;             // elements between consecutive rows
  // fp8 only: one scale per (row, 128-element block of k), row-major with
  // scales_ld floats between rows; each at most kFp8MaxScale.
  const float* scales = nullptr;
  int64_t scales_ld = 0;

  // The same weights from row `r` on.
  GemmWeights FromRow(int64_t r) const;
};

// y[m][n] = sum_p x[m][p] * w[n][p] for m < rows, n < n_out, p < k; row
// strides ldx and ldy (elements). Single-threaded: callers split n_out (or
// rows). Vectorised for AVX-512, AVX2 + FMA or SSE2, chosen at run time.
void GemmNT(int64_t rows, int64_t n_out, int64_t k, const float* x, int64_t ldx,
            const GemmWeights& w, float* y, int64_t ldy);

// y[m][c] += sum_p x[m][p] * w_rows[p][c] for m < rows, c < n, p < k: the
// rows of w given by pointer (attention's value rows, scattered over cache
// blocks). Each y element is one fused multiply-add chain over p in order
// (multiply then add on SSE2), whatever the row count or blocking.
// Single-threaded; same ISA choice as GemmNT.
void GemmNNAccumulate(int64_t rows, int64_t n, int64_t k, const float* x, int64_t ldx,
                      const float* const* w_rows, float* y, int64_t ldy);

// Which variant GemmNT runs on this CPU: "avx512", "avx2" or "sse2".
const char* GemmIsa();

}  // namespace mlag::host
