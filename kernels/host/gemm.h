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
//
// Row groups: the kernel reads kGemmGroupRows rows of w side by side. Stored
// row-major, that is kGemmGroupRows memory streams a row apart, which the
// hardware prefetchers follow far worse than one (on a 2-core AVX-512 host,
// a one-row bf16 product over expert-sized matrices read at about 0.73 of a
// plain read's bandwidth). Weights packed with PackGemmRowGroups (the host's
// model weights are) interleave each group's rows in kGemmGroupChunk-element
// pieces, so the kernel reads one sequential stream (0.95 and more there).
// The layout changes where elements are read from, never the order of the
// sums: packed and row-major weights give the same bits.
#pragma once

#include <cstdint>

#include "runtime/core/scalar_types.h"

namespace mlag::host {

// Rows of x that share one pass over w. A decode batch up to this size
// streams every weight once.
inline constexpr int64_t kGemmPanelRows = 64;

// The packed layout of an [n, k] weight: rows [0, n / kGemmGroupRows *
// kGemmGroupRows) in groups of kGemmGroupRows rows, each group's 4k elements
// in place of its rows; the remaining rows row-major after them. Within a
// group, k is cut into pieces of kGemmGroupChunk elements (the last piece
// k % kGemmGroupChunk wide if not whole), and piece c holds that piece of row
// 0, then of row 1, and so on: element (r, p) of the group is at
//   (p - p % C) * G + r * width(c) + p % C,   C = kGemmGroupChunk,
// G = kGemmGroupRows, width(c) = min(C, k - p + p % C).
inline constexpr int64_t kGemmGroupRows = 4;
inline constexpr int64_t kGemmGroupChunk = 16;

// The weight operand: n rows of k elements.
struct GemmWeights {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32, kBF16 or kF8E4M3
  int64_t ld = 0;             // elements between consecutive rows
  // fp8 only: one scale per (row, 128-element block of k), row-major with
  // scales_ld floats between rows; each at most kFp8MaxScale.
  const float* scales = nullptr;
  int64_t scales_ld = 0;
  // Rows [0, packed_rows) are in the packed layout (a multiple of
  // kGemmGroupRows; ld must then be k); the rest row-major.
  int64_t packed_rows = 0;

  // The same weights from row `r` on. In the packed rows, r must be a
  // multiple of kGemmGroupRows.
  GemmWeights FromRow(int64_t r) const;
};

// Rearranges the [n, k] matrix at `data` (contiguous, elements of `dtype`:
// f32, bf16 or fp8) in place into the packed layout; returns its packed_rows.
// Splits the groups over the host threads.
int64_t PackGemmRowGroups(void* data, DType dtype, int64_t n, int64_t k);

// The inverse of PackGemmRowGroups (for tests and tools that read weights
// back as rows).
void UnpackGemmRowGroups(void* data, DType dtype, int64_t n, int64_t k);

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

// Which variant GemmNT runs on this CPU: "avx512", "avx2" or "sse2", the
// widest the CPU has, or at most MLAG_HOST_ISA ("avx2" or "sse2") when that
// is set (for tests of the narrower variants).
const char* GemmIsa();

}  // namespace mlag::host
