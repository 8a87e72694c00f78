// CUDA launcher behind kernels/sampling.h. CUDA and the standard library only.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// Samples one token per row of logits, exactly as host::Sample does (the
// rules are in kernels/common/sampling_math.h): the same logits, parameters,
// seeds and steps give the same tokens on both backends.
//   logits: f32 [B, V], row r at logits + r * logits_row_stride (elements);
//   temperature f32 [B], top_k i32 [B], top_p f32 [B], seeds i64 [B],
//   steps i64 [B], out_tokens i32 [B]: contiguous, device memory.
// 1 <= V < 2^31. One block per row; no scratch memory, no host reads of
// device memory, no synchronisation: capturable into a CUDA graph.
cudaError_t LaunchSample(const float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                         const float* temperature, const int32_t* top_k, const float* top_p,
                         const int64_t* seeds, const int64_t* steps, int32_t* out_tokens,
                         cudaStream_t stream);

}  // namespace mlag::cuda
