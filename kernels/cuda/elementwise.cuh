// CUDA launchers behind kernels/elementwise.h. CUDA and the standard library
// only. Each enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Fill takes f32, bf16, f16, i32 and i64; Scale and Add the floating dtypes.
cudaError_t LaunchFill(void* data, DType dtype, int64_t n, double value, cudaStream_t stream);
cudaError_t LaunchScale(const void* x, DType x_dtype, float alpha, void* y, DType y_dtype,
                        int64_t n, cudaStream_t stream);
cudaError_t LaunchAdd(const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                      DType out_dtype, int64_t n, cudaStream_t stream);

}  // namespace mlag::cuda
