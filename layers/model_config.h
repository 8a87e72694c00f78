// The shape and behaviour of a DeepSeek-V2/V3 model, as config.json states it
// (DeepseekV2Config / DeepseekV3Config in Hugging Face transformers). Parsing
// and writing config.json live in runtime/checkpoint/model_config_json.h; this struct is what the
// layers are built from.
#pragma once

#include <string>

#include "kernels/moe.h"
#include "kernels/rope.h"

namespace mlag {

struct ModelConfig {
  std::string model_type = "deepseek_v3";  // "deepseek_v2" or "deepseek_v3"
  int vocab_size = 0;
  int hidden_size = 0;            // D
  int intermediate_size = 0;      // I: dense MLP width
  int moe_intermediate_size = 0;  // Im: routed expert width
  int num_hidden_layers = 0;
  int num_attention_heads = 0;  // H
  int n_shared_experts = 0;     // S: shared expert width is S * Im
  int n_routed_experts = 0;     // E
  int num_experts_per_tok = 0;  // K
  float routed_scaling_factor = 1.0f;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int q_lora_rank = 0;       // 0: no q LoRA (q_proj), as config's null
  int kv_lora_rank = 0;      // Rkv
  int qk_nope_head_dim = 0;  // dn
  int qk_rope_head_dim = 0;  // dr
  int v_head_dim = 0;        // dv
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 0;
  RopeParams rope;  // rotary_dim == qk_rope_head_dim
  bool tie_word_embeddings = false;
  // DeepSeek-V3's multi-token-prediction layers, stored after the decoder
  // layers (model.layers.<num_hidden_layers + i>.*). Not used for decoding:
  // the loader recognises and skips them. config.json's value, or when it is
  // absent 1 for deepseek_v3 (the default of DeepSeek's
  // configuration_deepseek.py) and 0 for deepseek_v2.
  int num_nextn_predict_layers = 0;
  // quantization_config: fp8 e4m3 weights with 128 x 128 block scales
  // (DeepSeek-V3's layout). Each tensor's dtype is still read from the
  // checkpoint; this says how export writes it.
  bool fp8_block_quantized = false;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Width of one latent cache row: Rkv + dr (576 for V2/V3).
  int kv_cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
  // Layer i uses MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
  bool IsMoeLayer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  RoutingParams routing() const {
    RoutingParams r;
    r.num_experts = n_routed_experts;
    r.top_k = num_experts_per_tok;
    r.n_group = n_group;
    r.topk_group = topk_group;
    r.scoring = scoring_func;
    r.method = topk_method;
    r.norm_topk_prob = norm_topk_prob;
    r.routed_scaling_factor = routed_scaling_factor;
    return r;
  }
};

}  // namespace mlag
