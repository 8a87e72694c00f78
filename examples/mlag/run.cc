// mlag run: serve a batch of requests (synthetic prompts or a prompts file)
// on one engine or an expert-parallel world, and print the run report.
//
//   mlag run --model M [--num-requests N --prompt-len L --shared-prefix-len P --seed S
//                       | --prompts FILE] --max-tokens T [engine, sampling, --ep flags] [--json]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "examples/mlag/cli.h"
#include "examples/mlag/run_report.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/core/file.h"
#include "runtime/core/status.h"
#include "runtime/engine/expert_parallel.h"
#include "runtime/engine/model_tokenizer.h"

namespace mlag::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct RunFlags {
  CLI::App* app = nullptr;
  // Whether `flag` was given on the command line.
  bool given(const char* flag) const { return app->count(flag) > 0; }
  EngineFlags engine;
  int num_requests = 8;
  int prompt_len = 32;
  int shared_prefix_len = 0;
  uint64_t seed = 0;
  std::string prompts_file;
  std::vector<std::string> prompt_texts;  // --prompt, one request each
  std::string prompts_text_file;          // --prompts-text: one prompt per line
  bool chat = false;                      // text prompts as a user's chat message
  int max_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  int logprobs = 0;
  std::vector<int> stop_tokens;
  bool json = false;
  int ep = 0;  // expert-parallel ranks; 0 = off
  std::string ep_backend = "local";
  std::vector<std::string> reconfigure_at;
  double ep_timeout_seconds = 60.0;
  double ep_startup_timeout_seconds = 600.0;
  std::vector<std::string> ep_faults;  // testing aid: fail:RANK:STEP or hang:RANK:STEP:SECONDS
};

// The most expert-parallel ranks (each builds an engine: thread ranks share
// this machine's memory).
constexpr int kMaxEpRanks = 1024;

// The most requests one run makes or reads (every one is held in memory).
constexpr int kMaxRequests = 1 << 20;

// Bytes of a bad word an error message quotes.
constexpr size_t kMaxQuotedBytes = 40;

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadPromptsFile(const std::string& path) {
  MLAG_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<std::vector<int32_t>> prompts;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    std::vector<int32_t> ids;
    for (absl::string_view word :
         absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(word, &id)) {
        // At most 40 bytes of the word, control characters escaped: the
        // message stays one readable line whatever the file holds.
        const bool cut = word.size() > kMaxQuotedBytes;
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", line_no, ": '", absl::CHexEscape(word.substr(0, kMaxQuotedBytes)),
            cut ? "...'" : "'", " is not a token id"));
      }
      ids.push_back(id);
    }
    if (!ids.empty()) prompts.push_back(std::move(ids));  // blank lines separate nothing
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

// Request i: its prompt and the run's sampling, with a seed of its own so
// its tokens do not depend on which requests share its steps.
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

// One engine in this process, stepped to completion with a progress bar on
// a terminal.
absl::Status RunSingle(const RunFlags& f, const EngineOptions& options,
                       const std::vector<RequestSpec>& specs, RunReport* report) {
  const auto t_start = Clock::now();
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  report->create_seconds = SecondsSince(t_start);  // engine ready
  std::vector<RequestId> ids;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<RequestId> id = engine->AddRequest(specs[i]);
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat("request ", i, ": ", id.status().message()));
    }
    ids.push_back(*id);
  }
  const bool progress = !f.json && isatty(STDERR_FILENO);
  const auto t_run = Clock::now();
  int64_t tokens_out = 0;
  while (engine->HasUnfinished()) {
    const auto t0 = Clock::now();
    absl::StatusOr<StepOutput> out = engine->Step();
    if (!out.ok())
      return absl::Status(out.status().code(),
                          absl::StrCat("step failed: ", out.status().message()));
    report->step_ms.push_back(1e3 * SecondsSince(t0));
    if (tokens_out == 0 && !out->new_tokens.empty()) {
      report->first_token_seconds = SecondsSince(t_start);
    }
    tokens_out += static_cast<int64_t>(out->new_tokens.size());
    if (progress) {
      int done = 0;
      for (RequestId id : ids) done += engine->request(id)->finished() ? 1 : 0;
      const int width = 30, filled = static_cast<int>(width * done / ids.size());
      std::fprintf(stderr, "\r[%s%s] %d/%zu requests, %lld tokens",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                   ids.size(), static_cast<long long>(tokens_out));
    }
  }
  report->run_seconds = SecondsSince(t_run);
  if (progress) std::fprintf(stderr, "\n");

  const EngineStats stats = engine->Stats();
  for (RequestId id : ids) report->requests.push_back(ResultOf(*engine->request(id)));
  report->model = engine->model_description();
  report->device =
      absl::StrCat(engine->device().name(), " (", engine->device().selection_reason(), ")");
  report->tokens_out = tokens_out;
  report->steps = report->engine_steps = stats.steps;
  report->eager_steps = stats.eager_steps;
  report->dummy_steps = stats.dummy_steps;
  report->preemptions = stats.preemptions;
  report->overlapped_steps = stats.overlapped_steps;
  report->fed_tokens = stats.fed_tokens;
  report->graph_replays = stats.graph_replays;
  report->prefix_cache_hit_rate = stats.prefix_cache_hit_rate;
  report->capture_seconds = stats.capture_seconds;
  report->open_model_seconds = stats.open_model_seconds;
  report->build_model_seconds = stats.build_model_seconds;
  report->kv_pool_seconds = stats.kv_pool_seconds;
  report->warmup_seconds = stats.warmup_seconds;
  report->has_startup = true;
  report->num_graphs = stats.num_graphs;
  report->kv_blocks_total = stats.kv_blocks_total;
  report->kv_blocks_used = stats.kv_blocks_used;
  report->kv_block_size = stats.kv_block_size;
  report->kv_bytes_per_token = stats.kv_bytes_per_token;
  report->has_memory_plan = true;
  report->memory_plan = engine->memory_plan();
  report->memory_allocated_bytes = stats.memory_allocated_bytes;
  return absl::OkStatus();
}

// The requests spread over f.ep expert-parallel ranks: thread ranks (local
// on the host, nccl on GPUs) or mpirun processes (mpi). Only rank 0 prints.
absl::Status RunExpertParallelRanks(const RunFlags& f, const EngineOptions& options,
                                    const std::vector<RequestSpec>& specs, RunReport* report,
                                    bool* prints) {
  EpOptions ep;
  ep.world = f.ep;
  ep.peer_timeout = absl::Seconds(f.ep_timeout_seconds);
  ep.startup_timeout = absl::Seconds(f.ep_startup_timeout_seconds);
  for (const std::string& text : f.reconfigure_at) {
    MLAG_ASSIGN_OR_RETURN(ReconfigureAt r, ParseReconfigureAt(text));
    if (r.size > f.ep) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reconfigure-at ", text, ": size ", r.size, " exceeds --ep ", f.ep));
    }
    ep.reconfigure.push_back(r);
  }
  std::stable_sort(ep.reconfigure.begin(), ep.reconfigure.end(),
                   [](const ReconfigureAt& a, const ReconfigureAt& b) { return a.step < b.step; });
  for (const std::string& text : f.ep_faults) {
    MLAG_ASSIGN_OR_RETURN(EpFault fault, ParseEpFault(text));
    ep.faults.push_back(fault);
  }
  MLAG_ASSIGN_OR_RETURN(EpBackend backend, ParseEpBackend(f.ep_backend));
  const auto t0 = Clock::now();
  int rank = 0;
  absl::StatusOr<EpRunResult> result = RunExpertParallel(options, ep, backend, specs, &rank);
  *prints = rank == 0;
  MLAG_RETURN_IF_ERROR(result.status());
  report->run_seconds = SecondsSince(t0);
  AddExpertParallelResult(*result, report);
  report->ep = f.ep;
  report->ep_backend = f.ep_backend;
  return absl::OkStatus();
}

int Run(const RunFlags& f) {
  absl::StatusOr<EngineOptions> options = f.engine.ToOptions();
  if (!options.ok()) return Fail(options.status());
  if (f.shared_prefix_len > f.prompt_len) {
    return Fail(absl::InvalidArgumentError("--shared-prefix-len must be in [0, --prompt-len]"));
  }
  // Flags that would have no effect are errors, not silently ignored.
  if (f.ep == 0) {
    for (const char* flag : {"--ep-backend", "--reconfigure-at", "--ep-timeout",
                             "--ep-startup-timeout", "--ep-fault"}) {
      if (f.given(flag)) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(flag, " needs --ep N")));
      }
    }
  }
  if (f.ep > 0 && options->step_overlap == "on") {
    return Fail(absl::InvalidArgumentError(
        "--step-overlap on is not available with --ep (the ranks agree on each step's shape "
        "before launching it)"));
  }
  if (!f.prompts_file.empty()) {
    for (const char* flag : {"--num-requests", "--prompt-len", "--shared-prefix-len"}) {
      if (f.given(flag)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat(flag, " has no effect with --prompts (the file gives the prompts)")));
      }
    }
  }
  const bool text = !f.prompt_texts.empty() || !f.prompts_text_file.empty();
  int sources = (f.prompts_file.empty() ? 0 : 1) + (f.prompt_texts.empty() ? 0 : 1) +
                (f.prompts_text_file.empty() ? 0 : 1);
  if (sources > 1) {
    return Fail(absl::InvalidArgumentError(
        "--prompts, --prompt and --prompts-text are alternatives: give one"));
  }
  if (text) {
    for (const char* flag : {"--num-requests", "--prompt-len", "--shared-prefix-len"}) {
      if (f.given(flag)) {
        return Fail(
            absl::InvalidArgumentError(absl::StrCat(flag, " has no effect with text prompts")));
      }
    }
  } else if (f.chat) {
    return Fail(absl::InvalidArgumentError("--chat needs --prompt or --prompts-text"));
  }
  std::vector<std::vector<int32_t>> prompts;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> prompt_texts;
  if (text) {
    absl::StatusOr<ModelSource> source = OpenModel(options->model);
    if (!source.ok()) return Fail(source.status());
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        OpenModelTokenizer(options->model, source->config);
    if (!tok.ok()) {
      if (absl::IsNotFound(tok.status())) {
        return Fail(absl::FailedPreconditionError(absl::StrCat(
            "model ", options->model, " has no tokenizer.json: text prompts need one")));
      }
      return Fail(tok.status());
    }
    tokenizer = *std::move(tok);
    if (options->chat_format != "auto") {
      tokenizer->set_chat_format(*ParseChatFormat(options->chat_format));
    }
    prompt_texts = f.prompt_texts;
    if (!f.prompts_text_file.empty()) {
      absl::StatusOr<std::string> file = ReadFile(f.prompts_text_file);
      if (!file.ok()) return Fail(file.status());
      for (absl::string_view line : absl::StrSplit(*file, '\n', absl::SkipEmpty())) {
        prompt_texts.emplace_back(absl::StripSuffix(line, "\r"));
      }
      if (prompt_texts.empty()) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(f.prompts_text_file, ": no prompts")));
      }
      if (prompt_texts.size() > static_cast<size_t>(kMaxRequests)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat(f.prompts_text_file, ": more than ", kMaxRequests, " prompts")));
      }
    }
    for (size_t i = 0; i < prompt_texts.size(); ++i) {
      std::string formatted = prompt_texts[i];
      bool add_bos = tokenizer->add_bos();
      if (f.chat) {
        absl::StatusOr<std::string> chat =
            tokenizer->FormatChat({ChatMessage{"user", prompt_texts[i]}}, true);
        if (!chat.ok()) return Fail(chat.status());
        formatted = *std::move(chat);
        add_bos = false;  // the format starts with the bos token's text
      }
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(formatted, add_bos);
      if (!ids.ok()) {
        return Fail(absl::Status(ids.status().code(),
                                 absl::StrCat("prompt ", i + 1, ": ", ids.status().message())));
      }
      if (ids->empty()) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("prompt ", i + 1, " is empty")));
      }
      prompts.push_back(*std::move(ids));
    }
  } else if (!f.prompts_file.empty()) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> read = ReadPromptsFile(f.prompts_file);
    if (!read.ok()) return Fail(read.status());
    prompts = std::move(*read);
  } else {
    absl::StatusOr<ModelSource> source = OpenModel(options->model);
    if (!source.ok()) return Fail(source.status());
    // Checked before the prompts are made: a prompt longer than any sequence
    // the model takes would only be refused after generating all of them.
    const int max_len = source->config.max_position_embeddings;
    if (f.prompt_len >= max_len) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--prompt-len ", f.prompt_len, " leaves no room to generate within the model's ",
          "max_position_embeddings ", max_len)));
    }
    prompts = SyntheticPrompts(f, source->config.vocab_size);
  }
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < prompts.size(); ++i) specs.push_back(MakeSpec(f, prompts[i], i));

  RunReport report;
  report.with_logprobs = f.logprobs > 0;
  report.graph_mode = std::string(GraphModeName(options->graph_mode));
  for (const auto& p : prompts) report.tokens_in += static_cast<int64_t>(p.size());
  bool prints = true;
  const auto t_create = Clock::now();
  absl::Status ran = f.ep > 0 ? RunExpertParallelRanks(f, *options, specs, &report, &prints)
                              : RunSingle(f, *options, specs, &report);
  if (!ran.ok()) return Fail(ran);
  // Expert-parallel ranks build their engines inside the run: what is not
  // the run is their start-up. A single engine measured its own.
  if (!report.has_startup) report.create_seconds = SecondsSince(t_create) - report.run_seconds;
  if (tokenizer != nullptr) {
    report.prompt_text = prompt_texts;
    for (const RequestResult& r : report.requests) {
      report.output_text.push_back(tokenizer->Decode(r.output_tokens, /*skip_special=*/true));
    }
  }
  if (report.model.empty()) {
    absl::StatusOr<ModelSource> source = OpenModel(options->model);
    report.model = source.ok() ? source->description : options->model;
  }
  if (prints) PrintRunReport(report, f.json);
  return 0;
}

}  // namespace

Command AddRunCommand(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "serve a batch of requests and print the outputs");
  f->engine.Register(run);
  run->add_option("--num-requests", f->num_requests, "synthetic requests")
      ->check(CLI::Range(1, kMaxRequests));
  run->add_option("--prompt-len", f->prompt_len, "tokens per synthetic prompt")->check(AtLeast(1));
  run->add_option("--shared-prefix-len", f->shared_prefix_len,
                  "leading tokens shared by every synthetic prompt")
      ->check(AtLeast(0));
  run->add_option("--seed", f->seed, "seed of the synthetic prompts and of sampling")
      ->check(Uint64());
  run->add_option("--prompts", f->prompts_file,
                  "file with one request per line: token ids separated by spaces");
  run->add_option("--prompt", f->prompt_texts,
                  "a text prompt, encoded by the model's tokenizer (repeatable: a request each)");
  run->add_option("--prompts-text", f->prompts_text_file,
                  "file with one text prompt per line, encoded by the model's tokenizer");
  run->add_flag("--chat", f->chat,
                "send each text prompt as a user's message in the model's chat format");
  run->add_option("--max-tokens", f->max_tokens, "tokens to generate per request")
      ->check(AtLeast(1));
  run->add_option("--temperature", f->temperature, "0 = greedy")->check(FiniteAtLeast(0));
  run->add_option("--top-k", f->top_k, "0 = off")->check(AtLeast(0));
  run->add_option("--top-p", f->top_p, "1 = off")->check(UnitInterval());
  run->add_option("--logprobs", f->logprobs, "top-K log-probabilities per token (JSON)")
      ->check(AtLeast(0));
  run->add_option("--stop-token", f->stop_tokens, "stop at this token id (repeatable)");
  run->add_flag("--json", f->json, "print one JSON object");
  run->add_option("--ep", f->ep, "expert-parallel ranks (0: off)")
      ->check(CLI::Range(0, kMaxEpRanks));
  run->add_option("--ep-backend", f->ep_backend,
                  "local (host thread ranks), nccl (a thread rank per GPU) or mpi (mpirun "
                  "processes; NCCL for data on GPUs)")
      ->check(CLI::IsMember({"local", "nccl", "mpi"}));
  run->add_option("--reconfigure-at", f->reconfigure_at,
                  "STEP:SIZE: reconfigure the expert-parallel group before STEP (repeatable)");
  run->add_option("--ep-timeout", f->ep_timeout_seconds,
                  "seconds a rank waits for its peers before it calls one dead or hung")
      ->check(CLI::Range(0.001, 86400.0));
  run->add_option("--ep-startup-timeout", f->ep_startup_timeout_seconds,
                  "seconds a rank that has loaded its model waits for the others to load theirs")
      ->check(CLI::Range(0.001, 86400.0));
  run->add_option("--ep-fault", f->ep_faults,
                  "testing aid: fail:RANK:STEP or hang:RANK:STEP:SECONDS (repeatable)");
  f->app = run;
  return {run, [f] { return Run(*f); }};
}

}  // namespace mlag::cli
