#include "kernels/cuda/elementwise.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b < 1 ? 1 : b) : 65535 * 8);
}

__global__ void FillKernel(void* data, DType dtype, int64_t n, double value) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (dtype == DType::kI32) {
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(value);
    } else if (dtype == DType::kI64) {
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(value);
    } else {
      StoreFromF32(dtype, data, i, static_cast<float>(value));
    }
  }
}

__global__ void ScaleKernel(const void* x, DType x_dtype, float alpha, void* y, DType y_dtype,
                            int64_t n) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreFromF32(y_dtype, y, i, alpha * LoadAsF32(x_dtype, x, i));
  }
}

__global__ void AddKernel(const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                          DType out_dtype, int64_t n) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreFromF32(out_dtype, out, i, LoadAsF32(a_dtype, a, i) + LoadAsF32(b_dtype, b, i));
  }
}

}  // namespace

cudaError_t LaunchFill(void* data, DType dtype, int64_t n, double value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MLAG_LAUNCH_PDL(FillKernel, Blocks(n), kThreads, 0, stream)(data, dtype, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchScale(const void* x, DType x_dtype, float alpha, void* y, DType y_dtype,
                        int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MLAG_LAUNCH_PDL(ScaleKernel, Blocks(n), kThreads, 0, stream)(x, x_dtype, alpha, y, y_dtype, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                      DType out_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MLAG_LAUNCH_PDL(AddKernel, Blocks(n), kThreads, 0, stream)
  (a, a_dtype, b, b_dtype, out, out_dtype, n);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
