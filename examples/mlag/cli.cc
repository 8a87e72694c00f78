#include "examples/mlag/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/core/status.h"

namespace mlag::cli {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "mlag: error: %s\n", std::string(status.message()).c_str());
  return kExitUsage;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(i, values.size() - 1)];
}

std::string ModelHelp() {
  return absl::StrCat("built-in model (", absl::StrJoin(BuiltinModelNames(), ", "),
                      ") or checkpoint directory");
}

CLI::Validator AtLeast(double min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(value, v) || !(v >= min)) {
          return absl::StrCat("value ", value, " must be >= ", min);
        }
        return "";
      },
      absl::StrCat(">=", min));
}

CLI::Validator FiniteAtLeast(double min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        double v = 0;
        // Finite as the float the option is stored in, too (1e39 is not).
        if (!CLI::detail::lexical_cast(value, v) || !std::isfinite(v) ||
            !std::isfinite(static_cast<float>(v)) || !(v >= min)) {
          return absl::StrCat("value ", value, " must be a finite number >= ", min);
        }
        return "";
      },
      absl::StrCat("finite >=", min));
}

CLI::Validator Uint64() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        // strtoull accepts a sign and wraps negatives; a seed is digits only.
        const bool digits = !value.empty() && value.size() <= 20 &&
                            value.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        if (digits) (void)std::strtoull(value.c_str(), nullptr, 10);
        if (!digits || errno == ERANGE) {
          return absl::StrCat("value ", value.substr(0, 40),
                              " must be an integer in [0, 2^64 - 1]");
        }
        return "";
      },
      "UINT64");
}

CLI::Validator UnitInterval() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(value, v) || !(v > 0.0 && v <= 1.0)) {
          return absl::StrCat("value ", value, " must be in (0, 1]");
        }
        return "";
      },
      "(0,1]");
}

void EngineFlags::Register(CLI::App* app) {
  app->add_option("--model", model, ModelHelp())->required();
  app->add_option("--device", device, "auto, host, cuda or cuda:N");
  app->add_option("--graph-mode", graph_mode, "full-decode (default) or none");
  app->add_option("--kv-cache-bytes", kv_cache_bytes,
                  "bytes of KV cache (default: what the memory plan leaves of the usable "
                  "memory; mlag info shows the plan)")
      ->check(AtLeast(1));
  app->add_option("--memory-utilization", memory_utilization,
                  "fraction of the memory the device has available that the plan may use "
                  "(default 0.9)")
      ->check(UnitInterval());
  app->add_option("--max-num-seqs", max_num_seqs, "most sequences per step")->check(AtLeast(1));
  app->add_option("--max-num-batched-tokens", max_num_batched_tokens,
                  "token budget per step (chunked prefill)")
      ->check(AtLeast(1));
  app->add_option("--block-size", block_size, "tokens per KV block")->check(AtLeast(1));
  app->add_option("--max-model-len", max_model_len,
                  "longest sequence, prompt and output (0: the model's "
                  "max_position_embeddings)")
      ->check(AtLeast(0));
  app->add_flag("--no-prefix-caching", no_prefix_caching, "disable prefix caching");
  app->add_option("--step-overlap", step_overlap,
                  "plan and stage the next step while the GPU runs this one: auto (on for "
                  "CUDA without expert parallelism), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "auto (bf16 on CUDA, f32 on the host), f32 or bf16");
  AddWeightDtype(app, &weight_dtype);
  app->add_option("--chat-format", chat_format,
                  "chat format of text prompts: auto (the tokenizer config's, else the model "
                  "type's), v2 or v3")
      ->check(CLI::IsMember({"auto", "v2", "v3"}));
  app->add_flag("--trust-weights", trust_weights,
                "skip the load-time scan that refuses NaN and infinite f32, bf16 and f16 "
                "weights (fp8 weights and their block scales are always checked: the fp8 "
                "kernels rely on them)");
}

void AddWeightDtype(CLI::App* app, std::string* weight_dtype) {
  app->add_option("--weight-dtype", *weight_dtype,
                  "projection weights: auto (as the checkpoint stores them), f32, bf16 or fp8 "
                  "(e4m3, 128x128 block scales)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
}

absl::StatusOr<EngineOptions> EngineFlags::ToOptions() const {
  EngineOptions o;
  o.model = model;
  o.device = device;
  MLAG_ASSIGN_OR_RETURN(o.graph_mode, ParseGraphMode(graph_mode));
  o.kv_cache_bytes = static_cast<size_t>(kv_cache_bytes);
  o.memory_utilization = memory_utilization;
  o.max_num_seqs = max_num_seqs;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.block_size = block_size;
  o.max_model_len = max_model_len;
  o.enable_prefix_caching = !no_prefix_caching;
  o.step_overlap = step_overlap;
  o.kv_cache_dtype = kv_cache_dtype;
  o.weight_dtype = weight_dtype;
  o.trust_weights = trust_weights;
  o.chat_format = chat_format;
  return o;
}

}  // namespace mlag::cli
