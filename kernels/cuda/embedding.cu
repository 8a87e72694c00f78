// GatherRows / Embedding (kernels/embedding.h): a 2-D grid, columns x output
// rows (striding over rows beyond the grid); each thread reads its row's
// index once per row.
#include "kernels/cuda/embedding.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20;

__global__ void __launch_bounds__(kThreads)
    GatherRowsKernel(const void* indices, bool indices_are_i64, int64_t index_stride,
                     const void* table, DType table_dtype, int64_t table_rows,
                     int64_t table_row_stride, void* out, DType out_dtype, int64_t out_row_stride,
                     int64_t num_rows, int64_t dim) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  for (int64_t t = blockIdx.y; t < num_rows; t += gridDim.y) {
    const int64_t id = indices_are_i64 ? static_cast<const int64_t*>(indices)[t * index_stride]
                                       : static_cast<const int32_t*>(indices)[t * index_stride];
    const bool valid = id >= 0 && id < table_rows;
    const int64_t src = id * table_row_stride;
    const int64_t dst = t * out_row_stride;
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < dim;
         i += int64_t(gridDim.x) * kThreads) {
      if (!valid) {
        // All-zero bits are +0.0 in f32, bf16 and f16 alike.
        if (out_dtype == DType::kF32) {
          static_cast<uint32_t*>(out)[dst + i] = 0;
        } else {
          static_cast<uint16_t*>(out)[dst + i] = 0;
        }
      } else if (table_dtype == out_dtype) {
        // Same dtype: the bits, as the host's memcpy (NaN payloads included).
        if (out_dtype == DType::kF32) {
          static_cast<uint32_t*>(out)[dst + i] = static_cast<const uint32_t*>(table)[src + i];
        } else {
          static_cast<uint16_t*>(out)[dst + i] = static_cast<const uint16_t*>(table)[src + i];
        }
      } else {
        StoreFromF32(out_dtype, out, dst + i, LoadAsF32(table_dtype, table, src + i));
      }
    }
  }
}

}  // namespace

cudaError_t LaunchGatherRows(const void* indices, bool indices_are_i64, int64_t index_stride,
                             const void* table, DType table_dtype, int64_t table_rows,
                             int64_t table_row_stride, void* out, DType out_dtype,
                             int64_t out_row_stride, int64_t num_rows, int64_t dim,
                             cudaStream_t stream) {
  if (num_rows <= 0 || dim <= 0) return cudaSuccess;
  const int64_t gx = (dim + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned int>(gx < kMaxGridX ? gx : kMaxGridX),
                  static_cast<unsigned int>(num_rows < kMaxGridY ? num_rows : kMaxGridY));
  MLAG_LAUNCH_PDL(GatherRowsKernel, grid, kThreads, 0, stream)
  (indices, indices_are_i64, index_stride, table, table_dtype, table_rows, table_row_stride, out,
   out_dtype, out_row_stride, num_rows, dim);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
