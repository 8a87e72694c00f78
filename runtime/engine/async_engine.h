// An Engine driven by its own thread, for many concurrent clients (mlag
// serve): clients submit requests from any thread and read their outputs as
// they grow; the engine thread admits them into its continuous batch at the
// next step boundary.
//
// With expert parallelism (ep_ranks >= 2), the engine is a world of host
// thread ranks (EpRank over local communicators): requests go to the ranks in
// turn, and every rank steps in lockstep with the others, idle ones running
// dummy steps, as `mlag run --ep N` does.
//
//   MLAG_ASSIGN_OR_RETURN(auto engine, AsyncEngine::Create(options, 256));
//   MLAG_ASSIGN_OR_RETURN(auto stream, engine->Submit(spec, {"\n\n"}));
//   RequestStream::Update u;
//   while (stream->Wait(&u, absl::Seconds(1)), !u.finished) Send(u.text);
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/engine/engine.h"

namespace mlag {

class Communicator;
class EpRank;

// One request's output as the engine thread produces it.
class RequestStream {
 public:
  // What arrived since the last Wait.
  struct Update {
    std::string text;                                 // whole UTF-8 characters, stop strings cut
    std::vector<int32_t> tokens;                      // the tokens generated since
    std::vector<std::vector<TokenLogprob>> logprobs;  // per token, when asked for
    // Once, with the first token, when prompt_logprobs were asked for: prompt
    // tokens 1.. (Request::prompt_logprobs).
    std::vector<PromptLogprob> prompt_logprobs;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;  // when finished
    absl::Status error;                         // a failed step ends every request
    int prompt_tokens = 0, completion_tokens = 0;
  };

  // Moves what arrived into *out (replacing its contents). Waits up to
  // `timeout` for something when nothing has; returns whether *out carries
  // news (text, tokens or the end). Once finished, every later call reports
  // the end again.
  bool Wait(Update* out, absl::Duration timeout);

  // Asks the engine thread to abort the request (a client went away).
  void Cancel() { cancelled_ = true; }

  // Has `notify` called, on the engine's thread and with no lock held,
  // whenever news arrives from now on (an event loop's wake-up: it should
  // only post a Wait to its own thread). News that arrived before is not
  // announced: call Wait once after setting it.
  void SetListener(std::function<void()> notify);

 private:
  friend class AsyncEngine;
  void Announce();  // after news, outside mu_

  std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;                  // guarded by mu_
  std::function<void()> listener_;  // guarded by mu_
  bool news_ = false;
  std::atomic<bool> cancelled_{false};
};

struct AsyncEngineMetrics {
  int64_t requests_finished = 0, requests_aborted = 0, requests_failed = 0,
          requests_rejected = 0;  // over the pending limit
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t steps = 0;  // lockstep steps (of rank 0 with expert parallelism)
  double step_seconds_sum = 0;
  int64_t running = 0, pending = 0;  // in the engines, and queued for them
  // Summed over the ranks, as of each one's last step.
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t graph_replays = 0;
  int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
  // The memory plans (EngineStats), summed over the ranks.
  int64_t memory_planned_bytes = 0, memory_usable_bytes = 0, memory_allocated_bytes = 0;
};

class AsyncEngine {
 public:
  // Starts the engine thread(s), which create the engine(s) and then step
  // them; returns once every engine is ready, or with the first error. At
  // most `max_pending` requests are in flight (queued or running) at once.
  // `ep_ranks` >= 2: that many expert-parallel host thread ranks.
  static absl::StatusOr<std::unique_ptr<AsyncEngine>> Create(const EngineOptions& options,
                                                             int max_pending, int ep_ranks = 0);
  // Stops the threads; unfinished requests end with an error.
  ~AsyncEngine();

  // Validates `spec` (Engine::ValidateRequest) and queues it. `stop_strings`
  // end the request where its text first contains one (the text stops just
  // before it, reason "stop"). ResourceExhausted when max_pending requests
  // are in flight. Safe from any thread.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(const RequestSpec& spec,
                                                        std::vector<std::string> stop_strings);

  AsyncEngineMetrics metrics() const;
  // Fixed after Create; safe from any thread.
  const ModelConfig& config() const { return front().config(); }
  int max_model_len() const { return front().max_model_len(); }
  // The first rank's memory plan (every rank makes its own).
  const MemoryPlan& memory_plan() const { return front().memory_plan(); }
  absl::StatusOr<const Tokenizer*> tokenizer() const { return front().tokenizer(); }
  const std::string& model_description() const { return front().model_description(); }
  std::string device_name() const;
  int ranks() const { return static_cast<int>(ranks_.size()); }

 private:
  struct Live;  // a request in an engine, with its text state
  struct Submission {
    RequestSpec spec;
    std::vector<std::string> stops;
    std::shared_ptr<RequestStream> stream;
  };
  // One engine and the thread that steps it.
  struct Rank {
    std::unique_ptr<Engine> own_engine;  // without expert parallelism
    // Declared before `ep`, which uses it until destroyed.
    std::unique_ptr<Communicator> world;
    std::unique_ptr<EpRank> ep;  // with it (owns the engine)
    Engine* engine = nullptr;
    std::deque<Submission> queue;                     // guarded by AsyncEngine::mu_
    std::map<RequestId, std::unique_ptr<Live>> live;  // its thread only
    std::thread thread;
    // Its share of the metrics, as of its last step (guarded by mu_).
    EngineStats stats;
    int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
  };

  AsyncEngine() = default;
  const Engine& front() const { return *ranks_.front()->engine; }
  void Loop(Rank& rank);
  // Whether any rank has work (or should stop), agreed over the world: the
  // ranks must take every step together.
  absl::StatusOr<bool> AnyRankBusy(Rank& rank, bool busy);
  // Rank-thread helpers.
  void Admit(Rank& rank);
  void Deliver(Rank& rank, RequestId id, Live& live);
  void Finish(Rank& rank, RequestId id, Live& live, FinishReason reason, const absl::Status& error);
  // Publishes the rank's engine stats to the metrics (after a step, or an
  // abort that left it idle).
  void PublishStats(Rank& rank, bool stepped, double step_seconds);

  std::vector<std::unique_ptr<Rank>> ranks_;
  const Tokenizer* tokenizer_ = nullptr;  // null: outputs carry no text
  int max_pending_ = 0;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  int64_t in_flight_ = 0;       // guarded by mu_
  uint64_t next_rank_ = 0;      // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  AsyncEngineMetrics metrics_;  // guarded by mu_ (the counters)
};

}  // namespace mlag
