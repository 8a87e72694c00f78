#include "runtime/engine/async_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace mlag {

struct AsyncEngine::Live {
  std::shared_ptr<RequestStream> stream;
  std::vector<std::string> stops;
  size_t longest_stop = 0;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;  // null without a tokenizer
  std::string text;    // every character so far, held-back ones included
  size_t emitted = 0;  // bytes of `text` handed to the stream
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool stopped = false;  // a stop string ended it
};

bool RequestStream::Wait(Update* out, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return news_; });
  const bool news = news_;
  *out = std::move(pending_);
  pending_ = Update();
  pending_.finished = out->finished;  // the end stays visible to later calls
  pending_.reason = out->reason;
  pending_.error = out->error;
  pending_.prompt_tokens = out->prompt_tokens;
  pending_.completion_tokens = out->completion_tokens;
  news_ = false;
  return news;
}

absl::StatusOr<std::unique_ptr<AsyncEngine>> AsyncEngine::Create(const EngineOptions& options,
                                                                 int max_pending) {
  if (max_pending < 1) return absl::InvalidArgumentError("max_pending must be at least 1");
  std::unique_ptr<AsyncEngine> a(new AsyncEngine());
  MLAG_ASSIGN_OR_RETURN(a->engine_, Engine::Create(options));
  absl::StatusOr<const Tokenizer*> tok = a->engine_->tokenizer();
  if (tok.ok()) {
    a->tokenizer_ = *tok;
  } else if (!absl::IsFailedPrecondition(tok.status())) {
    return tok.status();  // a malformed tokenizer.json (none at all is fine)
  }
  a->max_pending_ = max_pending;
  a->metrics_.engine = a->engine_->Stats();
  a->thread_ = std::thread([raw = a.get()] { raw->Loop(); });
  return a;
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::shared_ptr<RequestStream>> AsyncEngine::Submit(
    const RequestSpec& spec, std::vector<std::string> stop_strings) {
  MLAG_RETURN_IF_ERROR(engine_->ValidateRequest(spec));  // reads only fixed limits
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("the engine is shutting down");
    if (in_flight_ >= max_pending_) {
      ++metrics_.requests_rejected;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server has ", in_flight_, " requests in flight, its limit; retry later"));
    }
    ++in_flight_;
    ++metrics_.pending;
    queue_.push_back({spec, std::move(stop_strings), stream});
  }
  wake_.notify_all();
  return stream;
}

AsyncEngineMetrics AsyncEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

void AsyncEngine::Admit() {
  std::deque<Submission> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
    metrics_.pending = 0;
  }
  for (Submission& s : batch) {
    auto live = std::make_unique<Live>();
    live->stream = s.stream;
    live->stops = std::move(s.stops);
    for (const std::string& stop : live->stops) {
      live->longest_stop = std::max(live->longest_stop, stop.size());
    }
    if (tokenizer_ != nullptr) {
      live->detokenizer = std::make_unique<IncrementalDetokenizer>(tokenizer_, true);
    }
    live->prompt_tokens = static_cast<int>(s.spec.prompt.size());
    absl::StatusOr<RequestId> id = engine_->AddRequest(s.spec);
    if (!id.ok()) {
      Finish(-1, *live, FinishReason::kNone, id.status());
      continue;
    }
    live_[*id] = std::move(live);
  }
}

// Hands the stream its new token and the text that can be shown: all of it,
// less the last longest_stop - 1 bytes while a stop string could still
// begin there (cut back to a character boundary).
void AsyncEngine::Deliver(RequestId id, Live& live, const StepOutput& out) {
  (void)out;
  const Request* r = engine_->request(id);
  const int32_t token = r->tokens.back();
  ++live.completion_tokens;
  size_t show = live.emitted;
  if (live.detokenizer != nullptr) {
    live.text += live.detokenizer->Push(token);
    const size_t search_from =
        live.emitted >= live.longest_stop ? live.emitted - live.longest_stop : 0;
    const size_t at = FindStopString(live.text, live.stops, search_from);
    if (at != absl::string_view::npos) {
      live.stopped = true;
      show = at;
    } else {
      const size_t hold = live.longest_stop > 0 ? live.longest_stop - 1 : 0;
      show = live.text.size() > hold ? live.text.size() - hold : 0;
      while (show > live.emitted && show < live.text.size() &&
             (static_cast<unsigned char>(live.text[show]) & 0xC0) == 0x80) {
        --show;  // not inside a character
      }
    }
  }
  RequestStream& s = *live.stream;
  {
    std::lock_guard<std::mutex> lock(s.mu_);
    if (show > live.emitted) s.pending_.text.append(live.text, live.emitted, show - live.emitted);
    s.pending_.tokens.push_back(token);
    if (r->spec.sampling.logprobs > 0 && !r->logprobs.empty()) {
      s.pending_.logprobs.push_back(r->logprobs.back());
    }
    s.pending_.prompt_tokens = live.prompt_tokens;
    s.pending_.completion_tokens = live.completion_tokens;
    s.news_ = true;
  }
  live.emitted = std::max(live.emitted, show);
  s.cv_.notify_all();
}

void AsyncEngine::Finish(RequestId id, Live& live, FinishReason reason, const absl::Status& error) {
  RequestStream& s = *live.stream;
  {
    std::lock_guard<std::mutex> lock(s.mu_);
    if (!live.stopped && error.ok() && live.detokenizer != nullptr) {
      live.text += live.detokenizer->Finish();
      if (live.text.size() > live.emitted) s.pending_.text.append(live.text, live.emitted);
      live.emitted = live.text.size();
    }
    s.pending_.finished = true;
    s.pending_.reason = live.stopped ? FinishReason::kStop : reason;
    s.pending_.error = error;
    s.pending_.prompt_tokens = live.prompt_tokens;
    s.pending_.completion_tokens = live.completion_tokens;
    s.news_ = true;
  }
  s.cv_.notify_all();
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  if (!error.ok()) {
    ++metrics_.requests_failed;
  } else if (reason == FinishReason::kAbort && !live.stopped) {
    ++metrics_.requests_aborted;
  } else {
    ++metrics_.requests_finished;
  }
  metrics_.prompt_tokens += live.prompt_tokens;
  metrics_.generation_tokens += live.completion_tokens;
  if (id >= 0) engine_->Release(id).IgnoreError();  // finished by now: cannot fail
}

void AsyncEngine::Loop() {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return stop_ || !queue_.empty() || engine_->HasUnfinished(); });
      if (stop_) break;
    }
    Admit();
    // Clients that went away, and requests a stop string ended.
    for (auto it = live_.begin(); it != live_.end();) {
      Live& live = *it->second;
      if (live.stream->cancelled_ || live.stopped) {
        engine_->Abort(it->first).IgnoreError();  // it is in the engine: cannot fail
        Finish(it->first, live, FinishReason::kAbort, absl::OkStatus());
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    if (!engine_->HasUnfinished()) continue;
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepOutput> out = engine_->Step();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!out.ok()) {
      // The engine's state is unknown after a failed step: end everything.
      for (auto& [id, live] : live_) {
        engine_->Abort(id).IgnoreError();
        Finish(id, *live, FinishReason::kNone,
               absl::Status(out.status().code(),
                            absl::StrCat("step failed: ", out.status().message())));
      }
      live_.clear();
      continue;
    }
    for (const auto& [id, token] : out->new_tokens) {
      (void)token;
      auto it = live_.find(id);
      if (it != live_.end()) Deliver(id, *it->second, *out);
    }
    for (RequestId id : out->finished) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      const Request* r = engine_->request(id);
      Finish(id, *it->second, r != nullptr ? r->finish_reason : FinishReason::kNone,
             absl::OkStatus());
      live_.erase(it);
    }
    // Requests a stop string ended this step leave before the next one.
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->second->stopped) {
        engine_->Abort(it->first).IgnoreError();
        Finish(it->first, *it->second, FinishReason::kStop, absl::OkStatus());
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.steps;
    metrics_.step_seconds_sum += seconds;
    metrics_.running = static_cast<int64_t>(live_.size());
    metrics_.engine = engine_->Stats();
  }
  for (auto& [id, live] : live_) {
    engine_->Abort(id).IgnoreError();
    Finish(id, *live, FinishReason::kNone, absl::UnavailableError("the engine shut down"));
  }
  live_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Submission& s : queue_) {
    Live live;
    live.stream = s.stream;
    // Finish locks mu_: done below without it.
    std::lock_guard<std::mutex> slock(s.stream->mu_);
    s.stream->pending_.finished = true;
    s.stream->pending_.error = absl::UnavailableError("the engine shut down");
    s.stream->news_ = true;
    s.stream->cv_.notify_all();
  }
  queue_.clear();
}

}  // namespace mlag
