// The host GEMM: y = x w^T, with w in f32, bf16 or block-scaled fp8 (e4m3),
// converted to f32 in registers. Every projection, expert and per-head
// matmul of the host backend runs through it.
//
// Two storage forms of w, each with its own fixed summation order:
//   - Packed (the host's model weights, PackGemmRowGroups): groups of
//     kGemmGroupRows rows stored element-major, so the kernel multiplies one
//     x value by kLanes weights of different rows at once (an outer
//     product). Every y[m][n] is one multiply-add chain over p = 0, 1, ...,
//     k - 1 in order (fused where the ISA has FMA): no partial sums, no
//     reduction, and one order for every ISA with FMA.
//   - Row-major: kLanes partial sums striped over k, a fixed lane reduction,
//     then the scalar k tail; the order depends on k and the vector width.
// Neither order depends on the number of rows, which other rows are present,
// how n is split over threads, or the weight dtype. So a request's result
// does not depend on the batch it runs in, and an fp8 or bf16 weight gives
// the bits of its dequantized f32 value stored the same way
// (runtime/core/fp8_blocks.h). A weight is always stored one way (the
// loader packs whole groups; the rows after the last whole group stay
// row-major), so each output's order is fixed.
//
// Memory traffic: w is read from memory once per panel of kGemmPanelRows rows
// of x (packed fp8: four times that; a slice of w is reused from L1 for
// every block of rows, and the next slice is fetched meanwhile; an fp8 slice
// is converted to f32 once for all the blocks), so a decode step streams its
// weights once at any batch up to the panel, in one sequential stream per
// packed group.
//
// Conversion: the packed layout interleaves rows so that one vector load
// converts with plain shifts and masks (no shuffles): a bf16 is the top half
// of an f32, so of 32-bit words holding two bf16 weights, `word << 16` and
// `word & 0xffff0000` are two vectors of f32 weights; an e4m3 byte moved to
// an f32's top bits and masked is its value times 2^-120.
#pragma once

#include <cstdint>

#include "runtime/core/scalar_types.h"

namespace mlag::host {

// Rows of x that share one pass over w. A decode batch up to this size
// streams every weight once.
inline constexpr int64_t kGemmPanelRows = 64;

// The packed layout of an [n, k] weight: rows [0, n / kGemmGroupRows *
// kGemmGroupRows) in groups of kGemmGroupRows (64) rows, each group's 64 k
// elements in place of its rows; the remaining rows row-major after them.
// Within a group, element p of the 64 rows forms slab p (64 elements, at
// group + 64 p), in which row r sits at position
//   f32:  r;
//   bf16: 2 (r % 16 + 16 (r / 32)) + (r % 32) / 16  (32-bit word r % 16 +
//         16 (r / 32) holds row r % 16 + 32 (r / 32) in its low half and
//         that row + 16 in its high half);
//   fp8:  4 (r % 16) + r / 16  (byte j of word w holds row w + 16 j).
// GemmSlabPosition gives it.
inline constexpr int64_t kGemmGroupRows = 64;

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
  // kGemmGroupRows; ld must then be k); the rest row-major. The fp8 scales
  // stay per row either way.
  int64_t packed_rows = 0;

  // The same weights from row `r` on. In the packed rows, r must be a
  // multiple of kGemmGroupRows.
  GemmWeights FromRow(int64_t r) const;
};

// Where row r (< kGemmGroupRows) of a packed group sits within each slab.
int64_t GemmSlabPosition(DType dtype, int64_t r);

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
// `prefetch`, when given, is memory the caller reads next (attention's next
// key tile): its prefetch_bytes are requested into L2 a cache line at a time
// over the work, so they arrive while this call computes. A hint only: the
// result does not depend on it.
void GemmNNAccumulate(int64_t rows, int64_t n, int64_t k, const float* x, int64_t ldx,
                      const float* const* w_rows, float* y, int64_t ldy,
                      const void* prefetch = nullptr, int64_t prefetch_bytes = 0);

// The arithmetic ceiling of the kernels above: `steps` steps of a dozen
// independent multiply-add chains, one vector each, in registers (no memory
// traffic), on the variant GemmNT runs. Returns the multiply-adds done
// (lanes counted; a multiply and an add on SSE2). Timed on every host thread
// at once, it is the host's peak multiply-add rate, which mlag bench
// measures decode's arithmetic against.
int64_t GemmPeakProbe(int64_t steps);

// Which variant GemmNT runs on this CPU: "avx512", "avx2" or "sse2", the
// widest the CPU has, or at most MLAG_HOST_ISA ("avx2" or "sse2") when that
// is set (for tests of the narrower variants).
const char* GemmIsa();

}  // namespace mlag::host
