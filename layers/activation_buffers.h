// The activation buffers of one model, allocated once for the largest batch
// (max_tokens rows; max_seqs rows for the per-sequence outputs). A forward over
// T tokens uses the first T rows of each, so every captured graph sees the
// same addresses whatever its batch size.
#pragma once

#include "absl/status/statusor.h"
#include "layers/model_config.h"
#include "runtime/core/device.h"

namespace mlag {

struct ActivationBuffers {
  Tensor residual;       // [T, D] the residual stream
  Tensor normed;         // [T, D] normed input of the next block
  Tensor attn_out;       // [T, D]
  Tensor ffn_out;        // [T, D]
  Tensor q_a;            // [T, Rq] (q LoRA only)
  Tensor q;              // [T, H * dq]
  Tensor kv_a;           // [T, Rkv + dr] latent then k_pe
  Tensor q_latent;       // [T, H, Rkv]
  Tensor out_latent;     // [T, H, Rkv]
  Tensor lse;            // [T, H]
  Tensor v;              // [T, H * dv]
  Tensor gate_up;        // [T, 2 * W], W = widest MLP (dense or shared experts)
  Tensor act;            // [T, W]
  Tensor router_logits;  // [T, E]
  Tensor topk_ids;       // [T, K] i32
  Tensor topk_weights;   // [T, K]
  Tensor shared_out;     // [T, D]
  Tensor last_hidden;    // [B, D]
  Tensor logits;         // [B, V]
  // Expert parallelism over up to N ranks (empty when N == 1): the tokens,
  // routing and expert outputs of every rank of the group. On the host the
  // outputs are the weighted choices [N * T, K, D], and ep_choices receives
  // this rank's [T, K, D]; on CUDA the first N * T rows of ep_y hold partial
  // sums.
  Tensor ep_x;        // [N * T, D]
  Tensor ep_ids;      // [N * T, K] i32
  Tensor ep_weights;  // [N * T, K]
  Tensor ep_y;        // [N * T * K, D]
  Tensor ep_choices;  // [T * K, D]

  // Bytes the buffers need for `max_tokens`, `max_seqs` and an
  // expert-parallel group of at most `max_ep_ranks` ranks.
  static size_t Bytes(const ModelConfig& config, int max_tokens, int max_seqs,
                      int max_ep_ranks = 1);
  // Carves every buffer out of `workspace` (which must hold Bytes(...)).
  static absl::StatusOr<ActivationBuffers> Allocate(const ModelConfig& config, int max_tokens,
                                                    int max_seqs, int max_ep_ranks,
                                                    Workspace& workspace);
};

// The first `n` rows of `t`.
inline Tensor Rows(const Tensor& t, int64_t n) { return t.Slice(0, 0, n); }

// A contiguous view of `shape` over the start of buffer `t` (which must be
// contiguous and at least that large): for scratch buffers shared by ops of
// different widths.
inline Tensor ViewAs(const Tensor& t, std::initializer_list<int64_t> shape) {
  Tensor v(t.data(), t.dtype(), shape, t.device());
  return v.numel() <= t.numel() ? v : Tensor();
}

}  // namespace mlag
