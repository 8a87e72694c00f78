// CUDA launcher behind kernels/rope.h (ApplyRope; FillRopeTable stays on the
// host). CUDA and the standard library only. Enqueues on `stream` and
// returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Rotates, in place, the interleaved pairs of every q_pe head and of k_pe of
// token t by the table row of position positions[t * position_stride], with
// RopeRotatePair (kernels/common/rope_math.h), bit for bit as the host does.
// A position outside [0, table_rows) leaves the token's rows unchanged.
//   q_pe: f32 [num_tokens, heads, 2 half], element (t, h, j) at
//     q_pe[t * q_token_stride + h * q_head_stride + j];
//   k_pe: f32 [num_tokens, 2 half], element (t, j) at k_pe[t * k_token_stride + j];
//   table: f32 [table_rows, 2 half] (half cosines, then half sines), rows
//     `table_row_stride` elements apart.
cudaError_t LaunchApplyRope(const int32_t* positions, int64_t position_stride, const float* table,
                            int64_t table_rows, int64_t table_row_stride, float* q_pe,
                            int64_t q_token_stride, int64_t q_head_stride, int64_t heads,
                            float* k_pe, int64_t k_token_stride, int64_t num_tokens, int64_t half,
                            cudaStream_t stream);

}  // namespace mlag::cuda
