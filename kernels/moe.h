// Mixture-of-experts: routing (MoEGate in the Hugging Face modeling_deepseek.py)
// and the routed experts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/linear.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

enum class ScoringFunc { kSoftmax, kSigmoid };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct RoutingParams {
  int num_experts = 0;  // E
  int top_k = 0;        // K
  int n_group = 1;      // G; E % G == 0
  int topk_group = 1;   // groups kept
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
// CUDA: one warp per token; at most 4096 experts (Unimplemented beyond).
// Scores may differ from the host's in the last bits (expf, sum order), so
// ids agree except for scores within rounding of each other.
absl::Status MoeRoute(Stream& stream, const RoutingParams& params, const Tensor& logits,
                      const Tensor& correction_bias, const Tensor& topk_ids,
                      const Tensor& topk_weights);

// The router whole: logits = x w_gate^T (x f32 [T, D] row-major, w_gate f32
// [E, D] contiguous, logits f32 [T, E] row-major), then MoeRoute. On the
// host, and on CUDA beyond decode-sized batches, Linear then MoeRoute. On
// CUDA for T <= 32 (and E within the kernel's shared memory) one launch,
// "moe_gate_route" (kernels/cuda/moe.cuh: LaunchMoeGateRoute): the gate's
// f32 dot products in a fixed order per token, then the same router; its
// logits differ from cuBLASLt's in the last bits (another summation order),
// so ids agree with the two-launch path except where scores are within
// rounding of each other. `counter`: i32 [1] of device memory holding 0,
// which the fused launch uses and leaves 0 (an unset Tensor: two launches).
absl::Status MoeGateRoute(Stream& stream, const RoutingParams& params, const Tensor& x,
                          const Tensor& w_gate, const Tensor& correction_bias, const Tensor& logits,
                          const Tensor& counter, const Tensor& topk_ids,
                          const Tensor& topk_weights);

// out[t] = sum over k with expert_map[topk_ids[t,k]] >= 0 of
//          topk_weights[t,k] * f_e(x[t]),  f_e(x) = W_down (silu(W_gate x) * (W_up x))
// over the experts this rank holds. Work is grouped per expert (one GEMM per
// expert over its tokens), not per token.
//   x: f32 [T, D] row-major; topk_ids: i32 [T, K]; topk_weights: f32 [T, K]
//   expert_map: i32 [E] global expert -> local slot, -1 = not held here
//   w_gate_up: [L, 2*I, D] (gate rows then up rows per expert), w_down:
//     [L, D, I]; LinearWeights (kernels/linear.h) of one dtype: f32, bf16 or
//     fp8; on CUDA bf16 and fp8 weights run on tensor cores where
//     MoeExpertsOnTensorCores says so (bf16: x and the activations rounded to
//     bf16; fp8: both quantized per row and 128-column block to e4m3, as the
//     dense FP8 GEMM of Linear), else widened to f32 as loaded (fp8: times
//     its block scale, rounded once, the host's dequantized value)
//   out: f32 [T, D] contiguous, overwritten (rows with no local expert are 0).
//     Host only: out may instead be [T, K, D], the weighted choices
//     topk_weights[t,k] * f_e(x[t]) unsummed (0 where not held here), for an
//     expert-parallel exchange that MoeSumChoices then sums.
// Ids outside [0, E) or slots outside [0, L) are ignored.
// Host: each token's weighted choices are rounded, then summed in k order,
// so the result does not depend on which experts are local or on the batch.
//
// CUDA: counts, offsets and the grouped (token, k) rows are computed on the
// device, and the expert GEMMs' grids depend only on (T, K, D, I, L), so the
// launch is graph-capturable and never synchronises. It needs device scratch
// of MoeExpertsWorkspaceBytes(T, K, D, I, L) bytes:
//   - `workspace` (optional): a contiguous device tensor of any dtype, 4-byte
//     aligned, of at least that many bytes, owned by the caller. Size it once
//     for the largest T (the size grows with T) before any capture and pass
//     the same memory at every call; it may be reused by other ops between
//     calls (its contents do not persist), but must not overlap any argument.
//   - without it (an empty Tensor): a per-stream scratch buffer
//     (kernels/cuda_blas.h) that grows in eager launches only; a capture whose
//     shape needs more than the stream ever used eagerly fails with
//     FailedPrecondition.
// The host ignores `workspace`.
absl::Status MoeExperts(Stream& stream, const Tensor& x, const Tensor& topk_ids,
                        const Tensor& topk_weights, const Tensor& expert_map,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down,
                        const Tensor& out, const Tensor& workspace = Tensor());

// Whether MoeExperts on `device` multiplies `w_dtype` weights on tensor
// cores (CUDA: bf16 from sm_80, fp8 from sm_89, in a build with code for
// such a target); false on the host and for f32 weights.
absl::StatusOr<bool> MoeExpertsOnTensorCores(const Device& device, DType w_dtype);

// out[t] = sum over k, in k order from 0, of per_choice[t, k]:
// per_choice f32 [T, K, D] contiguous, out f32 [T, D] contiguous. Host only
// (the CUDA expert-parallel combine sums partial outputs instead).
absl::Status MoeSumChoices(Stream& stream, const Tensor& per_choice, const Tensor& out);

// Bytes of CUDA scratch MoeExperts needs for T rows of x, K experts per row,
// hidden size D, expert width I (w_gate_up is [L, 2I, D]) and L local
// experts; 0 in a build without CUDA. Pure arithmetic, no device needed.
size_t MoeExpertsWorkspaceBytes(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L);

}  // namespace mlag
