// ApplyRope (kernels/rope.h): one block per token (striding over tokens
// beyond the grid); its threads take the (heads + 1) * half pairs of the
// token, the last "head" being k_pe.
#include "kernels/common/rope_math.h"
#include "kernels/cuda/rope.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535 * 16;

__global__ void __launch_bounds__(kThreads)
    ApplyRopeKernel(const int32_t* positions, int64_t position_stride, const float* table,
                    int64_t table_rows, int64_t table_row_stride, float* q_pe,
                    int64_t q_token_stride, int64_t q_head_stride, int64_t heads, float* k_pe,
                    int64_t k_token_stride, int64_t num_tokens, int64_t half) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t pairs = (heads + 1) * half;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int64_t p = positions[t * position_stride];
    if (p < 0 || p >= table_rows) continue;  // left unchanged (see the contract)
    const float* cos_row = table + p * table_row_stride;
    const float* sin_row = cos_row + half;
    for (int64_t idx = threadIdx.x; idx < pairs; idx += kThreads) {
      const int64_t h = idx / half;
      const int64_t i = idx - h * half;
      float* x =
          h < heads ? q_pe + t * q_token_stride + h * q_head_stride : k_pe + t * k_token_stride;
      float y0, y1;
      RopeRotatePair(x[2 * i], x[2 * i + 1], cos_row[i], sin_row[i], &y0, &y1);
      x[2 * i] = y0;
      x[2 * i + 1] = y1;
    }
  }
}

}  // namespace

cudaError_t LaunchApplyRope(const int32_t* positions, int64_t position_stride, const float* table,
                            int64_t table_rows, int64_t table_row_stride, float* q_pe,
                            int64_t q_token_stride, int64_t q_head_stride, int64_t heads,
                            float* k_pe, int64_t k_token_stride, int64_t num_tokens, int64_t half,
                            cudaStream_t stream) {
  if (num_tokens <= 0 || half <= 0) return cudaSuccess;
  const int blocks = static_cast<int>(num_tokens < kMaxBlocks ? num_tokens : kMaxBlocks);
  MLAG_LAUNCH_PDL(ApplyRopeKernel, blocks, kThreads, 0, stream)
  (positions, position_stride, table, table_rows, table_row_stride, q_pe, q_token_stride,
   q_head_stride, heads, k_pe, k_token_stride, num_tokens, half);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
