// An Engine driven by its own thread, for many concurrent clients (mlag
// serve): clients submit requests from any thread and read their outputs as
// they grow; the engine thread admits them into its continuous batch at the
// next step boundary.
//
//   MLAG_ASSIGN_OR_RETURN(auto engine, AsyncEngine::Create(options, 256));
//   MLAG_ASSIGN_OR_RETURN(auto stream, engine->Submit(spec, {"\n\n"}));
//   RequestStream::Update u;
//   while (stream->Wait(&u, absl::Seconds(1)), !u.finished) Send(u.text);
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
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

// One request's output as the engine thread produces it.
class RequestStream {
 public:
  // What arrived since the last Wait.
  struct Update {
    std::string text;                                 // whole UTF-8 characters, stop strings cut
    std::vector<int32_t> tokens;                      // the tokens generated since
    std::vector<std::vector<TokenLogprob>> logprobs;  // per token, when asked for
    bool finished = false;
    FinishReason reason = FinishReason::kNone;  // when finished
    absl::Status error;                         // a failed step ends every request
    int prompt_tokens = 0, completion_tokens = 0;
  };

  // Moves what arrived into *out (replacing its contents). Waits up to
  // `timeout` for something when nothing has; returns whether *out carries
  // news (text, tokens or the end).
  bool Wait(Update* out, absl::Duration timeout);

  // Asks the engine thread to abort the request (a client went away).
  void Cancel() { cancelled_ = true; }

 private:
  friend class AsyncEngine;
  std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;  // guarded by mu_
  bool news_ = false;
  std::atomic<bool> cancelled_{false};
};

struct AsyncEngineMetrics {
  int64_t requests_finished = 0, requests_aborted = 0, requests_failed = 0,
          requests_rejected = 0;  // over the pending limit
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t steps = 0;
  double step_seconds_sum = 0;
  int64_t running = 0, pending = 0;  // in the engine, and queued for it
  EngineStats engine;                // as of the last step
};

class AsyncEngine {
 public:
  // Creates the engine (Engine::Create) and starts its thread. At most
  // `max_pending` requests are in flight (queued or running) at once.
  static absl::StatusOr<std::unique_ptr<AsyncEngine>> Create(const EngineOptions& options,
                                                             int max_pending);
  // Stops the thread; unfinished requests end with an error.
  ~AsyncEngine();

  // Validates `spec` (Engine::ValidateRequest) and queues it. `stop_strings`
  // end the request where its text first contains one (the text stops just
  // before it, reason "stop"). ResourceExhausted when max_pending requests
  // are in flight. Safe from any thread.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(const RequestSpec& spec,
                                                        std::vector<std::string> stop_strings);

  AsyncEngineMetrics metrics() const;
  // Fixed after Create; safe from any thread.
  const ModelConfig& config() const { return engine_->config(); }
  int max_model_len() const { return engine_->max_model_len(); }
  absl::StatusOr<const Tokenizer*> tokenizer() const { return engine_->tokenizer(); }
  const std::string& model_description() const { return engine_->model_description(); }
  std::string device_name() const { return engine_->device().name(); }

 private:
  struct Live;  // a request in the engine, with its text state
  AsyncEngine() = default;
  void Loop();
  // Engine-thread helpers.
  void Admit();
  void Deliver(RequestId id, Live& live, const StepOutput& out);
  void Finish(RequestId id, Live& live, FinishReason reason, const absl::Status& error);

  std::unique_ptr<Engine> engine_;
  const Tokenizer* tokenizer_ = nullptr;  // null: outputs carry no text
  int max_pending_ = 0;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  struct Submission {
    RequestSpec spec;
    std::vector<std::string> stops;
    std::shared_ptr<RequestStream> stream;
  };
  std::deque<Submission> queue_;                     // guarded by mu_
  int64_t in_flight_ = 0;                            // guarded by mu_
  bool stop_ = false;                                // guarded by mu_
  AsyncEngineMetrics metrics_;                       // guarded by mu_
  std::map<RequestId, std::unique_ptr<Live>> live_;  // engine thread only
  std::thread thread_;
};

}  // namespace mlag
