// CUDA launchers behind kernels/rms_norm.h. CUDA and the standard library
// only. Each enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Floating dtypes: f32, bf16, f16. Tensors are
// [rows, dim] with unit-stride rows `*_row_stride` elements apart; weight is
// [dim] contiguous. Arithmetic matches host::RmsNorm: the sum of squares is
// accumulated in double, 1 / sqrt(mean + eps) is one correctly rounded f32
// division of one correctly rounded f32 square root, and the normalised value
// is rounded to the normalised tensor's dtype before the weight multiplies it.
// One block per row.

// y = RmsNorm(x). y may be x itself (same dtype and row stride).
cudaError_t LaunchRmsNorm(const void* x, DType x_dtype, int64_t x_row_stride, const void* weight,
                          DType weight_dtype, void* y, DType y_dtype, int64_t y_row_stride,
                          int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// residual = round_to_residual_dtype(residual + x); y = RmsNorm(residual).
// y may be x itself, never residual.
cudaError_t LaunchAddRmsNorm(const void* x, DType x_dtype, int64_t x_row_stride, void* residual,
                             DType residual_dtype, int64_t residual_row_stride, const void* weight,
                             DType weight_dtype, void* y, DType y_dtype, int64_t y_row_stride,
                             int64_t rows, int64_t dim, float eps, cudaStream_t stream);

}  // namespace mlag::cuda
