// Engine: requests in, tokens out. Owns the model runner, the KV cache
// manager and the scheduler, and runs one step at a time.
//
// Example:
//   EngineOptions opts;
//   opts.model = "tiny-v3";
//   MLAG_ASSIGN_OR_RETURN(auto engine, Engine::Create(opts));
//   RequestSpec req;
//   req.prompt = {1, 2, 3};
//   req.max_tokens = 8;
//   MLAG_ASSIGN_OR_RETURN(RequestId id, engine->AddRequest(req));
//   while (engine->HasUnfinished()) MLAG_RETURN_IF_ERROR(engine->Step().status());
//   const Request* done = engine->request(id);  // done->output_tokens()
//
// Not thread-safe: one thread drives an engine.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/engine/kv_cache_manager.h"
#include "runtime/engine/memory_plan.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/request.h"
#include "runtime/engine/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace mlag {

// The KV cache dtype "auto" means on `device`: bf16 on CUDA (half the cache's
// bytes, and what the tensor-core decode kernel reads), f32 on the host (the
// activations' dtype: the cache holds the latents exactly as computed, so a
// request's tokens are those of the reference forward). bf16 rounds each
// cached latent once, which can flip a near-tied token: pass f32 to compare
// CUDA's tokens with the host's.
DType DefaultKvCacheDtype(const Device& device);

struct EngineOptions;

// The memory plan request (memory_plan.h) an engine with `options` makes on
// `device`: what `mlag info` plans without building an engine.
absl::StatusOr<MemoryPlanRequest> MemoryPlanRequestFor(const EngineOptions& options,
                                                       const Device& device);

struct EngineOptions {
  std::string model = "tiny-v3";  // built-in name or checkpoint directory
  std::string device = "auto";    // auto, host, cuda, cuda:N
  // Bytes of KV cache; 0: what the memory plan leaves of the usable memory
  // once everything else is counted (runtime/engine/memory_plan.h).
  size_t kv_cache_bytes = 0;
  // The fraction of the memory the device has available that the plan may
  // use (vLLM's --gpu-memory-utilization), in (0, 1].
  double memory_utilization = kDefaultMemoryUtilization;
  // This engine's part of that memory, in (0, 1]: 1/N for each of N
  // expert-parallel ranks that share one host's memory.
  double memory_share = 1.0;
  // Expert parallelism: the routed experts a layer this rank holds after
  // each reconfiguration given up front, in order (0: it leaves). The plan
  // holds back what migration needs beside the old buffers ("expert
  // migration").
  std::vector<int> reconfiguration_expert_slots;
  // KV cache element type: "auto" (DefaultKvCacheDtype: bf16 on CUDA, f32
  // on the host), "f32" or "bf16".
  std::string kv_cache_dtype = "auto";
  // How projection weights are held: "auto" (as the checkpoint stores them:
  // bf16 and fp8 kept, anything else f32), "f32", "bf16" or "fp8" (e4m3 with
  // 128 x 128 block scales; lm_head then bf16). CUDA runs bf16 projections
  // through cuBLASLt and fp8 ones through the FP8 GEMM from sm_89 on (older
  // GPUs hold them in bf16, dequantized at load).
  std::string weight_dtype = "auto";
  // Skip the load-time scan that refuses NaN and infinite weights (for
  // trusted checkpoints; the scan costs one pass over the weights).
  bool trust_weights = false;
  int block_size = 64;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  // The longest sequence, prompt and output together; it sizes the rope
  // table and the block tables. 0: the config's max_position_embeddings
  // (the plan refuses when its KV cache cannot hold one such sequence).
  int max_model_len = 0;
  GraphMode graph_mode = GraphMode::kFullDecode;
  std::vector<int> capture_sizes;  // empty: the default list
  // The overlapped loop (see Engine::Step): "auto" (on for CUDA without an
  // expert-parallel group), "on" or "off". Not with an expert-parallel group,
  // whose ranks agree on each step's shape before launching it.
  std::string step_overlap = "auto";
  bool enable_prefix_caching = true;
  std::vector<int> local_experts;  // empty: every routed expert
  // The chat format of text prompts: "auto" (from the tokenizer config, else
  // the model type), "v2" or "v3".
  std::string chat_format = "auto";
  // Expert parallelism: the group this rank's MoE layers dispatch over
  // (nullptr: none), and the largest group it will ever join. With a group,
  // every Step is taken in lockstep with the other ranks (see Step).
  Communicator* ep_group = nullptr;
  int max_ep_ranks = 1;
  // With a group: how long a wait on the stream (whose collectives wait for
  // every peer) may take before it fails with a PeerTimeoutError
  // (runtime/core/peer_fault.h), from the first capture on; it also fails
  // at once when the group's or the control communicator reports an error
  // (Communicator::Health). Zero: waits are unbounded.
  absl::Duration ep_peer_timeout = absl::ZeroDuration();
  // With a group: the communicator of the run's control plane (nullptr:
  // none). A failed peer aborts it, so polling its health tells the others
  // at once, even while their device work waits in a collective that only
  // a timeout would end (an NCCL kernel). It also carries the start-up
  // rendezvous.
  Communicator* ep_control = nullptr;
  // With a group: how long Create waits, once this rank's model is loaded,
  // for every other rank to load its own before the first capture. Model
  // loading varies across ranks by far more than a step does, so it has its
  // own bound. Zero: the peer timeout.
  absl::Duration ep_startup_timeout = absl::ZeroDuration();
};

// What one Step call delivers: the results of the steps it collected (with
// the overlapped loop, the step launched by the call before, and any steps
// Drain collected since), and what its own scheduling did.
struct StepOutput {
  // Requests that got a token, with it, in the order the steps ran.
  std::vector<std::pair<RequestId, int32_t>> new_tokens;
  // Per new token: its row in runner().last_logits(); empty unless every
  // token came from the last step launched (always so without the overlap).
  std::vector<int> logits_rows;
  std::vector<RequestId> finished;
  std::vector<RequestId> preempted;
  int num_tokens = 0;     // tokens computed by the steps collected
  bool replayed = false;  // the last step collected ran as a graph replay
  bool dummy = false;     // this rank had no work and ran a dummy step
  int padded_size = 0;
};

struct EngineStats {
  int64_t steps = 0;
  // Steps launched while the one before was still in flight (the overlapped
  // loop), and fed tokens: pending tokens the device passed from one step
  // to the next.
  int64_t overlapped_steps = 0;
  int64_t fed_tokens = 0;
  std::map<int, int64_t> graph_replays;
  int64_t eager_steps = 0;
  int64_t dummy_steps = 0;
  double prefix_cache_hit_rate = 0.0;
  int64_t prefix_cache_hit_tokens = 0;
  int kv_blocks_total = 0;  // usable blocks (the null block excluded)
  int kv_blocks_used = 0;
  int kv_blocks_free = 0;
  size_t kv_bytes_per_token = 0;
  int kv_block_size = 0;
  // Where Engine::Create's time went, in seconds: opening the model (config,
  // checkpoint index), building it, the KV pool, the eager warm-up before
  // capture, the capture itself.
  double open_model_seconds = 0.0;
  double build_model_seconds = 0.0;
  double kv_pool_seconds = 0.0;
  double warmup_seconds = 0.0;
  double capture_seconds = 0.0;
  int64_t preemptions = 0;
  int num_graphs = 0;
  // The memory plan (Engine::memory_plan): its total and the usable memory
  // it was made against, and the bytes the planned items hold now (the
  // runtime reserve is a margin, not an allocation).
  size_t memory_planned_bytes = 0;
  size_t memory_usable_bytes = 0;
  size_t memory_allocated_bytes = 0;
};

class Engine {
 public:
  // Opens the model, makes the memory plan (which sizes max_model_len and
  // the KV pool, or refuses before anything is allocated), builds the runner
  // and captures the graphs.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);

  // Validates and queues a request. InvalidArgument naming the problem for an
  // empty prompt, a token id outside the vocabulary, max_tokens < 1,
  // prompt + max_tokens > max_model_len, or a request that could never fit
  // the KV pool; that request alone is rejected.
  absl::StatusOr<RequestId> AddRequest(const RequestSpec& spec);

  // The checks AddRequest makes, without queuing anything.
  absl::Status ValidateRequest(const RequestSpec& spec) const;

  // Like AddRequest, with the id chosen by the caller (expert-parallel
  // drivers number requests across ranks). AlreadyExists for a used id.
  absl::StatusOr<RequestId> AddRequestWithId(const RequestSpec& spec, RequestId id);

  // Runs one scheduling step (a no-op step when nothing can run).
  //
  // With the overlapped loop (EngineOptions::step_overlap), Step schedules
  // and launches step N+1 before it collects step N, so the GPU runs N+1's
  // first kernels while the host applies N's tokens: it returns N's tokens.
  // A request's token from step N reaches step N+1 on the device; a request
  // it ends with a stop token is found one step late, and step N+1 writes no
  // KV for it (scheduler.h). Step calls continue while HasUnfinished; the
  // tokens are those of the loop without overlap.
  //
  // In an expert-parallel group every rank calls Step together: the ranks
  // agree on the step's shape (the largest row count, and a decode plan only
  // if every rank has one), so their MoE collectives match; a rank with
  // nothing scheduled runs a dummy step of that shape, which writes no KV.
  absl::StatusOr<StepOutput> Step();

  // Removes every unfinished request (freeing its KV blocks) and hands it to
  // the caller with its tokens so far: a leaving expert-parallel rank's
  // requests, to be adopted by another rank.
  std::vector<std::unique_ptr<Request>> TakeUnfinished();

  // Queues a request taken from another engine. Its generated tokens are
  // kept; its KV is recomputed (prefix-cache hits included). Its id must be
  // unused here.
  absl::Status AdoptRequest(std::unique_ptr<Request> request);

  // Switches the expert-parallel group (nullptr: none). Drops every graph;
  // call CaptureGraphs (in lockstep over the new group) before the next step.
  absl::Status SetExpertGroup(Communicator* group);

  // Finishes a request with reason "abort" and frees its blocks.
  absl::Status Abort(RequestId id);

  // Forgets a finished request (its record, tokens and logprobs), for a
  // long-running server. NotFound for an unknown id; FailedPrecondition for
  // one that has not finished.
  absl::Status Release(RequestId id);

  // Unfinished requests, a step in flight, or tokens not yet delivered.
  bool HasUnfinished() const {
    return scheduler_->HasUnfinished() || !in_flight_.empty() || !undelivered_.new_tokens.empty() ||
           !undelivered_.finished.empty();
  }

  // Whether `extra_bytes` more (named by `what`) fit the memory plan beside
  // everything the planned items hold now: ResourceExhausted naming them,
  // the usable memory and a fix otherwise. Before an expert migration.
  absl::Status CheckFitsPlan(size_t extra_bytes, absl::string_view what) const;

  // Collects every step in flight (the overlapped loop): their tokens are
  // applied to their requests now, and delivered by the next Step.
  absl::Status Drain();

  bool overlapped() const { return overlap_; }
  const Request* request(RequestId id) const;
  std::vector<RequestId> request_ids() const;
  EngineStats Stats() const;

  const ModelConfig& config() const { return runner_->model().config(); }
  int max_model_len() const { return max_model_len_; }
  // The plan Create sized everything by.
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  ModelRunner& runner() { return *runner_; }
  KvCacheManager& kv_cache() { return *kv_; }
  Device& device() { return *device_; }
  const std::string& model_description() const { return description_; }

  // The model's tokenizer (runtime/engine/model_tokenizer.h), loaded on the
  // first call and kept. FailedPrecondition naming the model when it has no
  // tokenizer.json; the load's error when the file is malformed. Safe to call
  // from several threads.
  absl::StatusOr<const Tokenizer*> tokenizer() const;

 private:
  Engine() = default;

  EngineOptions options_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<RequestId, std::unique_ptr<Request>> requests_;
  RequestId next_id_ = 0;
  int max_model_len_ = 0;
  MemoryPlan memory_plan_;
  int64_t steps_ = 0;
  int64_t overlapped_steps_ = 0;
  int64_t fed_tokens_ = 0;
  // The overlapped loop: steps launched and not yet collected (at most one
  // between Step calls), and results collected outside Step.
  struct InFlightStep {
    StepTicket ticket;
    SchedulerOutput sched;
    std::vector<RequestId> ids;    // of sched.scheduled (a request may be released meanwhile)
    std::vector<int> prompt_from;  // per sequence: the prompt token its first target is
  };
  bool overlap_ = false;
  std::vector<InFlightStep> in_flight_;
  uint64_t last_launched_ = 0;  // ticket id of the last step launched
  StepOutput undelivered_;
  // Collects the oldest step in flight into `out`.
  absl::Status CollectOldest(StepOutput* out);
  double open_model_seconds_ = 0.0;  // Create: OpenModel
  ModelConfig model_config_;         // as opened (for the tokenizer)
  // Loaded on the first tokenizer() call.
  mutable std::mutex tokenizer_mu_;
  mutable bool tokenizer_loaded_ = false;
  mutable absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer_{nullptr};
  std::string description_;
};

}  // namespace mlag
