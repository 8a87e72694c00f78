// Built-in models with seeded weights, generated in memory, so every command
// works offline. The tiny ones have every dimension distinct, so a mixed-up
// axis cannot pass unnoticed:
//   tiny-v3  V3 path (q LoRA, sigmoid noaux_tc routing, YaRN)
//   tiny-v2  V2 path (q_proj, softmax group_limited_greedy)
//   small    V2-Lite widths (hidden 2048, 16 heads, kv_lora 512, 64 experts
//            top-6, 2 shared) with 4 layers and a 32000-token vocabulary
//   v2-lite-8l  V2-Lite's shapes (vocabulary 102400) with 8 of its 27 layers,
//            for GPU benchmarks
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "layers/model_config.h"
#include "layers/weight_source.h"
#include "runtime/checkpoint/hf_layout.h"

namespace mlag {

// "tiny-v3", "tiny-v2", "small", "v2-lite-8l".
std::vector<std::string> BuiltinModelNames();
bool IsBuiltinModel(absl::string_view name);
absl::StatusOr<ModelConfig> BuiltinModelConfig(absl::string_view name);

// The default seed of the built-in weights.
inline constexpr uint64_t kBuiltinWeightSeed = 20240507;

// Weights generated on demand: element i of tensor `name` is a pure function
// of (seed, name, i), so any subset can be read in any order, on any number of
// threads, with the same result. Every value is exactly representable in
// bf16, so exporting to bf16 safetensors is lossless. Distributions:
// projections N(0, 1/in); router gates N(0, 16/in) (so routing is decisive);
// norm weights 1 + 0.2 N(0, 1); correction bias U[0, 0.5]; embedding N(0, 1).
class GeneratedWeights final : public WeightSource {
 public:
  GeneratedWeights(const ModelConfig& config, uint64_t seed = kBuiltinWeightSeed);

  absl::Status ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                       float* dst) override;
  bool Has(absl::string_view name) const override;
  std::vector<std::string> Unread() const override;

  const std::vector<TensorSpec>& tensors() const { return specs_; }

 private:
  uint64_t seed_;
  std::vector<TensorSpec> specs_;
  absl::flat_hash_map<std::string, size_t> index_;
  absl::flat_hash_set<std::string> read_;
};

}  // namespace mlag
