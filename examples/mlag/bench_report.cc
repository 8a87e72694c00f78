#include "examples/mlag/bench_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "kernels/host/gemm.h"
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

// The GEMM ceiling of a prefill of `tokens` rows: the better of the host GEMM
// and OpenBLAS on the model's projection at that row count, GFLOP/s; 0 when
// not measured (CUDA).
double GemmCeilingGflops(const BenchReport& r, int tokens) {
  for (const GemmCost& g : r.gemm_cost) {
    if (g.rows == tokens) return std::max(g.host_gemm_gflops, g.openblas_gflops);
  }
  return 0.0;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The GEMM ceilings of a prefill, GFLOP/s: the one measured beside its run,
// and the run's best (before and after the decode and prefill timings, and
// beside each run of this length). 0 when not measured (CUDA).
struct PrefillCeilings {
  double beside = 0, best = 0;
};
PrefillCeilings CeilingsOf(const BenchReport& r, const PrefillResult& p) {
  const double measured = GemmCeilingGflops(r, p.tokens);
  return {p.ceiling_beside_gflops > 0 ? p.ceiling_beside_gflops : measured,
          std::max(measured, p.ceiling_best_gflops)};
}

// A prefill faster than a GEMM ceiling measured beside it or at best: the
// ceiling, not the run, is wrong (as ProbeDefect for decode).
bool CeilingDefect(const PrefillCeilings& ceiling, double gflops) {
  return (ceiling.beside > 0 && gflops > ceiling.beside) ||
         (ceiling.best > 0 && gflops > ceiling.best);
}

// The attention op's share of a profiled step (--profile, host): the eager
// milliseconds of layers.*.attn.mla, 0 when not profiled.
constexpr const char* kAttentionOp = "layers.*.attn.mla";
double AttentionMs(const DecodeResult& d) {
  for (const auto& [op, ms] : d.profile_ms) {
    if (op == kAttentionOp) return ms;
  }
  return 0.0;
}

// The roofline of one decode step: the least time any implementation doing
// the step's arithmetic and moving its bytes could take on this machine,
// the longer of moving the bytes at the bandwidth measured beside the
// timing and doing the multiply-adds at the peak rate. Where the arithmetic
// is the longer, no step reaches the full bandwidth: it reaches at most
// memory_ms / roofline_ms of it (max_fraction_of_bandwidth). Host only (the
// peak is not measured on CUDA).
//
// By parts: a step runs its ops one after another, and its routed experts
// (a stream of weights, memory-bound at any batch up to the panel) cannot
// overlap the dense projections and lm_head (arithmetic-bound from a
// batch of tens). The roofline by parts is the sum of the rooflines of
// three phases, each the longer of its own bytes and arithmetic: the
// routed experts, the attention over the cache, and the rest (every other
// weight, the rows). It is the least time a step that runs its phases in
// turn could take, at least the step's roofline; the step's roofline
// assumes the experts' streaming hides all of the dense arithmetic.
struct Roofline {
  double memory_ms = 0, arithmetic_ms = 0, roofline_ms = 0;
  bool arithmetic_bound = false;
  double max_fraction_of_bandwidth = 0;  // memory_ms / roofline_ms
  double fraction_of_roofline = 0;       // roofline_ms / the graph step
  double parts_roofline_ms = 0;
  double fraction_of_parts_roofline = 0;  // parts_roofline_ms / the graph step
};

Roofline RooflineOf(const BenchReport& r, const DecodeResult& d) {
  Roofline f;
  if (r.peak_gflops <= 0 || d.bandwidth_bytes_per_second <= 0 || d.graph_ms <= 0) return f;
  f.memory_ms = 1e3 * d.bytes / d.bandwidth_bytes_per_second;
  f.arithmetic_ms = 1e3 * d.flops / (r.peak_gflops * 1e9);
  f.arithmetic_bound = f.arithmetic_ms > f.memory_ms;
  f.roofline_ms = std::max(f.memory_ms, f.arithmetic_ms);
  f.max_fraction_of_bandwidth = Ratio(f.memory_ms, f.roofline_ms);
  f.fraction_of_roofline = f.roofline_ms / d.graph_ms;
  auto phase_ms = [&](double bytes, double flops) {
    return std::max(1e3 * bytes / d.bandwidth_bytes_per_second,
                    1e3 * flops / (r.peak_gflops * 1e9));
  };
  f.parts_roofline_ms = phase_ms(d.routed_bytes, d.routed_flops) +
                        phase_ms(d.attention_bytes, d.attention_flops) +
                        phase_ms(d.bytes - d.routed_bytes - d.attention_bytes,
                                 d.flops - d.routed_flops - d.attention_flops);
  f.fraction_of_parts_roofline = f.parts_roofline_ms / d.graph_ms;
  return f;
}

// The matmul rate measured for `dtype`'s operands (CUDA --profile), 0 when
// none was.
double MatmulPeak(const BenchReport& r, DType dtype) {
  auto it = r.matmul_peak_flops.find(dtype);
  return it == r.matmul_peak_flops.end() ? 0.0 : it->second;
}

}  // namespace

// A step that moved its bytes faster than the bandwidth probe's ceiling
// (beside it, or the run's best) shows the probe is too low, not that the
// step exceeded the memory system.
// The median over a batch's timed graph steps of each step's bytes per
// second over the ceiling of its own phase (DecodeResult::paired_steps); 0
// where not measured (CUDA). Robust to a phase change inside the timing,
// which 'of bw' (the median step over the ceiling around all of them) is not.
double PairedFractionOfBandwidth(const DecodeResult& d) {
  std::vector<double> fractions;
  for (const auto& [ms, bps] : d.paired_steps) {
    if (ms > 0 && bps > 0) fractions.push_back(d.bytes / (ms / 1e3) / bps);
  }
  if (fractions.empty()) return 0.0;
  std::sort(fractions.begin(), fractions.end());
  const size_t n = fractions.size();
  return n % 2 == 1 ? fractions[n / 2] : 0.5 * (fractions[n / 2 - 1] + fractions[n / 2]);
}

bool ProbeDefect(const BenchReport& r, const DecodeResult& d) {
  if (d.graph_ms <= 0) return false;
  const double bps = d.bytes / (d.graph_ms / 1e3);
  return (d.bandwidth_bytes_per_second > 0 && bps > d.bandwidth_bytes_per_second) ||
         (r.bandwidth.bytes_per_second > 0 && bps > r.bandwidth.bytes_per_second) ||
         PairedFractionOfBandwidth(d) > 1.0;
}

void PrintBenchJson(const BenchReport& r) {
  const double tok_s_1 = TokensPerSecondAtBatch1(r);
  nlohmann::json j;
  j["machine"] = {{"device", r.device_name},
                  {"bandwidth_gb_s", r.bandwidth.bytes_per_second / 1e9},
                  {"bandwidth_method", r.bandwidth.method},
                  {"read_sum_gb_s", r.bandwidth.read_sum_bytes_per_second / 1e9},
                  {"gemv_gb_s", r.bandwidth.gemv_bytes_per_second / 1e9},
                  {"bandwidth_buffer_bytes", r.bandwidth.bytes},
                  {"bandwidth_huge_page_share", r.bandwidth.huge_page_share}};
  if (!r.is_cuda) {
    j["machine"]["host_isa"] = host::GemmIsa();
    j["machine"]["openblas_core"] = OpenblasCore();
  }
  if (r.peak_gflops > 0) j["machine"]["peak_gflops"] = r.peak_gflops;
  for (const auto& [dtype, flops] : r.matmul_peak_flops) {
    j["machine"]["matmul_peak_tflops"][std::string(DTypeName(dtype))] = flops / 1e12;
  }
  if (r.is_cuda) j["machine"]["emulated_times"] = r.emulated_times;
  for (double b : r.bandwidth_runs_bytes_per_second) {
    j["machine"]["bandwidth_runs_gb_s"].push_back(b / 1e9);
  }
  j["model"] = {{"name", r.model},
                {"layers", r.config.num_hidden_layers},
                {"hidden", r.config.hidden_size},
                {"heads", r.config.num_attention_heads},
                {"routed_experts", r.config.n_routed_experts},
                {"top_k", r.config.num_experts_per_tok},
                {"kv_lora_rank", r.config.kv_lora_rank},
                {"qk_rope_head_dim", r.config.qk_rope_head_dim},
                {"weight_bytes", r.weight_bytes},
                {"weight_huge_page_share", r.weight_huge_page_share}};
  j["kv_cache_dtype"] = DTypeName(r.kv_dtype);
  j["weight_dtype"] = WeightFormatName(r.weight_format);
  j["weight_dtype_defaulted"] = r.weight_dtype_defaulted;
  j["weight_bytes_by_dtype"] = nlohmann::json::object();
  for (const auto& [dtype, bytes] : r.weight_bytes_by_dtype) {
    j["weight_bytes_by_dtype"][std::string(DTypeName(dtype))] = bytes;
  }
  j["context_len"] = r.context_len;
  j["steps"] = r.steps;
  j["build_seconds"] = r.build_seconds;
  j["capture_seconds"] = r.capture_seconds;
  j["warmup_seconds"] = r.warmup_seconds;
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
         {"bandwidth_gb_s", d.bandwidth_bytes_per_second / 1e9},
         {"fraction_of_bandwidth", Ratio(gbs * 1e9, d.bandwidth_bytes_per_second)},
         {"fraction_of_best_bandwidth", Ratio(gbs * 1e9, r.bandwidth.bytes_per_second)},
         {"fraction_of_paired_bandwidth", PairedFractionOfBandwidth(d)},
         {"probe_defect", ProbeDefect(r, d)},
         {"tokens_per_s_vs_batch1", tok_s_1 > 0 ? d.batch / (d.graph_ms / 1e3) / tok_s_1 : 0.0}});
    j["decode"].back()["gflop_per_step"] = d.flops / 1e9;
    j["decode"].back()["gflops"] = d.flops / (d.graph_ms / 1e3) / 1e9;
    if (r.peak_gflops > 0) {
      // What the arithmetic alone takes at the peak rate, and the step's
      // rate as a fraction of it.
      j["decode"].back()["arithmetic_floor_ms"] = 1e3 * d.flops / (r.peak_gflops * 1e9);
      j["decode"].back()["fraction_of_peak"] =
          Ratio(d.flops / (d.graph_ms / 1e3) / 1e9, r.peak_gflops);
      if (const Roofline roof = RooflineOf(r, d); roof.roofline_ms > 0) {
        j["decode"].back()["memory_floor_ms"] = roof.memory_ms;
        j["decode"].back()["roofline_ms"] = roof.roofline_ms;
        j["decode"].back()["bound"] = roof.arithmetic_bound ? "arithmetic" : "memory";
        j["decode"].back()["max_fraction_of_bandwidth"] = roof.max_fraction_of_bandwidth;
        j["decode"].back()["fraction_of_roofline"] = roof.fraction_of_roofline;
        j["decode"].back()["parts_roofline_ms"] = roof.parts_roofline_ms;
        j["decode"].back()["fraction_of_parts_roofline"] = roof.fraction_of_parts_roofline;
        j["decode"].back()["routed_gb_per_step"] = d.routed_bytes / 1e9;
        j["decode"].back()["routed_gflop_per_step"] = d.routed_flops / 1e9;
        j["decode"].back()["attention_gb_per_step"] = d.attention_bytes / 1e9;
      }
    }
    if (!d.profile_ms.empty()) {
      nlohmann::json ops = nlohmann::json::array();
      for (const auto& [op, ms] : d.profile_ms) {
        ops.push_back({{"op", op}, {"ms_per_step", ms}, {"share", ms / d.eager_ms}});
      }
      j["decode"].back()["profile"] = ops;
      // The attention over the cache alone: its arithmetic per second, and
      // that against the peak (the one op that is neither a weight stream
      // nor a GEMM of the host's packed kind).
      const double attention_ms = AttentionMs(d);
      if (attention_ms > 0) {
        const double gflops = d.attention_flops / (attention_ms / 1e3) / 1e9;
        j["decode"].back()["attention_gflop_per_step"] = d.attention_flops / 1e9;
        j["decode"].back()["attention_gflops"] = gflops;
        if (r.peak_gflops > 0) {
          j["decode"].back()["attention_fraction_of_peak"] = gflops / r.peak_gflops;
        }
      }
    }
    if (d.launch_gap_us >= 0) {
      j["decode"].back()["replay_device_ms"] = d.replay_device_ms;
      j["decode"].back()["launch_gap_us"] = d.launch_gap_us;
    }
    if (!d.nodes.empty()) {
      nlohmann::json nodes = nlohmann::json::array();
      for (const NodeProfile& n : d.nodes) {
        const double bytes_per_s = n.us > 0 ? n.bytes / (n.us / 1e6) : 0.0;
        nlohmann::json e = {
            {"node", n.node},
            {"dtype", DTypeName(n.math)},
            {"us", n.us},
            {"launches", n.launches},
            {"bytes", n.bytes},
            {"gflop", n.flops / 1e9},
            {"gb_s", bytes_per_s / 1e9},
            {"fraction_of_bandwidth", Ratio(bytes_per_s, r.bandwidth.bytes_per_second)}};
        if (n.flops > 0 && MatmulPeak(r, n.math) > 0 && n.us > 0) {
          e["fraction_of_matmul_peak"] = n.flops / (n.us / 1e6) / MatmulPeak(r, n.math);
        }
        nodes.push_back(std::move(e));
      }
      j["decode"].back()["nodes"] = std::move(nodes);
      j["decode"].back()["profiled_step_wall_ms"] = d.profiled_step_wall_ms;
    }
    if (r.contention.threads > 0) {
      j["decode"].back()["contended_graph_ms"] = d.contended_graph_ms;
      j["decode"].back()["contended_tokens_per_s"] = d.batch / (d.contended_graph_ms / 1e3);
      j["decode"].back()["contended_vs_uncontended"] = d.graph_ms / d.contended_graph_ms;
    }
  }
  if (r.contention.threads > 0) {
    j["contention"] = {{"busy_threads", r.contention.threads},
                       {"capture_seconds_quiet", r.contention.quiet_capture_seconds},
                       {"capture_seconds_contended", r.contention.contended_capture_seconds},
                       {"capture_contended_vs_quiet", Ratio(r.contention.contended_capture_seconds,
                                                            r.contention.quiet_capture_seconds)}};
  }
  j["prefill"] = nlohmann::json::array();
  for (const PrefillResult& p : r.prefill) {
    const double gflops = p.flops / (p.ms / 1e3) / 1e9;
    const PrefillCeilings ceiling = CeilingsOf(r, p);
    nlohmann::json e = {{"tokens", p.tokens},
                        {"ms", p.ms},
                        {"tokens_per_s", p.tokens / (p.ms / 1e3)},
                        {"gflop", p.flops / 1e9},
                        {"gflops", gflops}};
    if (ceiling.beside > 0) {
      e["gemm_ceiling_gflops"] = ceiling.beside;
      e["fraction_of_gemm_ceiling"] = gflops / ceiling.beside;
      e["best_gemm_ceiling_gflops"] = ceiling.best;
      e["fraction_of_best_gemm_ceiling"] = gflops / ceiling.best;
      e["ceiling_defect"] = CeilingDefect(ceiling, gflops);
    }
    for (const auto& [op, ms] : p.profile_ms) e["profile_ms"].push_back({{"op", op}, {"ms", ms}});
    j["prefill"].push_back(std::move(e));
  }
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
  std::printf("machine: %s; memory bandwidth %.2f GB/s at best (%s, %.1f GiB buffer",
              r.device_name.c_str(), r.bandwidth.bytes_per_second / 1e9, r.bandwidth.method,
              r.bandwidth_gib);
  if (r.bandwidth_runs_bytes_per_second.size() == 2) {
    std::printf("; best of 5: %.2f GB/s before and %.2f GB/s after the decode timings",
                r.bandwidth_runs_bytes_per_second[0] / 1e9,
                r.bandwidth_runs_bytes_per_second[1] / 1e9);
  }
  if (!r.decode.empty()) {
    auto [lo, hi] = std::minmax_element(
        r.decode.begin(), r.decode.end(), [](const DecodeResult& a, const DecodeResult& b) {
          return a.bandwidth_bytes_per_second < b.bandwidth_bytes_per_second;
        });
    std::printf("; %.2f to %.2f GB/s beside them", lo->bandwidth_bytes_per_second / 1e9,
                hi->bandwidth_bytes_per_second / 1e9);
  }
  if (!r.is_cuda) {
    std::printf("; reads %.2f GB/s, matrix-vector %.2f GB/s, %.0f%% on huge pages",
                r.bandwidth.read_sum_bytes_per_second / 1e9,
                r.bandwidth.gemv_bytes_per_second / 1e9, 100.0 * r.bandwidth.huge_page_share);
  }
  std::printf(")\n");
  if (!r.is_cuda) {
    std::printf("host kernels: %s%s\n", host::GemmIsa(),
                std::getenv("MLAG_HOST_ISA") != nullptr ? " (capped by MLAG_HOST_ISA)" : "");
  }
  if (r.peak_gflops > 0) {
    std::printf("peak multiply-add rate: %.1f GFLOP/s (every thread, in registers)\n",
                r.peak_gflops);
  }
  for (const auto& [dtype, flops] : r.matmul_peak_flops) {
    std::printf("matmul peak, %s operands (cuBLASLt probe): %.1f TFLOP/s%s\n",
                std::string(DTypeName(dtype)).c_str(), flops / 1e12,
                r.emulated_times ? " (emulated: the CPU's rate)" : "");
  }
  std::printf(
      "model: %s: %d layers, hidden %d, %d heads, %d routed experts top-%d, "
      "%.2f GB of weights (--weight-dtype %s%s)%s\n",
      r.model.c_str(), r.config.num_hidden_layers, r.config.hidden_size,
      r.config.num_attention_heads, r.config.n_routed_experts, r.config.num_experts_per_tok,
      r.weight_bytes / 1e9, std::string(WeightFormatName(r.weight_format)).c_str(),
      r.weight_dtype_defaulted ? ": bench's default on CUDA; pass --weight-dtype to change" : "",
      r.is_cuda
          ? ""
          : absl::StrFormat(", %.0f%% on huge pages", 100.0 * r.weight_huge_page_share).c_str());
  std::printf(
      "decode at context %d (%s cache), median of %d steps; built in %.1f s, %zu graphs "
      "captured in %.3f s after a %.3f s warm-up\n\n",
      r.context_len, std::string(DTypeName(r.kv_dtype)).c_str(), r.steps, r.build_seconds,
      r.decode.size(), r.capture_seconds, r.warmup_seconds);
  const bool roofline = r.peak_gflops > 0;
  std::printf("%6s %10s %10s %8s %12s %12s %9s %8s %9s %7s %9s %9s %8s %8s %8s", "batch",
              "graph ms", "eager ms", "speedup", "graph tok/s", "eager tok/s", "vs b=1", "experts",
              "GB/step", "GB/s", "bw GB/s", "of bw", "of best", "of pair", "of peak");
  if (roofline) std::printf(" %7s %7s %8s %8s", "bound", "max bw", "of roof", "of parts");
  std::printf("\n");
  for (const DecodeResult& d : r.decode) {
    const double gbs = d.bytes / (d.graph_ms / 1e3) / 1e9;
    std::printf(
        "%6d %10.2f %10.2f %7.2fx %12.1f %12.1f %8.2fx %8d %9.3f %7.2f %9.2f %8.1f%% %7.1f%% "
        "%7.1f%% %7.1f%%",
        d.batch, d.graph_ms, d.eager_ms, d.eager_ms / d.graph_ms, d.batch / (d.graph_ms / 1e3),
        d.batch / (d.eager_ms / 1e3), tok_s_1 > 0 ? d.batch / (d.graph_ms / 1e3) / tok_s_1 : 0.0,
        d.experts_touched, d.bytes / 1e9, gbs, d.bandwidth_bytes_per_second / 1e9,
        100.0 * Ratio(gbs * 1e9, d.bandwidth_bytes_per_second),
        100.0 * Ratio(gbs * 1e9, r.bandwidth.bytes_per_second),
        100.0 * PairedFractionOfBandwidth(d),
        100.0 * Ratio(d.flops / (d.graph_ms / 1e3) / 1e9, r.peak_gflops));
    if (const Roofline roof = RooflineOf(r, d); roofline && roof.roofline_ms > 0) {
      std::printf(" %7s %6.1f%% %7.1f%% %7.1f%%", roof.arithmetic_bound ? "arith" : "memory",
                  100.0 * roof.max_fraction_of_bandwidth, 100.0 * roof.fraction_of_roofline,
                  100.0 * roof.fraction_of_parts_roofline);
    } else if (roofline) {
      std::printf(" %7s %7s %8s %8s", "-", "-", "-",
                  "-");  // no bandwidth measured beside this batch
    }
    std::printf("\n");
  }
  for (const DecodeResult& d : r.decode) {
    if (!ProbeDefect(r, d)) continue;
    std::printf(
        "probe defect: batch %d moved its bytes at %.2f GB/s (%.0f%% of the bandwidth of its "
        "steps' own phases), above the bandwidth probe (%.2f GB/s beside it, %.2f GB/s at best): "
        "the ceiling is too low, so its 'of bw' reads high\n",
        d.batch, d.bytes / (d.graph_ms / 1e3) / 1e9, 100.0 * PairedFractionOfBandwidth(d),
        d.bandwidth_bytes_per_second / 1e9, r.bandwidth.bytes_per_second / 1e9);
  }
  // Weights on fewer huge pages than the probe's buffer stream slower than
  // the ceiling was measured at: the steps' 'of bw' then reads low for a
  // reason outside the kernels. Counted where the weights on 4 KiB pages
  // are more than any last-level cache holds (a tiny model's small tensors
  // are on them by design, and read from cache).
  const double small_page_weight_bytes =
      (1.0 - r.weight_huge_page_share) * static_cast<double>(r.weight_bytes);
  if (!r.is_cuda && small_page_weight_bytes > 64.0 * (1 << 20) &&
      r.weight_huge_page_share < r.bandwidth.huge_page_share - 0.05) {
    std::printf(
        "weights on 4 KiB pages: %.0f%% of the weights are on huge pages, against %.0f%% of the "
        "bandwidth probe's buffer, so steps stream them slower than the ceiling was measured\n",
        100.0 * r.weight_huge_page_share, 100.0 * r.bandwidth.huge_page_share);
  }
  for (const DecodeResult& d : r.decode) {
    if (d.profile_ms.empty()) continue;
    std::printf("\nbatch %d, ms per step by op (eager; of a %.2f ms step):\n", d.batch, d.eager_ms);
    for (const auto& [op, ms] : d.profile_ms) {
      if (ms < 0.005 * d.eager_ms) break;  // sorted: the rest are smaller
      std::printf("  %8.2f %5.1f%%  %s\n", ms, 100.0 * ms / d.eager_ms, op.c_str());
    }
    const double attention_ms = AttentionMs(d);
    if (attention_ms > 0) {
      const double gflops = d.attention_flops / (attention_ms / 1e3) / 1e9;
      std::printf("  attention (%s): %.2f GFLOP per step at %.1f GFLOP/s", kAttentionOp,
                  d.attention_flops / 1e9, gflops);
      if (r.peak_gflops > 0) std::printf(", %.1f%% of peak", 100.0 * gflops / r.peak_gflops);
      std::printf("\n");
    }
  }
  for (const DecodeResult& d : r.decode) {
    if (d.nodes.empty()) continue;
    std::printf(
        "\nbatch %d, graph nodes of one eager event-timed step (%.3f ms wall)%s; "
        "bandwidth against %.1f GB/s copy:\n",
        d.batch, d.profiled_step_wall_ms,
        r.emulated_times ? " [EMULATED: CPU times of the CUDA emulation, not a GPU's]" : "",
        r.bandwidth.bytes_per_second / 1e9);
    std::printf("  %10s %6s %10s %9s %8s %8s  %s\n", "us", "share", "MB", "GFLOP", "of bw",
                "of peak", "node (launches, dtype)");
    for (const NodeProfile& n : d.nodes) {
      const double bytes_per_s = n.us > 0 ? n.bytes / (n.us / 1e6) : 0.0;
      const double peak = MatmulPeak(r, n.math);
      std::printf("  %10.1f %5.1f%% %10.3f %9.4f %7.1f%% ", n.us,
                  100.0 * Ratio(n.us, 1e3 * d.profiled_step_wall_ms), n.bytes / 1e6, n.flops / 1e9,
                  100.0 * Ratio(bytes_per_s, r.bandwidth.bytes_per_second));
      if (n.flops > 0 && peak > 0 && n.us > 0) {
        std::printf("%7.1f%% ", 100.0 * n.flops / (n.us / 1e6) / peak);
      } else {
        std::printf("%8s ", "-");
      }
      std::printf(" %s (%lld, %s)\n", n.node.c_str(), static_cast<long long>(n.launches),
                  std::string(DTypeName(n.math)).c_str());
    }
    if (d.launch_gap_us >= 0) {
      std::printf(
          "  graph replays: %.3f ms on the device each, %.1f us of device idle between "
          "consecutive ones (median)\n",
          d.replay_device_ms, d.launch_gap_us);
    }
  }
  if (!r.gemm_cost.empty()) {
    std::printf(
        "\nwhat batch invariance costs: the host GEMM (one summation order at every row count)"
        " against OpenBLAS sgemm (%s kernels), f32 [%lld x %lld] weights, GFLOP/s:\n",
        OpenblasCore(), static_cast<long long>(r.gemm_cost[0].out),
        static_cast<long long>(r.gemm_cost[0].in));
    for (const GemmCost& g : r.gemm_cost) {
      std::printf("  rows %5lld: host GEMM %8.1f  OpenBLAS %8.1f  (%.2fx)\n",
                  static_cast<long long>(g.rows), g.host_gemm_gflops, g.openblas_gflops,
                  g.host_gemm_gflops / g.openblas_gflops);
    }
  }
  if (r.contention.threads > 0) {
    const ContentionResult& c = r.contention;
    std::printf(
        "\nwith %d busy thread%s on the same cores: capture (warm-up included) %.3f s vs "
        "%.3f s quiet (%.2fx)\n",
        c.threads, c.threads == 1 ? "" : "s", c.contended_capture_seconds, c.quiet_capture_seconds,
        Ratio(c.contended_capture_seconds, c.quiet_capture_seconds));
    for (const DecodeResult& d : r.decode) {
      std::printf("  batch %5d: %10.1f tok/s vs %10.1f quiet (%.2fx)\n", d.batch,
                  d.batch / (d.contended_graph_ms / 1e3), d.batch / (d.graph_ms / 1e3),
                  d.graph_ms / d.contended_graph_ms);
    }
  }
  std::printf("\nprefill from an empty cache (eager; GFLOP counts the absorbed-form attention):\n");
  std::printf("%8s %10s %10s %8s %9s %14s %9s %12s %9s\n", "tokens", "ms", "tok/s", "GFLOP",
              "GFLOP/s", "GEMM ceiling", "of ceil", "best ceiling", "of best");
  for (const PrefillResult& p : r.prefill) {
    const double gflops = p.flops / (p.ms / 1e3) / 1e9;
    const PrefillCeilings ceiling = CeilingsOf(r, p);
    std::printf("%8d %10.1f %10.1f %8.2f %9.1f %14.1f %8.1f%% %12.1f %8.1f%%\n", p.tokens, p.ms,
                p.tokens / (p.ms / 1e3), p.flops / 1e9, gflops, ceiling.beside,
                100.0 * Ratio(gflops, ceiling.beside), ceiling.best,
                100.0 * Ratio(gflops, ceiling.best));
  }
  if (!r.is_cuda) {
    std::printf(
        "(GEMM ceiling: the better of the host GEMM and OpenBLAS on the model's projection at "
        "the prompt's row count, measured just before and just after the median run, the "
        "better of the two; best ceiling: the best of every such measurement in this run)\n");
  }
  for (const PrefillResult& p : r.prefill) {
    const double gflops = p.flops / (p.ms / 1e3) / 1e9;
    const PrefillCeilings ceiling = CeilingsOf(r, p);
    if (!CeilingDefect(ceiling, gflops)) continue;
    std::printf(
        "ceiling defect: the prefill of %d tokens ran at %.1f GFLOP/s, above the GEMM ceiling "
        "(%.1f GFLOP/s beside it, %.1f at best): the ceiling is too low, so its 'of ceil' reads "
        "high\n",
        p.tokens, gflops, ceiling.beside, ceiling.best);
  }
  for (const PrefillResult& p : r.prefill) {
    if (p.profile_ms.empty()) continue;
    double total = 0;
    for (const auto& [op, ms] : p.profile_ms) total += ms;
    std::printf("\nprefill of %d tokens, ms by op (one profiled run; ops total %.1f ms):\n",
                p.tokens, total);
    for (const auto& [op, ms] : p.profile_ms) {
      if (ms < 0.005 * total) break;  // sorted: the rest are smaller
      std::printf("  %8.1f %5.1f%%  %s\n", ms, 100.0 * ms / total, op.c_str());
    }
  }
  std::printf(
      "bytes/step = weights read (routed experts: those the batch routes to) + "
      "KV cache of the batch; 'of bw' = achieved / the bandwidth measured beside the timing "
      "('bw GB/s', the better of just before and just after); 'of best' = achieved / the "
      "run's best; 'of pair' (host) = the median over the timed steps of each step's rate / "
      "the bandwidth measured just before and just after its own pair of steps (the ceiling "
      "of the phase it ran in, on a machine whose bandwidth moves); 'of peak' = the step's "
      "multiply-adds (each new token's projections, "
      "routed and shared experts, attention over its context, lm_head) per second / the peak "
      "multiply-add rate (host; 0 on CUDA); host only: 'bound' = which takes longer, moving "
      "the step's bytes at 'bw GB/s' or its multiply-adds at the peak rate (the roofline: the "
      "longer of the two); 'max bw' = the most 'of bw' any step doing this arithmetic could "
      "reach beside this bandwidth (below 100%% when arithmetic-bound); 'of roof' = the "
      "roofline / the graph step; 'of parts' = the roofline by parts (the sum of the "
      "rooflines of the routed experts, the attention over the cache and the rest, each the "
      "longer of its own bytes and multiply-adds: phases that run in turn) / the graph step\n");
}

}  // namespace mlag::cli
