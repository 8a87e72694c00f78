// config.json parsing: the released V3 / V2 / V2-Lite
// configs, both rope forms, an error naming the field for every bad input,
// and ModelConfigToJson -> ParseModelConfig round trips.
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_config_json.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// The released configs, abbreviated to the fields that matter (plus a few
// bookkeeping fields the parser must ignore).
const char* const kV3Config = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "model_type": "deepseek_v3",
  "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
  "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4,
  "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
  "use_cache": true, "v_head_dim": 128, "vocab_size": 129280
})";

const char* const kV2Config = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "model_type": "deepseek_v2",
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 5120,
  "intermediate_size": 12288, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "moe_intermediate_size": 1536, "moe_layer_freq": 1, "n_group": 8,
  "n_routed_experts": 160, "n_shared_experts": 2, "norm_topk_prob": false,
  "num_attention_heads": 128, "num_experts_per_tok": 6, "num_hidden_layers": 60,
  "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 16.0, "scoring_func": "softmax",
  "tie_word_embeddings": false, "topk_group": 3, "topk_method": "group_limited_greedy",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400
})";

const char* const kV2LiteConfig = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "model_type": "deepseek_v2",
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
  "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
  "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400
})";

ModelConfig MustParse(const std::string& text) {
  auto c = ParseModelConfig(text, "config.json");
  EXPECT_OK(c);
  return c.ok() ? *c : ModelConfig{};
}

void ExpectSameRope(const RopeParams& a, const RopeParams& b) {
  EXPECT_EQ(a.rotary_dim, b.rotary_dim);
  EXPECT_EQ(a.theta, b.theta);
  EXPECT_EQ(a.yarn, b.yarn);
  if (a.yarn && b.yarn) {
    EXPECT_EQ(a.factor, b.factor);
    EXPECT_EQ(a.original_max_position, b.original_max_position);
    EXPECT_EQ(a.beta_fast, b.beta_fast);
    EXPECT_EQ(a.beta_slow, b.beta_slow);
    EXPECT_EQ(a.mscale, b.mscale);
    EXPECT_EQ(a.mscale_all_dim, b.mscale_all_dim);
  }
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.n_routed_experts, b.n_routed_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.topk_method, b.topk_method);
  EXPECT_EQ(a.scoring_func, b.scoring_func);
  EXPECT_EQ(a.n_group, b.n_group);
  EXPECT_EQ(a.topk_group, b.topk_group);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.first_k_dense_replace, b.first_k_dense_replace);
  EXPECT_EQ(a.moe_layer_freq, b.moe_layer_freq);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.num_nextn_predict_layers, b.num_nextn_predict_layers);
  ExpectSameRope(a.rope, b.rope);
}

// ---- the released configs --------------------------------------------------------

TEST(ModelConfigTest, ParsesV3) {
  const ModelConfig c = MustParse(kV3Config);
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.kv_cache_row(), 576);
  EXPECT_FALSE(c.IsMoeLayer(2));
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_EQ(c.rope.beta_fast, 32.0);
  EXPECT_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.mscale, 1.0);
  EXPECT_EQ(c.rope.mscale_all_dim, 1.0);
  const RoutingParams r = c.routing();
  EXPECT_EQ(r.num_experts, 256);
  EXPECT_EQ(r.top_k, 8);
  EXPECT_EQ(r.method, TopkMethod::kNoauxTc);
}

TEST(ModelConfigTest, ParsesV2) {
  const ModelConfig c = MustParse(kV2Config);
  EXPECT_EQ(c.model_type, "deepseek_v2");
  EXPECT_EQ(c.vocab_size, 102400);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 60);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.n_routed_experts, 160);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.routed_scaling_factor, 16.0f);
  EXPECT_EQ(c.topk_method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 3);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.mscale, 0.707);
  EXPECT_EQ(c.rope.mscale_all_dim, 0.707);
}

TEST(ModelConfigTest, ParsesV2Lite) {
  const ModelConfig c = MustParse(kV2LiteConfig);
  EXPECT_EQ(c.model_type, "deepseek_v2");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.routed_scaling_factor, 1.0f);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.q_lora_rank, 0);  // null
  EXPECT_EQ(c.rope.mscale, 0.707);
}

// ---- rope forms ----------------------------------------------------------------

json V3Json() { return json::parse(kV3Config); }

ModelConfig ParseJson(const json& j) { return MustParse(j.dump()); }

TEST(ModelConfigTest, RopeParametersFormMatchesRopeScaling) {
  const ModelConfig want = MustParse(kV3Config);
  json j = V3Json();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0},
                          {"factor", 40},        {"original_max_position_embeddings", 4096},
                          {"beta_fast", 32},     {"beta_slow", 1},
                          {"mscale", 1.0},       {"mscale_all_dim", 1.0}};
  ExpectSameConfig(ParseJson(j), want);

  // rope_scaling spelled with "rope_type", and both dicts present and agreeing.
  json k = V3Json();
  k["rope_scaling"].erase("type");
  k["rope_scaling"]["rope_type"] = "yarn";
  k["rope_parameters"] = j["rope_parameters"];
  ExpectSameConfig(ParseJson(k), want);

  // A different theta inside rope_parameters is used.
  j["rope_parameters"]["rope_theta"] = 50000.0;
  EXPECT_EQ(ParseJson(j).rope.theta, 50000.0);
}

TEST(ModelConfigTest, PlainRope) {
  json j = V3Json();
  j["rope_scaling"] = nullptr;
  ModelConfig c = ParseJson(j);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.rotary_dim, 64);

  j.erase("rope_scaling");
  j.erase("rope_theta");  // HF default 10000
  c = ParseJson(j);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.rope.theta, 10000.0);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123.0}};
  c = ParseJson(j);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.rope.theta, 123.0);
}

TEST(ModelConfigTest, YarnDefaultsAsDeepSeek) {
  json j = V3Json();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
  const ModelConfig c = ParseJson(j);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_EQ(c.rope.beta_fast, 32.0);
  EXPECT_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.mscale, 1.0);
  EXPECT_EQ(c.rope.mscale_all_dim, 0.0);
}

TEST(ModelConfigTest, HfDefaultsForAbsentOptionalFields) {
  // A dense model: no MoE fields at all.
  const char* text = R"({"model_type": "deepseek_v2", "vocab_size": 1024, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
    "q_lora_rank": null, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 24})";
  const ModelConfig c = MustParse(text);
  EXPECT_EQ(c.n_routed_experts, 0);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_FALSE(c.IsMoeLayer(1));
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c.routed_scaling_factor, 1.0f);
  EXPECT_EQ(c.first_k_dense_replace, 0);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);  // V2 has no multi-token prediction
  // V3 without the field: transformers' default, one MTP layer.
  json v3 = V3Json();
  v3.erase("num_nextn_predict_layers");
  EXPECT_EQ(ParseJson(v3).num_nextn_predict_layers, 1);
  v3["num_nextn_predict_layers"] = 0;
  EXPECT_EQ(ParseJson(v3).num_nextn_predict_layers, 0);
}

TEST(ModelConfigTest, ModelTypeFromArchitectures) {
  json j = V3Json();
  j.erase("model_type");
  EXPECT_EQ(ParseJson(j).model_type, "deepseek_v3");
}

// ---- errors name the field --------------------------------------------------------

struct BadConfig {
  const char* label;
  std::function<void(json&)> mutate;
  std::string field;  // must appear in the message
};

TEST(ModelConfigTest, EveryErrorNamesItsField) {
  const std::vector<BadConfig> cases = {
      {"unknown_topk_method", [](json& j) { j["topk_method"] = "best"; }, "topk_method"},
      {"unknown_scoring_func", [](json& j) { j["scoring_func"] = "tanh"; }, "scoring_func"},
      {"topk_method_not_string", [](json& j) { j["topk_method"] = 3; }, "topk_method"},
      {"noaux_tc_with_softmax", [](json& j) { j["scoring_func"] = "softmax"; }, "topk_method"},
      {"experts_not_divisible", [](json& j) { j["n_routed_experts"] = 250; }, "n_group"},
      {"topk_group_above_n_group", [](json& j) { j["topk_group"] = 9; }, "topk_group"},
      {"top_k_above_experts", [](json& j) { j["num_experts_per_tok"] = 257; },
       "num_experts_per_tok"},
      {"top_k_above_kept_groups",
       [](json& j) {
         j["topk_group"] = 1;
         j["num_experts_per_tok"] = 33;
       },
       "num_experts_per_tok"},
      {"odd_rope_dim", [](json& j) { j["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim"},
      {"zero_hidden", [](json& j) { j["hidden_size"] = 0; }, "hidden_size"},
      {"negative_heads", [](json& j) { j["num_attention_heads"] = -4; }, "num_attention_heads"},
      {"zero_q_lora", [](json& j) { j["q_lora_rank"] = 0; }, "q_lora_rank"},
      {"zero_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = 0; },
       "num_experts_per_tok"},
      {"negative_shared", [](json& j) { j["n_shared_experts"] = -1; }, "n_shared_experts"},
      {"zero_moe_layer_freq", [](json& j) { j["moe_layer_freq"] = 0; }, "moe_layer_freq"},
      {"string_size", [](json& j) { j["hidden_size"] = "big"; }, "hidden_size"},
      {"fractional_size", [](json& j) { j["hidden_size"] = 7168.5; }, "hidden_size"},
      {"bool_size", [](json& j) { j["vocab_size"] = true; }, "vocab_size"},
      {"huge_size", [](json& j) { j["vocab_size"] = 1e12; }, "vocab_size"},
      {"array_layers", [](json& j) { j["num_hidden_layers"] = json::array({61}); },
       "num_hidden_layers"},
      {"string_bool", [](json& j) { j["norm_topk_prob"] = "yes"; }, "norm_topk_prob"},
      {"string_eps", [](json& j) { j["rms_norm_eps"] = "1e-6"; }, "rms_norm_eps"},
      {"zero_eps", [](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
      {"negative_theta", [](json& j) { j["rope_theta"] = -1; }, "rope_theta"},
      {"zero_scaling_factor", [](json& j) { j["routed_scaling_factor"] = 0; },
       "routed_scaling_factor"},
      {"float_overflowing_scaling_factor", [](json& j) { j["routed_scaling_factor"] = 1e300; },
       "routed_scaling_factor"},
      {"float_overflowing_eps", [](json& j) { j["rms_norm_eps"] = 1e39; }, "rms_norm_eps"},
      {"implausible_v_head_dim", [](json& j) { j["v_head_dim"] = 2147483000; }, "v_head_dim"},
      {"implausible_positions", [](json& j) { j["max_position_embeddings"] = 2147483647; },
       "max_position_embeddings"},
      {"implausible_experts", [](json& j) { j["n_routed_experts"] = 1000000000; },
       "n_routed_experts"},
      {"implausible_layers", [](json& j) { j["num_hidden_layers"] = 100000; }, "num_hidden_layers"},
      {"negative_nextn", [](json& j) { j["num_nextn_predict_layers"] = -1; },
       "num_nextn_predict_layers"},
      {"quant_method_missing", [](json& j) { j["quantization_config"].erase("quant_method"); },
       "quantization_config.quant_method"},
      {"unknown_rope_type", [](json& j) { j["rope_scaling"]["type"] = "linear"; },
       "rope_scaling.type"},
      {"rope_type_missing", [](json& j) { j["rope_scaling"].erase("type"); },
       "rope_scaling.rope_type"},
      {"rope_types_disagree", [](json& j) { j["rope_scaling"]["rope_type"] = "default"; },
       "rope_scaling.rope_type"},
      {"yarn_without_factor", [](json& j) { j["rope_scaling"].erase("factor"); },
       "rope_scaling.factor"},
      {"yarn_factor_string", [](json& j) { j["rope_scaling"]["factor"] = "40"; },
       "rope_scaling.factor"},
      {"unknown_rope_key", [](json& j) { j["rope_scaling"]["attention_factor"] = 2.0; },
       "rope_scaling.attention_factor"},
      {"rope_scaling_not_object", [](json& j) { j["rope_scaling"] = "yarn"; }, "rope_scaling"},
      {"unknown_rope_parameters_type",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "llama3"}};
       },
       "rope_parameters.rope_type"},
      {"rope_forms_contradict",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 8}};
       },
       "rope_parameters"},
      {"rope_theta_contradicts",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5.0}};
       },
       "rope_parameters.rope_theta"},
      {"unknown_model_type", [](json& j) { j["model_type"] = "llama"; }, "model_type"},
      {"no_model_type",
       [](json& j) {
         j.erase("model_type");
         j.erase("architectures");
       },
       "model_type"},
      {"architecture_contradicts",
       [](json& j) { j["architectures"] = json::array({"DeepseekV2ForCausalLM"}); },
       "architectures"},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"attention_bias", [](json& j) { j["attention_bias"] = true; }, "attention_bias"},
      {"grouped_without_n_group", [](json& j) { j["n_group"] = nullptr; }, "n_group"},
      {"grouped_without_topk_group", [](json& j) { j.erase("topk_group"); }, "topk_group"},
      {"noaux_tc_group_of_one",
       [](json& j) {
         j["n_group"] = 256;
         j["topk_group"] = 8;
       },
       "n_group"},
      {"moe_without_top_k", [](json& j) { j.erase("num_experts_per_tok"); }, "num_experts_per_tok"},
      {"moe_with_null_top_k", [](json& j) { j["num_experts_per_tok"] = nullptr; },
       "num_experts_per_tok"},
      {"moe_without_width", [](json& j) { j.erase("moe_intermediate_size"); },
       "moe_intermediate_size"},
  };
  for (const char* required :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
        "qk_rope_head_dim", "v_head_dim"}) {
    SCOPED_TRACE(required);
    json j = V3Json();
    j.erase(required);
    auto c = ParseModelConfig(j.dump(), "cfg/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(std::string("'") + required + "'"));
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("cfg/config.json"));
  }
  for (const BadConfig& bad : cases) {
    SCOPED_TRACE(bad.label);
    json j = V3Json();
    bad.mutate(j);
    auto c = ParseModelConfig(j.dump(), "cfg/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("'" + bad.field + "'"));
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("cfg/config.json"));
  }
}

TEST(ModelConfigTest, MalformedTextIsAnError) {
  for (const char* text : {"", "{", "[1, 2]", "\"config\"", "{\"hidden_size\": 1,}"}) {
    SCOPED_TRACE(text);
    auto c = ParseModelConfig(text, "cfg/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("cfg/config.json"));
  }
  // Text after a NUL byte is not silently ignored.
  const std::string nul = std::string(kV3Config) + std::string(1, '\0') + "{}";
  auto after_nul = ParseModelConfig(nul, "cfg/config.json");
  ASSERT_FALSE(after_nul.ok());
  EXPECT_THAT(std::string(after_nul.status().message()), HasSubstr("NUL"));
  // A field given twice is ambiguous: an error naming it.
  std::string text = kV3Config;
  text.insert(text.find('{') + 1, "\"hidden_size\": 1024,");
  auto c = ParseModelConfig(text, "cfg/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("hidden_size"));
}

// ---- round trips ---------------------------------------------------------------

TEST(ModelConfigTest, ToJsonRoundTrips) {
  for (const char* text : {kV3Config, kV2Config, kV2LiteConfig}) {
    const ModelConfig c = MustParse(text);
    const json j = ModelConfigToJson(c);
    const ModelConfig back = MustParse(j.dump(2));
    ExpectSameConfig(back, c);
    EXPECT_EQ(ModelConfigToJson(back), j);
    EXPECT_EQ(j["model_type"], c.model_type);
    EXPECT_EQ(j["torch_dtype"], "bfloat16");
    EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
    EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-6);  // written as 1e-06, not 9.99e-07
  }
  const json v3 = ModelConfigToJson(MustParse(kV3Config));
  EXPECT_EQ(v3["architectures"], json::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(v3["q_lora_rank"], 1536);
  EXPECT_EQ(v3["topk_method"], "noaux_tc");
  EXPECT_EQ(v3["scoring_func"], "sigmoid");
  const json lite = ModelConfigToJson(MustParse(kV2LiteConfig));
  EXPECT_EQ(lite["architectures"], json::array({"DeepseekV2ForCausalLM"}));
  EXPECT_TRUE(lite["q_lora_rank"].is_null());

  // tiny-v3's config (odd float values), and a dense config with plain rope.
  ModelConfig a;
  a.model_type = "deepseek_v3";
  a.vocab_size = 1024;
  a.hidden_size = 256;
  a.intermediate_size = 512;
  a.moe_intermediate_size = 112;
  a.num_hidden_layers = 4;
  a.num_attention_heads = 8;
  a.q_lora_rank = 96;
  a.kv_lora_rank = 64;
  a.qk_nope_head_dim = 32;
  a.qk_rope_head_dim = 16;
  a.v_head_dim = 24;
  a.n_routed_experts = 16;
  a.num_experts_per_tok = 4;
  a.n_group = 4;
  a.topk_group = 2;
  a.n_shared_experts = 1;
  a.routed_scaling_factor = 2.5f;
  a.scoring_func = ScoringFunc::kSigmoid;
  a.topk_method = TopkMethod::kNoauxTc;
  a.norm_topk_prob = true;
  a.first_k_dense_replace = 1;
  a.rms_norm_eps = 1e-6f;
  a.max_position_embeddings = 256;
  a.rope.rotary_dim = 16;
  a.rope.theta = 100;
  a.rope.yarn = true;
  a.rope.factor = 4;
  a.rope.original_max_position = 64;
  a.rope.mscale = 0.707;
  a.rope.mscale_all_dim = 0.707;
  ExpectSameConfig(MustParse(ModelConfigToJson(a).dump()), a);

  ModelConfig dense = a;
  dense.model_type = "deepseek_v2";
  dense.n_routed_experts = 0;
  dense.num_experts_per_tok = 0;
  dense.n_shared_experts = 0;
  dense.topk_method = TopkMethod::kGreedy;
  dense.scoring_func = ScoringFunc::kSoftmax;
  dense.routed_scaling_factor = 1.1f;
  dense.rms_norm_eps = 3.3e-5f;
  dense.rope.yarn = false;
  dense.q_lora_rank = 0;
  dense.tie_word_embeddings = true;
  const json dj = ModelConfigToJson(dense);
  EXPECT_TRUE(dj["rope_scaling"].is_null());
  ExpectSameConfig(MustParse(dj.dump()), dense);
}

TEST(ModelConfigTest, LoadFromFile) {
  std::string pattern = ::testing::TempDir();
  if (pattern.empty() || pattern.back() != '/') pattern += '/';
  pattern += "mlag_cfg_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  ASSERT_NE(::mkdtemp(buf.data()), nullptr);
  const std::string dir(buf.data());
  {
    std::ofstream out(dir + "/config.json");
    out << kV2LiteConfig;
  }
  auto c = LoadModelConfig(dir + "/config.json");
  ASSERT_OK(c);
  EXPECT_EQ(c->hidden_size, 2048);

  auto missing = LoadModelConfig(dir + "/absent.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("absent.json"));

  {
    std::ofstream out(dir + "/bad.json");
    out << R"({"model_type": "deepseek_v2", "hidden_size": "big"})";
  }
  auto bad = LoadModelConfig(dir + "/bad.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(dir + "/bad.json"));
}

// DeepSeek-V3's multi-token-prediction layer 61, as the released checkpoint
// names its tensors (written out here, not generated by hf_layout): skipped
// whole; a tensor of a layer past it, or unknown inside it, is not.
TEST(HfLayoutTest, SkipsDeepSeekV3sMultiTokenPredictionLayerWhole) {
  const ModelConfig c = MustParse(kV3Config);
  ASSERT_EQ(c.num_hidden_layers, 61);
  ASSERT_EQ(c.num_nextn_predict_layers, 1);
  std::vector<std::string> mtp;
  auto fp8 = [&mtp](const std::string& name) {  // an fp8 projection and its block scales
    mtp.push_back(name + ".weight");
    mtp.push_back(name + ".weight_scale_inv");
  };
  const std::string l = "model.layers.61.";
  for (const char* p : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}) {
    fp8(l + "self_attn." + p);
  }
  for (const char* n :
       {"self_attn.q_a_layernorm.weight", "self_attn.kv_a_layernorm.weight",
        "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias", "embed_tokens.weight", "enorm.weight", "hnorm.weight",
        "shared_head.norm.weight", "shared_head.head.weight"}) {
    mtp.push_back(l + n);
  }
  for (int e = 0; e < 256; ++e) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      fp8(absl::StrCat(l, "mlp.experts.", e, ".", p));
    }
  }
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) fp8(l + "mlp.shared_experts." + p);
  fp8(l + "eh_proj");
  ASSERT_EQ(mtp.size(), 1565u);

  std::vector<std::string> unread = mtp;
  unread.push_back("model.layers.3.self_attn.rotary_emb.inv_freq");
  const UnreadTensors clean = SortUnreadTensors(c, unread);
  EXPECT_THAT(clean.unexpected, ::testing::IsEmpty());
  EXPECT_EQ(clean.mtp_layers, (std::vector<std::pair<int, int>>{{61, 1565}}));

  unread.push_back("model.layers.61.mlp.bogus.weight");
  unread.push_back("model.layers.62.enorm.weight");  // past num_nextn_predict_layers
  const UnreadTensors extra = SortUnreadTensors(c, unread);
  EXPECT_EQ(extra.unexpected, (std::vector<std::string>{"model.layers.61.mlp.bogus.weight",
                                                        "model.layers.62.enorm.weight"}));
  EXPECT_EQ(extra.mtp_layers, clean.mtp_layers);

  // Without eh_proj, layer 61 is no MTP layer: all of it is unexpected.
  std::vector<std::string> no_eh_proj;
  for (const std::string& name : mtp) {
    if (name.find("eh_proj") == std::string::npos) no_eh_proj.push_back(name);
  }
  const UnreadTensors plain = SortUnreadTensors(c, no_eh_proj);
  EXPECT_EQ(plain.unexpected, no_eh_proj);
  EXPECT_THAT(plain.mtp_layers, ::testing::IsEmpty());
}

}  // namespace
}  // namespace mlag
