// mlag bench: decode step latency and tokens/s per batch size with graphs and
// eagerly, achieved bytes/s against a memory-bandwidth ceiling measured in
// the same run and (host) achieved FLOP/s against the peak multiply-add rate
// measured in the same run, and the roofline of the two (which one bounds
// the step, and the most of the bandwidth it allows); prefill tokens/s per
// prompt length against a GEMM ceiling measured beside each run; with
// --contend N, decode and capture again with N busy threads on the same
// cores.
//
//   mlag bench --model M [--batch-sizes 1,8,32] [--context-len N]
//              [--prefill-lens 128,512,2048] [--contend N] [--json]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "examples/mlag/bench_report.h"
#include "examples/mlag/cli.h"
#include "examples/mlag/gemm_cost.h"
#include "examples/mlag/memory_bandwidth.h"
#include "mlag_config.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_runner.h"
#if MLAG_HAVE_CUDA
#include "kernels/cuda_blas.h"
#endif

namespace mlag::cli {
namespace {

struct BenchFlags {
  std::string model;
  std::string device = "auto";
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  // Cached tokens per decode sequence; 0: 512, or less when the model's
  // max_position_embeddings is smaller.
  int context_len = 0;
  int steps = 8;  // timed decode steps per batch size and mode
  // Prompt lengths of the prefill measurement (each capped by the model's
  // max_position_embeddings).
  std::vector<int> prefill_lens = {128, 512, 2048};
  int contend = 0;  // busy threads for the contended measurement; 0: none
  double bandwidth_gib = 2.0;
  // Caps the host kernels' ISA as MLAG_HOST_ISA does ("" or "avx512": the
  // widest the CPU has), so one machine measures the narrower variants too.
  std::string host_isa;
  bool profile = false;
  // auto: bf16 on CUDA (what the tensor-core decode kernel reads), f32 on
  // the host (the engine's default there).
  std::string kv_cache_dtype = "auto";
  std::string weight_dtype = "auto";
  bool json = false;
};

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// N threads that busy-loop until destroyed: another process's work on the
// same cores, for measuring how the engine holds up beside it.
class BusyThreads {
 public:
  explicit BusyThreads(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        uint64_t x = 1;
        while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
        sink_.fetch_add(x, std::memory_order_relaxed);
      });
    }
  }
  ~BusyThreads() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sink_{0};
  std::vector<std::thread> threads_;
};

// Multiply-adds per token of every projection, the router and the experts
// the token is routed to (top-k of the routed, all shared), as the engine
// computes them (attention in the absorbed form; lm_head not included).
double ProjectionMacsPerToken(const ModelConfig& c) {
  const double h = c.hidden_size, heads = c.num_attention_heads;
  const double q_proj = c.q_lora_rank > 0 ? h * c.q_lora_rank + static_cast<double>(c.q_lora_rank) *
                                                                    heads * c.qk_head_dim()
                                          : h * heads * c.qk_head_dim();
  const double attn_proj = q_proj + h * c.kv_cache_row() +
                           heads * c.kv_lora_rank * (c.qk_nope_head_dim + c.v_head_dim) +
                           heads * c.v_head_dim * h;
  double macs = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    macs += attn_proj;
    if (c.IsMoeLayer(l)) {
      macs += h * c.n_routed_experts +
              3.0 * h * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts);
    } else {
      macs += 3.0 * h * c.intermediate_size;
    }
  }
  return macs;
}

// Multiply-adds per token of the routed experts it is routed to (top-k),
// every MoE layer: the part of ProjectionMacsPerToken that a step's routed
// experts do.
double RoutedExpertMacsPerToken(const ModelConfig& c) {
  double macs = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) {
      macs += 3.0 * c.hidden_size * c.moe_intermediate_size * c.num_experts_per_tok;
    }
  }
  return macs;
}

// Attention multiply-adds of one query over `keys` cached tokens, every
// layer: scores over the kv_lora + rope dimensions, values over kv_lora.
double AttentionMacs(const ModelConfig& c, double keys) {
  return static_cast<double>(c.num_hidden_layers) * c.num_attention_heads * keys *
         (c.kv_cache_row() + static_cast<double>(c.kv_lora_rank));
}

// Multiply-adds times two of one prefill of `tokens` tokens from an empty
// cache, as the engine computes it: every token's projections and experts,
// causal attention, and the lm_head for the one sampled row.
double PrefillFlops(const ModelConfig& c, int64_t tokens) {
  const double t = static_cast<double>(tokens);
  const double key_pairs = t * (t + 1) / 2;  // causal (query, key) pairs
  return 2.0 * (ProjectionMacsPerToken(c) * t + AttentionMacs(c, key_pairs) +
                static_cast<double>(c.hidden_size) * c.vocab_size);
}

// Multiply-adds times two of the attention in one decode step of `batch`
// sequences with `context` tokens cached: each new token over context + 1 keys.
double DecodeAttentionFlops(const ModelConfig& c, int batch, int context) {
  return 2.0 * batch * AttentionMacs(c, context + 1.0);
}

// Multiply-adds times two of one decode step of `batch` sequences with
// `context` tokens cached: each new token's projections and experts, its
// attention (DecodeAttentionFlops), and lm_head for every row.
double DecodeFlops(const ModelConfig& c, int batch, int context) {
  return 2.0 * batch *
             (ProjectionMacsPerToken(c) + static_cast<double>(c.hidden_size) * c.vocab_size) +
         DecodeAttentionFlops(c, batch, context);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The decode batch: `batch` sequences with `context` tokens already cached,
// each computing one new token. Sequence b owns blocks [1 + b*nb, 1 + (b+1)*nb).
struct DecodeBatch {
  std::vector<std::vector<int>> tables;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<StepSequence> seqs;

  DecodeBatch(int batch, int context, int blocks_per_seq, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
    tables.resize(batch);
    tokens.resize(batch);
    seqs.resize(batch);
    for (int b = 0; b < batch; ++b) {
      for (int j = 0; j < blocks_per_seq; ++j) tables[b].push_back(1 + b * blocks_per_seq + j);
      tokens[b] = {tok(rng)};
      seqs[b].new_tokens = tokens[b];
      seqs[b].start_position = context;  // the same position every step: steady timing
      seqs[b].block_table = tables[b];
      seqs[b].sample = true;
    }
  }
};

absl::StatusOr<double> TimeSteps(ModelRunner& runner, const DecodeBatch& batch, int steps) {
  for (int i = 0; i < 2; ++i) MLAG_RETURN_IF_ERROR(runner.Execute(batch.seqs).status());
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    auto t0 = Clock::now();
    MLAG_RETURN_IF_ERROR(runner.Execute(batch.seqs).status());
    ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(ms);
}

// Graph replay and eager steps of `batch`, alternately, `steps` of each
// (after two of each to warm up): medians in ms, {graph, eager}. Alternate,
// so that a machine whose bandwidth moves between phases times both in the
// same phases, and in pairs that start with each in turn (graph, eager,
// eager, graph, ...), so that neither always runs after the other. With a
// `probe`, the bandwidth is also measured (one repetition of each method)
// before the first timed pair and after each: `paired` gets each timed graph
// step's ms with the better of the measurements just before and just after
// its pair, the ceiling of the phase the step ran in.
absl::StatusOr<std::pair<double, double>> TimeGraphAndEager(
    ModelRunner& runner, const DecodeBatch& batch, int steps, MemoryBandwidthProbe* probe = nullptr,
    std::vector<std::pair<double, double>>* paired = nullptr) {
  std::vector<double> graph_ms, eager_ms;
  absl::Status status;
  // One repetition of the probe's methods; 0 (and `status` set) on failure.
  auto sample = [&]() {
    absl::StatusOr<BandwidthMeasurement> m = probe->Measure(/*reps=*/1);
    if (!m.ok()) status = m.status();
    return m.ok() ? m->bytes_per_second : 0.0;
  };
  double sample_before = 0.0;
  for (int i = 0; i < steps + 2 && status.ok(); ++i) {
    if (probe != nullptr && i == 2) sample_before = sample();
    double pair_graph_ms = 0.0;
    for (int turn = 0; turn < 2; ++turn) {
      const bool graphs = (turn == 0) == (i % 2 == 0);  // graph first in even pairs
      runner.set_graphs_enabled(graphs);
      auto t0 = Clock::now();
      status = runner.Execute(batch.seqs).status();
      if (!status.ok()) break;
      const double ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= 2) (graphs ? graph_ms : eager_ms).push_back(ms);
      if (graphs) pair_graph_ms = ms;
    }
    if (probe != nullptr && i >= 2 && status.ok()) {
      const double sample_after = sample();
      paired->emplace_back(pair_graph_ms, std::max(sample_before, sample_after));
      sample_before = sample_after;
    }
  }
  runner.set_graphs_enabled(true);
  MLAG_RETURN_IF_ERROR(status);
  return std::make_pair(Median(graph_ms), Median(eager_ms));
}

// A node or op name with its layer indices folded: "layers.3.attn.mla" ->
// "layers.*.attn.mla".
std::string FoldLayers(const std::string& name) {
  std::string op;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(name[i])) && (i == 0 || name[i - 1] == '.')) {
      op += '*';
      while (i + 1 < name.size() && std::isdigit(static_cast<unsigned char>(name[i + 1]))) ++i;
    } else {
      op += name[i];
    }
  }
  return op;
}

// The nodes of one eager decode step on CUDA, each launch timed by events,
// folded over layers, most time first; `wall_ms` gets the step's wall time.
absl::StatusOr<std::vector<NodeProfile>> ProfileDeviceStep(ModelRunner& runner,
                                                           const DecodeBatch& batch,
                                                           double* wall_ms) {
  DeviceOpProfile profile;
  MLAG_RETURN_IF_ERROR(runner.stream().BeginDeviceProfile(&profile));
  const auto t0 = Clock::now();
  absl::Status s = runner.Execute(batch.seqs).status();
  // The step's wall time ends when its last launch has; reading the events
  // (EndDeviceProfile) is not part of it.
  if (s.ok()) s = runner.stream().Synchronize();
  *wall_ms = 1e3 * SecondsSince(t0);
  absl::Status ended = runner.stream().EndDeviceProfile();
  MLAG_RETURN_IF_ERROR(s);
  MLAG_RETURN_IF_ERROR(ended);
  std::map<std::string, NodeProfile> folded;
  for (const auto& [name, e] : profile.ops) {
    NodeProfile& n = folded[FoldLayers(name)];
    n.node = FoldLayers(name);
    if (n.launches == 0 || e.flops > 0) n.math = e.math;
    n.us += 1e6 * e.seconds;
    n.bytes += e.bytes;
    n.flops += e.flops;
    n.launches += e.launches;
  }
  std::vector<NodeProfile> out;
  for (auto& [name, n] : folded) out.push_back(std::move(n));
  return out;
}

// The graph replays of `steps` decode steps on CUDA, each timed by events:
// the median device time of one replay, ms, and the median device idle
// time between consecutive replays, us.
absl::StatusOr<std::pair<double, double>> ReplayTimes(ModelRunner& runner, const DecodeBatch& batch,
                                                      int steps) {
  DeviceOpProfile profile;
  MLAG_RETURN_IF_ERROR(runner.stream().BeginDeviceProfile(&profile));
  absl::Status s;
  for (int i = 0; i < std::max(steps, 2) && s.ok(); ++i) s = runner.Execute(batch.seqs).status();
  absl::Status ended = runner.stream().EndDeviceProfile();
  MLAG_RETURN_IF_ERROR(s);
  MLAG_RETURN_IF_ERROR(ended);
  const auto& r = profile.replays;
  if (r.size() < 2) {
    return absl::InternalError(absl::StrCat("bench: ", r.size(), " graph replays timed over ",
                                            std::max(steps, 2),
                                            " steps; the steps were not replayed"));
  }
  std::vector<double> replay_ms, gap_us;
  for (size_t i = 0; i < r.size(); ++i) {
    replay_ms.push_back(1e3 * (r[i].end_seconds - r[i].start_seconds));
    if (i > 0) gap_us.push_back(1e6 * (r[i].start_seconds - r[i - 1].end_seconds));
  }
  return std::make_pair(Median(replay_ms), Median(gap_us));
}

// Eager milliseconds per step of each host op over `steps` steps, layer
// indices folded ("layers.*.attn.mla"), most first.
absl::StatusOr<std::vector<std::pair<std::string, double>>> ProfileSteps(
    ModelRunner& runner, absl::Span<const StepSequence> seqs, int steps) {
  HostOpProfile profile;
  runner.stream().set_host_profile(&profile);
  absl::Status s;
  for (int i = 0; i < steps && s.ok(); ++i) s = runner.Execute(seqs).status();
  runner.stream().set_host_profile(nullptr);
  MLAG_RETURN_IF_ERROR(s);
  std::map<std::string, double> folded;
  for (const auto& [name, e] : profile.ops) folded[FoldLayers(name)] += 1e3 * e.seconds / steps;
  std::vector<std::pair<std::string, double>> out(folded.begin(), folded.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

// Repetitions of each bandwidth measurement beside a decode timing.
constexpr int kBesideReps = 3;

// The largest decode batch bench captures (the engine's max_num_seqs bound).
constexpr int kMaxBenchBatch = 65536;

// Runs this process again with OPENBLAS_CORETYPE set to `core`: OpenBLAS
// picks its kernels once, when it loads, so a run capped to a narrower ISA
// starts again for its GEMM ceiling (the better of the host GEMM and
// OpenBLAS) to be that ISA's too. Returns only on failure.
absl::Status RunAgainWithOpenblasCore(const char* core) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  if (args.empty()) return absl::InternalError("cannot read /proc/self/cmdline");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("OPENBLAS_CORETYPE", core, 1);
  std::fflush(stdout);
  execv("/proc/self/exe", argv.data());
  return absl::InternalError(
      absl::StrCat("running again for OPENBLAS_CORETYPE=", core, ": ", std::strerror(errno)));
}

absl::Status Bench(BenchFlags f) {
  if (!f.host_isa.empty()) {
    // Before any host kernel runs: the variant is chosen at the first call.
    if (f.host_isa == "avx512") {
      unsetenv("MLAG_HOST_ISA");
    } else {
      setenv("MLAG_HOST_ISA", f.host_isa.c_str(), 1);
      if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
        return RunAgainWithOpenblasCore(f.host_isa == "avx2" ? "Haswell" : "Prescott");
      }
    }
  }
  if (f.batch_sizes.empty()) return absl::InvalidArgumentError("--batch-sizes is empty");
  const int max_batch = *std::max_element(f.batch_sizes.begin(), f.batch_sizes.end());
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, Device::Create(f.device));
  MLAG_ASSIGN_OR_RETURN(ModelSource source, OpenModel(f.model));
  const ModelConfig& mc = source.config;
  if (f.context_len == 0) {
    f.context_len = std::min(512, mc.max_position_embeddings - 1);
    for (int& len : f.prefill_lens) len = std::min(len, mc.max_position_embeddings);
  }
  std::sort(f.prefill_lens.begin(), f.prefill_lens.end());
  f.prefill_lens.erase(std::unique(f.prefill_lens.begin(), f.prefill_lens.end()),
                       f.prefill_lens.end());
  if (f.prefill_lens.empty()) return absl::InvalidArgumentError("--prefill-lens is empty");
  const int max_prefill = f.prefill_lens.back();
  // Every size is checked against the model before any arithmetic on it and
  // before anything is allocated or measured.
  if (f.context_len >= mc.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--context-len ", f.context_len, ": a decode step needs context + 1 <= the model's ",
        "max_position_embeddings ", mc.max_position_embeddings));
  }
  if (max_prefill > mc.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--prefill-lens ", max_prefill,
                                                   " exceeds the model's max_position_embeddings ",
                                                   mc.max_position_embeddings));
  }
  if (max_batch > kMaxBenchBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch-sizes: ", max_batch, " exceeds the largest batch, ", kMaxBenchBatch));
  }
  RunnerConfig rc;
  rc.block_size = 64;
  rc.max_model_len = std::max(f.context_len + 1, max_prefill);
  const int blocks_per_seq = (rc.max_model_len + rc.block_size - 1) / rc.block_size;
  const int64_t num_blocks = 1 + int64_t{std::max(max_batch, 1)} * blocks_per_seq;
  if (num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch-sizes ", max_batch, " at --context-len ", f.context_len, " needs ",
                     num_blocks, " KV blocks, beyond the block table's int32 range"));
  }
  rc.num_blocks = static_cast<int>(num_blocks);
  rc.max_num_seqs = max_batch;
  rc.max_num_batched_tokens = std::max(max_batch, max_prefill);
  rc.graph_mode = GraphMode::kFullDecode;
  rc.capture_sizes = f.batch_sizes;
  rc.kv_dtype = DefaultKvCacheDtype(*device);
  if (f.kv_cache_dtype != "auto") {
    MLAG_ASSIGN_OR_RETURN(rc.kv_dtype, ParseDType(f.kv_cache_dtype));
  }
  // On CUDA the model runs in bf16 unless told otherwise (an fp8
  // checkpoint stays fp8): the dtypes the tensor-core paths are built for.
  const bool weight_dtype_defaulted =
      f.weight_dtype == "auto" && device->is_cuda() && !mc.fp8_block_quantized;
  MLAG_ASSIGN_OR_RETURN(rc.weight_format,
                        ParseWeightFormat(weight_dtype_defaulted ? "bf16" : f.weight_dtype));
  auto t_build = Clock::now();
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                        ModelRunner::Create(source, device.get(), rc));
  const double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();
  MLAG_RETURN_IF_ERROR(runner->FillKvCache(7));
  MLAG_RETURN_IF_ERROR(runner->CaptureGraphs());
  const double capture_s = runner->stats().capture_seconds;
  const double warmup_s = runner->stats().warmup_seconds;

  // The bandwidth ceiling, measured before the decode timings, beside each
  // and after them, on one buffer (two on CUDA: a copy's source and
  // destination), held until the last of those measurements. Allocated
  // after the model is built, so that the build's time is not measured
  // with them held.
  MLAG_ASSIGN_OR_RETURN(
      std::unique_ptr<MemoryBandwidthProbe> probe,
      MemoryBandwidthProbe::Create(*device, static_cast<size_t>(f.bandwidth_gib * (1 << 30))));
  MLAG_ASSIGN_OR_RETURN(BandwidthMeasurement bw, probe->Measure(/*reps=*/5));  // before

  // Bytes a decode step must read: every weight except the embedding and
  // rope tables (a step reads B rows of each) and the routed experts (only
  // those the batch routes to), plus the KV cache of every sequence.
  const DeepseekModel::WeightBytes wb = runner->model().weight_breakdown();
  const double fixed_bytes =
      static_cast<double>(wb.total - wb.embedding - wb.rope_table) -
      static_cast<double>(wb.routed_layers) * wb.local_experts * wb.routed_expert;
  const double row_bytes = static_cast<double>(mc.hidden_size) * sizeof(float);
  const double kv_token_bytes = static_cast<double>(runner->kv_bytes_per_token());

  std::vector<DecodeResult> results;
  std::vector<BandwidthMeasurement> beside;  // the ceiling beside each graph timing
  for (int b : f.batch_sizes) {
    DecodeBatch batch(b, f.context_len, blocks_per_seq, mc.vocab_size, 100 + b);
    DecodeResult r;
    r.batch = b;
    r.flops = DecodeFlops(mc, b, f.context_len);
    r.attention_flops = DecodeAttentionFlops(mc, b, f.context_len);
    r.routed_flops = 2.0 * b * RoutedExpertMacsPerToken(mc);
    // The ceiling beside this timing: the better of one taken just before
    // and one just after, so that both figures come from the same phase of
    // a machine whose bandwidth moves.
    MLAG_ASSIGN_OR_RETURN(const BandwidthMeasurement beside_before, probe->Measure(kBesideReps));
    MLAG_ASSIGN_OR_RETURN(
        std::tie(r.graph_ms, r.eager_ms),
        TimeGraphAndEager(*runner, batch, f.steps, device->is_cuda() ? nullptr : probe.get(),
                          &r.paired_steps));
    MLAG_ASSIGN_OR_RETURN(const BandwidthMeasurement beside_after, probe->Measure(kBesideReps));
    if (f.profile && device->is_cuda()) {
      MLAG_ASSIGN_OR_RETURN(std::tie(r.replay_device_ms, r.launch_gap_us),
                            ReplayTimes(*runner, batch, f.steps));
    }
    beside.push_back(beside_before.bytes_per_second >= beside_after.bytes_per_second
                         ? beside_before
                         : beside_after);
    r.bandwidth_bytes_per_second = beside.back().bytes_per_second;
    results.push_back(r);
  }
  // Contention: the graphs captured again (warm, quiet, for a like-for-like
  // start-up figure), then captured and replayed with busy threads beside.
  ContentionResult contention;
  if (f.contend > 0) {
    contention.threads = f.contend;
    auto t_quiet = Clock::now();
    MLAG_RETURN_IF_ERROR(runner->CaptureGraphs());
    contention.quiet_capture_seconds = SecondsSince(t_quiet);
    BusyThreads busy(f.contend);
    auto t_busy = Clock::now();
    MLAG_RETURN_IF_ERROR(runner->CaptureGraphs());
    contention.contended_capture_seconds = SecondsSince(t_busy);
    for (DecodeResult& r : results) {
      DecodeBatch batch(r.batch, f.context_len, blocks_per_seq, mc.vocab_size, 100 + r.batch);
      MLAG_ASSIGN_OR_RETURN(r.contended_graph_ms, TimeSteps(*runner, batch, f.steps));
    }
  }
  // Routing of each batch (an eager step with recording on); eager timing
  // was alternated with the graph's above.
  runner->DropGraphs();
  for (DecodeResult& r : results) {
    DecodeBatch batch(r.batch, f.context_len, blocks_per_seq, mc.vocab_size, 100 + r.batch);
    std::vector<std::vector<int32_t>> routing;
    runner->model().RecordRouting(&routing);
    absl::Status s = runner->Execute(batch.seqs).status();
    runner->model().RecordRouting(nullptr);
    MLAG_RETURN_IF_ERROR(s);
    for (const auto& layer : routing) {
      // Only the batch's real rows count: padding rows are not part of it.
      const size_t real =
          std::min(layer.size(), static_cast<size_t>(r.batch) * mc.num_experts_per_tok);
      r.experts_touched +=
          static_cast<int>(std::set<int32_t>(layer.begin(), layer.begin() + real).size());
    }
    r.routed_bytes = r.experts_touched * static_cast<double>(wb.routed_expert);
    r.attention_bytes = r.batch * (f.context_len + 1) * kv_token_bytes;
    r.bytes = fixed_bytes + r.routed_bytes + r.batch * row_bytes + r.attention_bytes;
    if (f.profile && !device->is_cuda()) {
      MLAG_ASSIGN_OR_RETURN(r.profile_ms, ProfileSteps(*runner, batch.seqs, f.steps));
    }
    if (f.profile && device->is_cuda()) {
      MLAG_ASSIGN_OR_RETURN(r.nodes, ProfileDeviceStep(*runner, batch, &r.profiled_step_wall_ms));
      // What the launches could not know: the cached tokens the attention
      // reads (and multiplies) and the routed experts' weights the batch
      // reaches, as the step's bytes count them.
      for (NodeProfile& n : r.nodes) {
        if (n.node == "layers.*.attn.mla") {
          n.bytes += r.batch * (f.context_len + 1) * kv_token_bytes;
          n.flops += r.attention_flops;
        } else if (n.node == "layers.*.moe.experts") {
          n.bytes += r.experts_touched * static_cast<double>(wb.routed_expert);
        }
      }
      std::stable_sort(r.nodes.begin(), r.nodes.end(),
                       [](const NodeProfile& a, const NodeProfile& b) { return a.us > b.us; });
    }
  }
  // The ceiling measured again after the decode timings. The run's best is
  // the best of every measurement, the ones beside the timings included: on
  // a shared machine one measurement can land in a slow moment, and the
  // best bounds the figures most conservatively (never above what the
  // memory gave).
  MLAG_ASSIGN_OR_RETURN(const BandwidthMeasurement bw_after, probe->Measure(/*reps=*/5));
  probe.reset();
  const double bw_before_bytes_per_second = bw.bytes_per_second;
  if (bw_after.bytes_per_second > bw.bytes_per_second) bw = bw_after;
  for (const BandwidthMeasurement& m : beside) {
    if (m.bytes_per_second > bw.bytes_per_second) bw = m;
  }

  // The GEMM ceiling (host): the widest dense projection the model has (an
  // MLP's gate|up) through the host GEMM and OpenBLAS, at the decode batches
  // and the prefill lengths: the cost of batch invariance, and the ceiling
  // prefill is measured against.
  const int64_t gemm_width = mc.n_routed_experts > 0 ? 2 * int64_t{mc.moe_intermediate_size}
                                                     : 2 * int64_t{mc.intermediate_size};
  auto measure_gemm = [&]() -> absl::StatusOr<std::vector<GemmCost>> {
    std::vector<int64_t> rows = {1, max_batch};
    rows.insert(rows.end(), f.prefill_lens.begin(), f.prefill_lens.end());
    return MeasureGemmCost(gemm_width, mc.hidden_size, rows, /*reps=*/5);
  };
  std::vector<GemmCost> gemm_before;
  // The arithmetic ceiling (host): the peak multiply-add rate, measured
  // here and again after the prefill timings, the better of the two; after
  // the decode timings, so that its burst of arithmetic does not precede
  // any of them.
  double peak_gflops = 0.0;
  if (!device->is_cuda()) {
    MLAG_ASSIGN_OR_RETURN(gemm_before, measure_gemm());
    peak_gflops = MeasurePeakGflops();
  }
  // The matmul ceilings (CUDA, --profile): bf16 (and e4m3 on sm_90) on the
  // tensor cores and f32 on the FMA units, through cuBLASLt, after the decode timings. 8192^3
  // keeps an H200 busy for milliseconds at its peak; the emulation computes
  // on the CPU, where a small matrix already shows its rate.
  std::map<DType, double> matmul_peak;
#if MLAG_HAVE_CUDA
  if (f.profile && device->is_cuda()) {
    const int64_t n = MLAG_CUDA_EMULATED ? 128 : 8192;
    for (DType ab : {DType::kBF16, DType::kF32}) {
      MLAG_ASSIGN_OR_RETURN(matmul_peak[ab],
                            cuda_blas::MeasureMatmulFlops(runner->stream(), ab, n, /*reps=*/5));
    }
    // e4m3 (cuBLASLt's block scaling) where the GPU has it: fp8 nodes then
    // read against the FP8 tensor cores' rate.
    absl::StatusOr<double> fp8 =
        cuda_blas::MeasureMatmulFlops(runner->stream(), DType::kF8E4M3, n, /*reps=*/5);
    if (fp8.ok()) {
      matmul_peak[DType::kF8E4M3] = *fp8;
    } else if (!absl::IsUnimplemented(fp8.status())) {
      return fp8.status();
    }
  }
#endif

  // Prefill: one sequence of each prompt length from an empty cache, eager
  // (prefill is never captured). Long prompts take seconds: one warm-up run
  // and fewer timed runs for them.
  std::vector<PrefillResult> prefills;
  for (int len : f.prefill_lens) {
    std::vector<int32_t> prompt(len);
    std::mt19937 rng(3);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % mc.vocab_size);
    std::vector<int> table;
    for (int j = 0; j < (len + rc.block_size - 1) / rc.block_size; ++j) table.push_back(1 + j);
    StepSequence pre;
    pre.new_tokens = prompt;
    pre.block_table = table;
    pre.sample = true;
    MLAG_RETURN_IF_ERROR(runner->Execute({&pre, 1}).status());
    // Host: the GEMM ceiling at this row count measured again just before
    // each run and after the last, so that each run has one beside it (the
    // better of the two adjacent): this machine's speed moves between
    // phases of seconds, and a ceiling from another phase compares nothing
    // (as the bandwidth beside each decode timing).
    auto ceiling_now = [&]() -> absl::StatusOr<double> {
      if (device->is_cuda()) return 0.0;
      MLAG_ASSIGN_OR_RETURN(const std::vector<GemmCost> g,
                            MeasureGemmCost(gemm_width, mc.hidden_size, {len}, /*reps=*/3));
      return std::max(g[0].host_gemm_gflops, g[0].openblas_gflops);
    };
    std::vector<double> ms, ceilings;
    const int reps = len <= 512 ? 3 : 1;
    for (int i = 0; i < reps; ++i) {
      MLAG_ASSIGN_OR_RETURN(ceilings.emplace_back(), ceiling_now());
      auto t0 = Clock::now();
      MLAG_RETURN_IF_ERROR(runner->Execute({&pre, 1}).status());
      ms.push_back(1e3 * SecondsSince(t0));
    }
    MLAG_ASSIGN_OR_RETURN(ceilings.emplace_back(), ceiling_now());
    // The median run, and the ceiling beside it.
    std::vector<int> order(reps);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ms[a] < ms[b]; });
    const int median = order[reps / 2];
    PrefillResult& result = prefills.emplace_back();
    result.tokens = len;
    result.ms = ms[median];
    result.flops = PrefillFlops(mc, len);
    result.ceiling_beside_gflops = std::max(ceilings[median], ceilings[median + 1]);
    result.ceiling_best_gflops = *std::max_element(ceilings.begin(), ceilings.end());
    if (f.profile && !device->is_cuda()) {
      // Where a prefill's time goes, op by op: one more run, profiled.
      MLAG_ASSIGN_OR_RETURN(prefills.back().profile_ms, ProfileSteps(*runner, {&pre, 1}, 1));
    }
  }

  BenchReport report;
  report.device_name = device->name();
  report.is_cuda = device->is_cuda();
  report.bandwidth = bw;
  report.bandwidth_runs_bytes_per_second = {bw_before_bytes_per_second, bw_after.bytes_per_second};
  report.bandwidth_gib = f.bandwidth_gib;
  report.model = source.description;
  report.config = mc;
  report.weight_bytes = wb.total;
  report.weight_bytes_by_dtype = runner->model().weight_bytes_by_dtype();
  report.weight_huge_page_share = runner->model().weight_huge_page_share();
  report.kv_dtype = rc.kv_dtype;
  report.weight_format = rc.weight_format;
  report.weight_dtype_defaulted = weight_dtype_defaulted;
  report.matmul_peak_flops = matmul_peak;
  report.emulated_times = device->is_cuda() && MLAG_CUDA_EMULATED;
  report.context_len = f.context_len;
  report.steps = f.steps;
  report.build_seconds = build_s;
  report.capture_seconds = capture_s;
  report.warmup_seconds = warmup_s;
  report.decode = results;
  report.contention = contention;
  report.prefill = prefills;
  if (!device->is_cuda()) {
    // Measured again after the prefill timings; the better of the two
    // measurements.
    MLAG_ASSIGN_OR_RETURN(const std::vector<GemmCost> after, measure_gemm());
    report.peak_gflops = std::max(peak_gflops, MeasurePeakGflops());
    for (size_t i = 0; i < gemm_before.size() && i < after.size(); ++i) {
      GemmCost g = gemm_before[i];
      g.host_gemm_gflops = std::max(g.host_gemm_gflops, after[i].host_gemm_gflops);
      g.openblas_gflops = std::max(g.openblas_gflops, after[i].openblas_gflops);
      report.gemm_cost.push_back(g);
    }
  }
  if (f.json) {
    PrintBenchJson(report);
  } else {
    PrintBenchText(report);
  }
  return absl::OkStatus();
}

}  // namespace

Command AddBenchCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* bench = app.add_subcommand("bench", "decode latency and tokens/s per batch size");
  bench->add_option("--model", f->model, ModelHelp())->required();
  bench->add_option("--device", f->device, "auto, host, cuda or cuda:N");
  bench->add_option("--batch-sizes", f->batch_sizes, "comma-separated batch sizes")
      ->delimiter(',')
      ->check(AtLeast(1));
  bench
      ->add_option("--context-len", f->context_len,
                   "cached tokens per sequence (default 512, capped by the model)")
      ->check(AtLeast(0));
  bench->add_option("--steps", f->steps, "timed decode steps per batch size")->check(AtLeast(1));
  bench
      ->add_option("--prefill-lens,--prefill-len", f->prefill_lens,
                   "comma-separated prompt lengths of the prefill runs (default 128,512,2048, "
                   "capped by the model)")
      ->delimiter(',')
      ->check(AtLeast(1));
  bench
      ->add_option("--contend", f->contend,
                   "busy threads to run beside a second round of decode and capture timings")
      ->check(CLI::Range(0, 256));
  bench
      ->add_option("--host-isa", f->host_isa,
                   "host kernels' widest ISA: avx512 (the CPU's best), avx2 or sse2 "
                   "(as MLAG_HOST_ISA; OpenBLAS is capped to match, Haswell or Prescott "
                   "kernels, unless OPENBLAS_CORETYPE is set)")
      ->check(CLI::IsMember({"avx512", "avx2", "sse2"}));
  bench
      ->add_option("--bandwidth-gib", f->bandwidth_gib, "buffer of the bandwidth measurement (GiB)")
      ->check(CLI::Range(1.0 / 1024, 1024.0));
  bench->add_flag("--profile", f->profile,
                  "where a step's time goes: host: each op of --steps eager decode steps per batch "
                  "size and of one run per prefill length; CUDA: each graph node of one eager "
                  "event-timed step per batch size, its "
                  "bytes and FLOPs against the copy bandwidth and a cuBLASLt matmul's rate "
                  "measured in the same run, and the device's idle time between graph replays");
  bench
      ->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                   "auto (bf16 on CUDA, f32 on the host), f32 or bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  AddWeightDtype(bench, &f->weight_dtype);
  bench->add_flag("--json", f->json, "print JSON");
  return {bench, [f] {
            absl::Status s = Bench(*f);
            return s.ok() ? 0 : Fail(s);
          }};
}

}  // namespace mlag::cli
