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
#pragma once

#include <deque>
#include <vector>

#include "runtime/engine/kv_cache_manager.h"
#include "runtime/engine/request.h"

namespace mlag {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
};

struct ScheduledRequest {
  Request* request;
  int num_new_tokens;  // tokens [num_computed_tokens, +num_new_tokens) run this step
  bool samples;        // the step computes the request's last known token: sample one
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

  // Applies a step's results: advances computed tokens, appends the sampled
  // token of each request that sampled (sampled_tokens is parallel to
  // out.scheduled; entries of requests that did not sample are ignored),
  // caches full blocks, finishes requests that hit max_tokens, a stop token or
  // max_model_len, and frees their blocks. Returns the requests finished.
  std::vector<Request*> Update(const SchedulerOutput& out,
                               const std::vector<int32_t>& sampled_tokens, int max_model_len);

  // Removes a request wherever it is and frees its blocks.
  void Abort(Request* request);

  // Forgets an unfinished request (frees its blocks, leaves its state and
  // tokens alone) so that another scheduler can adopt it.
  void Remove(Request* request);

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
