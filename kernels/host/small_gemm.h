// y = x w^T for a few rows of x, streaming w once.
//
// A decode step multiplies a handful of activation rows (the batch, or the
// tokens routed to one expert) by large weight matrices. sgemm first packs
// all of w, which at a few rows costs more memory traffic than the product
// itself; sgemv streams w once per row. This kernel streams each row of w
// once for all the rows of x, which stay in cache, so a step reads its
// weights once at any batch size up to kSmallGemmMaxRows.
#pragma once

#include <cstdint>

namespace mlag::host {

// Measured on one AVX-512 core against single-threaded OpenBLAS (decode
// shapes 2816 x 2048 to 10944 x 2048): 2.1-2.9x faster at 3-4 rows, 1.2-1.7x
// at 8-16, even at about 28, slower beyond (sgemm's blocking wins there).
inline constexpr int64_t kSmallGemmMaxRows = 24;

// y[m][n] = sum_k x[m][k] * w[n][k] for m < rows (<= kSmallGemmMaxRows),
// n < n_out; row strides ldx, ldw, ldy (elements). Single-threaded: callers
// split n_out. Vectorised for AVX-512, AVX2 + FMA or SSE2, chosen at run
// time (the build targets baseline x86-64). Every y[m][n] is summed in one
// fixed order (vector lanes over k, a fixed lane reduction, then the k tail)
// that does not depend on rows, n_out, how n_out is split or which other
// rows are present, so results do not depend on the batch a row is in.
void SmallRowsGemmNT(int64_t rows, int64_t n_out, int64_t k, const float* x, int64_t ldx,
                     const float* w, int64_t ldw, float* y, int64_t ldy);

// Which variant SmallRowsGemmNT runs on this CPU: "avx512", "avx2" or "sse2".
const char* SmallGemmIsa();

}  // namespace mlag::host
