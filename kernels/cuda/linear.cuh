// CUDA helper behind kernels/linear.h. The matmuls themselves run through
// cuBLASLt (kernels/cuda_blas.cc); this is the one case cuBLASLt is not asked
// about: an empty reduction (k == 0), whose result is all zeros.
// CUDA and the standard library only.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Writes 0.0f to every element of the f32 view p[i0 * stride0 + i1 * stride1 + i2]
// for i0 < n0, i1 < n1, i2 < n2 (last dimension unit-stride).
cudaError_t LaunchZeroF32(float* p, int64_t n0, int64_t n1, int64_t n2, int64_t stride0,
                          int64_t stride1, cudaStream_t stream);

}  // namespace mlag::cuda
