// CUDA launchers behind kernels/elementwise.h. CUDA and the standard library
// only. Each enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// dtype codes follow mlag::DType's underlying values (0 f32, 1 bf16, 2 f16,
// 3 i32, 4 i64).
cudaError_t LaunchFill(void* data, int dtype, int64_t n, double value, cudaStream_t stream);
cudaError_t LaunchScale(const void* x, int x_dtype, float alpha, void* y, int y_dtype, int64_t n,
                        cudaStream_t stream);
cudaError_t LaunchAdd(const void* a, int a_dtype, const void* b, int b_dtype, void* out,
                      int out_dtype, int64_t n, cudaStream_t stream);

}  // namespace mlag::cuda
