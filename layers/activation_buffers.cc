#include "layers/activation_buffers.h"

#include <algorithm>

#include "runtime/core/status.h"

namespace mlag {
namespace {

// Runs `alloc(dtype, shape)` for every buffer, in one fixed order, so sizing
// and allocation cannot disagree.
template <typename Alloc>
absl::Status ForEachBuffer(const ModelConfig& c, int64_t T, int64_t B, int64_t N,
                           ActivationBuffers* a, Alloc&& alloc) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, R = c.kv_lora_rank;
  const int64_t W =
      std::max<int64_t>(c.intermediate_size, int64_t{c.n_shared_experts} * c.moe_intermediate_size);
  const int64_t E = std::max(c.n_routed_experts, 1), K = std::max(c.num_experts_per_tok, 1);
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, D}, &a->residual));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, D}, &a->normed));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, D}, &a->attn_out));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, D}, &a->ffn_out));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, std::max(c.q_lora_rank, 1)}, &a->q_a));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, H * c.qk_head_dim()}, &a->q));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, c.kv_cache_row()}, &a->kv_a));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, H, R}, &a->q_latent));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, H, R}, &a->out_latent));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, H}, &a->lse));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, H * c.v_head_dim}, &a->v));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, 2 * W}, &a->gate_up));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, W}, &a->act));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, E}, &a->router_logits));
  MLAG_RETURN_IF_ERROR(alloc(DType::kI32, {T, K}, &a->topk_ids));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, K}, &a->topk_weights));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T, D}, &a->shared_out));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {B, D}, &a->last_hidden));
  MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {B, int64_t{c.vocab_size}}, &a->logits));
  if (N > 1) {
    MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {N * T, D}, &a->ep_x));
    MLAG_RETURN_IF_ERROR(alloc(DType::kI32, {N * T, K}, &a->ep_ids));
    MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {N * T, K}, &a->ep_weights));
    MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {N * T * K, D}, &a->ep_y));
    MLAG_RETURN_IF_ERROR(alloc(DType::kF32, {T * K, D}, &a->ep_choices));
  }
  return absl::OkStatus();
}

}  // namespace

size_t ActivationBuffers::Bytes(const ModelConfig& config, int max_tokens, int max_seqs,
                                int max_ep_ranks) {
  size_t total = 0;
  ActivationBuffers unused;
  ForEachBuffer(config, max_tokens, max_seqs, max_ep_ranks, &unused,
                [&](DType dtype, std::initializer_list<int64_t> shape, Tensor*) {
                  size_t bytes = Tensor(nullptr, dtype, shape).nbytes();
                  total += (bytes + 63) / 64 * 64;  // the workspace's alignment
                  return absl::OkStatus();
                })
      .IgnoreError();
  return total;
}

absl::StatusOr<ActivationBuffers> ActivationBuffers::Allocate(const ModelConfig& config,
                                                              int max_tokens, int max_seqs,
                                                              int max_ep_ranks,
                                                              Workspace& workspace) {
  ActivationBuffers a;
  MLAG_RETURN_IF_ERROR(ForEachBuffer(
      config, max_tokens, max_seqs, max_ep_ranks, &a,
      [&](DType dtype, std::initializer_list<int64_t> shape, Tensor* out) -> absl::Status {
        MLAG_ASSIGN_OR_RETURN(*out, workspace.Allocate(dtype, shape));
        return absl::OkStatus();
      }));
  return a;
}

}  // namespace mlag
