#include "runtime/checkpoint/hf_layout.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mlag {

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const int64_t D = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads;
  const int64_t R = c.kv_lora_rank, dr = c.qk_rope_head_dim, dq = c.qk_head_dim();
  std::vector<TensorSpec> t;
  auto add = [&](std::string name, std::vector<int64_t> shape, TensorRole role) {
    t.push_back({std::move(name), std::move(shape), role});
  };
  add("model.embed_tokens.weight", {V, D}, TensorRole::kEmbedding);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    const std::string a = l + "self_attn.";
    add(l + "input_layernorm.weight", {D}, TensorRole::kNorm);
    if (c.q_lora_rank > 0) {
      add(a + "q_a_proj.weight", {c.q_lora_rank, D}, TensorRole::kLinear);
      add(a + "q_a_layernorm.weight", {c.q_lora_rank}, TensorRole::kNorm);
      add(a + "q_b_proj.weight", {H * dq, c.q_lora_rank}, TensorRole::kLinear);
    } else {
      add(a + "q_proj.weight", {H * dq, D}, TensorRole::kLinear);
    }
    add(a + "kv_a_proj_with_mqa.weight", {R + dr, D}, TensorRole::kLinear);
    add(a + "kv_a_layernorm.weight", {R}, TensorRole::kNorm);
    add(a + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), R}, TensorRole::kLinear);
    add(a + "o_proj.weight", {D, H * c.v_head_dim}, TensorRole::kLinear);
    add(l + "post_attention_layernorm.weight", {D}, TensorRole::kNorm);
    const std::string m = l + "mlp.";
    if (c.IsMoeLayer(i)) {
      const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
      add(m + "gate.weight", {E, D}, TensorRole::kRouterGate);
      if (c.topk_method == TopkMethod::kNoauxTc) {
        add(m + "gate.e_score_correction_bias", {E}, TensorRole::kCorrectionBias);
      }
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = absl::StrCat(m, "experts.", e, ".");
        add(x + "gate_proj.weight", {I, D}, TensorRole::kLinear);
        add(x + "up_proj.weight", {I, D}, TensorRole::kLinear);
        add(x + "down_proj.weight", {D, I}, TensorRole::kLinear);
      }
      if (c.n_shared_experts > 0) {
        const int64_t S = int64_t{c.n_shared_experts} * I;
        add(m + "shared_experts.gate_proj.weight", {S, D}, TensorRole::kLinear);
        add(m + "shared_experts.up_proj.weight", {S, D}, TensorRole::kLinear);
        add(m + "shared_experts.down_proj.weight", {D, S}, TensorRole::kLinear);
      }
    } else {
      const int64_t I = c.intermediate_size;
      add(m + "gate_proj.weight", {I, D}, TensorRole::kLinear);
      add(m + "up_proj.weight", {I, D}, TensorRole::kLinear);
      add(m + "down_proj.weight", {D, I}, TensorRole::kLinear);
    }
  }
  add("model.norm.weight", {D}, TensorRole::kNorm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, D}, TensorRole::kLinear);
  return t;
}

bool QuantizedInFp8Checkpoints(const TensorSpec& spec) {
  return spec.role == TensorRole::kLinear && spec.name != "lm_head.weight";
}

bool IsIgnorableTensor(const ModelConfig& config, const std::string& name) {
  if (absl::EndsWith(name, "rotary_emb.inv_freq")) return true;
  return absl::StartsWith(name, absl::StrCat("model.layers.", config.num_hidden_layers, "."));
}

}  // namespace mlag
