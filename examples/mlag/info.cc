// mlag info: build a model on a device and describe it: shapes, MLA and MoE
// settings, tensors, the bytes of its weights, and the memory plan an engine
// with the same flags would make (runtime/engine/memory_plan.h).
//
//   mlag info --model M [--device D] [engine flags: --memory-utilization,
//             --max-model-len, --kv-cache-bytes, ...]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/mlag/cli.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/engine/engine.h"

namespace mlag::cli {
namespace {

int Info(const EngineFlags& f, bool plan_only) {
  absl::StatusOr<EngineOptions> engine_options = f.ToOptions();
  if (!engine_options.ok()) return Fail(engine_options.status());
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Create(f.device);
  if (!device.ok()) return Fail(device.status());
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ModelSource> source = OpenModel(f.model);
  if (!source.ok()) return Fail(source.status());
  // The plan first: a model that cannot fit is refused before any weight
  // is read.
  absl::StatusOr<MemoryPlanRequest> request = MemoryPlanRequestFor(*engine_options, **device);
  if (!request.ok()) return Fail(request.status());
  absl::StatusOr<MemoryPlan> plan = PlanMemory(*source, device->get(), *request);
  if (!plan.ok()) return Fail(plan.status());
  if (plan_only) {
    std::printf("model: %s on %s\n", source->description.c_str(), (*device)->name().c_str());
    std::printf("memory plan (max_model_len %d%s):\n", plan->max_model_len,
                plan->max_model_len_given ? "" : ", the model's max_position_embeddings");
    for (const std::string& line : plan->Lines()) std::printf("%s\n", line.c_str());
    return 0;
  }
  ModelOptions options;
  options.max_tokens = 64;
  options.max_seqs = 8;
  options.weight_format = request->runner.weight_format;
  options.local_experts = request->runner.local_experts;
  options.max_positions = plan->max_model_len;
  absl::StatusOr<std::unique_ptr<DeepseekModel>> built =
      BuildModel(*source, device->get(), options);
  if (!built.ok()) return Fail(built.status());
  const double seconds = SecondsSince(t0);
  const ModelConfig& c = source->config;
  int moe_layers = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.IsMoeLayer(i) ? 1 : 0;
  std::printf("model: %s (%s)\n", source->description.c_str(), c.model_type.c_str());
  std::printf("device: %s — %s\n", (*device)->name().c_str(),
              (*device)->selection_reason().c_str());
  std::printf("layers: %d (%d MoE), hidden %d, heads %d, vocab %d\n", c.num_hidden_layers,
              moe_layers, c.hidden_size, c.num_attention_heads, c.vocab_size);
  std::printf("MLA: q_lora %d, kv_lora %d, nope %d, rope %d, v %d, softmax scale %.6f\n",
              c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
              (*built)->attention(0).softmax_scale());
  std::printf("MoE: %d routed experts, top-%d, %d shared, expert width %d\n", c.n_routed_experts,
              c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size);
  std::string by_dtype;
  for (const auto& [dtype, bytes] : (*built)->weight_bytes_by_dtype()) {
    absl::StrAppend(&by_dtype, by_dtype.empty() ? "" : ", ", DTypeName(dtype), " ",
                    absl::StrFormat("%.2f", bytes / 1048576.0), " MiB");
  }
  std::printf("tensors: %zu, weights on device: %.1f MiB (%s)\n", ExpectedTensors(c).size(),
              (*built)->weight_bytes() / 1048576.0, by_dtype.c_str());
  if (c.fp8_block_quantized) {
    std::printf("checkpoint: fp8 e4m3 projections with 128x128 block scales\n");
  }
  // Tensors the model does not use: the multi-token-prediction layer(s) of V3
  // (BuildModel refused anything else left unread).
  for (const auto& [layer, tensors] : SortUnreadTensors(c, source->weights->Unread()).mtp_layers) {
    std::printf("skipped: multi-token-prediction layer %d (%d tensors; not used for decoding)\n",
                layer, tensors);
  }
  std::printf(
      "kv cache: %s by default on this device (--kv-cache-dtype auto of run, serve and bench)\n",
      std::string(DTypeName(DefaultKvCacheDtype(**device))).c_str());
  std::printf("built in %.2f s\n", seconds);
  std::printf("memory plan (max_model_len %d%s; run and serve make it with the same flags):\n",
              plan->max_model_len,
              plan->max_model_len_given ? "" : ", the model's max_position_embeddings");
  for (const std::string& line : plan->Lines()) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

Command AddInfoCommand(CLI::App& app) {
  auto f = std::make_shared<EngineFlags>();
  CLI::App* info =
      app.add_subcommand("info", "build a model and describe it, with its memory plan");
  f->Register(info);
  auto plan_only = std::make_shared<bool>(false);
  info->add_flag("--plan", *plan_only,
                 "print the memory plan only, without building the model (reads no weight)");
  return {info, [f, plan_only] { return Info(*f, *plan_only); }};
}

}  // namespace mlag::cli
