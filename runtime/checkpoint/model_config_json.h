// config.json <-> ModelConfig, in the Hugging Face DeepSeek-V2/V3 layout (the
// fields of DeepseekV2Config / DeepseekV3Config).
//
// Parsing is strict about what changes the model and lenient about
// bookkeeping: a missing shape field, a value of the wrong JSON type, an
// unknown topk_method / scoring_func / rope type, or two fields that
// contradict each other is an InvalidArgument naming the field; fields that
// do not affect the computation (transformers_version, bos_token_id,
// num_key_value_heads, ...) are ignored. num_nextn_predict_layers says which
// layers past num_hidden_layers the loader may skip (multi-token prediction);
// quantization_config must be DeepSeek-V3's fp8 block layout, quant_method
// included.
//
// Example:
//   MLAG_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
//   nlohmann::json j = ModelConfigToJson(config);  // the same model, HF layout
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/model_config.h"

namespace mlag {

// Parses the text of a config.json. `source` names it in error messages
// (usually the file's path). Errors are InvalidArgument and name the field,
// e.g. "config.json: field 'hidden_size': expected an integer, got string".
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             absl::string_view source);

// Reads and parses the file at `path_to_config_json` (NotFound when missing).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path_to_config_json);

// The Hugging Face config.json object for `config`: model_type and
// architectures for V2 or V3, "q_lora_rank": null when it is 0, "rope_scaling"
// null or {"type": "yarn", ...}, "torch_dtype": "bfloat16" (the dtype of the
// released checkpoints; ModelConfig does not record one). Parsing the result
// gives back `config`.
nlohmann::json ModelConfigToJson(const ModelConfig& config);

// Parses JSON text the way every loader in runtime/ does: a syntax error, a
// NUL byte (the parser would stop there and ignore the rest), or a key
// repeated within one object (which JSON tolerates but which would make the
// last value silently win), is InvalidArgument naming `source`.
absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text, absl::string_view source);

}  // namespace mlag
