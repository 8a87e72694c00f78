// The Hugging Face DeepSeek-V2/V3 checkpoint layout (the parameter names of
// modeling_deepseek.py, as the released checkpoints store them): every
// tensor a config implies, with its shape. Used to generate the built-in
// models, to export them, and to tell an unexpected tensor from a missing one.
#pragma once

#include <string>
#include <vector>

#include "layers/model_config.h"

namespace mlag {

// What a tensor is, which decides how the built-in generator fills it.
enum class TensorRole {
  kEmbedding,       // model.embed_tokens.weight
  kLinear,          // a projection [out, in]
  kRouterGate,      // mlp.gate.weight
  kNorm,            // an RMSNorm weight
  kCorrectionBias,  // mlp.gate.e_score_correction_bias (noaux_tc)
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role;
};

// Every tensor of the checkpoint for `config`, in a fixed order (embedding,
// then each layer's attention and FFN, then final norm and lm_head).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Whether DeepSeek-V3's fp8 checkpoints store `spec` in fp8 with block
// scales: every projection inside the layers; not lm_head, the embedding,
// norms, the router gate or the correction bias.
bool QuantizedInFp8Checkpoints(const TensorSpec& spec);

// Whether a checkpoint tensor that no layer reads may be ignored: the V3
// multi-token-prediction layer (model.layers.<num_hidden_layers>.*) and rotary
// inv_freq buffers some exporters write.
bool IsIgnorableTensor(const ModelConfig& config, const std::string& name);

}  // namespace mlag
