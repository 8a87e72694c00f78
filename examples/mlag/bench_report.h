// The report of mlag bench: decode per batch size against the memory
// bandwidth measured in the same run, prefill, and the model and build
// figures, as text or JSON.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "examples/mlag/gemm_cost.h"
#include "examples/mlag/memory_bandwidth.h"
#include "layers/model_config.h"
#include "layers/weight_arena.h"
#include "runtime/core/dtype.h"

namespace mlag::cli {

// One graph node of a profiled CUDA step (--profile on CUDA), layer
// indices folded: what its launches declared they move and compute (plus,
// for the attention and the routed experts, the cached tokens and the
// experts the batch routes to), and its event-timed device time.
struct NodeProfile {
  std::string node;          // "layers.*.attn.mla"
  DType math = DType::kF32;  // the operands' dtype of its multiply-adds
  double us = 0;             // per step
  double bytes = 0;
  double flops = 0;
  int64_t launches = 0;
};

struct DecodeResult {
  int batch = 0;
  double graph_ms = 0, eager_ms = 0;
  double contended_graph_ms = 0;  // with --contend busy threads; 0 when not run
  double bytes = 0;               // per step
  double flops = 0;               // per step: DecodeFlops, the arithmetic the engine computes
  double attention_flops = 0;     // the part of it in the attention over the cache (attn.mla)
  // The parts of bytes and flops in the routed experts (those the batch
  // routes to; its rows' top-k) and of bytes in the attention (the KV cache
  // read): the phases of the step's roofline by parts (host).
  double routed_bytes = 0, routed_flops = 0, attention_bytes = 0;
  // The bandwidth ceiling beside the graph timing: the better of one
  // measurement just before it and one just after.
  double bandwidth_bytes_per_second = 0;
  // Host: each timed graph step's ms with the ceiling of its own phase (the
  // better of one-repetition measurements just before and just after its
  // pair of steps; TimeGraphAndEager), {ms, bytes/s}: on a machine whose
  // bandwidth moves between phases within a batch's timing, a step is
  // divided by the ceiling of the phase it ran in (PairedFractionOfBandwidth).
  std::vector<std::pair<double, double>> paired_steps;
  int experts_touched = 0;  // summed over MoE layers
  // --profile (host): eager milliseconds per step of each op, layer indices
  // folded ("layers.*.moe.experts"), most first.
  std::vector<std::pair<std::string, double>> profile_ms;
  // --profile (CUDA): the nodes of one eager event-timed step, most time
  // first; the step's wall time; and, over the graph timings, the median
  // device time of one replay and the median device idle time between
  // consecutive replays (what the host spends per step: staging, launch,
  // reading the sampled tokens back).
  std::vector<NodeProfile> nodes;
  double profiled_step_wall_ms = 0;
  double replay_device_ms = 0;
  double launch_gap_us = -1;  // -1: not measured
};

// --contend N: the graphs captured again on a warm engine, quietly and then
// with N busy threads on the same cores (warm-up included in both).
struct ContentionResult {
  int threads = 0;  // 0: not measured
  double quiet_capture_seconds = 0, contended_capture_seconds = 0;
};

// One prefill from an empty cache.
struct PrefillResult {
  int tokens = 0;
  double ms = 0;
  double flops = 0;  // PrefillFlops: the work of the forms the engine computes
  // Host: the GEMM ceiling at `tokens` rows (the better of the host GEMM and
  // OpenBLAS on the model's projection), measured just before and just
  // after the reported run, the better of the two; and the best of every
  // such measurement of this length. 0 on CUDA.
  double ceiling_beside_gflops = 0;
  double ceiling_best_gflops = 0;
  // Host, --profile: ms of one run by op (layers folded), largest first.
  std::vector<std::pair<std::string, double>> profile_ms;
};

struct BenchReport {
  // Host: the host GEMM against OpenBLAS on a projection of the model.
  std::vector<GemmCost> gemm_cost;
  std::string device_name;
  bool is_cuda = false;
  // The run's best: the best of every measurement, before and after the
  // decode timings and beside each.
  BandwidthMeasurement bandwidth;
  std::vector<double> bandwidth_runs_bytes_per_second;  // before and after the decode timings
  double bandwidth_gib = 0;                             // the measurement's buffer
  // Host: the peak multiply-add rate (MeasurePeakGflops), the better of
  // before and after the prefill timings (both after the decode timings); 0
  // on CUDA.
  double peak_gflops = 0;
  // CUDA --profile: the matmul rate of the cuBLASLt probe
  // (cuda_blas::MeasureMatmulFlops) by operand dtype, FLOP/s; and whether
  // every device time was taken on the CPU emulation of CUDA.
  std::map<DType, double> matmul_peak_flops;
  bool emulated_times = false;
  // The weight dtype was chosen by mlag bench (bf16 on CUDA), not the flag.
  bool weight_dtype_defaulted = false;
  std::string model;
  ModelConfig config;
  size_t weight_bytes = 0;
  std::map<DType, size_t> weight_bytes_by_dtype;
  double weight_huge_page_share = 0.0;  // host: the share of weight_bytes on huge pages
  DType kv_dtype = DType::kF32;
  WeightFormat weight_format = WeightFormat::kAuto;
  int context_len = 0;
  int steps = 0;  // timed decode steps per batch size and mode
  double build_seconds = 0, capture_seconds = 0, warmup_seconds = 0;
  std::vector<DecodeResult> decode;
  ContentionResult contention;
  std::vector<PrefillResult> prefill;
};

void PrintBenchJson(const BenchReport& r);
void PrintBenchText(const BenchReport& r);

}  // namespace mlag::cli
