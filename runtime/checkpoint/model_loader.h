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

  // fp8 tensors (F8_E4M3 with an F32 "<name>_scale_inv" of block scales)
  // are dequantized by Fp8Dequantize; reading a weight marks its scales read.
  absl::Status ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                       float* dst) override;
  DType StoredDType(absl::string_view name) const override;
  absl::Status ReadStored(absl::string_view name, absl::Span<const int64_t> shape, void* dst,
                          float* block_scales) override;
  bool Has(absl::string_view name) const override;
  std::vector<std::string> Unread() const override;
  void SetScanNonFinite(bool scan) override { scan_non_finite_ = scan; }

 private:
  // The tensor `name` with shape `shape`, marked read; errors name both.
  absl::StatusOr<const SafetensorsTensor*> Get(absl::string_view name,
                                               absl::Span<const int64_t> shape);
  // The block scales of fp8 tensor `t` [rows, cols] into `block_scales`
  // ([Fp8Blocks(rows), Fp8Blocks(cols)]), marked read.
  absl::Status ReadScales(const SafetensorsTensor& t, float* block_scales);

  // InvalidArgument naming tensor `t` and the first NaN or infinity among
  // the n floats (f32 values) or bf16 values (bits) at `data`, when scanning.
  absl::Status CheckFinite(const SafetensorsTensor& t, const float* data, size_t n) const;
  absl::Status CheckFiniteBf16(const SafetensorsTensor& t, const uint16_t* bits, size_t n) const;

  std::unique_ptr<Checkpoint> checkpoint_;
  std::string dir_;
  absl::flat_hash_set<std::string> read_;
  bool scan_non_finite_ = true;
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
// (SortUnreadTensors: skipped multi-token-prediction layers, rotary buffers)
// and routed experts this instance does not hold.
absl::StatusOr<std::unique_ptr<DeepseekModel>> BuildModel(ModelSource& source, Device* device,
                                                          const ModelOptions& options);

// Writes `config` as config.json and every tensor ExpectedTensors(config)
// lists, read from `weights` and stored as `dtype` (bf16 by default, as
// released checkpoints are), into `dir` as model.safetensors (created if
// missing). dtype kF8E4M3 writes DeepSeek-V3's layout: the projections
// (QuantizedInFp8Checkpoints) as F8_E4M3 plus "<name>_scale_inv" block scales
// computed from the weights (or copied from an fp8 source), the rest bf16
// (the correction bias f32), and quantization_config in config.json. Any
// other dtype dequantizes an fp8 source (Fp8Dequantize).
absl::Status ExportModel(const ModelConfig& config, WeightSource& weights, const std::string& dir,
                         DType dtype = DType::kBF16);

}  // namespace mlag
