// mlag export: write a model (built-in or a checkpoint) in the Hugging Face
// layout: config.json + model.safetensors (bf16).
//
//   mlag export --model M --out DIR
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
};

int Export(const ExportFlags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ModelSource> source = OpenModel(f.model);
  if (!source.ok()) return Fail(source.status());
  absl::Status s = ExportModel(source->config, *source->weights, f.out);
  if (!s.ok()) return Fail(s);
  std::printf("exported %s to %s: %zu tensors, config.json + model.safetensors (bf16) in %.2f s\n",
              source->description.c_str(), f.out.c_str(), ExpectedTensors(source->config).size(),
              SecondsSince(t0));
  return 0;
}

}  // namespace

Command AddExportCommand(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* exp = app.add_subcommand("export", "write a model as config.json + safetensors");
  exp->add_option("--model", f->model, ModelHelp())->required();
  exp->add_option("--out", f->out, "output directory")->required();
  return {exp, [f] { return Export(*f); }};
}

}  // namespace mlag::cli
