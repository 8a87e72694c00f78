#include "runtime/checkpoint/model_loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/host/parallel.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_config_json.h"
#include "runtime/core/file.h"
#include "runtime/core/fp8_blocks.h"
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

absl::StatusOr<const SafetensorsTensor*> CheckpointWeights::Get(absl::string_view name,
                                                                absl::Span<const int64_t> shape) {
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
  if (!IsFloat(t->dtype) && t->dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", t->file,
                                                   " has dtype ", DTypeName(t->dtype),
                                                   ", expected F32, BF16, F16 or F8_E4M3"));
  }
  if (t->dtype == DType::kF8E4M3 && t->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", t->file, ": F8_E4M3 is read only for 2-d weight matrices"));
  }
  read_.insert(std::string(name));
  return t;
}

absl::Status CheckpointWeights::ReadScales(const SafetensorsTensor& t, float* block_scales) {
  const std::string name = t.name + "_scale_inv";
  const std::vector<int64_t> shape = {Fp8Blocks(t.shape[0]), Fp8Blocks(t.shape[1])};
  const SafetensorsTensor* s = checkpoint_->Find(name);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir_, ": F8_E4M3 tensor '", t.name,
                                            "' has no block scales '", name, "'"));
  }
  if (s->dtype != DType::kF32 || s->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' in ", s->file, " is ", DTypeName(s->dtype), " [",
                     absl::StrJoin(s->shape, ", "), "], expected f32 [", absl::StrJoin(shape, ", "),
                     "] (one scale per 128 x 128 block)"));
  }
  read_.insert(name);
  std::memcpy(block_scales, s->data, s->nbytes);  // possibly misaligned in the file
  for (int64_t i = 0; i < s->numel(); ++i) {
    if (!(block_scales[i] > 0.0f && block_scales[i] <= kFp8MaxScale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' in ", s->file, ": block scale ", i, " is ",
                       block_scales[i], ", expected a finite value in (0, ", kFp8MaxScale, "]"));
    }
  }
  return absl::OkStatus();
}

DType CheckpointWeights::StoredDType(absl::string_view name) const {
  const SafetensorsTensor* t = checkpoint_->Find(name);
  if (t == nullptr) return DType::kF32;
  return t->dtype == DType::kBF16 || t->dtype == DType::kF8E4M3 ? t->dtype : DType::kF32;
}

absl::Status CheckpointWeights::ReadStored(absl::string_view name, absl::Span<const int64_t> shape,
                                           void* dst, float* block_scales) {
  MLAG_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, shape));
  if (t->dtype != DType::kBF16 && t->dtype != DType::kF8E4M3) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not stored in bf16 or fp8"));
  }
  if (t->nbytes > 0) std::memcpy(dst, t->data, t->nbytes);
  if (t->dtype == DType::kBF16) {
    return CheckFiniteBf16(*t, static_cast<const uint16_t*>(dst), static_cast<size_t>(t->numel()));
  }
  return ReadScales(*t, block_scales);  // fp8: NaN codes are checked by the loader
}

namespace {

// The first index of a NaN or infinity among n values whose exponent field
// is `exp_mask` of their bits, or n. The common case (none) is one pass of
// OR-reductions the compiler vectorises.
template <typename Bits>
size_t FirstNonFinite(const Bits* bits, size_t n, Bits exp_mask) {
  constexpr size_t kChunk = 4096;
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t i1 = std::min(n, i0 + kChunk);
    bool any = false;
    for (size_t i = i0; i < i1; ++i) any |= (bits[i] & exp_mask) == exp_mask;
    if (!any) continue;
    for (size_t i = i0; i < i1; ++i) {
      if ((bits[i] & exp_mask) == exp_mask) return i;
    }
  }
  return n;
}

}  // namespace

absl::Status CheckpointWeights::CheckFinite(const SafetensorsTensor& t, const float* data,
                                            size_t n) const {
  if (!scan_non_finite_) return absl::OkStatus();
  const size_t i = FirstNonFinite(reinterpret_cast<const uint32_t*>(data), n, 0x7f800000u);
  if (i == n) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", t.name, "' in ", t.file, ": element ", i, " is ", data[i],
                   " (weights must be finite; --trust-weights skips this check)"));
}

absl::Status CheckpointWeights::CheckFiniteBf16(const SafetensorsTensor& t, const uint16_t* bits,
                                                size_t n) const {
  if (!scan_non_finite_) return absl::OkStatus();
  const size_t i = FirstNonFinite(bits, n, static_cast<uint16_t>(0x7f80u));
  if (i == n) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", t.name, "' in ", t.file, ": element ", i, " is ", Bf16ToF32(bits[i]),
                   " (weights must be finite; --trust-weights skips this check)"));
}

absl::Status CheckpointWeights::ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                                        float* dst) {
  MLAG_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, shape));
  const size_t n = static_cast<size_t>(t->numel());
  if (t->dtype == DType::kF32) {
    if (n > 0) std::memcpy(dst, t->data, n * sizeof(float));
    return CheckFinite(*t, dst, n);
  }
  if (t->dtype == DType::kF8E4M3) {
    std::vector<float> scales(static_cast<size_t>(Fp8Blocks(t->shape[0]) * Fp8Blocks(t->shape[1])));
    MLAG_RETURN_IF_ERROR(ReadScales(*t, scales.data()));
    const auto* q = static_cast<const uint8_t*>(t->data);
    for (size_t i = 0; i < n; ++i) {
      if ((q[i] & 0x7f) == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' in ", t->file, ": fp8 element ", i, " is NaN"));
      }
    }
    DequantizeFp8Blocks(static_cast<const uint8_t*>(t->data), scales.data(), t->shape[0],
                        t->shape[1], dst);
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
  return CheckFinite(*t, dst, n);  // f16 and bf16 infinities and NaNs stay so in f32
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
  // config.json and the tensors agree on fp8: `mlag info` and `mlag export
  // --weight-dtype auto` go by the config, the arithmetic by each tensor's
  // dtype.
  const std::string* fp8_tensor = nullptr;
  for (const std::string& name : checkpoint->names()) {
    if (checkpoint->Find(name)->dtype == DType::kF8E4M3) {
      fp8_tensor = &name;
      break;
    }
  }
  if (fp8_tensor != nullptr && !source.config.fp8_block_quantized) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_or_dir, ": tensor '", *fp8_tensor,
        "' is F8_E4M3 but config.json has no quantization_config (an fp8 checkpoint declares "
        "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [128, 128]})"));
  }
  if (fp8_tensor == nullptr && source.config.fp8_block_quantized) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_or_dir,
                     ": config.json's quantization_config declares fp8 weights, but no tensor "
                     "is stored as F8_E4M3 (weights converted from fp8, e.g. by DeepSeek's "
                     "fp8_cast_bf16.py, need quantization_config removed from config.json)"));
  }
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
  bool past_layers = false;  // an unexpected tensor of a layer past num_hidden_layers
  for (const std::string& name :
       SortUnreadTensors(source.config, source.weights->Unread()).unexpected) {
    int expert = RoutedExpertId(name);
    if (expert >= 0 && !local.empty() && !std::binary_search(local.begin(), local.end(), expert) &&
        expert < source.config.n_routed_experts) {
      continue;  // held by another expert-parallel rank
    }
    past_layers = past_layers || LayerIndexOf(name) >= source.config.num_hidden_layers;
    unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    if (unexpected.size() > 5) {
      size_t more = unexpected.size() - 5;
      unexpected.resize(5);
      unexpected.push_back(absl::StrCat("and ", more, " more"));
    }
    const ModelConfig& c = source.config;
    return absl::InvalidArgumentError(absl::StrCat(
        source.description,
        ": unexpected tensor(s) for this config: ", absl::StrJoin(unexpected, ", "),
        past_layers ? absl::StrCat(" (config.json: num_hidden_layers ", c.num_hidden_layers,
                                   ", num_nextn_predict_layers ", c.num_nextn_predict_layers,
                                   "; a layer past num_hidden_layers is skipped only as a "
                                   "multi-token-prediction layer, with its eh_proj)")
                    : ""));
  }
  return model;
}

absl::Status ExportModel(const ModelConfig& config, WeightSource& weights, const std::string& dir,
                         DType dtype) {
  if (!IsFloat(dtype) && dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError("export dtype must be f32, bf16, f16 or fp8");
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory ", dir, ": ", std::strerror(errno)));
  }
  const bool fp8 = dtype == DType::kF8E4M3;
  ModelConfig out_config = config;
  out_config.fp8_block_quantized = fp8;
  out_config.num_nextn_predict_layers = 0;  // no multi-token-prediction layer is written
  SafetensorsWriter writer;
  std::vector<float> f32;
  std::vector<uint8_t> stored;
  std::vector<float> scales;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t s : spec.shape) n *= s;
    if (fp8 && QuantizedInFp8Checkpoints(spec)) {
      // DeepSeek-V3's layout: e4m3 values and "<name>_scale_inv", one f32
      // scale per 128 x 128 block; an fp8 source is copied as stored.
      const int64_t rows = spec.shape[0], cols = spec.shape[1];
      const int64_t col_blocks = Fp8Blocks(cols);
      stored.resize(static_cast<size_t>(n));
      scales.resize(static_cast<size_t>(Fp8Blocks(rows) * col_blocks));
      if (weights.StoredDType(spec.name) == DType::kF8E4M3) {
        MLAG_RETURN_IF_ERROR(
            weights.ReadStored(spec.name, spec.shape, stored.data(), scales.data()));
      } else {
        f32.resize(static_cast<size_t>(n));
        MLAG_RETURN_IF_ERROR(weights.ReadF32(spec.name, spec.shape, f32.data()));
        host::ParallelFor(Fp8Blocks(rows), [&](int64_t br) {
          const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
          QuantizeFp8Blocks(f32.data() + r0 * cols, r1 - r0, cols, stored.data() + r0 * cols,
                            scales.data() + br * col_blocks);
        });
      }
      MLAG_RETURN_IF_ERROR(writer.Add(spec.name, DType::kF8E4M3, spec.shape, stored.data()));
      MLAG_RETURN_IF_ERROR(writer.Add(spec.name + "_scale_inv", DType::kF32,
                                      {Fp8Blocks(rows), col_blocks}, scales.data()));
      continue;
    }
    f32.resize(static_cast<size_t>(n));
    MLAG_RETURN_IF_ERROR(weights.ReadF32(spec.name, spec.shape, f32.data()));
    // The correction bias stays f32, as in released V3 checkpoints; fp8
    // checkpoints keep everything else that is not quantized in bf16.
    const DType d = spec.role == TensorRole::kCorrectionBias ? DType::kF32
                    : fp8                                    ? DType::kBF16
                                                             : dtype;
    stored.resize(static_cast<size_t>(n) * DTypeSize(d));
    ConvertFromF32(f32.data(), d, stored.data(), static_cast<size_t>(n));
    MLAG_RETURN_IF_ERROR(writer.Add(spec.name, d, spec.shape, stored.data()));
  }
  // Both files complete under temporary names in `dir` before either
  // replaces anything, then renamed into place, weights first: a failure
  // (a bad source tensor, a full disk) leaves an existing checkpoint as it
  // was, and no reader sees a new config beside old weights.
  const std::string weights_path = dir + "/model.safetensors";
  const std::string config_path = dir + "/config.json";
  const std::string suffix = absl::StrCat(".export.", ::getpid());
  const std::string weights_tmp = weights_path + suffix, config_tmp = config_path + suffix;
  absl::Status written = writer.Write(weights_tmp);
  if (written.ok()) {
    written = WriteFileAtomically(config_tmp, {ModelConfigToJson(out_config).dump(2) + "\n"});
  }
  if (written.ok() && std::rename(weights_tmp.c_str(), weights_path.c_str()) != 0) {
    written = ErrnoStatus(errno, "cannot rename into place", weights_path);
  }
  if (written.ok() && std::rename(config_tmp.c_str(), config_path.c_str()) != 0) {
    written = ErrnoStatus(errno, "cannot rename into place", config_path);
  }
  std::remove(weights_tmp.c_str());  // no-ops once renamed
  std::remove(config_tmp.c_str());
  return written;
}

}  // namespace mlag
