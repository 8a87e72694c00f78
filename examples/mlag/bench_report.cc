#include "examples/mlag/bench_report.h"

#include <cstdio>

#include "nlohmann/json.hpp"

namespace mlag::cli {
namespace {

// Decode tokens/s at batch 1 (graph mode), 0 when batch 1 was not run.
double TokensPerSecondAtBatch1(const BenchReport& r) {
  double tok_s_1 = 0;
  for (const DecodeResult& d : r.decode) {
    if (d.batch == 1) tok_s_1 = 1e3 / d.graph_ms;
  }

  return tok_s_1;
}

}  // namespace

void PrintBenchJson(const BenchReport& r) {
  const double tok_s_1 = TokensPerSecondAtBatch1(r);
  const double prefill_tok_s = r.prefill_tokens / (r.prefill_ms / 1e3);
  nlohmann::json j;
  j["machine"] = {{"device", r.device_name},
                  {"bandwidth_gb_s", r.bandwidth.bytes_per_second / 1e9},
                  {"bandwidth_method", r.bandwidth.method},
                  {"read_sum_gb_s", r.bandwidth.read_sum_bytes_per_second / 1e9},
                  {"gemv_gb_s", r.bandwidth.gemv_bytes_per_second / 1e9},
                  {"bandwidth_buffer_bytes", r.bandwidth.bytes}};
  for (double b : r.bandwidth_runs_bytes_per_second) {
    j["machine"]["bandwidth_runs_gb_s"].push_back(b / 1e9);
  }
  j["model"] = {{"name", r.model},
                {"layers", r.config.num_hidden_layers},
                {"hidden", r.config.hidden_size},
                {"heads", r.config.num_attention_heads},
                {"routed_experts", r.config.n_routed_experts},
                {"top_k", r.config.num_experts_per_tok},
                {"weight_bytes", r.weight_bytes}};
  j["kv_cache_dtype"] = DTypeName(r.kv_dtype);
  j["weight_dtype"] = WeightFormatName(r.weight_format);
  j["weight_bytes_by_dtype"] = nlohmann::json::object();
  for (const auto& [dtype, bytes] : r.weight_bytes_by_dtype) {
    j["weight_bytes_by_dtype"][std::string(DTypeName(dtype))] = bytes;
  }
  j["context_len"] = r.context_len;
  j["steps"] = r.steps;
  j["build_seconds"] = r.build_seconds;
  j["capture_seconds"] = r.capture_seconds;
  j["decode"] = nlohmann::json::array();
  for (const DecodeResult& d : r.decode) {
    const double gbs = d.bytes / (d.graph_ms / 1e3) / 1e9;
    j["decode"].push_back(
        {{"batch", d.batch},
         {"graph_ms", d.graph_ms},
         {"eager_ms", d.eager_ms},
         {"graph_tokens_per_s", d.batch / (d.graph_ms / 1e3)},
         {"eager_tokens_per_s", d.batch / (d.eager_ms / 1e3)},
         {"graph_speedup", d.eager_ms / d.graph_ms},
         {"bytes_per_step", d.bytes},
         {"experts_touched", d.experts_touched},
         {"achieved_gb_s", gbs},
         {"fraction_of_bandwidth", gbs * 1e9 / r.bandwidth.bytes_per_second},
         {"tokens_per_s_vs_batch1", tok_s_1 > 0 ? d.batch / (d.graph_ms / 1e3) / tok_s_1 : 0.0}});
  }
  j["prefill"] = {
      {"tokens", r.prefill_tokens}, {"ms", r.prefill_ms}, {"tokens_per_s", prefill_tok_s}};
  j["invariance_cost"] = nlohmann::json::array();
  for (const GemmCost& g : r.gemm_cost) {
    j["invariance_cost"].push_back(
        {{"rows", g.rows},
         {"out", g.out},
         {"in", g.in},
         {"host_gemm_gflops", g.host_gemm_gflops},
         {"openblas_gflops", g.openblas_gflops},
         {"host_gemm_vs_openblas", g.host_gemm_gflops / g.openblas_gflops}});
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void PrintBenchText(const BenchReport& r) {
  const double tok_s_1 = TokensPerSecondAtBatch1(r);
  const double prefill_tok_s = r.prefill_tokens / (r.prefill_ms / 1e3);
  std::printf("machine: %s; memory bandwidth %.2f GB/s (%s, %.1f GiB buffer, best of 5",
              r.device_name.c_str(), r.bandwidth.bytes_per_second / 1e9, r.bandwidth.method,
              r.bandwidth_gib);
  if (r.bandwidth_runs_bytes_per_second.size() == 2) {
    std::printf("; the better of %.2f GB/s before and %.2f GB/s after the decode timings",
                r.bandwidth_runs_bytes_per_second[0] / 1e9,
                r.bandwidth_runs_bytes_per_second[1] / 1e9);
  }
  if (!r.is_cuda) {
    std::printf("; read-sum %.2f GB/s, matrix-vector %.2f GB/s",
                r.bandwidth.read_sum_bytes_per_second / 1e9,
                r.bandwidth.gemv_bytes_per_second / 1e9);
  }
  std::printf(")\n");
  std::printf(
      "model: %s: %d layers, hidden %d, %d heads, %d routed experts top-%d, "
      "%.2f GB of weights (--weight-dtype %s)\n",
      r.model.c_str(), r.config.num_hidden_layers, r.config.hidden_size,
      r.config.num_attention_heads, r.config.n_routed_experts, r.config.num_experts_per_tok,
      r.weight_bytes / 1e9, std::string(WeightFormatName(r.weight_format)).c_str());
  std::printf(
      "decode at context %d (%s cache), median of %d steps; built in %.1f s, %zu graphs "
      "captured in %.3f s\n\n",
      r.context_len, std::string(DTypeName(r.kv_dtype)).c_str(), r.steps, r.build_seconds,
      r.decode.size(), r.capture_seconds);
  std::printf("%6s %10s %10s %8s %12s %12s %9s %8s %9s %7s %9s\n", "batch", "graph ms", "eager ms",
              "speedup", "graph tok/s", "eager tok/s", "vs b=1", "experts", "GB/step", "GB/s",
              "of bw");
  for (const DecodeResult& d : r.decode) {
    const double gbs = d.bytes / (d.graph_ms / 1e3) / 1e9;
    std::printf("%6d %10.2f %10.2f %7.2fx %12.1f %12.1f %8.2fx %8d %9.3f %7.2f %8.1f%%\n", d.batch,
                d.graph_ms, d.eager_ms, d.eager_ms / d.graph_ms, d.batch / (d.graph_ms / 1e3),
                d.batch / (d.eager_ms / 1e3),
                tok_s_1 > 0 ? d.batch / (d.graph_ms / 1e3) / tok_s_1 : 0.0, d.experts_touched,
                d.bytes / 1e9, gbs, 100.0 * gbs * 1e9 / r.bandwidth.bytes_per_second);
  }
  if (!r.gemm_cost.empty()) {
    std::printf(
        "\nwhat batch invariance costs: the host GEMM (one summation order at every row count)"
        " against OpenBLAS sgemm, f32 [%lld x %lld] weights, GFLOP/s:\n",
        static_cast<long long>(r.gemm_cost[0].out), static_cast<long long>(r.gemm_cost[0].in));
    for (const GemmCost& g : r.gemm_cost) {
      std::printf("  rows %5lld: host GEMM %8.1f  OpenBLAS %8.1f  (%.2fx)\n",
                  static_cast<long long>(g.rows), g.host_gemm_gflops, g.openblas_gflops,
                  g.host_gemm_gflops / g.openblas_gflops);
    }
  }
  std::printf("\nprefill: %d tokens in %.1f ms: %.1f tokens/s\n", r.prefill_tokens, r.prefill_ms,
              prefill_tok_s);
  std::printf(
      "bytes/step = weights read (routed experts: those the batch routes to) + "
      "KV cache of the batch; 'of bw' = achieved / measured bandwidth\n");
}

}  // namespace mlag::cli
