#include "runtime/checkpoint/model_config_json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/core/file.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

using json = nlohmann::json;

// Plausible maxima of config.json's sizes. DeepSeek-V3 (vocab 129280,
// hidden 7168, 61 layers, 128 heads, 256 experts of width 2048, 163840
// positions) is far inside every one; products of these stay well inside
// int64, so the byte counts built from them cannot overflow.
constexpr int kMaxVocabSize = 1 << 22;
constexpr int kMaxHiddenSize = 1 << 16;
constexpr int kMaxIntermediateSize = 1 << 20;
constexpr int kMaxLayers = 1 << 10;
constexpr int kMaxHeads = 1 << 10;
constexpr int kMaxLoraRank = 1 << 16;
constexpr int kMaxHeadDim = 1 << 12;
constexpr int kMaxPositions = 1 << 30;  // memory bounds it first (the rope table)
constexpr int kMaxExperts = 1 << 16;
constexpr int kMaxSharedExperts = 1 << 10;
constexpr int kMaxExpertsPerToken = 1 << 10;

// A JSON value in messages: its type and (shortened) text.
std::string Describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return absl::StrCat(v.type_name(), " ", text);
}

// Typed, named access to the fields of one JSON object; every error names
// the field as `prefix + name` (e.g. "rope_scaling.factor").
class Fields {
 public:
  Fields(const json& object, absl::string_view source, std::string prefix)
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  absl::Status Error(absl::string_view name, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field '", prefix_, name, "': ", what));
  }
  // The field's value, or nullptr when absent.
  const json* Get(absl::string_view name) const {
    auto it = object_.find(std::string(name));
    return it == object_.end() ? nullptr : &*it;
  }
  bool IsNull(absl::string_view name) const {
    const json* v = Get(name);
    return v != nullptr && v->is_null();
  }
  bool Has(absl::string_view name) const { return Get(name) != nullptr; }

  // Integer field. Absent: `out` keeps its default unless `required`. A
  // float with an integral value is accepted (Python may write 4096.0).
  absl::Status Int(absl::string_view name, int* out, bool required = false) const {
    const json* v = Get(name);
    if (v == nullptr) return required ? Error(name, "missing (required)") : absl::OkStatus();
    double d;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
          return Error(name, absl::StrCat("value ", u, " is out of range"));
        }
        *out = static_cast<int>(u);
        return absl::OkStatus();
      }
      d = static_cast<double>(v->get<int64_t>());
    } else if (v->is_number_float()) {
      d = v->get<double>();
      if (d != std::floor(d)) {
        return Error(name, absl::StrCat("expected an integer, got ", Describe(*v)));
      }
    } else {
      return Error(name, absl::StrCat("expected an integer, got ", Describe(*v)));
    }
    if (d < std::numeric_limits<int>::min() || d > std::numeric_limits<int>::max()) {
      return Error(name, absl::StrCat("value ", v->dump(), " is out of range"));
    }
    *out = static_cast<int>(d);
    return absl::OkStatus();
  }
  // Integer field where null means "none": absent or null gives `if_null`.
  absl::Status NullableInt(absl::string_view name, int* out, int if_null,
                           bool required = false) const {
    const json* v = Get(name);
    if (v == nullptr && required) {
      return Error(name, "missing (required; write null for none)");
    }
    if (v == nullptr || v->is_null()) {
      *out = if_null;
      return absl::OkStatus();
    }
    return Int(name, out);
  }
  absl::Status Double(absl::string_view name, double* out, bool required = false) const {
    const json* v = Get(name);
    if (v == nullptr) return required ? Error(name, "missing (required)") : absl::OkStatus();
    if (!v->is_number()) return Error(name, absl::StrCat("expected a number, got ", Describe(*v)));
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Error(name, absl::StrCat("value ", v->dump(), " is not finite"));
    *out = d;
    return absl::OkStatus();
  }
  // A double field the model uses as a float: finite as a float too.
  absl::Status Float(absl::string_view name, float* out) const {
    double d = *out;
    MLAG_RETURN_IF_ERROR(Double(name, &d));
    if (!std::isfinite(static_cast<float>(d))) {
      return Error(name, absl::StrCat("value ", d, " is not finite as a float"));
    }
    *out = static_cast<float>(d);
    return absl::OkStatus();
  }
  absl::Status Bool(absl::string_view name, bool* out) const {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean())
      return Error(name, absl::StrCat("expected true or false, got ", Describe(*v)));
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(absl::string_view name, std::string* out) const {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Error(name, absl::StrCat("expected a string, got ", Describe(*v)));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const json& object_;
  absl::string_view source_;
  std::string prefix_;
};

absl::string_view TopkMethodName(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
  }
  return "?";
}

absl::string_view ScoringFuncName(ScoringFunc s) {
  switch (s) {
    case ScoringFunc::kSoftmax:
      return "softmax";
    case ScoringFunc::kSigmoid:
      return "sigmoid";
  }
  return "?";
}

// The float a config holds, as the double with the shortest decimal form
// that reads back as the same float (1e-6f is written 1e-06, not
// 9.99999997e-07), so config.json stays readable and round-trips exactly.
double FloatForJson(float f) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), f);
  *result.ptr = '\0';
  return std::strtod(buf, nullptr);
}

// Rope settings from one dict ("rope_scaling" or "rope_parameters").
struct RopeDict {
  bool yarn = false;
  RopeParams params;            // the YaRN fields when yarn
  std::optional<double> theta;  // "rope_theta" inside the dict
};

absl::StatusOr<RopeDict> ParseRopeDict(const json& dict, absl::string_view field,
                                       absl::string_view source) {
  if (!dict.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": field '", field, "': expected an object or null, got ", Describe(dict)));
  }
  Fields f(dict, source, absl::StrCat(field, "."));
  static const char* const kKnown[] = {
      "type",      "rope_type", "factor", "original_max_position_embeddings",
      "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
      "rope_theta"};
  for (auto it = dict.begin(); it != dict.end(); ++it) {
    bool known = false;
    for (const char* k : kKnown) known = known || it.key() == k;
    // A key we do not know may change the rotation (attention_factor,
    // low_freq_factor, ...): refuse it rather than silently ignore it.
    if (!known && !it.value().is_null()) return f.Error(it.key(), "unknown rope setting");
  }
  std::string type, rope_type;
  MLAG_RETURN_IF_ERROR(f.String("type", &type));
  MLAG_RETURN_IF_ERROR(f.String("rope_type", &rope_type));
  if (!type.empty() && !rope_type.empty() && type != rope_type) {
    return f.Error("rope_type",
                   absl::StrCat("'", rope_type, "' contradicts ", field, ".type '", type, "'"));
  }
  const std::string kind = rope_type.empty() ? type : rope_type;
  const char* kind_field = rope_type.empty() ? "type" : "rope_type";
  if (kind.empty()) return f.Error("rope_type", "missing (\"yarn\" or \"default\")");
  RopeDict out;
  if (f.Has("rope_theta")) {
    double theta = 0;
    MLAG_RETURN_IF_ERROR(f.Double("rope_theta", &theta));
    out.theta = theta;
  }
  if (kind == "default") return out;
  if (kind != "yarn") {
    return f.Error(kind_field, absl::StrCat("unsupported rope type '", kind,
                                            "' (supported: \"yarn\", \"default\")"));
  }
  // YaRN, with the defaults of DeepSeek's DeepseekV2YarnRotaryEmbedding
  // (factor required; original_max_position_embeddings 4096, beta_fast 32,
  // beta_slow 1, mscale 1, mscale_all_dim 0), which RopeParams also has.
  out.yarn = true;
  RopeParams& p = out.params;
  p.yarn = true;
  MLAG_RETURN_IF_ERROR(f.Double("factor", &p.factor, /*required=*/true));
  MLAG_RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &p.original_max_position));
  MLAG_RETURN_IF_ERROR(f.Double("beta_fast", &p.beta_fast));
  MLAG_RETURN_IF_ERROR(f.Double("beta_slow", &p.beta_slow));
  MLAG_RETURN_IF_ERROR(f.Double("mscale", &p.mscale));
  MLAG_RETURN_IF_ERROR(f.Double("mscale_all_dim", &p.mscale_all_dim));
  if (!(p.factor > 0)) return f.Error("factor", absl::StrCat("must be positive, got ", p.factor));
  if (p.original_max_position <= 0) {
    return f.Error("original_max_position_embeddings",
                   absl::StrCat("must be positive, got ", p.original_max_position));
  }
  if (!(p.beta_fast > 0)) return f.Error("beta_fast", "must be positive");
  if (!(p.beta_slow > 0)) return f.Error("beta_slow", "must be positive");
  return out;
}

bool SameYarn(const RopeDict& a, const RopeDict& b) {
  if (a.yarn != b.yarn) return false;
  if (!a.yarn) return true;
  const RopeParams& x = a.params;
  const RopeParams& y = b.params;
  return x.factor == y.factor && x.original_max_position == y.original_max_position &&
         x.beta_fast == y.beta_fast && x.beta_slow == y.beta_slow && x.mscale == y.mscale &&
         x.mscale_all_dim == y.mscale_all_dim;
}

}  // namespace

absl::StatusOr<json> ParseJsonStrict(absl::string_view text, absl::string_view source) {
  // The parser takes a NUL byte for the end of the input, so what follows one
  // would go unread (a safetensors header is padded with spaces, never NULs).
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON: a NUL byte at offset ", nul));
  }
  // The keys of every object being parsed, innermost last (keys only occur
  // directly inside objects, so the innermost open object owns each key).
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool has_duplicate = false;
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!has_duplicate && !open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          has_duplicate = true;
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (has_duplicate) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"", duplicate, "\" appears twice in one object"));
  }
  return value;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             absl::string_view source) {
  MLAG_ASSIGN_OR_RETURN(json j, ParseJsonStrict(json_text, source));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": config is a JSON ", j.type_name(), ", not an object"));
  }
  Fields f(j, source, "");
  ModelConfig c;

  // ---- model_type / architectures ----
  std::string model_type;
  MLAG_RETURN_IF_ERROR(f.String("model_type", &model_type));
  if (f.Has("model_type") && model_type != "deepseek_v2" && model_type != "deepseek_v3") {
    return f.Error("model_type",
                   absl::StrCat("'", model_type, "' is not \"deepseek_v2\" or \"deepseek_v3\""));
  }
  if (const json* arch = f.Get("architectures"); arch != nullptr && !arch->is_null()) {
    if (!arch->is_array()) {
      return f.Error("architectures", absl::StrCat("expected an array, got ", Describe(*arch)));
    }
    for (const json& a : *arch) {
      if (!a.is_string()) {
        return f.Error("architectures", absl::StrCat("expected strings, got ", Describe(a)));
      }
      const std::string name = a.get<std::string>();
      std::string implied;
      if (name == "DeepseekV2ForCausalLM") implied = "deepseek_v2";
      if (name == "DeepseekV3ForCausalLM") implied = "deepseek_v3";
      if (implied.empty()) continue;  // other heads (e.g. MTP variants) say nothing
      if (model_type.empty()) model_type = implied;
      if (model_type != implied) {
        return f.Error("architectures",
                       absl::StrCat("'", name, "' contradicts model_type '", model_type, "'"));
      }
    }
  }
  if (model_type.empty()) return f.Error("model_type", "missing (required)");
  c.model_type = model_type;

  // ---- shapes: required, no default guessed ----
  MLAG_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab_size, true));
  MLAG_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden_size, true));
  MLAG_RETURN_IF_ERROR(f.Int("intermediate_size", &c.intermediate_size, true));
  MLAG_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_hidden_layers, true));
  MLAG_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_attention_heads, true));
  MLAG_RETURN_IF_ERROR(f.Int("kv_lora_rank", &c.kv_lora_rank, true));
  MLAG_RETURN_IF_ERROR(f.Int("qk_nope_head_dim", &c.qk_nope_head_dim, true));
  MLAG_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &c.qk_rope_head_dim, true));
  MLAG_RETURN_IF_ERROR(f.Int("v_head_dim", &c.v_head_dim, true));
  // HF defaults q_lora_rank to 1536, but it decides which tensors exist, so
  // it must be stated: null (-> 0) for a plain q_proj.
  MLAG_RETURN_IF_ERROR(f.NullableInt("q_lora_rank", &c.q_lora_rank, 0, /*required=*/true));
  if (!f.IsNull("q_lora_rank") && c.q_lora_rank <= 0) {
    return f.Error("q_lora_rank", absl::StrCat("must be positive or null, got ", c.q_lora_rank));
  }

  // ---- MoE. HF defaults: n_routed_experts None (-> 0: every layer dense),
  // n_shared_experts None (-> 0), routed_scaling_factor 1.0, scoring_func
  // softmax, norm_topk_prob false, first_k_dense_replace 0, moe_layer_freq 1,
  // n_group/topk_group None (-> 1, which only greedy may leave unstated).
  // topk_method defaults to greedy (HF's default is the typo "gready").
  // With routed experts, moe_intermediate_size and num_experts_per_tok are
  // required (HF's 1407 / None are not real defaults). ----
  MLAG_RETURN_IF_ERROR(f.NullableInt("n_routed_experts", &c.n_routed_experts, 0));
  MLAG_RETURN_IF_ERROR(f.NullableInt("n_shared_experts", &c.n_shared_experts, 0));
  const bool moe = c.n_routed_experts > 0;
  if (moe && f.IsNull("num_experts_per_tok")) {
    return f.Error("num_experts_per_tok", "is null but n_routed_experts > 0");
  }
  if (f.IsNull("moe_intermediate_size") && moe) {
    return f.Error("moe_intermediate_size", "is null but n_routed_experts > 0");
  }
  if (!f.IsNull("moe_intermediate_size")) {
    MLAG_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c.moe_intermediate_size, moe));
  }
  MLAG_RETURN_IF_ERROR(f.NullableInt("num_experts_per_tok", &c.num_experts_per_tok, 0));
  if (moe && !f.Has("num_experts_per_tok")) {
    return f.Error("num_experts_per_tok", "missing (required when n_routed_experts > 0)");
  }
  MLAG_RETURN_IF_ERROR(f.Float("routed_scaling_factor", &c.routed_scaling_factor));
  std::string topk_method = "greedy", scoring_func = "softmax";
  MLAG_RETURN_IF_ERROR(f.String("topk_method", &topk_method));
  MLAG_RETURN_IF_ERROR(f.String("scoring_func", &scoring_func));
  if (topk_method == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (topk_method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (topk_method == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else {
    return f.Error(
        "topk_method",
        absl::StrCat("unknown '", topk_method,
                     "' (expected \"greedy\", \"group_limited_greedy\" or \"noaux_tc\")"));
  }
  if (scoring_func == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else if (scoring_func == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else {
    return f.Error("scoring_func", absl::StrCat("unknown '", scoring_func,
                                                "' (expected \"softmax\" or \"sigmoid\")"));
  }
  const bool grouped = c.topk_method != TopkMethod::kGreedy;
  for (const char* name : {"n_group", "topk_group"}) {
    if (moe && grouped && (!f.Has(name) || f.IsNull(name))) {
      return f.Error(name, absl::StrCat("missing (required with topk_method '", topk_method, "')"));
    }
  }
  MLAG_RETURN_IF_ERROR(f.NullableInt("n_group", &c.n_group, 1));
  MLAG_RETURN_IF_ERROR(f.NullableInt("topk_group", &c.topk_group, 1));
  MLAG_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c.norm_topk_prob));
  MLAG_RETURN_IF_ERROR(f.Int("first_k_dense_replace", &c.first_k_dense_replace));
  MLAG_RETURN_IF_ERROR(f.Int("moe_layer_freq", &c.moe_layer_freq));

  // ---- the rest. HF defaults: rms_norm_eps 1e-6, max_position_embeddings
  // 2048, tie_word_embeddings false, rope_theta 10000, rope_scaling None. ----
  MLAG_RETURN_IF_ERROR(f.Float("rms_norm_eps", &c.rms_norm_eps));
  c.max_position_embeddings = 2048;
  MLAG_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c.max_position_embeddings));
  MLAG_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  // Multi-token-prediction layers: not computed, but their tensors follow the
  // decoder layers in the checkpoint and the loader must know to skip them.
  c.num_nextn_predict_layers = c.model_type == "deepseek_v3" ? 1 : 0;
  MLAG_RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c.num_nextn_predict_layers));
  // Fields the runtime does not model must hold the one value it computes.
  std::string hidden_act = "silu";
  MLAG_RETURN_IF_ERROR(f.String("hidden_act", &hidden_act));
  if (hidden_act != "silu") {
    return f.Error("hidden_act",
                   absl::StrCat("'", hidden_act, "' is not supported (only \"silu\")"));
  }
  bool attention_bias = false;
  MLAG_RETURN_IF_ERROR(f.Bool("attention_bias", &attention_bias));
  if (attention_bias) return f.Error("attention_bias", "true is not supported (MLA has no biases)");

  // ---- quantization: only DeepSeek-V3's fp8 block layout ----
  if (const json* q = f.Get("quantization_config"); q != nullptr && !q->is_null()) {
    if (!q->is_object()) {
      return f.Error("quantization_config", absl::StrCat("expected an object, got ", Describe(*q)));
    }
    Fields qf(*q, source, "quantization_config.");
    std::string method, fmt = "e4m3", activations = "dynamic";
    if (!qf.Has("quant_method")) return qf.Error("quant_method", "missing (required)");
    MLAG_RETURN_IF_ERROR(qf.String("quant_method", &method));
    MLAG_RETURN_IF_ERROR(qf.String("fmt", &fmt));
    MLAG_RETURN_IF_ERROR(qf.String("activation_scheme", &activations));
    if (method != "fp8") {
      return qf.Error("quant_method",
                      absl::StrCat("'", method, "' is not supported (only \"fp8\")"));
    }
    if (fmt != "e4m3") {
      return qf.Error("fmt", absl::StrCat("'", fmt, "' is not supported (only \"e4m3\")"));
    }
    if (activations != "dynamic") {
      return qf.Error("activation_scheme",
                      absl::StrCat("'", activations, "' is not supported (only \"dynamic\")"));
    }
    const json* block = qf.Get("weight_block_size");
    if (block == nullptr || *block != json::array({kFp8BlockSize, kFp8BlockSize})) {
      return qf.Error("weight_block_size",
                      absl::StrCat(block == nullptr ? "missing" : Describe(*block),
                                   ": only [128, 128] blocks are supported"));
    }
    c.fp8_block_quantized = true;
  }

  // ---- rope ----
  double theta = 10000.0;
  MLAG_RETURN_IF_ERROR(f.Double("rope_theta", &theta));
  std::optional<RopeDict> scaling, parameters;
  if (const json* v = f.Get("rope_scaling"); v != nullptr && !v->is_null()) {
    MLAG_ASSIGN_OR_RETURN(scaling, ParseRopeDict(*v, "rope_scaling", source));
  }
  if (const json* v = f.Get("rope_parameters"); v != nullptr && !v->is_null()) {
    MLAG_ASSIGN_OR_RETURN(parameters, ParseRopeDict(*v, "rope_parameters", source));
    if (parameters->theta.has_value()) {
      if (f.Has("rope_theta") && *parameters->theta != theta) {
        return f.Error("rope_parameters.rope_theta",
                       absl::StrCat(*parameters->theta, " contradicts rope_theta ", theta));
      }
      theta = *parameters->theta;
    }
    if (scaling.has_value() && !SameYarn(*scaling, *parameters)) {
      return f.Error("rope_parameters", "contradicts rope_scaling");
    }
  }
  const RopeDict* rope = parameters.has_value() ? &*parameters
                         : scaling.has_value()  ? &*scaling
                                                : nullptr;
  if (rope != nullptr && rope->yarn) c.rope = rope->params;
  c.rope.yarn = rope != nullptr && rope->yarn;
  c.rope.theta = theta;
  c.rope.rotary_dim = c.qk_rope_head_dim;

  // ---- validation: every size positive, no contradictions ----
  struct Positive {
    const char* name;
    int value;
  };
  for (const Positive& p :
       {Positive{"vocab_size", c.vocab_size}, Positive{"hidden_size", c.hidden_size},
        Positive{"intermediate_size", c.intermediate_size},
        Positive{"num_hidden_layers", c.num_hidden_layers},
        Positive{"num_attention_heads", c.num_attention_heads},
        Positive{"kv_lora_rank", c.kv_lora_rank}, Positive{"qk_nope_head_dim", c.qk_nope_head_dim},
        Positive{"qk_rope_head_dim", c.qk_rope_head_dim}, Positive{"v_head_dim", c.v_head_dim},
        Positive{"max_position_embeddings", c.max_position_embeddings},
        Positive{"moe_layer_freq", c.moe_layer_freq}}) {
    if (p.value <= 0) return f.Error(p.name, absl::StrCat("must be positive, got ", p.value));
  }
  for (const Positive& p : {Positive{"n_routed_experts", c.n_routed_experts},
                            Positive{"n_shared_experts", c.n_shared_experts},
                            Positive{"first_k_dense_replace", c.first_k_dense_replace},
                            Positive{"num_nextn_predict_layers", c.num_nextn_predict_layers}}) {
    if (p.value < 0) return f.Error(p.name, absl::StrCat("must not be negative, got ", p.value));
  }
  // Plausible ranges, checked before any arithmetic on the sizes (the
  // largest released models are far inside them): a hostile or mistyped
  // config gets a named error rather than an overflow or a huge allocation.
  struct Bounded {
    const char* name;
    int value;
    int max;
  };
  for (const Bounded& b : {
           Bounded{"vocab_size", c.vocab_size, kMaxVocabSize},
           Bounded{"hidden_size", c.hidden_size, kMaxHiddenSize},
           Bounded{"intermediate_size", c.intermediate_size, kMaxIntermediateSize},
           Bounded{"moe_intermediate_size", c.moe_intermediate_size, kMaxIntermediateSize},
           Bounded{"num_hidden_layers", c.num_hidden_layers, kMaxLayers},
           Bounded{"num_attention_heads", c.num_attention_heads, kMaxHeads},
           Bounded{"q_lora_rank", c.q_lora_rank, kMaxLoraRank},
           Bounded{"kv_lora_rank", c.kv_lora_rank, kMaxLoraRank},
           Bounded{"qk_nope_head_dim", c.qk_nope_head_dim, kMaxHeadDim},
           Bounded{"qk_rope_head_dim", c.qk_rope_head_dim, kMaxHeadDim},
           Bounded{"v_head_dim", c.v_head_dim, kMaxHeadDim},
           Bounded{"max_position_embeddings", c.max_position_embeddings, kMaxPositions},
           Bounded{"n_routed_experts", c.n_routed_experts, kMaxExperts},
           Bounded{"n_shared_experts", c.n_shared_experts, kMaxSharedExperts},
           Bounded{"num_experts_per_tok", c.num_experts_per_tok, kMaxExpertsPerToken},
           Bounded{"n_group", c.n_group, kMaxExperts},
           Bounded{"topk_group", c.topk_group, kMaxExperts},
           Bounded{"first_k_dense_replace", c.first_k_dense_replace, kMaxLayers},
           Bounded{"moe_layer_freq", c.moe_layer_freq, kMaxLayers},
           Bounded{"num_nextn_predict_layers", c.num_nextn_predict_layers, kMaxLayers},
       }) {
    if (b.value > b.max) {
      return f.Error(b.name,
                     absl::StrCat("value ", b.value, " exceeds the plausible maximum ", b.max));
    }
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return f.Error("qk_rope_head_dim",
                   absl::StrCat("must be even (rope rotates pairs), got ", c.qk_rope_head_dim));
  }
  if (!(c.rms_norm_eps > 0)) return f.Error("rms_norm_eps", "must be positive");
  if (!(theta > 0)) return f.Error("rope_theta", absl::StrCat("must be positive, got ", theta));
  if (moe) {
    for (const Positive& p :
         {Positive{"moe_intermediate_size", c.moe_intermediate_size},
          Positive{"num_experts_per_tok", c.num_experts_per_tok}, Positive{"n_group", c.n_group},
          Positive{"topk_group", c.topk_group}}) {
      if (p.value <= 0) return f.Error(p.name, absl::StrCat("must be positive, got ", p.value));
    }
    if (!(c.routed_scaling_factor > 0)) return f.Error("routed_scaling_factor", "must be positive");
    if (c.num_experts_per_tok > c.n_routed_experts) {
      return f.Error(
          "num_experts_per_tok",
          absl::StrCat(c.num_experts_per_tok, " exceeds n_routed_experts ", c.n_routed_experts));
    }
    if (c.n_routed_experts % c.n_group != 0) {
      return f.Error("n_group", absl::StrCat("n_routed_experts ", c.n_routed_experts,
                                             " is not divisible by n_group ", c.n_group));
    }
    if (c.topk_group > c.n_group) {
      return f.Error("topk_group", absl::StrCat(c.topk_group, " exceeds n_group ", c.n_group));
    }
    if (c.topk_method == TopkMethod::kNoauxTc && c.scoring_func != ScoringFunc::kSigmoid) {
      return f.Error("topk_method", absl::StrCat("'noaux_tc' needs scoring_func 'sigmoid', not '",
                                                 scoring_func, "'"));
    }
    const int group_size = c.n_routed_experts / c.n_group;
    if (grouped && c.num_experts_per_tok > c.topk_group * group_size) {
      return f.Error("num_experts_per_tok",
                     absl::StrCat(c.num_experts_per_tok, " exceeds the ", c.topk_group * group_size,
                                  " experts of the topk_group ", c.topk_group, " groups kept"));
    }
    if (c.topk_method == TopkMethod::kNoauxTc && group_size < 2) {
      return f.Error("n_group",
                     absl::StrCat("noaux_tc scores a group by its top-2 experts, but n_group ",
                                  c.n_group, " leaves ", group_size, " per group"));
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path_to_config_json) {
  MLAG_ASSIGN_OR_RETURN(std::string text, ReadFile(path_to_config_json));
  return ParseModelConfig(text, path_to_config_json);
}

json ModelConfigToJson(const ModelConfig& c) {
  const bool v3 = c.model_type == "deepseek_v3";
  json j = json::object();
  j["architectures"] = json::array({v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;  // HF writes it; meaningless for MLA
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["routed_scaling_factor"] = FloatForJson(c.routed_scaling_factor);
  j["topk_method"] = std::string(TopkMethodName(c.topk_method));
  j["scoring_func"] = std::string(ScoringFuncName(c.scoring_func));
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rms_norm_eps"] = FloatForJson(c.rms_norm_eps);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.yarn) {
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope.factor},
        {"original_max_position_embeddings", c.rope.original_max_position},
        {"beta_fast", c.rope.beta_fast},
        {"beta_slow", c.rope.beta_slow},
        {"mscale", c.rope.mscale},
        {"mscale_all_dim", c.rope.mscale_all_dim},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (v3 || c.num_nextn_predict_layers != 0) {
    j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  }
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["torch_dtype"] = "bfloat16";
  if (c.fp8_block_quantized) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {kFp8BlockSize, kFp8BlockSize}}};
  }
  return j;
}

}  // namespace mlag
