#include "runtime/checkpoint/model_loader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_config_json.h"
#include "runtime/core/file.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "model.layers.3.mlp.experts.17.up_proj.weight" -> 17; -1 otherwise.
int RoutedExpertId(const std::string& name) {
  size_t pos = name.find(".mlp.experts.");
  if (pos == std::string::npos) return -1;
  std::vector<std::string> parts = absl::StrSplit(name.substr(pos + 13), '.');
  int id = -1;
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &id)) return -1;
  return id;
}

}  // namespace

CheckpointWeights::CheckpointWeights(std::unique_ptr<Checkpoint> checkpoint, std::string dir)
    : checkpoint_(std::move(checkpoint)), dir_(std::move(dir)) {}

bool CheckpointWeights::Has(absl::string_view name) const {
  return checkpoint_->Find(name) != nullptr;
}

std::vector<std::string> CheckpointWeights::Unread() const {
  std::vector<std::string> out;
  for (const std::string& n : checkpoint_->names()) {
    if (!read_.contains(n)) out.push_back(n);
  }
  return out;
}

absl::Status CheckpointWeights::ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                                        float* dst) {
  const SafetensorsTensor* t = checkpoint_->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " is missing tensor '", name, "'"));
  }
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", t->file, " has shape [", absl::StrJoin(t->shape, ", "),
        "], expected [", absl::StrJoin(shape, ", "), "]"));
  }
  if (!IsFloat(t->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", t->file,
                                                   " has dtype ", DTypeName(t->dtype),
                                                   ", expected F32, BF16 or F16"));
  }
  read_.insert(std::string(name));
  const size_t n = static_cast<size_t>(t->numel());
  if (t->dtype == DType::kF32) {
    std::memcpy(dst, t->data, n * sizeof(float));
    return absl::OkStatus();
  }
  // The mapped data may be misaligned in a foreign file: copy 16-bit values
  // out byte-wise in chunks.
  const char* src = static_cast<const char*>(t->data);
  constexpr size_t kChunk = 4096;
  uint16_t buf[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    size_t m = std::min(kChunk, n - i);
    std::memcpy(buf, src + i * 2, m * 2);
    ConvertToF32(t->dtype, buf, dst + i, m);
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSource> OpenModel(const std::string& name_or_dir) {
  ModelSource source;
  if (IsBuiltinModel(name_or_dir)) {
    MLAG_ASSIGN_OR_RETURN(source.config, BuiltinModelConfig(name_or_dir));
    source.weights = std::make_unique<GeneratedWeights>(source.config);
    source.description = absl::StrCat("built-in ", name_or_dir);
    return source;
  }
  if (!IsDirectory(name_or_dir)) {
    return absl::NotFoundError(
        absl::StrCat("model '", name_or_dir, "' is neither a built-in model (",
                     absl::StrJoin(BuiltinModelNames(), ", "), ") nor a directory"));
  }
  MLAG_ASSIGN_OR_RETURN(source.config, LoadModelConfig(name_or_dir + "/config.json"));
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(name_or_dir));
  source.weights = std::make_unique<CheckpointWeights>(std::move(checkpoint), name_or_dir);
  source.description = name_or_dir;
  return source;
}

absl::StatusOr<std::unique_ptr<DeepseekModel>> BuildModel(ModelSource& source, Device* device,
                                                          const ModelOptions& options) {
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model,
                        DeepseekModel::Create(source.config, device, *source.weights, options));
  std::vector<int> local = options.local_experts;
  std::sort(local.begin(), local.end());
  std::vector<std::string> unexpected;
  for (const std::string& name : source.weights->Unread()) {
    if (IsIgnorableTensor(source.config, name)) continue;
    int expert = RoutedExpertId(name);
    if (expert >= 0 && !local.empty() && !std::binary_search(local.begin(), local.end(), expert) &&
        expert < source.config.n_routed_experts) {
      continue;  // held by another expert-parallel rank
    }
    unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    if (unexpected.size() > 5) {
      size_t more = unexpected.size() - 5;
      unexpected.resize(5);
      unexpected.push_back(absl::StrCat("and ", more, " more"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source.description,
                     ": unexpected tensor(s) for this config: ", absl::StrJoin(unexpected, ", ")));
  }
  return model;
}

absl::Status ExportModel(const ModelConfig& config, WeightSource& weights, const std::string& dir,
                         DType dtype) {
  if (!IsFloat(dtype)) return absl::InvalidArgumentError("export dtype must be f32, bf16 or f16");
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory ", dir, ": ", std::strerror(errno)));
  }
  MLAG_RETURN_IF_ERROR(
      WriteFileAtomically(dir + "/config.json", {ModelConfigToJson(config).dump(2) + "\n"}));
  SafetensorsWriter writer;
  std::vector<float> f32;
  std::vector<uint8_t> stored;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t s : spec.shape) n *= s;
    f32.resize(static_cast<size_t>(n));
    MLAG_RETURN_IF_ERROR(weights.ReadF32(spec.name, spec.shape, f32.data()));
    stored.resize(static_cast<size_t>(n) * DTypeSize(dtype));
    // The correction bias stays f32, as in released V3 checkpoints.
    DType d = spec.role == TensorRole::kCorrectionBias ? DType::kF32 : dtype;
    stored.resize(static_cast<size_t>(n) * DTypeSize(d));
    ConvertFromF32(f32.data(), d, stored.data(), static_cast<size_t>(n));
    MLAG_RETURN_IF_ERROR(writer.Add(spec.name, d, spec.shape, stored.data()));
  }
  return writer.Write(dir + "/model.safetensors");
}

}  // namespace mlag
