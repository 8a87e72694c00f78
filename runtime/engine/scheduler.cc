#include "runtime/engine/scheduler.h"

#include <algorithm>

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
  std::vector<Request*> order;
  for (Request* r : running_) {
    if (r->num_tokens() - r->num_computed_tokens == 1) order.push_back(r);
  }
  for (Request* r : running_) {
    if (r->num_tokens() - r->num_computed_tokens != 1) order.push_back(r);
  }
  std::vector<Request*> scheduled_now;
  for (Request* r : order) {
    if (budget == 0) break;
    if (r->state != RequestState::kRunning) continue;  // preempted earlier in this loop
    const int n = std::min(r->num_tokens() - r->num_computed_tokens, budget);
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
    out.scheduled.push_back({r, n, r->num_computed_tokens + n == r->num_tokens()});
    out.num_tokens += n;
    budget -= n;
  }

  // Admit waiting requests, unless this step had to preempt.
  while (out.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    if (r->num_computed_tokens == 0 && kv_->block_table(r->id).empty()) {
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
    out.scheduled.push_back({r, n, r->num_computed_tokens + n == r->num_tokens()});
    out.num_tokens += n;
    budget -= n;
  }
  return out;
}

std::vector<Request*> Scheduler::Update(const SchedulerOutput& out,
                                        const std::vector<int32_t>& sampled_tokens,
                                        int max_model_len) {
  std::vector<Request*> finished;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    Request* r = s.request;
    if (r->state != RequestState::kRunning) continue;  // aborted meanwhile
    r->num_computed_tokens += s.num_new_tokens;
    kv_->CacheComputedBlocks(r->id, r->tokens, r->num_computed_tokens);
    if (!s.samples) continue;
    const int32_t token = sampled_tokens[i];
    r->tokens.push_back(token);
    const auto& stops = r->spec.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      r->finish_reason = FinishReason::kStop;
    } else if (r->num_output_tokens() >= r->spec.max_tokens || r->num_tokens() >= max_model_len) {
      r->finish_reason = FinishReason::kLength;
    }
    if (r->finish_reason != FinishReason::kNone) {
      r->state = RequestState::kFinished;
      kv_->Free(r->id);
      running_.erase(std::find(running_.begin(), running_.end(), r));
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
