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

// The most columns LaunchTopLogprobs writes per row (kernels/sampling.h's
// kMaxTopLogprobs).
constexpr int kTopLogprobsMaxCols = 64;

// The top k_b = clamp(k[b], 0, min(k_cols, V)) tokens of each row and their
// log-probabilities, exactly as host::TopLogprobs ranks them (logit
// descending, lower id first on ties), log-softmax computed in double and
// rounded once to f32; columns [k_b, k_cols) get token -1 and logprob -inf.
//   logits: f32 [B, V], row r at logits + r * logits_row_stride (elements);
//   k: i32 [B] contiguous; out_tokens i32 and out_logprobs f32 [B, k_cols],
//   row r at r * their row stride; device memory.
// 1 <= V < 2^31, 1 <= k_cols <= kTopLogprobsMaxCols. One block per row; no
// scratch memory, no host reads of device memory, no synchronisation:
// capturable into a CUDA graph.
cudaError_t LaunchTopLogprobs(const float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                              const int32_t* k, int64_t k_cols, int32_t* out_tokens,
                              int64_t tokens_row_stride, float* out_logprobs,
                              int64_t logprobs_row_stride, cudaStream_t stream);

// kernels/sampling.h's AdjustLogits: logits f32 [B, V], row r at logits +
// r * logits_row_stride; offsets i32 [B + 1], tokens i32 [A], deltas f32
// [A], device memory. One block per row; capturable into a CUDA graph.
cudaError_t LaunchAdjustLogits(float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                               const int32_t* offsets, const int32_t* tokens, const float* deltas,
                               int64_t A, cudaStream_t stream);

// kernels/sampling.h's FeedSampledTokens: src i32 [B], stop_ids i32
// [B, stops_per_seq], query_start_loc i32 [B + 1], prev_tokens i32 [P],
// input_ids i32 [T], slot_mapping i64 [T], device memory. One thread per
// sequence; capturable into a CUDA graph.
cudaError_t LaunchFeedSampledTokens(const int32_t* src, const int32_t* stop_ids, int stops_per_seq,
                                    const int32_t* query_start_loc, int64_t B,
                                    const int32_t* prev_tokens, int64_t P, int32_t* input_ids,
                                    int64_t* slot_mapping, int64_t T, cudaStream_t stream);

}  // namespace mlag::cuda
