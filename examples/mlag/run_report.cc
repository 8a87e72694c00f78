#include "examples/mlag/run_report.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/escaping.h"
#include "examples/mlag/cli.h"
#include "nlohmann/json.hpp"

namespace mlag::cli {
namespace {

using Json = nlohmann::ordered_json;

Json RequestJson(const RequestResult& r, bool with_logprobs) {
  Json j = {{"id", r.id},
            {"prompt_tokens", r.prompt_tokens},
            {"output_tokens", r.output_tokens},
            {"finish_reason", std::string(FinishReasonName(r.finish_reason))}};
  if (with_logprobs) {
    Json per_token = Json::array();
    for (const auto& entry : r.logprobs) {
      Json top = Json::array();
      for (const TokenLogprob& t : entry)
        top.push_back({{"token", t.token}, {"logprob", t.logprob}});
      per_token.push_back(std::move(top));
    }
    j["logprobs"] = std::move(per_token);
  }
  return j;
}

}  // namespace

Json MemoryPlanJson(const MemoryPlan& p, size_t allocated_bytes) {
  Json items = Json::array();
  for (const MemoryPlanItem& item : p.items) {
    items.push_back({{"name", item.name}, {"bytes", item.bytes}, {"detail", item.detail}});
  }
  Json j = {{"device", p.device},
            {"available_bytes", p.budget.available},
            {"total_bytes", p.budget.total},
            {"source", p.budget.source},
            {"memory_utilization", p.memory_utilization},
            {"memory_share", p.memory_share},
            {"usable_bytes", p.usable_bytes},
            {"planned_bytes", p.planned_bytes()},
            {"max_model_len", p.max_model_len},
            {"max_model_len_given", p.max_model_len_given},
            {"kv_cache_given", p.kv_cache_given},
            {"kv_blocks", p.kv_blocks},
            {"kv_block_bytes", p.kv_block_bytes},
            {"kv_tokens", p.kv_tokens()},
            {"items", std::move(items)}};
  if (allocated_bytes > 0) j["allocated_bytes"] = allocated_bytes;
  return j;
}

namespace {

void PrintJson(const RunReport& r) {
  Json j;
  j["requests"] = Json::array();
  for (size_t i = 0; i < r.requests.size(); ++i) {
    j["requests"].push_back(RequestJson(r.requests[i], r.with_logprobs));
    if (i < r.output_text.size()) {
      j["requests"].back()["prompt_text"] = r.prompt_text[i];
      j["requests"].back()["output_text"] = r.output_text[i];
    }
  }
  Json replays = Json::object();
  for (const auto& [size, count] : r.graph_replays) replays[std::to_string(size)] = count;
  Json s = {{"steps", r.steps},
            {"engine_steps", r.engine_steps},
            {"graph_replays", replays},
            {"eager_steps", r.eager_steps},
            {"dummy_steps", r.dummy_steps},
            {"prefix_cache_hit_rate", r.prefix_cache_hit_rate},
            {"capture_seconds", r.capture_seconds},
            {"preemptions", r.preemptions},
            {"overlapped_steps", r.overlapped_steps},
            {"fed_tokens", r.fed_tokens},
            {"tokens_in", r.tokens_in},
            {"tokens_out", r.tokens_out},
            {"run_seconds", r.run_seconds}};
  if (r.has_startup) {
    s["startup_seconds"] = {
        {"open_model", r.open_model_seconds},  {"build_model", r.build_model_seconds},
        {"kv_pool", r.kv_pool_seconds},        {"warmup", r.warmup_seconds},
        {"capture", r.capture_seconds},        {"engine_ready", r.create_seconds},
        {"first_token", r.first_token_seconds}};
  }
  if (!r.step_ms.empty()) {
    s["step_latency_ms"] = {{"p50", Percentile(r.step_ms, 0.5)},
                            {"p99", Percentile(r.step_ms, 0.99)}};
  }
  if (r.kv_blocks_total > 0) s["kv_blocks_total"] = r.kv_blocks_total;
  if (r.has_memory_plan) s["memory_plan"] = MemoryPlanJson(r.memory_plan, r.memory_allocated_bytes);
  if (r.ep > 0) {
    s["ep"] = r.ep;
    s["ep_backend"] = r.ep_backend;
  }
  j["stats"] = std::move(s);
  if (r.ep > 0) {
    j["reconfigurations"] = Json::array();
    for (const ReconfigurationReport& c : r.reconfigurations) {
      Json phases = Json::object();
      for (const auto& [name, seconds] : c.seconds) phases[name] = seconds;
      j["reconfigurations"].push_back({{"step", c.step},
                                       {"from", c.from},
                                       {"to", c.to},
                                       {"kv_pages_unchanged", c.kv_pages_unchanged},
                                       {"seconds", std::move(phases)}});
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

void PrintText(const RunReport& r) {
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const RequestResult& q = r.requests[i];
    std::printf("request %lld (%d prompt tokens, %s):", static_cast<long long>(q.id),
                q.prompt_tokens, std::string(FinishReasonName(q.finish_reason)).c_str());
    for (int32_t t : q.output_tokens) std::printf(" %d", t);
    std::printf("\n");
    if (i < r.output_text.size()) {
      // Control characters escaped, UTF-8 kept: one line per text.
      std::printf("  prompt: \"%s\"\n  output: \"%s\"\n",
                  absl::Utf8SafeCEscape(r.prompt_text[i]).c_str(),
                  absl::Utf8SafeCEscape(r.output_text[i]).c_str());
    }
  }
  std::printf("\nmodel %s", r.model.c_str());
  if (!r.device.empty()) std::printf(" on %s", r.device.c_str());
  std::printf("\n");
  if (r.ep > 0) {
    std::printf(
        "expert parallel: %d ranks (%s backend), %lld engine steps summed over ranks, "
        "%lld dummy steps\n",
        r.ep, r.ep_backend.c_str(), static_cast<long long>(r.engine_steps),
        static_cast<long long>(r.dummy_steps));
  } else {
    std::printf("engine built in %.2f s; %d graphs captured in %.3f s (graph mode %s)\n",
                r.create_seconds, r.num_graphs, r.capture_seconds, r.graph_mode.c_str());
    if (r.has_startup) {
      std::printf(
          "start-up: open %.3f s, build model %.3f s, KV pool %.3f s, warm-up %.3f s, "
          "capture %.3f s; first token at %.3f s\n",
          r.open_model_seconds, r.build_model_seconds, r.kv_pool_seconds, r.warmup_seconds,
          r.capture_seconds, r.first_token_seconds);
    }
  }
  if (r.has_memory_plan) {
    std::printf("memory plan (max_model_len %d%s):\n", r.memory_plan.max_model_len,
                r.memory_plan.max_model_len_given ? "" : ", the model's max_position_embeddings");
    for (const std::string& line : r.memory_plan.Lines()) std::printf("%s\n", line.c_str());
    std::printf("  %-16s %10s  held by the planned items after the run\n", "allocated",
                FormatBytes(static_cast<double>(r.memory_allocated_bytes)).c_str());
  }
  std::printf("requests: %zu, tokens in %lld, tokens out %lld, %.1f s, %.1f tokens/s out\n",
              r.requests.size(), static_cast<long long>(r.tokens_in),
              static_cast<long long>(r.tokens_out), r.run_seconds,
              static_cast<double>(r.tokens_out) / std::max(r.run_seconds, 1e-9));
  std::printf("steps: %lld", static_cast<long long>(r.steps));
  if (!r.step_ms.empty()) {
    std::printf(", step latency p50 %.2f ms, p99 %.2f ms", Percentile(r.step_ms, 0.5),
                Percentile(r.step_ms, 0.99));
  }
  std::printf(", eager steps %lld, preemptions %lld", static_cast<long long>(r.eager_steps),
              static_cast<long long>(r.preemptions));
  if (r.overlapped_steps > 0) {
    std::printf(", overlapped %lld (%lld tokens fed on the device)",
                static_cast<long long>(r.overlapped_steps), static_cast<long long>(r.fed_tokens));
  }
  std::printf("\n");
  std::printf("graph replays per size:");
  if (r.graph_replays.empty()) std::printf(" none");
  for (const auto& [size, count] : r.graph_replays) {
    std::printf(" %d:%lld", size, static_cast<long long>(count));
  }
  std::printf("\nprefix cache hit rate %.1f%%", 100.0 * r.prefix_cache_hit_rate);
  if (r.kv_blocks_total > 0) {
    std::printf("; KV %d blocks of %d tokens (%zu bytes/token), %d in use at exit",
                r.kv_blocks_total, r.kv_block_size, r.kv_bytes_per_token, r.kv_blocks_used);
  }
  std::printf("\n");
  for (const ReconfigurationReport& c : r.reconfigurations) {
    std::printf("reconfiguration at step %d: %d -> %d ranks, kv pages unchanged: %s;", c.step,
                c.from, c.to, c.kv_pages_unchanged ? "yes" : "NO");
    for (const auto& [name, seconds] : c.seconds) std::printf(" %s %.4f s", name.c_str(), seconds);
    std::printf("\n");
  }
}

}  // namespace

void AddExpertParallelResult(const EpRunResult& result, RunReport* report) {
  report->device = result.device + " (rank 0)";
  report->requests = result.requests;
  report->steps = result.driver_steps;
  report->engine_steps = result.engine_steps;
  report->eager_steps = result.eager_steps;
  report->dummy_steps = result.dummy_steps;
  report->preemptions = result.preemptions;
  report->graph_replays = result.graph_replays;
  report->capture_seconds = result.capture_seconds;
  report->prefix_cache_hit_rate =
      result.prefix_queried_tokens > 0
          ? static_cast<double>(result.prefix_hit_tokens) / result.prefix_queried_tokens
          : 0.0;
  report->reconfigurations = result.reconfigurations;
  report->tokens_out = 0;
  for (const RequestResult& r : result.requests) {
    report->tokens_out += static_cast<int64_t>(r.output_tokens.size());
  }
}

void PrintRunReport(const RunReport& report, bool json) {
  if (json) {
    PrintJson(report);
  } else {
    PrintText(report);
  }
}

}  // namespace mlag::cli
