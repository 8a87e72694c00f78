// CUDA kernels for kernels/linear.h. Linear and HeadMatmul are cuBLASLt
// matmuls (kernels/cuda_blas.cc); the only kernel here zeroes the output of
// an empty reduction.
#include "kernels/cuda/linear.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    ZeroF32Kernel(float* p, int64_t n0, int64_t n1, int64_t n2, int64_t stride0, int64_t stride1) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t n = n0 * n1 * n2;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i2 = idx % n2;
    const int64_t i01 = idx / n2;
    const int64_t i1 = i01 % n1;
    const int64_t i0 = i01 / n1;
    p[i0 * stride0 + i1 * stride1 + i2] = 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads)
    F32ToBf16RowsKernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t n = rows * cols;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[idx] = F32ToBf16(x[(idx / cols) * ld + idx % cols]);
  }
}

}  // namespace

cudaError_t LaunchF32ToBf16Rows(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                uint16_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  int64_t blocks = (rows * cols + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  MLAG_LAUNCH_PDL(F32ToBf16RowsKernel, static_cast<unsigned>(blocks), kThreads, 0, stream)
  (x, rows, cols, ld, out);
  return cudaGetLastError();
}

cudaError_t LaunchZeroF32(float* p, int64_t n0, int64_t n1, int64_t n2, int64_t stride0,
                          int64_t stride1, cudaStream_t stream) {
  if (n0 <= 0 || n1 <= 0 || n2 <= 0) return cudaSuccess;
  int64_t blocks = (n0 * n1 * n2 + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  MLAG_LAUNCH_PDL(ZeroF32Kernel, static_cast<unsigned>(blocks), kThreads, 0, stream)
  (p, n0, n1, n2, stride0, stride1);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
