// Opening a model by name: a built-in model ("tiny-v3", "tiny-v2", "small")
// or a directory in the Hugging Face layout (config.json plus safetensors,
// single file or sharded); exporting a model to such a directory.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "layers/deepseek_model.h"
#include "layers/model_config.h"
#include "layers/weight_source.h"
#include "runtime/checkpoint/safetensors.h"

namespace mlag {

// A WeightSource over an opened checkpoint: converts F32/BF16/F16 to f32,
// checks shapes, and names the file and tensor in every error.
class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(std::unique_ptr<Checkpoint> checkpoint, std::string dir);

  absl::Status ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                       float* dst) override;
  bool Has(absl::string_view name) const override;
  std::vector<std::string> Unread() const override;

 private:
  std::unique_ptr<Checkpoint> checkpoint_;
  std::string dir_;
  absl::flat_hash_set<std::string> read_;
};

// A model's config and where its weights come from.
struct ModelSource {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::string description;  // "built-in tiny-v3" or the directory
};

// `name_or_dir` is a built-in model name or a checkpoint directory. A missing
// directory or config.json is NotFound naming the path.
absl::StatusOr<ModelSource> OpenModel(const std::string& name_or_dir);

// Builds the model from `source` and checks that the checkpoint held nothing
// unexpected: every tensor must have been read, except ignorable ones
// (IsIgnorableTensor) and routed experts this instance does not hold.
absl::StatusOr<std::unique_ptr<DeepseekModel>> BuildModel(ModelSource& source, Device* device,
                                                          const ModelOptions& options);

// Writes `config` as config.json and every tensor ExpectedTensors(config)
// lists, read from `weights` and stored as `dtype` (bf16 by default, as
// released checkpoints are), into `dir` as model.safetensors (created if
// missing).
absl::Status ExportModel(const ModelConfig& config, WeightSource& weights, const std::string& dir,
                         DType dtype = DType::kBF16);

}  // namespace mlag
