// mlag: the command line of mlagraph.
//
//   mlag run    --model M [--num-requests N --prompt-len L --shared-prefix-len P --seed S
//                          | --prompts FILE] --max-tokens T [engine and sampling flags] [--json]
//   mlag graphs --model M [--size N] [--dot FILE]
//   mlag export --model M --out DIR
//   mlag info   --model M
//
// M is a built-in model (tiny-v3, tiny-v2, small) or a checkpoint directory.
// Every error from a flag or a file is one line on stderr naming the problem,
// with exit code 2.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "examples/bench.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"
#include "mlag_config.h"
#include "runtime/engine.h"
#include "runtime/expert_parallel.h"
#if MLAG_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif
#include "runtime/hf_layout.h"
#include "runtime/model_loader.h"

namespace mlag {
namespace {

constexpr int kExitUsage = 2;

// An error from a flag, a file or a model: one line, exit 2.
int Fail(const absl::Status& s) {
  std::fprintf(stderr, "mlag: error: %s\n", std::string(s.message()).c_str());
  return kExitUsage;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// ---- shared engine flags -----------------------------------------------------------

struct EngineFlags {
  std::string model;
  std::string device = "auto";
  std::string graph_mode = "full-decode";
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int block_size = 64;
  int max_model_len = 0;
  bool no_prefix_caching = false;
  std::string kv_cache_dtype = "auto";

  void Register(CLI::App* app) {
    app->add_option("--model", model, "built-in model (tiny-v3, tiny-v2, small) or directory")
        ->required();
    app->add_option("--device", device, "auto, host, cuda or cuda:N");
    app->add_option("--graph-mode", graph_mode, "full-decode (default) or none");
    app->add_option("--kv-cache-bytes", kv_cache_bytes, "bytes of KV cache");
    app->add_option("--max-num-seqs", max_num_seqs, "most sequences per step");
    app->add_option("--max-num-batched-tokens", max_num_batched_tokens,
                    "token budget per step (chunked prefill)");
    app->add_option("--block-size", block_size, "tokens per KV block");
    app->add_option("--max-model-len", max_model_len, "longest sequence (0: model default)");
    app->add_flag("--no-prefix-caching", no_prefix_caching, "disable prefix caching");
    app->add_option("--kv-cache-dtype", kv_cache_dtype,
                    "auto (bf16 on CUDA, f32 on the host), f32 or bf16");
  }

  absl::StatusOr<EngineOptions> ToOptions() const {
    EngineOptions o;
    o.model = model;
    o.device = device;
    MLAG_ASSIGN_OR_RETURN(o.graph_mode, ParseGraphMode(graph_mode));
    if (kv_cache_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-bytes must be positive, got ",
                                                     kv_cache_bytes));
    }
    o.kv_cache_bytes = static_cast<size_t>(kv_cache_bytes);
    if (max_num_seqs < 1) return absl::InvalidArgumentError("--max-num-seqs must be >= 1");
    if (max_num_batched_tokens < 1) {
      return absl::InvalidArgumentError("--max-num-batched-tokens must be >= 1");
    }
    if (block_size < 1) return absl::InvalidArgumentError("--block-size must be >= 1");
    if (max_model_len < 0) return absl::InvalidArgumentError("--max-model-len must be >= 0");
    o.max_num_seqs = max_num_seqs;
    o.max_num_batched_tokens = max_num_batched_tokens;
    o.block_size = block_size;
    o.max_model_len = max_model_len;
    o.enable_prefix_caching = !no_prefix_caching;
    o.kv_cache_dtype = kv_cache_dtype;
    return o;
  }
};

// ---- mlag run -----------------------------------------------------------------------

struct RunFlags {
  EngineFlags engine;
  int num_requests = 8;
  int prompt_len = 32;
  int shared_prefix_len = 0;
  uint64_t seed = 0;
  std::string prompts_file;
  int max_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  int logprobs = 0;
  std::vector<int> stop_tokens;
  bool json = false;
  // Expert parallelism: 0 = off.
  int ep = 0;
  std::string ep_backend = "local";
  std::vector<std::string> reconfigure_at;
};

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadPromptsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open prompts file ", path));
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::vector<int32_t> ids;
    for (absl::string_view word : absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(word, &id)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": '", word,
                                                       "' is not a token id"));
      }
      ids.push_back(id);
    }
    if (ids.empty()) continue;  // blank lines separate nothing
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return prompts;
}

std::vector<std::vector<int32_t>> SyntheticPrompts(const RunFlags& f, int vocab) {
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> prefix(std::min(f.shared_prefix_len, f.prompt_len));
  for (int32_t& t : prefix) t = token(rng);
  std::vector<std::vector<int32_t>> prompts(f.num_requests);
  for (auto& p : prompts) {
    p = prefix;
    while (static_cast<int>(p.size()) < f.prompt_len) p.push_back(token(rng));
  }
  return prompts;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

RequestSpec MakeSpec(const RunFlags& f, const std::vector<int32_t>& prompt, size_t index) {
  RequestSpec spec;
  spec.prompt = prompt;
  spec.max_tokens = f.max_tokens;
  spec.stop_token_ids.assign(f.stop_tokens.begin(), f.stop_tokens.end());
  spec.sampling.temperature = f.temperature;
  spec.sampling.top_k = f.top_k;
  spec.sampling.top_p = f.top_p;
  spec.sampling.seed = f.seed * 1000003ull + index;
  spec.sampling.logprobs = f.logprobs;
  return spec;
}

// mlag run --ep N: the requests spread over N expert-parallel ranks (thread
// ranks for --ep-backend local, mpirun processes for mpi), with optional
// reconfigurations. Prints like a single-rank run, plus the reconfigurations.
int RunExpertParallelCli(const RunFlags& f, const EngineOptions& options,
                         std::vector<std::vector<int32_t>> prompts) {
  EpOptions ep;
  ep.world = f.ep;
  for (const std::string& r : f.reconfigure_at) {
    auto parsed = ParseReconfigureAt(r);
    if (!parsed.ok()) return Fail(parsed.status());
    if (parsed->size > f.ep) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--reconfigure-at ", r, ": size ", parsed->size, " exceeds --ep ", f.ep)));
    }
    ep.reconfigure.push_back(*parsed);
  }
  std::stable_sort(ep.reconfigure.begin(), ep.reconfigure.end(),
                   [](const ReconfigureAt& a, const ReconfigureAt& b) { return a.step < b.step; });
  if (prompts.empty()) {
    auto source = OpenModel(options.model);
    if (!source.ok()) return Fail(source.status());
    prompts = SyntheticPrompts(f, source->config.vocab_size);
  }
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < prompts.size(); ++i) specs.push_back(MakeSpec(f, prompts[i], i));

  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<EpRunResult> result;
  int my_rank = 0;
  if (f.ep_backend == "local") {
    result = RunLocalExpertParallel(options, ep, specs);
  } else if (f.ep_backend == "mpi") {
#if MLAG_HAVE_MPI
    auto world = MpiCommunicator::World();
    if (!world.ok()) return Fail(world.status());
    my_rank = (*world)->rank();
    auto rank = EpRank::Create(world->get(), options, ep);
    if (!rank.ok()) return Fail(rank.status());
    result = (*rank)->Run(specs);
#else
    return Fail(absl::FailedPreconditionError("--ep-backend mpi: built without MPI"));
#endif
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "unknown --ep-backend '", f.ep_backend, "' (expected local or mpi)")));
  }
  if (!result.ok()) return Fail(result.status());
  const double seconds = Seconds(t0);
  if (my_rank != 0) return 0;  // rank 0 prints for the world

  int64_t tokens_in = 0, tokens_out = 0;
  for (const auto& p : prompts) tokens_in += static_cast<int64_t>(p.size());
  for (const EpRequestResult& r : result->requests) tokens_out += r.output_tokens.size();
  const double hit_rate = result->prefix_queried_tokens > 0
                              ? static_cast<double>(result->prefix_hit_tokens) /
                                    result->prefix_queried_tokens
                              : 0.0;
  if (f.json) {
    nlohmann::ordered_json j;
    j["requests"] = nlohmann::ordered_json::array();
    for (const EpRequestResult& r : result->requests) {
      nlohmann::ordered_json rj = {{"id", r.id},
                           {"prompt_tokens", r.prompt_tokens},
                           {"output_tokens", r.output_tokens},
                           {"finish_reason", std::string(FinishReasonName(r.finish_reason))}};
      if (f.logprobs > 0) {
        nlohmann::ordered_json lp = nlohmann::ordered_json::array();
        for (const auto& entry : r.logprobs) {
          nlohmann::ordered_json top = nlohmann::ordered_json::array();
          for (const TokenLogprob& t : entry) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
          lp.push_back(top);
        }
        rj["logprobs"] = lp;
      }
      j["requests"].push_back(rj);
    }
    nlohmann::ordered_json replays = nlohmann::ordered_json::object();
    for (const auto& [size, count] : result->graph_replays) replays[std::to_string(size)] = count;
    j["stats"] = {{"steps", result->driver_steps},
                  {"engine_steps", result->engine_steps},
                  {"graph_replays", replays},
                  {"eager_steps", result->eager_steps},
                  {"dummy_steps", result->dummy_steps},
                  {"prefix_cache_hit_rate", hit_rate},
                  {"capture_seconds", result->capture_seconds},
                  {"preemptions", result->preemptions},
                  {"tokens_in", tokens_in},
                  {"tokens_out", tokens_out},
                  {"run_seconds", seconds},
                  {"ep", f.ep},
                  {"ep_backend", f.ep_backend}};
    j["reconfigurations"] = nlohmann::ordered_json::array();
    for (const ReconfigurationReport& r : result->reconfigurations) {
      nlohmann::ordered_json phases = nlohmann::ordered_json::object();
      for (const auto& [name, s] : r.seconds) phases[name] = s;
      nlohmann::ordered_json rj = {{"step", r.step},
                           {"from", r.from},
                           {"to", r.to},
                           {"kv_pages_unchanged", r.kv_pages_unchanged}};
      rj["seconds"] = phases;  // in phase order
      j["reconfigurations"].push_back(rj);
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  for (const EpRequestResult& r : result->requests) {
    std::printf("request %lld (%d prompt tokens, %s):", static_cast<long long>(r.id),
                r.prompt_tokens, std::string(FinishReasonName(r.finish_reason)).c_str());
    for (int32_t t : r.output_tokens) std::printf(" %d", t);
    std::printf("\n");
  }
  std::printf("\nexpert parallel: %d ranks (%s backend), %lld driver steps, %lld engine steps "
              "summed over ranks, %lld dummy steps\n",
              f.ep, f.ep_backend.c_str(), static_cast<long long>(result->driver_steps),
              static_cast<long long>(result->engine_steps),
              static_cast<long long>(result->dummy_steps));
  std::printf("requests: %zu, tokens in %lld, tokens out %lld, %.1f s, %.1f tokens/s out; "
              "prefix cache hit rate %.1f%%\n",
              result->requests.size(), static_cast<long long>(tokens_in),
              static_cast<long long>(tokens_out), seconds, tokens_out / std::max(seconds, 1e-9),
              100.0 * hit_rate);
  std::printf("graph replays per size:");
  for (const auto& [size, count] : result->graph_replays) std::printf(" %d:%lld", size, static_cast<long long>(count));
  std::printf("\n");
  for (const ReconfigurationReport& r : result->reconfigurations) {
    std::printf("reconfiguration at step %d: %d -> %d ranks, kv pages unchanged: %s;", r.step,
                r.from, r.to, r.kv_pages_unchanged ? "yes" : "NO");
    for (const auto& [name, s] : r.seconds) std::printf(" %s %.4f s", name.c_str(), s);
    std::printf("\n");
  }
  return 0;
}

int RunRun(const RunFlags& f) {
  if (f.max_tokens < 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be >= 1, got ", f.max_tokens)));
  }
  if (f.prompts_file.empty()) {
    if (f.num_requests < 1) return Fail(absl::InvalidArgumentError("--num-requests must be >= 1"));
    if (f.prompt_len < 1) return Fail(absl::InvalidArgumentError("--prompt-len must be >= 1"));
    if (f.shared_prefix_len < 0 || f.shared_prefix_len > f.prompt_len) {
      return Fail(absl::InvalidArgumentError("--shared-prefix-len must be in [0, --prompt-len]"));
    }
  }
  if (f.temperature < 0.0f || !(f.top_p > 0.0f && f.top_p <= 1.0f) || f.logprobs < 0) {
    return Fail(absl::InvalidArgumentError(
        "--temperature must be >= 0, --top-p in (0, 1], --logprobs >= 0"));
  }
  auto options = f.engine.ToOptions();
  if (!options.ok()) return Fail(options.status());
  std::vector<std::vector<int32_t>> prompts;
  if (!f.prompts_file.empty()) {
    auto read = ReadPromptsFile(f.prompts_file);
    if (!read.ok()) return Fail(read.status());
    prompts = std::move(*read);
  }

  if (f.ep > 0) return RunExpertParallelCli(f, *options, prompts);

  auto t_create = std::chrono::steady_clock::now();
  auto engine_or = Engine::Create(*options);
  if (!engine_or.ok()) return Fail(engine_or.status());
  Engine& engine = **engine_or;
  const double create_seconds = Seconds(t_create);
  if (f.prompts_file.empty()) prompts = SyntheticPrompts(f, engine.config().vocab_size);

  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = f.max_tokens;
    spec.stop_token_ids.assign(f.stop_tokens.begin(), f.stop_tokens.end());
    spec.sampling.temperature = f.temperature;
    spec.sampling.top_k = f.top_k;
    spec.sampling.top_p = f.top_p;
    spec.sampling.seed = f.seed * 1000003ull + i;
    spec.sampling.logprobs = f.logprobs;
    auto id = engine.AddRequest(spec);
    if (!id.ok()) {
      return Fail(absl::Status(id.status().code(),
                               absl::StrCat("request ", i, ": ", id.status().message())));
    }
    ids.push_back(*id);
  }

  const bool progress = !f.json && isatty(STDERR_FILENO);
  std::vector<double> step_ms;
  int64_t tokens_out = 0;
  auto t_run = std::chrono::steady_clock::now();
  while (engine.HasUnfinished()) {
    auto t0 = std::chrono::steady_clock::now();
    auto out = engine.Step();
    if (!out.ok()) {
      std::fprintf(stderr, "mlag: error: step failed: %s\n",
                   std::string(out.status().message()).c_str());
      return 1;
    }
    step_ms.push_back(1e3 * Seconds(t0));
    tokens_out += static_cast<int64_t>(out->new_tokens.size());
    if (progress) {
      int done = 0;
      for (RequestId id : ids) done += engine.request(id)->finished() ? 1 : 0;
      const int width = 30, filled = static_cast<int>(width * done / ids.size());
      std::fprintf(stderr, "\r[%s%s] %d/%zu requests, %lld tokens", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done, ids.size(),
                   static_cast<long long>(tokens_out));
    }
  }
  const double run_seconds = Seconds(t_run);
  if (progress) std::fprintf(stderr, "\n");
  const EngineStats stats = engine.Stats();

  int64_t tokens_in = 0;
  for (const auto& p : prompts) tokens_in += static_cast<int64_t>(p.size());
  if (f.json) {
    nlohmann::json j;
    j["requests"] = nlohmann::json::array();
    for (RequestId id : ids) {
      const Request* r = engine.request(id);
      nlohmann::json rj;
      rj["id"] = id;
      rj["prompt_tokens"] = r->num_prompt_tokens;
      rj["output_tokens"] = r->output_tokens();
      rj["finish_reason"] = std::string(FinishReasonName(r->finish_reason));
      if (f.logprobs > 0) {
        nlohmann::json lp = nlohmann::json::array();
        for (const auto& entry : r->logprobs) {
          nlohmann::json top = nlohmann::json::array();
          for (const TokenLogprob& t : entry) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
          lp.push_back(top);
        }
        rj["logprobs"] = lp;
      }
      j["requests"].push_back(rj);
    }
    nlohmann::json s;
    s["steps"] = stats.steps;
    nlohmann::json replays = nlohmann::json::object();
    for (const auto& [size, count] : stats.graph_replays) replays[std::to_string(size)] = count;
    s["graph_replays"] = replays;
    s["eager_steps"] = stats.eager_steps;
    s["prefix_cache_hit_rate"] = stats.prefix_cache_hit_rate;
    s["capture_seconds"] = stats.capture_seconds;
    s["preemptions"] = stats.preemptions;
    s["tokens_in"] = tokens_in;
    s["tokens_out"] = tokens_out;
    s["run_seconds"] = run_seconds;
    s["step_latency_ms"] = {{"p50", Percentile(step_ms, 0.5)}, {"p99", Percentile(step_ms, 0.99)}};
    s["kv_blocks_total"] = stats.kv_blocks_total;
    j["stats"] = s;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  for (RequestId id : ids) {
    const Request* r = engine.request(id);
    std::printf("request %lld (%d prompt tokens, %s):", static_cast<long long>(id),
                r->num_prompt_tokens, std::string(FinishReasonName(r->finish_reason)).c_str());
    for (int32_t t : r->output_tokens()) std::printf(" %d", t);
    std::printf("\n");
  }
  std::printf("\nmodel %s on %s (%s)\n", engine.model_description().c_str(),
              engine.device().name().c_str(), engine.device().selection_reason().c_str());
  std::printf("engine built in %.2f s; %d graphs captured in %.3f s (graph mode %s)\n",
              create_seconds, stats.num_graphs, stats.capture_seconds,
              f.engine.graph_mode.c_str());
  std::printf("requests: %zu, tokens in %lld, tokens out %lld, %.1f s, %.1f tokens/s out\n",
              ids.size(), static_cast<long long>(tokens_in), static_cast<long long>(tokens_out),
              run_seconds, tokens_out / std::max(run_seconds, 1e-9));
  std::printf("steps: %lld, step latency p50 %.2f ms, p99 %.2f ms, eager steps %lld, "
              "preemptions %lld\n",
              static_cast<long long>(stats.steps), Percentile(step_ms, 0.5),
              Percentile(step_ms, 0.99), static_cast<long long>(stats.eager_steps),
              static_cast<long long>(stats.preemptions));
  std::printf("graph replays per size:");
  if (stats.graph_replays.empty()) std::printf(" none");
  for (const auto& [size, count] : stats.graph_replays) std::printf(" %d:%lld", size, static_cast<long long>(count));
  std::printf("\nprefix cache hit rate %.1f%%; KV %d blocks of %d tokens (%zu bytes/token), "
              "%d in use at exit\n",
              100.0 * stats.prefix_cache_hit_rate, stats.kv_blocks_total, stats.kv_block_size,
              stats.kv_bytes_per_token, stats.kv_blocks_used);
  return 0;
}

// ---- mlag graphs --------------------------------------------------------------------

int RunGraphs(const EngineFlags& flags, int only_size, const std::string& dot_file) {
  auto options = flags.ToOptions();
  if (!options.ok()) return Fail(options.status());
  if (options->graph_mode == GraphMode::kNone) {
    return Fail(absl::InvalidArgumentError("mlag graphs needs --graph-mode full-decode"));
  }
  auto engine = Engine::Create(*options);
  if (!engine.ok()) return Fail(engine.status());
  ModelRunner& runner = (*engine)->runner();
  if (only_size > 0 && runner.graph(only_size) == nullptr) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("no graph of size ", only_size)));
  }
  std::ofstream dot;
  if (!dot_file.empty()) {
    dot.open(dot_file);
    if (!dot) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", dot_file)));
    dot << "digraph mlagraph {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n";
  }
  std::printf("%d graphs captured in %.3f s on %s\n", runner.num_graphs(),
              runner.stats().capture_seconds, (*engine)->device().name().c_str());
  for (auto it = runner.capture_sizes().rbegin(); it != runner.capture_sizes().rend(); ++it) {
    const int size = *it;
    if (only_size > 0 && size != only_size) continue;
    const Graph* g = runner.graph(size);
    std::printf("size %d: %zu nodes\n", size, g->nodes().size());
    for (const GraphNode& n : g->nodes()) {
      std::printf("  %s %s\n", n.name.c_str(), std::string(OpKindName(n.kind)).c_str());
    }
    if (dot.is_open()) {
      dot << "  subgraph cluster_" << size << " {\n    label=\"size " << size << "\";\n";
      for (size_t i = 0; i < g->nodes().size(); ++i) {
        const GraphNode& n = g->nodes()[i];
        dot << "    s" << size << "_" << i << " [label=\"" << n.name << "\\n"
            << OpKindName(n.kind) << "\"];\n";
        if (i > 0) dot << "    s" << size << "_" << i - 1 << " -> s" << size << "_" << i << ";\n";
      }
      dot << "  }\n";
    }
  }
  if (dot.is_open()) {
    dot << "}\n";
    std::printf("wrote %s\n", dot_file.c_str());
  }
  return 0;
}

// ---- mlag export / info -------------------------------------------------------------

int RunExport(const std::string& model, const std::string& out) {
  auto t0 = std::chrono::steady_clock::now();
  auto source = OpenModel(model);
  if (!source.ok()) return Fail(source.status());
  absl::Status s = ExportModel(source->config, *source->weights, out);
  if (!s.ok()) return Fail(s);
  std::printf("exported %s to %s: %zu tensors, config.json + model.safetensors (bf16) in %.2f s\n",
              source->description.c_str(), out.c_str(), ExpectedTensors(source->config).size(),
              Seconds(t0));
  return 0;
}

int RunInfo(const std::string& model, const std::string& device_spec) {
  auto device = Device::Create(device_spec);
  if (!device.ok()) return Fail(device.status());
  auto t0 = std::chrono::steady_clock::now();
  auto source = OpenModel(model);
  if (!source.ok()) return Fail(source.status());
  ModelOptions options;
  options.max_tokens = 64;
  options.max_seqs = 8;
  auto built = BuildModel(*source, device->get(), options);
  if (!built.ok()) return Fail(built.status());
  const double seconds = Seconds(t0);
  const ModelConfig& c = source->config;
  int moe_layers = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.IsMoeLayer(i) ? 1 : 0;
  std::printf("model: %s (%s)\n", source->description.c_str(), c.model_type.c_str());
  std::printf("device: %s — %s\n", (*device)->name().c_str(),
              (*device)->selection_reason().c_str());
  std::printf("layers: %d (%d MoE), hidden %d, heads %d, vocab %d\n", c.num_hidden_layers,
              moe_layers, c.hidden_size, c.num_attention_heads, c.vocab_size);
  std::printf("MLA: q_lora %d, kv_lora %d, nope %d, rope %d, v %d, softmax scale %.6f\n",
              c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
              c.v_head_dim, (*built)->attention(0).softmax_scale());
  std::printf("MoE: %d routed experts, top-%d, %d shared, expert width %d\n", c.n_routed_experts,
              c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size);
  std::printf("tensors: %zu, weights on device: %.1f MiB (f32)\n", ExpectedTensors(c).size(),
              (*built)->weight_bytes() / 1048576.0);
  std::printf("built in %.2f s\n", seconds);
  return 0;
}

}  // namespace
}  // namespace mlag

int main(int argc, char** argv) {
  CLI::App app{"mlag: serve DeepSeek-style MLA + MoE models by replaying captured graphs"};
  app.require_subcommand(1);

  mlag::RunFlags run_flags;
  CLI::App* run = app.add_subcommand("run", "serve a batch of requests and print the outputs");
  run_flags.engine.Register(run);
  run->add_option("--num-requests", run_flags.num_requests, "synthetic requests");
  run->add_option("--prompt-len", run_flags.prompt_len, "tokens per synthetic prompt");
  run->add_option("--shared-prefix-len", run_flags.shared_prefix_len,
                  "leading tokens shared by every synthetic prompt");
  run->add_option("--seed", run_flags.seed, "seed of the synthetic prompts and of sampling");
  run->add_option("--prompts", run_flags.prompts_file,
                  "file with one request per line: token ids separated by spaces");
  run->add_option("--max-tokens", run_flags.max_tokens, "tokens to generate per request");
  run->add_option("--temperature", run_flags.temperature, "0 = greedy");
  run->add_option("--top-k", run_flags.top_k, "0 = off");
  run->add_option("--top-p", run_flags.top_p, "1 = off");
  run->add_option("--logprobs", run_flags.logprobs, "top-K log-probabilities per token (JSON)");
  run->add_option("--stop-token", run_flags.stop_tokens, "stop at this token id (repeatable)");
  run->add_flag("--json", run_flags.json, "print one JSON object");
  run->add_option("--ep", run_flags.ep, "expert-parallel ranks (0: off)");
  run->add_option("--ep-backend", run_flags.ep_backend, "local (thread ranks) or mpi (mpirun)");
  run->add_option("--reconfigure-at", run_flags.reconfigure_at,
                  "STEP:SIZE: reconfigure the expert-parallel group before STEP (repeatable)");

  mlag::EngineFlags graphs_flags;
  int graphs_size = 0;
  std::string dot_file;
  CLI::App* graphs = app.add_subcommand("graphs", "capture every graph size and list the nodes");
  graphs_flags.Register(graphs);
  graphs->add_option("--size", graphs_size, "only this capture size");
  graphs->add_option("--dot", dot_file, "also write Graphviz to this file");

  mlag::BenchFlags bench_flags;
  CLI::App* bench = app.add_subcommand("bench", "decode latency and tokens/s per batch size");
  bench->add_option("--model", bench_flags.model, "built-in model or directory")->required();
  bench->add_option("--device", bench_flags.device, "auto, host, cuda or cuda:N");
  bench->add_option("--batch-sizes", bench_flags.batch_sizes, "comma-separated batch sizes")
      ->delimiter(',');
  bench->add_option("--context-len", bench_flags.context_len, "cached tokens per sequence (default 512, capped by the model)");
  bench->add_option("--steps", bench_flags.steps, "timed decode steps per batch size");
  bench->add_option("--prefill-len", bench_flags.prefill_len, "tokens of the prefill run");
  bench->add_option("--bandwidth-gib", bench_flags.bandwidth_gib,
                    "buffer of the bandwidth measurement (GiB)");
  bench->add_flag("--json", bench_flags.json, "print JSON");

  std::string model, out, device = "auto";
  CLI::App* exp = app.add_subcommand("export", "write a model as config.json + safetensors");
  exp->add_option("--model", model, "built-in model (tiny-v3, tiny-v2, small) or directory")
      ->required();
  exp->add_option("--out", out, "output directory")->required();

  CLI::App* info = app.add_subcommand("info", "build a model and describe it");
  info->add_option("--model", model, "built-in model (tiny-v3, tiny-v2, small) or directory")
      ->required();
  info->add_option("--device", device, "auto, host, cuda or cuda:N");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mlag: error: %s\n", e.what());
    return mlag::kExitUsage;
  }
  if (run->parsed()) return mlag::RunRun(run_flags);
  if (bench->parsed()) return mlag::RunBench(bench_flags);
  if (graphs->parsed()) return mlag::RunGraphs(graphs_flags, graphs_size, dot_file);
  if (exp->parsed()) return mlag::RunExport(model, out);
  if (info->parsed()) return mlag::RunInfo(model, device);
  return 0;
}
