// CUDA launcher behind kernels/embedding.h. CUDA and the standard library
// only. Enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// out[t, :] = table[indices[t], :], converting when the dtypes differ (the
// same rounding as the host) and copying bits when they are equal; an index
// outside [0, table_rows) writes a row of zeros and reads nothing.
//   indices: i32 (indices_are_i64 false) or i64, element t at
//     indices[t * index_stride];
//   table: [table_rows, dim], rows `table_row_stride` elements apart;
//   out: [num_rows, dim], rows `out_row_stride` elements apart.
// Floating dtypes: f32, bf16, f16.
cudaError_t LaunchGatherRows(const void* indices, bool indices_are_i64, int64_t index_stride,
                             const void* table, DType table_dtype, int64_t table_rows,
                             int64_t table_row_stride, void* out, DType out_dtype,
                             int64_t out_row_stride, int64_t num_rows, int64_t dim,
                             cudaStream_t stream);

}  // namespace mlag::cuda
