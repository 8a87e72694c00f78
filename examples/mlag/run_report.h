// The report of `mlag run`, for one rank or an expert-parallel world: built
// once from the run, then written as text or as one JSON object.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/engine/expert_parallel.h"
#include "runtime/engine/memory_plan.h"
#include "runtime/engine/request.h"

namespace mlag::cli {

struct RunReport {
  std::vector<RequestResult> requests;  // in id order
  bool with_logprobs = false;
  // Text prompts (--prompt, --prompts-text): each request's prompt and output
  // as text, in request order; empty otherwise.
  std::vector<std::string> prompt_text, output_text;

  std::string model;   // description
  std::string device;  // name and why it was chosen (single rank)
  std::string graph_mode;
  double create_seconds = 0, capture_seconds = 0, run_seconds = 0;
  int num_graphs = 0;
  // Start-up in phases (single rank; seconds): the engine's own, then from
  // the command's start to the first sampled token.
  double open_model_seconds = 0, build_model_seconds = 0, kv_pool_seconds = 0, warmup_seconds = 0,
         first_token_seconds = 0;
  bool has_startup = false;

  int64_t tokens_in = 0, tokens_out = 0;
  int64_t steps = 0;         // driver steps (every rank steps together)
  int64_t engine_steps = 0;  // summed over ranks
  int64_t eager_steps = 0, dummy_steps = 0, preemptions = 0;
  // The overlapped loop: steps launched while the one before ran, and the
  // tokens the device fed from one step to the next.
  int64_t overlapped_steps = 0, fed_tokens = 0;
  std::map<int, int64_t> graph_replays;  // capture size -> replays, summed over ranks
  double prefix_cache_hit_rate = 0;
  std::vector<double> step_ms;  // per step (single rank only)

  // KV pool (single rank only; 0 when unknown).
  int kv_blocks_total = 0, kv_blocks_used = 0, kv_block_size = 0;
  size_t kv_bytes_per_token = 0;
  // The memory plan (single rank) and the bytes its items hold after the run.
  bool has_memory_plan = false;
  MemoryPlan memory_plan;
  size_t memory_allocated_bytes = 0;

  // Expert parallelism (ep == 0: off).
  int ep = 0;
  std::string ep_backend;
  std::vector<ReconfigurationReport> reconfigurations;
};

// The memory plan as JSON: the device, its available memory and what bounds
// it, the utilization, usable and planned bytes, max_model_len, the KV
// blocks, and every item {name, bytes, detail}; with `allocated_bytes` when
// nonzero (what the items hold).
nlohmann::ordered_json MemoryPlanJson(const MemoryPlan& plan, size_t allocated_bytes = 0);

// Fills the request and counter fields from an expert-parallel run.
void AddExpertParallelResult(const EpRunResult& result, RunReport* report);

// Writes the report to stdout: a line per request and a summary, or one JSON
// object (`json`).
void PrintRunReport(const RunReport& report, bool json);

}  // namespace mlag::cli
