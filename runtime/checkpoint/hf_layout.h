// The Hugging Face DeepSeek-V2/V3 checkpoint layout (the parameter names of
// modeling_deepseek.py, as the released checkpoints store them): every
// tensor a config implies, with its shape. Used to generate the built-in
// models, to export them, and to tell an unexpected tensor from a missing one.
#pragma once

#include <string>
#include <utility>
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

// The decoder layer a tensor name belongs to: "model.layers.<i>.…" -> i;
// -1 for any other name.
int LayerIndexOf(const std::string& name);

// The checkpoint tensors no layer read, sorted into those the loader may
// skip and those it may not. Skipped: rotary inv_freq buffers some exporters
// write, and DeepSeek-V3's multi-token-prediction layers, model.layers.<L>.*
// for num_hidden_layers <= L < num_hidden_layers + num_nextn_predict_layers
// where the layer holds eh_proj.weight: the tensors an MTP layer holds (a
// decoder layer, embed_tokens, enorm, hnorm, eh_proj, shared_head.norm and
// shared_head.head, and block scales of them). Any other tensor past the
// decoder layers (in such a layer, or in a layer without eh_proj: say, a
// config that gives fewer layers than the checkpoint holds) is unexpected.
struct UnreadTensors {
  std::vector<std::string> unexpected;          // in the order given
  std::vector<std::pair<int, int>> mtp_layers;  // (layer, tensors) skipped, by layer
};
UnreadTensors SortUnreadTensors(const ModelConfig& config, const std::vector<std::string>& unread);

}  // namespace mlag
