// CUDA helpers behind kernels/linear.h. The matmuls themselves run through
// cuBLASLt (kernels/cuda_blas.cc); these cover what cuBLASLt is not asked
// about: an empty reduction (k == 0), whose result is all zeros, and the bf16
// copy of x a bf16-weight matmul takes.
// CUDA and the standard library only.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Writes 0.0f to every element of the f32 view p[i0 * stride0 + i1 * stride1 + i2]
// for i0 < n0, i1 < n1, i2 < n2 (last dimension unit-stride).
cudaError_t LaunchZeroF32(float* p, int64_t n0, int64_t n1, int64_t n2, int64_t stride0,
                          int64_t stride1, cudaStream_t stream);

// out [rows, cols] (contiguous) = x [rows, cols] (row stride ld) rounded to
// bf16 (nearest even): the B operand of a bf16-weight Linear.
cudaError_t LaunchF32ToBf16Rows(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                uint16_t* out, cudaStream_t stream);

}  // namespace mlag::cuda
