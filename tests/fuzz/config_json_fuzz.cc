// Fuzz target: config.json. ParseModelConfig must return a status for any
// bytes; a config it accepts must give a tensor list and a memory plan of
// its weights without overflow (checked by UBSan in the sanitizer build).
#include <string>
#include <vector>

#include "layers/deepseek_model.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_config_json.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

// Every tensor present, stored as fp8: the plan's largest dtype mix.
class Fp8Everywhere final : public mlag::WeightSource {
 public:
  absl::Status ReadF32(absl::string_view, absl::Span<const int64_t>, float*) override {
    return absl::UnimplementedError("planning only");
  }
  mlag::DType StoredDType(absl::string_view) const override { return mlag::DType::kF8E4M3; }
  bool Has(absl::string_view) const override { return true; }
  std::vector<std::string> Unread() const override { return {}; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mlag::ModelConfig> config = mlag::ParseModelConfig(text, "fuzz/config.json");
  if (!config.ok()) return 0;
  size_t elements = 0;
  for (const mlag::TensorSpec& t : mlag::ExpectedTensors(*config)) elements += t.shape.size();
  (void)elements;
  static std::unique_ptr<mlag::Device> host = mlag::Device::Create("host").value();
  mlag::ModelOptions options;
  options.weight_format = mlag::WeightFormat::kAuto;
  Fp8Everywhere source;
  (void)mlag::DeepseekModel::PlanWeightBytes(*config, host.get(), source, options);
  (void)mlag::DeepseekModel::RopeTableBytes(*config, options);
  return 0;
}

namespace mlag::fuzz {

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds;
  for (const std::string& name : BuiltinModelNames()) {
    seeds.push_back(ModelConfigToJson(BuiltinModelConfig(name).value()).dump(1));
  }
  return seeds;
}

}  // namespace mlag::fuzz
