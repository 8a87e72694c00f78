// Token sampling: greedy, temperature, top-k and top-p, with a counter-based
// RNG keyed by (request seed, step), so a request draws the same tokens
// whatever else is in the batch and on any backend.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// For every row b:
//   temperature[b] <= 0: greedy argmax of logits[b] (ties: lowest token id).
//   else: p = softmax(logits[b] / temperature[b]); keep the top_k[b] most
//     likely tokens (top_k <= 0 or >= V: all), then the smallest prefix of
//     them, by descending probability, whose mass reaches top_p[b] (top_p >= 1:
//     all; the most likely token is always kept); renormalise and draw with
//     u = Uniform(seeds[b], steps[b]) in [0, 1).
// Ordering among equal probabilities: lower token id first.
//   logits: f32 [B, V] row-major; temperature f32 [B]; top_k i32 [B];
//   top_p f32 [B]; seeds i64 [B]; steps i64 [B] (the request's output index);
//   out_tokens: i32 [B].
absl::Status Sample(Stream& stream, const Tensor& logits, const Tensor& temperature,
                    const Tensor& top_k, const Tensor& top_p, const Tensor& seeds,
                    const Tensor& steps, const Tensor& out_tokens);

// The most columns TopLogprobs writes per row: the CUDA kernel holds a row's
// candidates in shared memory. Callers wanting more use host::TopLogprobs.
constexpr int kMaxTopLogprobs = 64;

// For every row b, the k_b = clamp(k[b], 0, min(K, V)) most likely tokens of
// softmax(logits[b]) and their log-probabilities, as host::TopLogprobs gives
// them: most likely first, the lower id first among equal logits;
// log-softmax in double (max-shifted log-sum-exp) rounded once to f32. The
// backends differ only in the order of the double sum of exponentials (a
// float ulp or two). Columns [k_b, K) get token -1 and logprob -inf.
// A row holding NaN gets NaN log-probabilities; the order of its tokens is
// then unspecified.
//   logits: f32 [B, V] row-major; k: i32 [B] contiguous;
//   out_tokens: i32 [B, K] and out_logprobs: f32 [B, K], row-major,
//   0 <= K <= kMaxTopLogprobs.
// On CUDA: one block per row, no scratch memory, capturable into a graph.
absl::Status TopLogprobs(Stream& stream, const Tensor& logits, const Tensor& k,
                         const Tensor& out_tokens, const Tensor& out_logprobs);

// The most logit adjustments one sequence carries in a step: its logit_bias
// entries plus the distinct tokens it has generated, when it has penalties
// (runtime/engine/request.h). Sizes the runner's adjustment buffer.
constexpr int kMaxLogitAdjustmentsPerSeq = 4096;

// Sparse additions to the logits before sampling (logit_bias and the
// presence and frequency penalties, folded by the caller into one delta per
// token). For every row b and every i in [offsets[b], offsets[b + 1]):
//   logits[b, tokens[i]] += deltas[i]   (an f32 add)
// Each row lists a token at most once. Entries whose token is outside
// [0, V) are skipped; offsets are clamped to [0, A]. The sum is one f32
// addition per touched logit, whatever the batch: batch-invariant.
//   logits: f32 [B, V] row-major; offsets: i32 [B + 1]; tokens: i32 [A];
//   deltas: f32 [A]; all contiguous.
// On CUDA: one block per row, capturable into a graph.
absl::Status AdjustLogits(Stream& stream, const Tensor& logits, const Tensor& offsets,
                          const Tensor& tokens, const Tensor& deltas);

// The most stop tokens per sequence FeedSampledTokens checks.
constexpr int kMaxFeedStopIds = 8;

// Feeds the tokens the previous step sampled into this step's inputs on the
// device, so the host can launch a step before it knows them (the engine's
// overlapped loop, runtime/engine/engine.h). For every sequence b with
// src[b] >= 0 (its one new token is a placeholder):
//   t = query_start_loc[b]; token = prev_tokens[src[b]];
//   input_ids[t] = token;
//   slot_mapping[t] = -1 when token is one of stop_ids[b, :] (the request
//     ended on it: its KV is not written, as the step-by-step engine never
//     computes a stop token's KV).
// Entries of stop_ids below 0 are unused. A sequence whose src[b] is outside
// prev_tokens, or whose row t is outside input_ids, is left alone (the
// runner never stages one).
//   src: i32 [B]; stop_ids: i32 [B, kMaxFeedStopIds]; query_start_loc: i32
//   [B + 1]; prev_tokens: i32 [P]; input_ids: i32 [T]; slot_mapping: i64 [T];
//   all contiguous.
// On CUDA: one thread per sequence, capturable into a graph.
absl::Status FeedSampledTokens(Stream& stream, const Tensor& src, const Tensor& stop_ids,
                               const Tensor& query_start_loc, const Tensor& prev_tokens,
                               const Tensor& input_ids, const Tensor& slot_mapping);

}  // namespace mlag
