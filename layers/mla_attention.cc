#include "layers/mla_attention.h"

#include "absl/strings/str_cat.h"
#include "kernels/linear.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "runtime/core/status.h"

namespace mlag {

MlaAttention::MlaAttention(int layer, const MlaDims& dims, float softmax_scale)
    : layer_(layer), dims_(dims), softmax_scale_(softmax_scale) {}

std::string MlaAttention::NodeName(const char* op) const {
  return absl::StrCat("layers.", layer_, ".attn.", op);
}

absl::Status MlaAttention::SetKvB(WeightArena& arena, const std::vector<float>& kv_b) {
  const int64_t H = dims_.num_heads, R = dims_.kv_lora_rank, dn = dims_.qk_nope_head_dim,
                dv = dims_.v_head_dim;
  if (static_cast<int64_t>(kv_b.size()) != H * (dn + dv) * R) {
    return absl::InternalError("SetKvB: kv_b_proj size does not match the layer's dims");
  }
  std::vector<float> uk(H * R * dn), uv(H * dv * R);
  for (int64_t h = 0; h < H; ++h) {
    const float* head = kv_b.data() + h * (dn + dv) * R;
    for (int64_t i = 0; i < dn; ++i) {
      for (int64_t r = 0; r < R; ++r) uk[(h * R + r) * dn + i] = head[i * R + r];
    }
    std::copy(head + dn * R, head + (dn + dv) * R, uv.begin() + h * dv * R);
  }
  MLAG_ASSIGN_OR_RETURN(w_uk_.values, arena.Allocate({H, R, dn}));
  MLAG_ASSIGN_OR_RETURN(w_uv_.values, arena.Allocate({H, dv, R}));
  MLAG_RETURN_IF_ERROR(arena.Upload(uk, w_uk_.values));
  MLAG_RETURN_IF_ERROR(arena.Upload(uv, w_uv_.values));
  MLAG_RETURN_IF_ERROR(PackForLinear(arena.device(), w_uk_));
  return PackForLinear(arena.device(), w_uv_);
}

absl::Status MlaAttention::AbsorbQuery(Stream& stream, const Tensor& q_nope,
                                       const Tensor& q_latent) const {
  NodeScope scope(stream, NodeName("q_absorb"), OpKind::kGemm);
  return HeadMatmul(stream, q_nope, w_uk_, /*transpose_w=*/true, q_latent);
}

absl::Status MlaAttention::Forward(Stream& stream, const AttentionMetadata& meta,
                                   const Tensor& rope_table, const Tensor& kv_c,
                                   const KvLatentNorm* latent_norm, const Tensor& k_pe,
                                   const Tensor& q_latent, const Tensor& q_pe,
                                   const Tensor& out_latent, const Tensor& lse) const {
  if (cache_.numel() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer ", layer_, ": MLA attention has no KV cache bound"));
  }
  {
    NodeScope scope(stream, NodeName("kv_update"), OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(MlaRopeKvUpdate(stream, meta.positions.Slice(0, 0, q_pe.size(0)),
                                         rope_table, q_pe, kv_c, k_pe, meta.slot_mapping, cache_,
                                         latent_norm));
  }
  NodeScope scope(stream, NodeName("mla"), OpKind::kKernel);
  if (meta.decode_only) {
    return MlaDecode(stream, q_latent, q_pe, cache_, meta.block_table, meta.seq_lens,
                     softmax_scale_, out_latent, lse, decode_workspace_);
  }
  return MlaPrefill(stream, q_latent, q_pe, cache_, meta.block_table, meta.seq_lens,
                    meta.query_start_loc, softmax_scale_, out_latent, lse);
}

absl::Status MlaAttention::ExpandOutput(Stream& stream, const Tensor& out_latent,
                                        const Tensor& v) const {
  NodeScope scope(stream, NodeName("v_up"), OpKind::kGemm);
  return HeadMatmul(stream, out_latent, w_uv_, /*transpose_w=*/true, v);
}

}  // namespace mlag
