// MlaAttention: the attention of one MLA layer over its paged latent cache.
//
// It is its own layer, not a flag on a generic attention: it owns the layer's
// KV cache view [num_blocks, block_size, Rkv + dr], the absorbed weights
// W_UK [H, dn, Rkv] and W_UV [H, dv, Rkv] derived from kv_b_proj after
// loading, and the softmax scale. Forward records exactly two graph nodes,
//   layers.<i>.attn.kv_update   the latent's norm and rope on q_pe and k_pe,
//                               then this step's kv_c / k_pe written at
//                               slot_mapping (one launch: MlaRopeKvUpdate)
//   layers.<i>.attn.mla         attention over the cache (reads it only)
// and does no projections: the MLA block around it does those, using
// AbsorbQuery (q_nope -> latent query) and ExpandOutput (latent output ->
// per-head values), which record their own nodes.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "kernels/linear.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "layers/attention_metadata.h"
#include "layers/weight_arena.h"
#include "runtime/core/stream.h"

namespace mlag {

struct MlaDims {
  int num_heads = 0;         // H
  int kv_lora_rank = 0;      // Rkv
  int qk_nope_head_dim = 0;  // dn
  int qk_rope_head_dim = 0;  // dr
  int v_head_dim = 0;        // dv
};

class MlaAttention {
 public:
  MlaAttention(int layer, const MlaDims& dims, float softmax_scale);

  // Derives W_UK and W_UV from kv_b_proj [H*(dn+dv), Rkv] (host f32): head h
  // owns rows [h*(dn+dv), (h+1)*(dn+dv)), the first dn being W_UK^h, the next
  // dv W_UV^h.
  absl::Status SetKvB(WeightArena& arena, const std::vector<float>& kv_b);

  // Points the layer at its KV cache: [num_blocks, block_size, Rkv + dr],
  // f32 or bf16, on the model's device. The runtime owns the memory.
  void BindCache(const Tensor& cache) { cache_ = cache; }
  // The split-KV scratch of the CUDA decode kernel (owned by the model,
  // allocated before any capture, shared by every layer); nullptr on the host.
  void SetDecodeWorkspace(const MlaDecodeWorkspace* workspace) { decode_workspace_ = workspace; }
  const Tensor& cache() const { return cache_; }

  // q_latent[t,h] = W_UK^h^T q_nope[t,h]. q_nope [T,H,dn] (strided rows ok),
  // q_latent [T,H,Rkv]. Node layers.<i>.attn.q_absorb.
  absl::Status AbsorbQuery(Stream& stream, const Tensor& q_nope, const Tensor& q_latent) const;

  // The two nodes: kv_update then mla. kv_c [T,Rkv] the latent (normalised
  // by kv_update first when latent_norm is given; only read), k_pe [T,dr]
  // and q_pe [T,H,dr] not yet rotated (kv_update rotates them in place at
  // meta.positions with rope_table, from FillRopeTable), q_latent
  // [T,H,Rkv]; out_latent [T,H,Rkv] and lse [T,H] receive the attention
  // output in the latent space.
  absl::Status Forward(Stream& stream, const AttentionMetadata& meta, const Tensor& rope_table,
                       const Tensor& kv_c, const KvLatentNorm* latent_norm, const Tensor& k_pe,
                       const Tensor& q_latent, const Tensor& q_pe, const Tensor& out_latent,
                       const Tensor& lse) const;

  // v[t,h] = W_UV^h out_latent[t,h]: [T,H,Rkv] -> [T,H,dv]. Node
  // layers.<i>.attn.v_up.
  absl::Status ExpandOutput(Stream& stream, const Tensor& out_latent, const Tensor& v) const;

  float softmax_scale() const { return softmax_scale_; }
  const MlaDims& dims() const { return dims_; }
  const LinearWeight& w_uk() const { return w_uk_; }
  const LinearWeight& w_uv() const { return w_uv_; }

 private:
  std::string NodeName(const char* op) const;

  int layer_;
  MlaDims dims_;
  float softmax_scale_;
  // f32, packed per head on the host (PackForLinear).
  LinearWeight w_uk_;  // [H, Rkv, dn]: W_UK[h] transposed, so both per-head matmuls are x W^T
  LinearWeight w_uv_;  // [H, dv, Rkv]
  Tensor cache_;
  const MlaDecodeWorkspace* decode_workspace_ = nullptr;
};

}  // namespace mlag
