#include "runtime/engine/scheduler.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace mlag {

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAbort:
      return "abort";
  }
  return "";
}

std::vector<LogitAdjustment> LogitAdjustments(const SamplingParams& sampling,
                                              absl::Span<const int32_t> generated) {
  // Token -> (bias, count), in token order.
  std::map<int32_t, std::pair<double, int64_t>> per_token;
  for (const LogitAdjustment& b : sampling.logit_bias) per_token[b.token].first = b.delta;
  if (sampling.has_penalties()) {
    for (int32_t t : generated) ++per_token[t].second;
  }
  std::vector<LogitAdjustment> out;
  out.reserve(per_token.size());
  for (const auto& [token, bc] : per_token) {
    const auto [bias, count] = bc;
    const double delta = bias - double{sampling.presence_penalty} * (count > 0 ? 1 : 0) -
                         double{sampling.frequency_penalty} * static_cast<double>(count);
    if (delta != 0.0) out.push_back({token, static_cast<float>(delta)});
  }
  return out;
}

void Scheduler::Add(Request* request) {
  request->state = RequestState::kWaiting;
  waiting_.push_back(request);
}

void Scheduler::Preempt(Request* victim) {
  kv_->Free(victim->id);
  victim->num_computed_tokens = 0;
  victim->state = RequestState::kWaiting;
  ++victim->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  waiting_.push_front(victim);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // Running requests: decodes first, then unfinished prefills, each group in
  // admission order.
  // A request's tokens include its pending one. One with a pending token the
  // device could not check against its stop tokens sits out. (One that its
  // pending token ends by length has left already: RetireEndingByLength.)
  auto total = [](const Request* r) { return r->num_tokens() + r->num_pending_tokens; };
  auto runnable = [&](const Request* r) {
    return r->num_pending_tokens == 0 ||
           static_cast<int>(r->spec.stop_token_ids.size()) <= config_.max_fed_stop_ids;
  };
  std::vector<Request*> order;
  for (Request* r : running_) {
    if (runnable(r) && total(r) - r->num_computed_tokens == 1) order.push_back(r);
  }
  for (Request* r : running_) {
    if (runnable(r) && total(r) - r->num_computed_tokens > 1) order.push_back(r);
  }
  std::vector<Request*> scheduled_now;
  for (Request* r : order) {
    if (budget == 0) break;
    if (r->state != RequestState::kRunning) continue;  // preempted earlier in this loop
    const int n = std::min(total(r) - r->num_computed_tokens, budget);
    bool preempted_self = false;
    while (!kv_->EnsureCapacity(r->id, r->num_computed_tokens + n)) {
      // The youngest running request not already in this step gives way.
      Request* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        if (std::find(scheduled_now.begin(), scheduled_now.end(), *it) == scheduled_now.end()) {
          victim = *it;
          break;
        }
      }
      if (victim == nullptr) break;  // cannot happen: r itself is unscheduled
      out.preempted.push_back(victim->id);
      Preempt(victim);
      if (victim == r) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;
    scheduled_now.push_back(r);
    const int end = r->num_computed_tokens + n;
    out.scheduled.push_back({r, n, end == total(r), r->num_pending_tokens > 0, end});
    out.num_tokens += n;
    budget -= n;
  }

  // Admit waiting requests, unless this step had to preempt. A preempted
  // request whose pending token is not known yet waits for it (its prompt
  // is recomputed with it), and those behind it wait too.
  while (out.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < config_.max_num_seqs &&
         waiting_.front()->num_pending_tokens == 0) {
    Request* r = waiting_.front();
    // A request asking for its prompt's log-probabilities computes every
    // prompt position (no cached prefix).
    if (r->num_computed_tokens == 0 && kv_->block_table(r->id).empty() &&
        r->spec.sampling.prompt_logprobs < 0) {
      r->num_computed_tokens = kv_->AcquireCachedPrefix(r->id, r->tokens);
    }
    const int n = std::min(r->num_tokens() - r->num_computed_tokens, budget);
    if (!kv_->EnsureCapacity(r->id, r->num_computed_tokens + n)) {
      // Not enough free blocks now: give the prefix references back (and the
      // query, which is asked again next time) and wait.
      kv_->Withdraw(r->id);
      r->num_computed_tokens = 0;
      break;
    }
    waiting_.pop_front();
    r->state = RequestState::kRunning;
    running_.push_back(r);
    const int end = r->num_computed_tokens + n;
    out.scheduled.push_back({r, n, end == r->num_tokens(), false, end});
    out.num_tokens += n;
    budget -= n;
  }
  return out;
}

void Scheduler::RetireEndingByLength(const SchedulerOutput& launched) {
  for (const ScheduledRequest& s : launched.scheduled) {
    Request* r = s.request;
    if (!s.samples || r->state != RequestState::kRunning || r->num_pending_tokens == 0) continue;
    if (r->num_output_tokens() + r->num_pending_tokens < r->spec.max_tokens &&
        r->num_tokens() + r->num_pending_tokens < config_.max_model_len) {
      continue;
    }
    // What Sampled would do for it, but for appending the token: its full
    // blocks cached (the launched step computed nothing past the tokens
    // known), its blocks freed, its seat given up.
    kv_->CacheComputedBlocks(r->id, r->tokens, std::min(s.computed_end, r->num_tokens()));
    Remove(r);
  }
}

void Scheduler::Launched(const SchedulerOutput& out) {
  for (const ScheduledRequest& s : out.scheduled) {
    Request* r = s.request;
    if (r->state != RequestState::kRunning) continue;  // aborted meanwhile
    r->num_computed_tokens = s.computed_end;
    if (s.samples) ++r->num_pending_tokens;
  }
}

std::vector<Request*> Scheduler::Sampled(const SchedulerOutput& out,
                                         const std::vector<int32_t>& sampled_tokens) {
  std::vector<Request*> finished;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    Request* r = s.request;
    if (r == nullptr || r->finished()) continue;  // forgotten, aborted or ended by a stop token
    // The blocks the step filled, up to what it computed (a later step in
    // flight may have computed more, not known to be written yet). A
    // request preempted since has no blocks to cache.
    if (r->state == RequestState::kRunning) {
      kv_->CacheComputedBlocks(r->id, r->tokens, std::min(s.computed_end, r->num_tokens()));
    }
    if (!s.samples) continue;
    const int32_t token = sampled_tokens[i];
    r->tokens.push_back(token);
    r->num_pending_tokens = std::max(0, r->num_pending_tokens - 1);
    const auto& stops = r->spec.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      r->finish_reason = FinishReason::kStop;
    } else if (r->num_output_tokens() >= r->spec.max_tokens ||
               r->num_tokens() >= config_.max_model_len) {
      r->finish_reason = FinishReason::kLength;
    }
    if (r->finish_reason != FinishReason::kNone) {
      Remove(r);  // from the running or (preempted meanwhile) the waiting queue
      r->state = RequestState::kFinished;
      finished.push_back(r);
    }
  }
  return finished;
}

void Scheduler::Remove(Request* request) {
  auto w = std::find(waiting_.begin(), waiting_.end(), request);
  if (w != waiting_.end()) waiting_.erase(w);
  auto r = std::find(running_.begin(), running_.end(), request);
  if (r != running_.end()) running_.erase(r);
  kv_->Free(request->id);
}

void Scheduler::Abort(Request* request) {
  if (request->finished()) return;
  Remove(request);
  request->state = RequestState::kFinished;
  request->finish_reason = FinishReason::kAbort;
}

}  // namespace mlag
