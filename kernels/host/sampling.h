// Host implementation behind kernels/sampling.h. Arguments are validated by
// the caller (kernels/sampling.cc).
#pragma once

#include <cstdint>

#include "runtime/core/tensor.h"

namespace mlag::host {

void Sample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
            const Tensor& top_p, const Tensor& seeds, const Tensor& steps,
            const Tensor& out_tokens);

// The `k` most likely tokens of one row of logits and their log-probabilities
// under softmax(logits), most likely first, ties to the lower token id.
// log-softmax is taken in double (max-shifted log-sum-exp) and rounded once
// to f32. `k` is clamped to [0, vocab]; returns how many were written to
// `tokens` and `logprobs` (each with room for k entries).
int TopLogprobs(const float* logits, int vocab, int k, int32_t* tokens, float* logprobs);

// TopLogprobs of every row of `logits` [B, V], k[b] clamped to out_tokens'
// K columns, into out_tokens [B, K] and out_logprobs [B, K]; columns past a
// row's count get token -1 and logprob -inf (kernels/sampling.h).
void TopLogprobsRows(const Tensor& logits, const Tensor& k, const Tensor& out_tokens,
                     const Tensor& out_logprobs);

// kernels/sampling.h's AdjustLogits.
void AdjustLogits(const Tensor& logits, const Tensor& offsets, const Tensor& tokens,
                  const Tensor& deltas);

// log softmax(logits)[token] of one row, as TopLogprobs computes it: in
// double, max-shifted log-sum-exp, rounded once to f32.
float TokenLogprob(const float* logits, int vocab, int32_t token);

// kernels/sampling.h's FeedSampledTokens.
void FeedSampledTokens(const Tensor& src, const Tensor& stop_ids, const Tensor& query_start_loc,
                       const Tensor& prev_tokens, const Tensor& input_ids,
                       const Tensor& slot_mapping);

}  // namespace mlag::host
