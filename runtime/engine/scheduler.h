// Continuous batching: which requests run in the next step, and how many of
// their tokens.
//
// Each step has a token budget (max_num_batched_tokens) and at most
// max_num_seqs running requests. Running requests go first, decodes (one token
// to compute) before unfinished prefills; then waiting requests are admitted in
// arrival order, each with its prefix-cache hit and a prefill chunk that fits
// the budget (chunked prefill). When the KV pool runs dry, the youngest
// running request is preempted: its blocks are freed and it goes back to the
// front of the waiting queue to be recomputed (its generated tokens are kept,
// so no output is lost, duplicated or reordered).
//
// A step is applied in two halves: Launched when it is launched (its tokens
// count as computed, and each sampling request gets a pending token), and
// Sampled once its tokens are known. The step-by-step engine calls them
// back to back. The overlapped engine schedules step N+1 between them: a
// request with a pending token decodes it in N+1 (fed on the device) unless
// that token ends it by length, which the scheduler can tell without
// knowing it (RetireEndingByLength); a token that ends it by being a stop
// token is known one step late, and step N+1 writes no KV for it
// (ModelRunner::Launch).
#pragma once

#include <deque>
#include <vector>

#include "runtime/engine/kv_cache_manager.h"
#include "runtime/engine/request.h"

namespace mlag {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int max_model_len = 1 << 30;
  // A request with a pending token is scheduled only if it has at most this
  // many stop tokens (what the device checks when it feeds the token);
  // otherwise it waits for the token to be collected.
  int max_fed_stop_ids = 0;
};

struct ScheduledRequest {
  Request* request;
  int num_new_tokens;    // tokens [num_computed_tokens, +num_new_tokens) run this step
  bool samples;          // the step computes the request's last token: sample one
  bool fed = false;      // its one new token is pending: the device feeds it
  int computed_end = 0;  // num_computed_tokens once this step has run
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;
  int num_tokens = 0;
  std::vector<RequestId> preempted;
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {}

  // Queues a validated request (state kWaiting). The caller owns it and keeps
  // it alive until it finishes.
  void Add(Request* request);

  // Picks the next step's batch (may be empty when nothing can run).
  SchedulerOutput Schedule();

  // The step `out` was launched: advances computed tokens, and gives each
  // request that samples a pending token.
  void Launched(const SchedulerOutput& out);

  // Before scheduling the step after `launched` (still in flight): each
  // request that its pending token from `launched` ends by length (max_tokens
  // or max_model_len, known without the token) leaves at once, in the step's
  // order, as it would have had the step been collected first: its computed
  // blocks cached, its blocks freed (the device writes them in stream order
  // before any later step reuses them), its seat free for the next request.
  // Sampled appends its token and finishes it. So without stop tokens both
  // loops schedule the same batches.
  void RetireEndingByLength(const SchedulerOutput& launched);

  // The step's tokens are known: appends the sampled token of each request
  // that sampled in place of its pending one (sampled_tokens is parallel to
  // out.scheduled; entries of requests that did not sample are ignored, and
  // so are null requests: ones the engine has forgotten since), caches the
  // full blocks the step computed, finishes requests that hit max_tokens, a
  // stop token or max_model_len, and frees their blocks. A finished or
  // aborted request's token is dropped. Returns the requests finished.
  std::vector<Request*> Sampled(const SchedulerOutput& out,
                                const std::vector<int32_t>& sampled_tokens);

  // Removes a request wherever it is and frees its blocks.
  void Abort(Request* request);

  // Forgets an unfinished request (frees its blocks, leaves its state and
  // tokens alone) so that another scheduler can adopt it.
  void Remove(Request* request);

  void set_max_fed_stop_ids(int n) { config_.max_fed_stop_ids = n; }

  bool HasUnfinished() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::vector<Request*>& running() const { return running_; }

 private:
  void Preempt(Request* victim);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order: the last is the youngest
  int64_t num_preemptions_ = 0;
};

}  // namespace mlag
