// mlag export: write a model (built-in or a checkpoint) in the Hugging Face
// layout: config.json + model.safetensors, in bf16 (as released V2/V3
// checkpoints), f32, or DeepSeek-V3's fp8 layout (e4m3 projections with
// 128 x 128 block scales, the rest bf16, quantization_config).
//
//   mlag export --model M --out DIR [--weight-dtype auto|f32|bf16|fp8]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "examples/mlag/cli.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_loader.h"

namespace mlag::cli {
namespace {

struct ExportFlags {
  std::string model;
  std::string out;
  std::string weight_dtype = "auto";
};

int Export(const ExportFlags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ModelSource> source = OpenModel(f.model);
  if (!source.ok()) return Fail(source.status());
  // auto: an fp8 checkpoint stays fp8, anything else becomes bf16.
  DType dtype = DType::kBF16;
  if (f.weight_dtype == "f32") dtype = DType::kF32;
  if (f.weight_dtype == "fp8" || (f.weight_dtype == "auto" && source->config.fp8_block_quantized)) {
    dtype = DType::kF8E4M3;
  }
  absl::Status s = ExportModel(source->config, *source->weights, f.out, dtype);
  if (!s.ok()) return Fail(s);
  std::printf("exported %s to %s: %zu weights, config.json + model.safetensors (%s) in %.2f s\n",
              source->description.c_str(), f.out.c_str(), ExpectedTensors(source->config).size(),
              dtype == DType::kF8E4M3 ? "fp8 e4m3 projections with 128x128 block scales, rest bf16"
                                      : std::string(DTypeName(dtype)).c_str(),
              SecondsSince(t0));
  return 0;
}

}  // namespace

Command AddExportCommand(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* exp = app.add_subcommand("export", "write a model as config.json + safetensors");
  exp->add_option("--model", f->model, ModelHelp())->required();
  exp->add_option("--out", f->out, "output directory")->required();
  exp->add_option("--weight-dtype", f->weight_dtype,
                  "auto (fp8 stays fp8, anything else bf16), f32, bf16 or fp8 (DeepSeek-V3's "
                  "e4m3 layout with 128x128 block scales)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  return {exp, [f] { return Export(*f); }};
}

}  // namespace mlag::cli
