// What the subcommands of mlag share: the one-line error convention, the
// engine flags (declared once, with their ranges) and the subcommand type.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"

namespace mlag::cli {

// Exit code of every error from a flag, a file or a model.
inline constexpr int kExitUsage = 2;

// Prints "mlag: error: <message>" on one line of stderr; returns kExitUsage.
int Fail(const absl::Status& status);

double SecondsSince(std::chrono::steady_clock::time_point start);
// The q-quantile (0 <= q <= 1) of `values`, nearest rank; 0 when empty.
double Percentile(std::vector<double> values, double q);

// "built-in model (tiny-v3, tiny-v2, ...) or checkpoint directory", from the
// list of built-in models.
std::string ModelHelp();

// Flag validators, so that a value out of range fails while parsing with
// CLI11's one-line message naming the flag.
CLI::Validator AtLeast(double min);  // [min, inf)
CLI::Validator UnitInterval();
// A finite number >= min, finite as a float too (temperatures).
CLI::Validator FiniteAtLeast(double min);
// An unsigned decimal integer that fits uint64 (seeds): no sign, no wrap.
CLI::Validator Uint64();  // (0, 1]
// --weight-dtype (auto, f32, bf16 or fp8) into `weight_dtype`.
void AddWeightDtype(CLI::App* app, std::string* weight_dtype);

// The flags every command that builds an engine takes.
struct EngineFlags {
  std::string model;
  std::string device = "auto";
  std::string graph_mode = "full-decode";
  std::string step_overlap = "auto";
  int64_t kv_cache_bytes = 0;  // 0: what the memory plan leaves
  double memory_utilization = kDefaultMemoryUtilization;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int block_size = 64;
  int max_model_len = 0;
  bool no_prefix_caching = false;
  std::string kv_cache_dtype = "auto";
  std::string weight_dtype = "auto";
  bool trust_weights = false;
  std::string chat_format = "auto";

  void Register(CLI::App* app);
  // The engine options; the values were range-checked while parsing, the
  // rest (graph mode, device, dtype names, sizes against the model) is
  // checked by Engine::Create.
  absl::StatusOr<EngineOptions> ToOptions() const;
};

// A subcommand: its CLI11 app, and what to run when it was given.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Each adds its subcommand to `app` (one file each: run.cc, graphs.cc,
// bench.cc, export.cc, info.cc).
Command AddRunCommand(CLI::App& app);
Command AddGraphsCommand(CLI::App& app);
Command AddBenchCommand(CLI::App& app);
Command AddExportCommand(CLI::App& app);
Command AddInfoCommand(CLI::App& app);
Command AddServeCommand(CLI::App& app);
Command AddBenchServeCommand(CLI::App& app);

}  // namespace mlag::cli
