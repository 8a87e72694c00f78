#include "runtime/checkpoint/hf_layout.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mlag {

namespace {

// The tensors of decoder layer i (MoE or dense as the config's pattern says).
void AddDecoderLayer(const ModelConfig& c, int i, std::vector<TensorSpec>& t) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  const int64_t R = c.kv_lora_rank, dr = c.qk_rope_head_dim, dq = c.qk_head_dim();
  auto add = [&t](std::string name, std::vector<int64_t> shape, TensorRole role) {
    t.push_back({std::move(name), std::move(shape), role});
  };
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

// The tensor names of multi-token-prediction layer `layer`: a decoder layer
// and the module around it (DeepSeek-V3's modeling: embed_tokens, enorm,
// hnorm, eh_proj, shared_head).
absl::flat_hash_set<std::string> MtpLayerTensors(const ModelConfig& c, int layer) {
  std::vector<TensorSpec> specs;
  AddDecoderLayer(c, layer, specs);
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& spec : specs) names.insert(spec.name);
  const std::string l = absl::StrCat("model.layers.", layer, ".");
  for (const char* own : {"embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
                          "shared_head.norm.weight", "shared_head.head.weight"}) {
    names.insert(l + own);
  }
  return names;
}

}  // namespace

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const int64_t D = c.hidden_size, V = c.vocab_size;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {V, D}, TensorRole::kEmbedding});
  for (int i = 0; i < c.num_hidden_layers; ++i) AddDecoderLayer(c, i, t);
  t.push_back({"model.norm.weight", {D}, TensorRole::kNorm});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {V, D}, TensorRole::kLinear});
  return t;
}

bool QuantizedInFp8Checkpoints(const TensorSpec& spec) {
  return spec.role == TensorRole::kLinear && spec.name != "lm_head.weight";
}

int LayerIndexOf(const std::string& name) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(name, kPrefix)) return -1;
  const size_t dot = name.find('.', kPrefix.size());
  int layer = -1;
  if (dot == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(name).substr(kPrefix.size(), dot - kPrefix.size()),
                        &layer)) {
    return -1;
  }
  return layer;
}

UnreadTensors SortUnreadTensors(const ModelConfig& config, const std::vector<std::string>& unread) {
  const int first_mtp = config.num_hidden_layers;
  const int end_mtp = first_mtp + config.num_nextn_predict_layers;
  // The unread tensors of each layer where an MTP layer may sit.
  std::map<int, std::vector<const std::string*>> candidates;
  for (const std::string& name : unread) {
    const int layer = LayerIndexOf(name);
    if (layer >= first_mtp && layer < end_mtp) candidates[layer].push_back(&name);
  }
  UnreadTensors out;
  // An MTP layer's tensors, skipped; anything else in such a layer stays
  // unexpected (named in the error), as does every tensor of a layer without
  // eh_proj (not an MTP layer at all).
  absl::flat_hash_set<const std::string*> skipped;
  for (const auto& [layer, names] : candidates) {
    const absl::flat_hash_set<std::string> mtp = MtpLayerTensors(config, layer);
    const std::string eh_proj = absl::StrCat("model.layers.", layer, ".eh_proj.weight");
    if (std::none_of(names.begin(), names.end(),
                     [&](const std::string* name) { return *name == eh_proj; })) {
      continue;
    }
    int tensors = 0;
    for (const std::string* name : names) {
      // A block scale belongs with its weight.
      absl::string_view base = *name;
      absl::ConsumeSuffix(&base, "_scale_inv");
      if (mtp.contains(base)) {
        skipped.insert(name);
        ++tensors;
      }
    }
    out.mtp_layers.emplace_back(layer, tensors);
  }
  for (const std::string& name : unread) {
    if (absl::EndsWith(name, "rotary_emb.inv_freq") || skipped.contains(&name)) continue;
    out.unexpected.push_back(name);
  }
  return out;
}

}  // namespace mlag
