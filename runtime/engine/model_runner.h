// The model runner: static input buffers, the per-batch-size graphs, padding,
// dummy runs and the KV cache memory.
//
// Graphs (GraphMode::kFullDecode): one full-model graph per capture size,
// captured largest first after an eager dummy warm-up, all sharing the
// model's one activation workspace and the static input buffers below. A pure
// decode batch of B sequences is padded to the smallest captured size P >= B
// (padding rows: token 0, position 0, slot -1, seq_len 0, block table of null
// blocks) and replays graph P; the padded rows write no KV and their outputs
// are dropped. Batches with prefill tokens, and decode batches above the
// largest size, run eagerly at their exact size. GraphMode::kNone captures
// nothing and runs everything eagerly, with decode batches padded to the same
// sizes, so that both modes do the same arithmetic (host sgemm and the MoE
// grouping are not batch-invariant to the last bit).
//
// Launch and Collect split a step in two, so the host can plan and launch
// step N+1 while step N runs (the engine's overlapped loop): each step
// stages its inputs in one of two pinned staging slots and copies its
// results back into that slot's pinned memory, then records the slot's
// event; Collect waits for that event only. A step may take a token the
// step before it sampled straight from the device (StepSequence::feed_from).
//
// Dummy runs (DummyStep) use the same path with every row a padding row. They
// are how warm-up and capture run, and how an idle expert-parallel rank or a
// reconfiguration exercises the graphs, and they never touch a live KV page:
// every slot is -1, so kv_update writes nothing, and seq_len 0 makes attention
// produce zeros.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "layers/deepseek_model.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/engine/request.h"

namespace mlag {

enum class GraphMode { kNone, kFullDecode };

// "none", "full-decode".
absl::string_view GraphModeName(GraphMode mode);
absl::StatusOr<GraphMode> ParseGraphMode(absl::string_view name);

// [1, 2, 4] + multiples of 8 below 256 + multiples of 16 from 256 up to
// min(2 * max_num_seqs, 512), clipped to max_num_batched_tokens.
std::vector<int> DefaultCaptureSizes(int max_num_seqs, int max_num_batched_tokens);

struct RunnerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int max_model_len = 256;
  int max_ep_ranks = 1;          // largest expert-parallel group (sizes its buffers)
  DType kv_dtype = DType::kF32;  // KV cache element type: f32 or bf16
  WeightFormat weight_format = WeightFormat::kAuto;  // projection weights (layers/weight_arena.h)
  int block_size = 64;
  int num_blocks = 64;  // including the null block 0
  GraphMode graph_mode = GraphMode::kFullDecode;
  std::vector<int> capture_sizes;  // empty: DefaultCaptureSizes
  std::vector<int> local_experts;  // empty: all routed experts
};

// The sizes a runner's buffers take from its config, computed before
// anything is allocated (the memory plan's figures are these).
struct RunnerShape {
  std::vector<int> capture_sizes;  // sorted, unique
  int max_rows = 0;                // rows of the per-token buffers
  int max_seq_rows = 0;            // rows of the per-sequence buffers
  int max_blocks_per_seq = 0;      // block-table columns: max_model_len's blocks

  static absl::StatusOr<RunnerShape> Of(const RunnerConfig& config);
  // The static inputs' dtypes and shapes, in the order they are laid out.
  std::vector<std::pair<DType, std::vector<int64_t>>> InputFields() const;
  // Their bytes, each field 64-byte aligned.
  size_t InputBytes() const;
  // The runner's device buffers: inputs, sampled tokens, (CUDA) top
  // log-probabilities.
  size_t DeviceBufferBytes(const RunnerConfig& config, bool cuda) const;
  // Its two pinned staging slots (host memory; the same memory as the device
  // on the host).
  size_t StagingBytes(const RunnerConfig& config, bool cuda) const;
  static size_t TopLogprobBytes(const RunnerConfig& config);
  // The logit adjustments of one step: tokens i32 then deltas f32, room for
  // kMaxLogitAdjustmentsPerSeq per sequence.
  static size_t AdjustmentBytes(const RunnerConfig& config);
};

// One sequence of a step, as the runner sees it.
struct StepSequence {
  absl::Span<const int32_t> new_tokens;  // tokens to compute this step
  int start_position = 0;                // position of new_tokens[0]
  absl::Span<const int> block_table;     // the sequence's blocks (covers every position)
  bool sample = false;                   // sample a token from the last position
  SamplingParams sampling;
  int64_t output_index = 0;  // RNG step: number of tokens generated so far
  // >= 0: new_tokens is one placeholder for the token the previous step
  // launched sampled for its sequence `feed_from`, not yet known to the host.
  // The step reads it on the device (FeedSampledTokens), and writes no KV for
  // it when it is one of stop_token_ids (at most kMaxFeedStopIds): the
  // request ended on it.
  int feed_from = -1;
  absl::Span<const int32_t> stop_token_ids;
  // Added to the sampled row's logits before sampling (kernels/sampling.h's
  // AdjustLogits): sorted by token, each once, at most
  // kMaxLogitAdjustmentsPerSeq, tokens in the vocabulary. Only with sample.
  // With sampling's penalties these depend on every token generated, so the
  // step must be collected before the next launch (the runner says so).
  absl::Span<const LogitAdjustment> logit_adjustments;
  // The prompt log-probabilities this step computes (sampling.prompt_logprobs
  // >= 0): target i is the token that follows new_tokens[i], for the first
  // targets.size() <= new_tokens.size() rows.
  absl::Span<const int32_t> prompt_logprob_targets;
};

// The shape a step runs with. decode: every sequence has one token and the
// batch is laid out as `rows` sequences (padding sequences included), which
// can replay the graph of that size; otherwise `rows` token rows (padding
// rows belong to no sequence) run eagerly.
struct StepPlan {
  int rows = 0;
  bool decode = false;
};

struct StepResult {
  std::vector<int32_t> tokens;                      // per sequence; -1 where sample was false
  std::vector<std::vector<TokenLogprob>> logprobs;  // per sequence, when asked for
  // Per sequence: one entry per prompt_logprob_targets entry.
  std::vector<std::vector<PromptLogprob>> prompt_logprobs;
  // The prompt log-probabilities reused the logits buffer: last_logits() no
  // longer holds the step's logits.
  bool logits_replaced = false;
  bool replayed = false;  // a captured graph ran
  int padded_size = 0;    // rows the step ran with
};

// A launched step, to be collected (ModelRunner::Collect) in launch order.
struct StepTicket {
  uint64_t id = 0;
};

struct RunnerStats {
  std::map<int, int64_t> graph_replays;  // capture size -> replays
  int64_t eager_steps = 0;
  int64_t dummy_steps = 0;
  // Start-up, in phases (seconds). capture excludes the warm-up before it.
  double build_model_seconds = 0.0;  // weights loaded or generated, laid out
  double kv_pool_seconds = 0.0;      // KV caches allocated (zero pages)
  double warmup_seconds = 0.0;       // eager dummy steps before capture
  double capture_seconds = 0.0;      // the last CaptureGraphs, warm-up excluded
};

class ModelRunner {
 public:
  // Builds the model and allocates the KV cache and static buffers. Does not
  // capture: call CaptureGraphs.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(ModelSource& source, Device* device,
                                                             const RunnerConfig& config);

  // Drops every graph and captures one per capture size (kFullDecode), largest
  // first, each after an eager dummy warm-up. No-op for kNone.
  absl::Status CaptureGraphs();
  void DropGraphs() { graphs_.clear(); }
  // false: steps run eagerly even where a graph is captured (the same
  // padding, so the same arithmetic), until set true again. For benchmarks
  // that time both alternately.
  void set_graphs_enabled(bool enabled) { graphs_enabled_ = enabled; }

  // The plan this runner would choose for `seqs` alone: a pure decode batch
  // padded to the smallest capture size (its exact size above the largest),
  // otherwise the token count.
  StepPlan Plan(absl::Span<const StepSequence> seqs) const;
  // The plan every rank of an expert-parallel group runs with, given the
  // largest rows and whether all ranks' plans were decode plans: the same on
  // every rank, so their collectives match.
  StepPlan Agree(int max_rows, bool all_decode) const;

  // Runs one step over `seqs` (at most max_num_seqs, at most
  // max_num_batched_tokens tokens in all) with `plan` (nullptr: Plan(seqs)).
  // A plan may only add padding: plan->rows >= what `seqs` needs.
  // Launch then Collect.
  absl::StatusOr<StepResult> Execute(absl::Span<const StepSequence> seqs,
                                     const StepPlan* plan = nullptr);

  // Stages and launches one step (as Execute) without waiting for it. At
  // most two steps are in flight: FailedPrecondition for a third. A
  // sequence with feed_from >= 0 needs the previous run of this runner to
  // have been a launched step (not a dummy step or a capture) with a
  // sequence of that index, one new token and at most kMaxFeedStopIds stop
  // tokens.
  absl::StatusOr<StepTicket> Launch(absl::Span<const StepSequence> seqs,
                                    const StepPlan* plan = nullptr);
  // Waits for the oldest step in flight, which `ticket` must name, and
  // returns its results. A step with host-computed log-probabilities (more
  // than kMaxTopLogprobs, or any on the host device) reads its logits here,
  // and one with prompt log-probabilities runs the LM head over its hidden
  // states here: FailedPrecondition if a later step has been launched since.
  absl::StatusOr<StepResult> Collect(StepTicket ticket);
  // Whether `ticket`'s results must be collected before another launch: it
  // reads its activations at Collect (above), or a sequence of it has
  // penalties, whose next adjustments count the token it samples.
  bool NeedsCollectBeforeNextLaunch(StepTicket ticket) const;
  int steps_in_flight() const;
  // Whether a sampled row asking for k log-probabilities gets them from the
  // device (CUDA, k <= kMaxTopLogprobs) rather than from its logits.
  bool LogprobsOnDevice(int k) const;

  // A run of dummy rows only: `plan.rows` padding sequences (decode layout:
  // the graph of that size when captured) or token rows of no sequence.
  // Writes no KV and reads none. Safe at any step boundary.
  absl::Status DummyStep(const StepPlan& plan);
  absl::Status DummyStep(int padded_size) { return DummyStep(StepPlan{padded_size, true}); }

  // Saves the static attention-metadata buffers (block tables, sequence
  // lengths, slots) and overwrites them with dummy values; RestoreMetadata
  // puts them back. Around a reconfiguration's re-capture, so nothing but
  // dummy metadata is visible while graphs are rebuilt.
  absl::Status SaveAndClearMetadata();
  absl::Status RestoreMetadata();

  // Sets the expert-parallel group the model dispatches over. Graphs captured
  // with another group must be dropped and captured again.
  absl::Status SetExpertGroup(Communicator* group) { return model_->SetExpertGroup(group); }

  // Fills every KV cache block with seeded random values. For benchmarks,
  // whose timing does not depend on what the cache holds.
  absl::Status FillKvCache(uint64_t seed);

  // Checksums of KV cache blocks over every layer: one per listed block.
  absl::StatusOr<std::vector<uint64_t>> BlockChecksums(absl::Span<const int> blocks) const;
  // One checksum over the listed blocks (all blocks when empty).
  absl::StatusOr<uint64_t> KvChecksum(absl::Span<const int> blocks) const;

  // f32 [rows, V]: the logits of the last step (rows as run, padding included).
  Tensor last_logits() const { return model_->logits(last_rows_); }

  const std::vector<int>& capture_sizes() const { return capture_sizes_; }
  const Graph* graph(int size) const;
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  const RunnerStats& stats() const { return stats_; }
  // Bytes held, by the memory plan's items (memory_plan.h): "weights",
  // "rope table", "activations", "static buffers", "KV cache".
  std::vector<std::pair<std::string, size_t>> AllocatedBytes() const;
  const RunnerConfig& config() const { return config_; }
  DeepseekModel& model() { return *model_; }
  Stream& stream() { return *stream_; }
  Device& device() { return *device_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  size_t kv_bytes_per_token() const;

 private:
  ModelRunner(Device* device, const RunnerConfig& config) : device_(device), config_(config) {}
  absl::Status Init(ModelSource& source);
  // Metadata over the first `rows` rows of the static buffers.
  AttentionMetadata Metadata(int num_tokens, int num_seqs, bool decode_only) const;
  // The static inputs of one step, written in the pinned staging buffer.
  struct Staging {
    int32_t *ids, *positions, *block_table, *seq_lens, *qsl, *logits_idx, *top_k, *logprobs_k,
        *feed_src, *stop_ids, *adjust_offsets;
    int64_t *slots, *seeds, *steps;
    float *temperature, *top_p;
  };
  // Views of a staging buffer, one per static input buffer.
  struct StagedInputs {
    Tensor input_ids, positions, slot_mapping, block_table, seq_lens, query_start_loc,
        logits_indices, temperature, top_k, top_p, seeds, steps, logprobs_k, feed_src, stop_ids,
        adjust_offsets;
  };
  // The next staging slot's buffer, with dummy values in `rows` token rows
  // and `seqs` sequence rows; waits for the slot's last use first.
  absl::StatusOr<Staging> BeginStaging(int rows, int seqs);
  // Copies the slot's staging buffer into the static buffers, block table
  // rows [0, seqs) only (one async copy on the runner's stream).
  absl::Status UploadStaging(int seqs);
  // Ends the slot's use: records its event (after the copies that read or
  // write its host memory) and moves to the other slot.
  absl::Status EndSlot();
  // FailedPrecondition naming `what` while a step is in flight: dummy runs,
  // captures and metadata swaps wait for the stream and replace the sampled
  // tokens, so the engine collects its steps first.
  absl::Status RefuseWhileInFlight(absl::string_view what) const;
  // Writes a dummy step of `plan` into the static buffers.
  absl::Status FillDummy(const StepPlan& plan);
  // Forward + sampling on the static buffers (eager or recorded).
  absl::Status RunOps(const AttentionMetadata& meta);
  // Smallest captured size >= n, or 0.
  int PaddedSize(int n) const;

  Device* device_;
  RunnerConfig config_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<DeepseekModel> model_;
  std::vector<int> capture_sizes_;  // ascending
  int max_rows_ = 0;                // rows of the static buffers (tokens)
  int max_seq_rows_ = 0;            // rows of the per-sequence buffers
  int max_blocks_per_seq_ = 0;
  std::vector<Buffer> buffers_;
  std::vector<Tensor> kv_caches_;  // per layer [num_blocks, block_size, row]
  Buffer inputs_;                  // the static input buffers, on the device
  size_t block_table_offset_ = 0;  // of the block table, the last field, in inputs_
  // What a launched step needs at Collect.
  struct InFlight {
    uint64_t id = 0;  // 0: none
    int seqs = 0;     // B
    int seq_rows = 0;
    int top_k_cols = 0;           // K of the device's top log-probabilities
    std::vector<char> sample;     // per sequence
    std::vector<int> logprobs_k;  // per sequence (0: none)
    bool host_logprobs = false;   // some row's come from the logits, on the host
    bool penalties = false;       // some row's adjustments count its sampled tokens
    // Prompt log-probabilities: per token row of the step, its sequence and
    // the token it predicts.
    std::vector<int32_t> prompt_rows, prompt_targets, prompt_seq;
    std::vector<int> prompt_k;  // per sequence: top alternatives wanted
    bool replayed = false;
    int rows = 0;
  };
  // A staging slot: the pinned memory one step's inputs and results travel
  // through, and the event after its last copy.
  struct Slot {
    Buffer staging;       // pinned, the layout of inputs_
    StagedInputs staged;  // views of it
    Buffer sampled_host;  // pinned [max_seq_rows] i32: the sampled tokens
    // CUDA only: the step's top log-probabilities, tokens i32 [B, K] then
    // logprobs f32 [B, K] (K the step's largest k), pinned; room for
    // max_num_seqs * kMaxTopLogprobs of each.
    Buffer top_logprobs_host;
    Buffer adjustments_host;  // pinned, the layout of adjustments_
    std::unique_ptr<StreamEvent> done;
    InFlight step;
  };
  // Collect's prompt log-probabilities of `step` into result->prompt_logprobs.
  absl::Status PromptLogprobs(const InFlight& step, StepResult* result);
  Slot slots_[2];
  int slot_ = 0;  // the slot the next staging uses
  uint64_t next_ticket_ = 1;
  uint64_t last_launched_ = 0;  // the last step launched, while in flight
  // Sequences of the last run whose sampled tokens are still in sampled_
  // (what feed_from may name): 0 after a dummy run or a capture.
  int feedable_seqs_ = 0;
  // CUDA only: the device side of the top log-probabilities.
  Buffer top_logprobs_;
  // The step's logit adjustments: tokens i32 [A] then deltas f32 [A]
  // (RunnerShape::AdjustmentBytes), indexed by adjust_offsets_.
  Buffer adjustments_;
  Tensor adjust_tokens_, adjust_deltas_;
  // Static input buffers.
  Tensor input_ids_, positions_, slot_mapping_;                       // [max_rows]
  Tensor block_table_, seq_lens_, query_start_loc_, logits_indices_;  // per sequence
  Tensor temperature_, top_k_, top_p_, seeds_, steps_, sampled_;      // per sequence
  Tensor logprobs_k_;      // per sequence: k of the device's top log-probabilities (0: none)
  Tensor feed_src_;        // per sequence: the row of sampled_ its token comes from (-1: none)
  Tensor stop_ids_;        // per sequence [kMaxFeedStopIds]: stops of a fed token (-1: unused)
  Tensor adjust_offsets_;  // [max_seq_rows + 1]: row b's adjustments (AdjustLogits)
  std::map<int, std::unique_ptr<Graph>> graphs_;
  std::vector<std::vector<char>> saved_metadata_;
  RunnerStats stats_;
  int last_rows_ = 1;
  bool graphs_enabled_ = true;
};

}  // namespace mlag
