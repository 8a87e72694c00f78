#include "layers/mla_block.h"

#include "absl/strings/str_cat.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {
// q_a_layernorm and kv_a_layernorm use 1e-6 whatever rms_norm_eps says.
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

MlaBlock::MlaBlock(int layer, const ModelConfig& config) : layer_(layer), config_(config) {
  MlaDims dims;
  dims.num_heads = config.num_attention_heads;
  dims.kv_lora_rank = config.kv_lora_rank;
  dims.qk_nope_head_dim = config.qk_nope_head_dim;
  dims.qk_rope_head_dim = config.qk_rope_head_dim;
  dims.v_head_dim = config.v_head_dim;
  attention_ = std::make_unique<MlaAttention>(layer, dims,
                                              MlaSoftmaxScale(config.qk_head_dim(), config.rope));
}

std::string MlaBlock::Node(const char* op) const {
  return absl::StrCat("layers.", layer_, ".attn.", op);
}

absl::Status MlaBlock::Load(WeightArena& arena, WeightSource& source) {
  const ModelConfig& c = config_;
  const std::string p = absl::StrCat("model.layers.", layer_, ".self_attn.");
  const int64_t D = c.hidden_size, H = c.num_attention_heads, R = c.kv_lora_rank;
  const int64_t dq = c.qk_head_dim();
  if (c.q_lora_rank > 0) {
    MLAG_ASSIGN_OR_RETURN(w_q_a_,
                          arena.LoadLinear(source, p + "q_a_proj.weight", {c.q_lora_rank, D}));
    MLAG_ASSIGN_OR_RETURN(w_q_a_norm_,
                          arena.Load(source, p + "q_a_layernorm.weight", {c.q_lora_rank}));
    MLAG_ASSIGN_OR_RETURN(w_q_b_,
                          arena.LoadLinear(source, p + "q_b_proj.weight", {H * dq, c.q_lora_rank}));
  } else {
    MLAG_ASSIGN_OR_RETURN(w_q_, arena.LoadLinear(source, p + "q_proj.weight", {H * dq, D}));
  }
  MLAG_ASSIGN_OR_RETURN(w_kv_a_, arena.LoadLinear(source, p + "kv_a_proj_with_mqa.weight",
                                                  {R + c.qk_rope_head_dim, D}));
  MLAG_ASSIGN_OR_RETURN(w_kv_a_norm_, arena.Load(source, p + "kv_a_layernorm.weight", {R}));
  MLAG_ASSIGN_OR_RETURN(
      std::vector<float> kv_b,
      arena.ReadHost(source, p + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), R}));
  MLAG_RETURN_IF_ERROR(attention_->SetKvB(arena, kv_b));
  MLAG_ASSIGN_OR_RETURN(w_o_, arena.LoadLinear(source, p + "o_proj.weight", {D, H * c.v_head_dim}));
  return absl::OkStatus();
}

void MlaBlock::PlanWeights(WeightPlan& plan) const {
  const ModelConfig& c = config_;
  const std::string p = absl::StrCat("model.layers.", layer_, ".self_attn.");
  const int64_t D = c.hidden_size, H = c.num_attention_heads, R = c.kv_lora_rank;
  const int64_t dq = c.qk_head_dim();
  if (c.q_lora_rank > 0) {
    plan.AddLinear(p + "q_a_proj.weight", {c.q_lora_rank, D});
    plan.Add({c.q_lora_rank});
    plan.AddLinear(p + "q_b_proj.weight", {H * dq, c.q_lora_rank});
  } else {
    plan.AddLinear(p + "q_proj.weight", {H * dq, D});
  }
  plan.AddLinear(p + "kv_a_proj_with_mqa.weight", {R + c.qk_rope_head_dim, D});
  plan.Add({R});
  // kv_b_proj, split by SetKvB into W_UK and W_UV, f32.
  plan.Add({H, R, c.qk_nope_head_dim});
  plan.Add({H, c.v_head_dim, R});
  plan.AddLinear(p + "o_proj.weight", {D, H * c.v_head_dim});
}

absl::Status MlaBlock::Forward(Stream& stream, const AttentionMetadata& meta,
                               const Tensor& rope_table, const ActivationBuffers& acts,
                               const Tensor& x_in, const Tensor& out_in) const {
  const ModelConfig& c = config_;
  const int64_t T = meta.num_tokens, H = c.num_attention_heads, R = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dq = c.qk_head_dim();
  const Tensor x = Rows(x_in, T), out = Rows(out_in, T);
  const Tensor q = Rows(acts.q, T);

  // Query projections.
  if (c.q_lora_rank > 0) {
    const Tensor q_a = Rows(acts.q_a, T);
    {
      NodeScope s(stream, Node("q_a_proj"), OpKind::kGemm);
      MLAG_RETURN_IF_ERROR(Linear(stream, x, w_q_a_, q_a));
    }
    {
      NodeScope s(stream, Node("q_a_norm"), OpKind::kKernel);
      MLAG_RETURN_IF_ERROR(RmsNorm(stream, q_a, w_q_a_norm_, kLatentNormEps, q_a));
    }
    NodeScope s(stream, Node("q_b_proj"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(Linear(stream, q_a, w_q_b_, q));
  } else {
    NodeScope s(stream, Node("q_proj"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(Linear(stream, x, w_q_, q));
  }

  // Latent KV: [c_raw | k_pe] = W_kva x; c_kv = RMSNorm(c_raw); k_pe unnormed.
  // The norm, and rope on q_pe of every head and on the shared k_pe (in
  // place), happen in the attention's kv_update node, fused with the cache
  // write.
  const Tensor kv_a = Rows(acts.kv_a, T);
  {
    NodeScope s(stream, Node("kv_a_proj"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(Linear(stream, x, w_kv_a_, kv_a));
  }
  MLAG_ASSIGN_OR_RETURN(Tensor q3, q.Reshape({T, H, dq}));
  const Tensor q_nope = q3.Slice(2, 0, dn);
  const Tensor q_pe = q3.Slice(2, dn, dq);
  const Tensor k_pe = kv_a.Slice(1, R, R + dr);

  // Absorbed attention in the latent space, then back to per-head values.
  const Tensor q_latent = Rows(acts.q_latent, T);
  const Tensor out_latent = Rows(acts.out_latent, T);
  MLAG_RETURN_IF_ERROR(attention_->AbsorbQuery(stream, q_nope, q_latent));
  const KvLatentNorm latent_norm{w_kv_a_norm_, kLatentNormEps};
  MLAG_RETURN_IF_ERROR(attention_->Forward(stream, meta, rope_table, kv_a.Slice(1, 0, R),
                                           &latent_norm, k_pe, q_latent, q_pe, out_latent,
                                           Rows(acts.lse, T)));
  const Tensor v = Rows(acts.v, T);
  MLAG_ASSIGN_OR_RETURN(Tensor v3, v.Reshape({T, H, int64_t{c.v_head_dim}}));
  MLAG_RETURN_IF_ERROR(attention_->ExpandOutput(stream, out_latent, v3));

  NodeScope s(stream, Node("o_proj"), OpKind::kGemm);
  return Linear(stream, v, w_o_, out);
}

}  // namespace mlag
