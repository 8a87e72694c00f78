// Mixture-of-experts: routing (SPEC-deepseek §4) and the routed experts.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

enum class ScoringFunc { kSoftmax, kSigmoid };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct RoutingParams {
  int num_experts = 0;   // E
  int top_k = 0;         // K
  int n_group = 1;       // G; E % G == 0
  int topk_group = 1;    // groups kept
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  TopkMethod method = TopkMethod::kGreedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// Picks K experts per token and their weights.
//   logits: f32 [T, E] — the gate linear's output, computed in f32
//   correction_bias: f32 [E] for noaux_tc (selection only); ignored otherwise
//     (pass an empty Tensor)
//   topk_ids: i32 [T, K]; topk_weights: f32 [T, K]
// Methods:
//   softmax + greedy: s = softmax(l), ids = topK(s).
//   softmax + group_limited_greedy: group score = max s in the group; the
//     topk_group best groups are kept, the rest masked to -inf; ids = topK.
//   sigmoid + noaux_tc: s = sigmoid(l), b = s + bias; group score = sum of the
//     group's top-2 b; keep topk_group groups, others -inf; ids = topK(b).
// Weights: w = s[ids]; norm_topk_prob: w /= sum(w) (+1e-20 for sigmoid), and
// softmax then skips the scaling factor; otherwise (and always for sigmoid)
// w *= routed_scaling_factor.
// Ties (equal scores, or equal group scores) go to the lower index. The K
// outputs of a token are in selection order: best first.
absl::Status MoeRoute(Stream& stream, const RoutingParams& params, const Tensor& logits,
                      const Tensor& correction_bias, const Tensor& topk_ids,
                      const Tensor& topk_weights);

// out[t] = sum over k with expert_map[topk_ids[t,k]] >= 0 of
//          topk_weights[t,k] * f_e(x[t]),  f_e(x) = W_down (silu(W_gate x) * (W_up x))
// over the experts this rank holds. Work is grouped per expert (one sgemm per
// expert over its tokens), not per token.
//   x: f32 [T, D] row-major; topk_ids: i32 [T, K]; topk_weights: f32 [T, K]
//   expert_map: i32 [E] global expert -> local slot, -1 = not held here
//   w_gate_up: f32 [L, 2*I, D] contiguous (gate rows then up rows per expert)
//   w_down: f32 [L, D, I] contiguous
//   out: f32 [T, D] contiguous, overwritten (rows with no local expert are 0)
// Ids outside [0, E) or slots outside [0, L) are ignored.
absl::Status MoeExperts(Stream& stream, const Tensor& x, const Tensor& topk_ids,
                        const Tensor& topk_weights, const Tensor& expert_map,
                        const Tensor& w_gate_up, const Tensor& w_down, const Tensor& out);

}  // namespace mlag
