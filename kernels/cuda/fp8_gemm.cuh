// The FP8 block-scaled GEMM of kernels/linear.h on CUDA (sm_89 and later):
// y = x W^T with W in e4m3 and one f32 scale per (row, 128-column block),
// x quantized per row and 128-column block the same way (scale = block amax
// / 448, as DeepSeek-V3 quantizes activations), products on e4m3 tensor
// cores (mma.sync m16n8k32) and the block scales applied per 128-wide K
// slice to an f32 accumulator:
//   y[t][f] = sum_kb sx[t][kb] * sw[f][kb] * (sum_{k in kb} qx[t][k] qw[f][k]).
// The GEMM is the routed experts' tensor-core kernel on one dense slot
// (kernels/cuda/tc_gemm.cuh: weights streamed through a cp.async ring,
// ldmatrix, 64 weight rows per CTA; design figures there).
// Older GPUs (and builds without an sm_89+ target) dequantize fp8 weights to
// bf16 at load instead (layers/weight_arena.cc): Fp8BlockGemmSupported.
// CUDA and the standard library only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

inline constexpr int64_t kFp8GemmBlockK = 128;  // the scale block along K

// Row pitch (bytes) of quantized activations with `cols` columns: cols
// rounded up to 16, the padding zero-filled.
inline int64_t Fp8QuantizedPitch(int64_t cols) { return (cols + 15) / 16 * 16; }

// Device bytes LaunchFp8BlockGemm's quantized activations take for
// [rows, cols]: the scales (f32 [rows, ceil(cols / 128)]) first, then the
// e4m3 rows at a 256-byte aligned offset.
size_t Fp8QuantizedBytes(int64_t rows, int64_t cols);

// Whether `device` runs the e4m3 mma and this build has code for it.
cudaError_t Fp8BlockGemmSupported(int device, bool* supported);

// qx [rows, Fp8QuantizedPitch(cols)] and sx [rows, ceil(cols / 128)] from x
// [rows, cols] (row stride ld): for each 128-column block of a row, s = amax
// / 448 (1 for an all-zero block) and q = e4m3(x / s), nearest even,
// saturating at 448. Bitwise QuantizeFp8Blocks (runtime/core/fp8_blocks.h)
// applied to each row.
cudaError_t LaunchQuantizeFp8Rows(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                  uint8_t* qx, float* sx, cudaStream_t stream);

// The same quantization with the scales laid out as cuBLASLt's
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F reads them for the B operand
// (rows are op(B)'s n): the scale of row r, block kb at sx[kb * sx_ld + r],
// sx_ld >= rows (cuBLASLt's is roundup(rows, 4)). The padding between rows
// is left as it was.
cudaError_t LaunchQuantizeFp8RowsVec128(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                        uint8_t* qx, float* sx, int64_t sx_ld, cudaStream_t stream);

// K splits of the GEMM for [rows, k] x [out, k]^T on a GPU of `sm_count` SMs:
// 1 when the output tiles (ceil(rows / tile rows) x ceil(out / 64)) give two
// CTAs per SM, else enough slices of K for that, each at least 4 K blocks
// (512 bytes of every weight row) and at most kFp8GemmMaxSplits. A decode
// step's narrow projections (kv_a_proj: 576 rows of 7168, 9 tiles) would
// otherwise stream their weights from a handful of SMs. Pure arithmetic.
inline constexpr int kFp8GemmMaxSplits = 16;
int Fp8GemmSplits(int64_t rows, int64_t out, int64_t k, int sm_count);

// Device bytes of the f32 partial sums for `splits` > 1 (0 for 1).
size_t Fp8GemmPartialBytes(int64_t rows, int64_t out, int splits);

// y [rows, out] (row stride ldy) = the product above, from LaunchQuantizeFp8Rows's
// qx and sx and the weights w [out, k] (e4m3, contiguous) with per-row scales
// sw [out, ceil(k / 128)]. With splits > 1, each K slice writes its partial
// sums to `partials` (Fp8GemmPartialBytes) and one more kernel adds them in
// slice order, so the bits depend on the split count, which depends on the
// shapes and the GPU only.
cudaError_t LaunchFp8BlockGemm(const uint8_t* qx, const float* sx, const uint8_t* w,
                               const float* sw, int64_t rows, int64_t out, int64_t k, float* y,
                               int64_t ldy, int splits, float* partials, cudaStream_t stream);

}  // namespace mlag::cuda
