#include "runtime/engine/async_engine.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/local_communicator.h"
#include "kernels/host/thread_pool.h"
#include "runtime/core/status.h"
#include "runtime/engine/expert_parallel.h"

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
  bool prompt_logprobs_sent = false;
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

void RequestStream::SetListener(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(notify);
}

void RequestStream::Announce() {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify = listener_;
  }
  if (notify) notify();
}

absl::StatusOr<std::unique_ptr<AsyncEngine>> AsyncEngine::Create(const EngineOptions& options,
                                                                 int max_pending, int ep_ranks) {
  if (max_pending < 1) return absl::InvalidArgumentError("max_pending must be at least 1");
  if (ep_ranks < 0 || ep_ranks > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert-parallel ranks must be in [0, 1024], got ", ep_ranks));
  }
  std::unique_ptr<AsyncEngine> a(new AsyncEngine());
  a->max_pending_ = max_pending;
  const int n = std::max(1, ep_ranks);
  EngineOptions o = options;
  EpOptions ep;
  std::vector<std::unique_ptr<Communicator>> worlds;
  if (n > 1) {
    if (o.device != "auto" && o.device != "host") {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert parallelism in one process runs its ranks on the host, not on ", o.device));
    }
    o.device = "host";
    ep.world = n;
    worlds = LocalCommunicator::CreateGroup(n, ep.peer_timeout);
  }
  for (int r = 0; r < n; ++r) {
    a->ranks_.push_back(std::make_unique<Rank>());
    if (n > 1) a->ranks_.back()->world = std::move(worlds[r]);
  }
  // Each engine is built on the thread that then steps it: a CUDA device is
  // current on the thread that made it, and the ranks of an expert-parallel
  // world capture their graphs in lockstep.
  std::vector<std::promise<absl::Status>> ready(n);
  const int threads_per_rank = std::max(1, host::NumThreads() / n);
  for (int r = 0; r < n; ++r) {
    Rank* rank = a->ranks_[r].get();
    std::promise<absl::Status>* promise = &ready[r];
    rank->thread = std::thread([raw = a.get(), rank, promise, o, ep, n, threads_per_rank] {
      absl::Status status = [&]() -> absl::Status {
        if (n > 1) {
          host::SetNumThreads(threads_per_rank);  // the ranks share the cores
          MLAG_ASSIGN_OR_RETURN(rank->ep, EpRank::Create(rank->world.get(), o, ep));
          rank->engine = &rank->ep->engine();
        } else {
          MLAG_ASSIGN_OR_RETURN(rank->own_engine, Engine::Create(o));
          rank->engine = rank->own_engine.get();
        }
        // The plan and the KV pool are in the metrics before the first step.
        const EngineStats stats = rank->engine->Stats();
        std::lock_guard<std::mutex> lock(raw->mu_);
        rank->stats = stats;
        return absl::OkStatus();
      }();
      const bool ok = status.ok();
      promise->set_value(std::move(status));
      if (ok) raw->Loop(*rank);
    });
  }
  absl::Status status;
  for (auto& p : ready) {
    absl::Status s = p.get_future().get();
    if (status.ok() && !s.ok()) status = s;
  }
  if (!status.ok()) {
    // Ranks that did start stop at their first agreement (stop_ is set).
    {
      std::lock_guard<std::mutex> lock(a->mu_);
      a->stop_ = true;
    }
    for (auto& rank : a->ranks_) {
      if (rank->world != nullptr) rank->world->Abort(status);
    }
    return status;  // the destructor joins the threads
  }
  absl::StatusOr<const Tokenizer*> tok = a->front().tokenizer();
  if (tok.ok()) {
    a->tokenizer_ = *tok;
  } else if (!absl::IsFailedPrecondition(tok.status())) {
    return tok.status();  // a malformed tokenizer.json (none at all is fine)
  }
  return a;
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& rank : ranks_) {
    if (rank->thread.joinable()) rank->thread.join();
  }
}

std::string AsyncEngine::device_name() const {
  std::string name = ranks_.front()->engine->device().name();
  if (ranks_.size() > 1) absl::StrAppend(&name, ", ", ranks_.size(), " expert-parallel ranks");
  return name;
}

absl::StatusOr<std::shared_ptr<RequestStream>> AsyncEngine::Submit(
    const RequestSpec& spec, std::vector<std::string> stop_strings) {
  MLAG_RETURN_IF_ERROR(front().ValidateRequest(spec));  // reads only fixed limits
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
    Rank& rank = *ranks_[next_rank_++ % ranks_.size()];
    rank.queue.push_back({spec, std::move(stop_strings), stream});
  }
  wake_.notify_all();
  return stream;
}

AsyncEngineMetrics AsyncEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  AsyncEngineMetrics m = metrics_;
  m.running = in_flight_ - metrics_.pending;  // as of now, not of the last step
  m.kv_blocks_used = m.kv_blocks_total = m.graph_replays = 0;
  m.prefix_hit_tokens = m.prefix_queried_tokens = 0;
  m.memory_planned_bytes = m.memory_usable_bytes = m.memory_allocated_bytes = 0;
  for (const auto& rank : ranks_) {
    m.memory_planned_bytes += static_cast<int64_t>(rank->stats.memory_planned_bytes);
    m.memory_usable_bytes += static_cast<int64_t>(rank->stats.memory_usable_bytes);
    m.memory_allocated_bytes += static_cast<int64_t>(rank->stats.memory_allocated_bytes);
    m.kv_blocks_used += rank->stats.kv_blocks_used;
    m.kv_blocks_total += rank->stats.kv_blocks_total;
    for (const auto& [size, count] : rank->stats.graph_replays) m.graph_replays += count;
    m.prefix_hit_tokens += rank->prefix_hit_tokens;
    m.prefix_queried_tokens += rank->prefix_queried_tokens;
  }
  return m;
}

void AsyncEngine::Admit(Rank& rank) {
  std::deque<Submission> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(rank.queue);
    metrics_.pending -= static_cast<int64_t>(batch.size());
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
    absl::StatusOr<RequestId> id = rank.engine->AddRequest(s.spec);
    if (!id.ok()) {
      Finish(rank, -1, *live, FinishReason::kNone, id.status());
      continue;
    }
    rank.live[*id] = std::move(live);
  }
}

// Hands the stream its new token and the text that can be shown: all of it,
// less the last longest_stop - 1 bytes while a stop string could still
// begin there (cut back to a character boundary).
void AsyncEngine::Deliver(Rank& rank, RequestId id, Live& live) {
  const Request* r = rank.engine->request(id);
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
    if (r->spec.sampling.prompt_logprobs >= 0 && !live.prompt_logprobs_sent) {
      s.pending_.prompt_logprobs = r->prompt_logprobs;  // complete: the prompt is computed
      live.prompt_logprobs_sent = true;
    }
    if (r->spec.sampling.logprobs > 0 && !r->logprobs.empty()) {
      s.pending_.logprobs.push_back(r->logprobs.back());
    }
    s.pending_.prompt_tokens = live.prompt_tokens;
    s.pending_.completion_tokens = live.completion_tokens;
    s.news_ = true;
  }
  live.emitted = std::max(live.emitted, show);
  s.cv_.notify_all();
  s.Announce();
}

void AsyncEngine::Finish(Rank& rank, RequestId id, Live& live, FinishReason reason,
                         const absl::Status& error) {
  if (id >= 0) rank.engine->Release(id).IgnoreError();  // finished by now: cannot fail
  // The request leaves the in-flight count before its client hears of the
  // end: a client that then submits at once must find the room.
  {
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
  }
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
  s.Announce();
}

void AsyncEngine::PublishStats(Rank& rank, bool stepped, double step_seconds) {
  const EngineStats stats = rank.engine->Stats();
  std::lock_guard<std::mutex> lock(mu_);
  rank.stats = stats;
  rank.prefix_hit_tokens = rank.engine->kv_cache().hit_tokens();
  rank.prefix_queried_tokens = rank.engine->kv_cache().queried_tokens();
  if (stepped && &rank == ranks_.front().get()) {
    ++metrics_.steps;
    metrics_.step_seconds_sum += step_seconds;
  }
  metrics_.running = in_flight_ - metrics_.pending;
}

absl::StatusOr<bool> AsyncEngine::AnyRankBusy(Rank& rank, bool busy) {
  bool stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop = stop_;
  }
  const int64_t mine = stop ? 2 : busy ? 1 : 0;
  if (rank.world == nullptr) {
    if (stop) return absl::CancelledError("stopping");
    return busy;
  }
  MLAG_ASSIGN_OR_RETURN(int64_t all, rank.world->AllReduceScalar(mine, ReduceOp::kMax));
  if (all == 2) return absl::CancelledError("stopping");
  return all == 1;
}

void AsyncEngine::Loop(Rank& rank) {
  using Clock = std::chrono::steady_clock;
  Engine& engine = *rank.engine;
  const bool lockstep = rank.world != nullptr;
  absl::Status ended = absl::UnavailableError("the engine shut down");
  for (;;) {
    {
      // Idle: wait for work. Expert-parallel ranks wait briefly and then
      // agree again, so a request on any rank starts the next step soon.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(lockstep ? 2 : 50),
                     [&] { return stop_ || !rank.queue.empty() || engine.HasUnfinished(); });
    }
    Admit(rank);
    // Clients that went away.
    bool aborted = false;
    for (auto it = rank.live.begin(); it != rank.live.end();) {
      if (it->second->stream->cancelled_) {
        engine.Abort(it->first).IgnoreError();  // it is in the engine: cannot fail
        Finish(rank, it->first, *it->second, FinishReason::kAbort, absl::OkStatus());
        it = rank.live.erase(it);
        aborted = true;
      } else {
        ++it;
      }
    }
    // An abort that leaves the engine idle takes no step: the gauges
    // (running requests, KV blocks in use) must not wait for the next one.
    if (aborted) PublishStats(rank, /*stepped=*/false, 0);
    absl::StatusOr<bool> busy = AnyRankBusy(rank, engine.HasUnfinished());
    if (!busy.ok()) {
      if (!absl::IsCancelled(busy.status())) ended = busy.status();
      break;
    }
    if (!*busy) continue;
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepOutput> out = engine.Step();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!out.ok()) {
      // The engine's state is unknown after a failed step (and a peer's
      // collectives may be broken): end everything.
      ended =
          absl::Status(out.status().code(), absl::StrCat("step failed: ", out.status().message()));
      if (rank.world != nullptr) rank.world->Abort(ended);
      break;
    }
    for (const auto& [id, token] : out->new_tokens) {
      (void)token;
      auto it = rank.live.find(id);
      if (it != rank.live.end()) Deliver(rank, id, *it->second);
    }
    for (RequestId id : out->finished) {
      auto it = rank.live.find(id);
      if (it == rank.live.end()) continue;
      const Request* r = engine.request(id);
      Finish(rank, id, *it->second, r != nullptr ? r->finish_reason : FinishReason::kNone,
             absl::OkStatus());
      rank.live.erase(it);
    }
    // Requests a stop string ended this step leave before the next one.
    for (auto it = rank.live.begin(); it != rank.live.end();) {
      if (it->second->stopped) {
        engine.Abort(it->first).IgnoreError();
        Finish(rank, it->first, *it->second, FinishReason::kStop, absl::OkStatus());
        it = rank.live.erase(it);
      } else {
        ++it;
      }
    }
    PublishStats(rank, /*stepped=*/true, seconds);
  }
  for (auto& [id, live] : rank.live) {
    engine.Abort(id).IgnoreError();
    Finish(rank, id, *live, FinishReason::kNone, ended);
  }
  rank.live.clear();
  // Whatever was still queued for this rank ends the same way.
  std::deque<Submission> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(rank.queue);
    metrics_.pending -= static_cast<int64_t>(left.size());
  }
  for (Submission& s : left) {
    Live live;
    live.stream = s.stream;
    live.prompt_tokens = static_cast<int>(s.spec.prompt.size());
    Finish(rank, -1, live, FinishReason::kNone, ended);
  }
}

}  // namespace mlag
