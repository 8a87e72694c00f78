#include "runtime/engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "kernels/host/sampling.h"
#include "kernels/sampling.h"
#include "runtime/core/status.h"

namespace mlag {

absl::string_view GraphModeName(GraphMode mode) {
  return mode == GraphMode::kNone ? "none" : "full-decode";
}

absl::StatusOr<GraphMode> ParseGraphMode(absl::string_view name) {
  if (name == "none") return GraphMode::kNone;
  if (name == "full-decode") return GraphMode::kFullDecode;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown graph mode '", name, "' (expected full-decode or none)"));
}

std::vector<int> DefaultCaptureSizes(int max_num_seqs, int max_num_batched_tokens) {
  const int max_size = static_cast<int>(std::min<int64_t>(2 * int64_t{max_num_seqs}, 512));
  std::vector<int> sizes = {1, 2, 4};
  for (int s = 8; s < 256; s += 8) sizes.push_back(s);
  for (int s = 256; s <= 512; s += 16) sizes.push_back(s);
  std::vector<int> out;
  for (int s : sizes) {
    if (s <= max_size && s <= max_num_batched_tokens) out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(ModelSource& source,
                                                                 Device* device,
                                                                 const RunnerConfig& config) {
  std::unique_ptr<ModelRunner> runner(new ModelRunner(device, config));
  MLAG_RETURN_IF_ERROR(runner->Init(source));
  return runner;
}

absl::StatusOr<RunnerShape> RunnerShape::Of(const RunnerConfig& c) {
  RunnerShape s;
  s.capture_sizes = c.capture_sizes.empty()
                        ? DefaultCaptureSizes(c.max_num_seqs, c.max_num_batched_tokens)
                        : c.capture_sizes;
  std::sort(s.capture_sizes.begin(), s.capture_sizes.end());
  s.capture_sizes.erase(std::unique(s.capture_sizes.begin(), s.capture_sizes.end()),
                        s.capture_sizes.end());
  if (!s.capture_sizes.empty() && s.capture_sizes.front() < 1) {
    return absl::InvalidArgumentError("capture sizes must be positive");
  }
  const int max_capture = s.capture_sizes.empty() ? 0 : s.capture_sizes.back();
  s.max_rows = std::max(c.max_num_batched_tokens, max_capture);
  s.max_seq_rows = std::max(c.max_num_seqs, max_capture);
  s.max_blocks_per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  return s;
}

std::vector<std::pair<DType, std::vector<int64_t>>> RunnerShape::InputFields() const {
  const int64_t R = max_rows, S = max_seq_rows;
  // The order of ModelRunner::Init's fields.
  return {{DType::kI32, {R}},     {DType::kI32, {R}},
          {DType::kI64, {R}},     {DType::kI32, {S}},
          {DType::kI32, {S + 1}}, {DType::kI32, {S}},
          {DType::kF32, {S}},     {DType::kI32, {S}},
          {DType::kF32, {S}},     {DType::kI64, {S}},
          {DType::kI64, {S}},     {DType::kI32, {S}},
          {DType::kI32, {S}},     {DType::kI32, {S, kMaxFeedStopIds}},
          {DType::kI32, {S + 1}}, {DType::kI32, {S, max_blocks_per_seq}}};
}

size_t RunnerShape::InputBytes() const {
  size_t bytes = 0;
  for (const auto& [dtype, shape] : InputFields()) {
    bytes += (Tensor(nullptr, dtype, shape).nbytes() + 63) / 64 * 64;
  }
  return bytes;
}

size_t RunnerShape::DeviceBufferBytes(const RunnerConfig& c, bool cuda) const {
  // The inputs, the sampled tokens, the logit adjustments and (CUDA) the
  // top log-probabilities.
  return InputBytes() + static_cast<size_t>(max_seq_rows) * sizeof(int32_t) + AdjustmentBytes(c) +
         (cuda ? TopLogprobBytes(c) : 0);
}

size_t RunnerShape::StagingBytes(const RunnerConfig& c, bool cuda) const {
  // Two slots, each a copy of the inputs, its sampled tokens, its logit
  // adjustments and (CUDA) its top log-probabilities.
  return 2 * DeviceBufferBytes(c, cuda);
}

size_t RunnerShape::TopLogprobBytes(const RunnerConfig& c) {
  return size_t{2} * c.max_num_seqs * kMaxTopLogprobs * sizeof(int32_t);
}

size_t RunnerShape::AdjustmentBytes(const RunnerConfig& c) {
  return size_t{2} * c.max_num_seqs * kMaxLogitAdjustmentsPerSeq * sizeof(int32_t);
}

absl::Status ModelRunner::Init(ModelSource& source) {
  const RunnerConfig& c = config_;
  if (c.kv_dtype != DType::kF32 && c.kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype ", DTypeName(c.kv_dtype), ": expected f32 or bf16"));
  }
  if (c.max_num_seqs < 1 || c.max_num_batched_tokens < 1 || c.block_size < 1 || c.num_blocks < 2 ||
      c.max_model_len < 1) {
    return absl::InvalidArgumentError(
        "runner needs max_num_seqs, max_num_batched_tokens, block_size, max_model_len >= 1 "
        "and at least 2 KV blocks");
  }
  MLAG_ASSIGN_OR_RETURN(const RunnerShape shape, RunnerShape::Of(c));
  capture_sizes_ = shape.capture_sizes;
  max_rows_ = shape.max_rows;
  max_seq_rows_ = shape.max_seq_rows;
  max_blocks_per_seq_ = shape.max_blocks_per_seq;

  MLAG_ASSIGN_OR_RETURN(stream_, Stream::Create(device_));
  ModelOptions mo;
  mo.max_tokens = max_rows_;
  mo.max_seqs = max_seq_rows_;
  mo.local_experts = c.local_experts;
  mo.max_ep_ranks = c.max_ep_ranks;
  mo.weight_format = c.weight_format;
  mo.max_positions = c.max_model_len;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_build = Clock::now();
  MLAG_ASSIGN_OR_RETURN(model_, BuildModel(source, device_, mo));
  const Clock::time_point t_kv = Clock::now();
  stats_.build_model_seconds = std::chrono::duration<double>(t_kv - t_build).count();

  // KV caches, zero-filled: on the host, pages the kernel zeroes when a block
  // is first written, so the pool costs neither start-up time nor memory
  // until requests reach it.
  const ModelConfig& mc = model_->config();
  for (int l = 0; l < mc.num_hidden_layers; ++l) {
    Tensor probe(nullptr, c.kv_dtype, {c.num_blocks, c.block_size, mc.kv_cache_row()});
    MLAG_ASSIGN_OR_RETURN(Buffer b, device_->AllocateZeroed(probe.nbytes()));
    Tensor cache = b.AsTensor(c.kv_dtype, {c.num_blocks, c.block_size, mc.kv_cache_row()});
    buffers_.push_back(std::move(b));
    kv_caches_.push_back(cache);
    model_->BindKvCache(l, cache);
  }
  stats_.kv_pool_seconds = std::chrono::duration<double>(Clock::now() - t_kv).count();
  // The static input buffers: one device allocation and a pinned staging
  // buffer of the same layout, so a step's inputs travel in one copy.
  const int64_t R = max_rows_, S = max_seq_rows_;
  struct Field {
    Tensor* device;
    Tensor StagedInputs::*staged;
    DType dtype;
    std::vector<int64_t> shape;
  };
  // Dtypes and shapes from RunnerShape::InputFields (the memory plan's
  // figure), in its order.
  Field fields[] = {
      {&input_ids_, &StagedInputs::input_ids},
      {&positions_, &StagedInputs::positions},
      {&slot_mapping_, &StagedInputs::slot_mapping},
      {&seq_lens_, &StagedInputs::seq_lens},
      {&query_start_loc_, &StagedInputs::query_start_loc},
      {&logits_indices_, &StagedInputs::logits_indices},
      {&temperature_, &StagedInputs::temperature},
      {&top_k_, &StagedInputs::top_k},
      {&top_p_, &StagedInputs::top_p},
      {&seeds_, &StagedInputs::seeds},
      {&steps_, &StagedInputs::steps},
      {&logprobs_k_, &StagedInputs::logprobs_k},
      {&feed_src_, &StagedInputs::feed_src},
      {&stop_ids_, &StagedInputs::stop_ids},
      {&adjust_offsets_, &StagedInputs::adjust_offsets},
      // Last, and by far the largest: a step uploads only its own rows.
      {&block_table_, &StagedInputs::block_table},
  };
  const auto layout = shape.InputFields();
  static_assert(std::size(fields) == 16, "one field per RunnerShape::InputFields entry");
  std::vector<size_t> offsets;
  size_t bytes = 0;
  for (size_t i = 0; i < std::size(fields); ++i) {
    fields[i].dtype = layout[i].first;
    fields[i].shape = layout[i].second;
    offsets.push_back(bytes);
    bytes += (Tensor(nullptr, fields[i].dtype, fields[i].shape).nbytes() + 63) / 64 * 64;
  }
  block_table_offset_ = offsets.back();
  MLAG_ASSIGN_OR_RETURN(inputs_, device_->Allocate(bytes));
  for (size_t i = 0; i < std::size(fields); ++i) {
    const Field& f = fields[i];
    *f.device =
        Tensor(static_cast<char*>(inputs_.data()) + offsets[i], f.dtype, f.shape, device_->kind());
  }
  // Two staging slots (model_runner.h), each with its pinned results.
  const size_t top_bytes = RunnerShape::TopLogprobBytes(c);
  const size_t adjust_bytes = RunnerShape::AdjustmentBytes(c);
  for (Slot& slot : slots_) {
    MLAG_ASSIGN_OR_RETURN(slot.staging, device_->AllocatePinned(bytes));
    std::memset(slot.staging.data(), 0, bytes);
    for (size_t i = 0; i < std::size(fields); ++i) {
      const Field& f = fields[i];
      slot.staged.*f.staged = Tensor(static_cast<char*>(slot.staging.data()) + offsets[i], f.dtype,
                                     f.shape, DeviceKind::kHost);
    }
    // Nothing fed and no stop tokens, in every row (zeros would read as
    // "take the token of sequence 0"): BeginStaging resets only the rows a
    // step uses, and every row is uploaded.
    std::fill_n(slot.staged.feed_src.data_as<int32_t>(), slot.staged.feed_src.numel(), -1);
    std::fill_n(slot.staged.stop_ids.data_as<int32_t>(), slot.staged.stop_ids.numel(), -1);
    MLAG_ASSIGN_OR_RETURN(slot.sampled_host, device_->AllocatePinned(S * sizeof(int32_t)));
    MLAG_ASSIGN_OR_RETURN(slot.adjustments_host, device_->AllocatePinned(adjust_bytes));
    if (stream_->is_cuda()) {
      MLAG_ASSIGN_OR_RETURN(slot.top_logprobs_host, device_->AllocatePinned(top_bytes));
    }
    MLAG_ASSIGN_OR_RETURN(slot.done, StreamEvent::Create(stream_.get()));
  }
  MLAG_RETURN_IF_ERROR(stream_->CopyFromHost(inputs_.data(), slots_[0].staging.data(), bytes));
  // The sampled tokens.
  MLAG_ASSIGN_OR_RETURN(Buffer sampled, device_->Allocate(S * sizeof(int32_t)));
  MLAG_RETURN_IF_ERROR(stream_->Memset(sampled.data(), 0, sampled.bytes()));
  sampled_ = sampled.AsTensor(DType::kI32, {S});
  buffers_.push_back(std::move(sampled));
  if (stream_->is_cuda()) {
    MLAG_ASSIGN_OR_RETURN(top_logprobs_, device_->Allocate(top_bytes));
  }
  // The logit adjustments: only entries [0, A) of a step are uploaded, and
  // adjust_offsets_ (zeros until then) names no others.
  const int64_t A = int64_t{c.max_num_seqs} * kMaxLogitAdjustmentsPerSeq;
  MLAG_ASSIGN_OR_RETURN(adjustments_, device_->Allocate(adjust_bytes));
  adjust_tokens_ = Tensor(adjustments_.data(), DType::kI32, {A}, device_->kind());
  adjust_deltas_ =
      Tensor(static_cast<int32_t*>(adjustments_.data()) + A, DType::kF32, {A}, device_->kind());
  return stream_->Synchronize();
}

std::vector<std::pair<std::string, size_t>> ModelRunner::AllocatedBytes() const {
  size_t kv = 0;
  for (const Tensor& cache : kv_caches_) kv += cache.nbytes();
  size_t statics =
      inputs_.bytes() + sampled_.nbytes() + top_logprobs_.bytes() + adjustments_.bytes();
  if (!stream_->is_cuda()) {
    for (const Slot& slot : slots_) {
      statics += slot.staging.bytes() + slot.sampled_host.bytes() + slot.top_logprobs_host.bytes() +
                 slot.adjustments_host.bytes();
    }
  }
  return {{"weights", model_->weight_bytes()},
          {"rope table", model_->rope_table_bytes()},
          {"activations", model_->activation_bytes()},
          {"static buffers", statics},
          {"KV cache", kv}};
}

size_t ModelRunner::kv_bytes_per_token() const {
  const ModelConfig& mc = model_->config();
  return static_cast<size_t>(mc.num_hidden_layers) * mc.kv_cache_row() *
         DTypeSize(config_.kv_dtype);
}

const Graph* ModelRunner::graph(int size) const {
  auto it = graphs_.find(size);
  return it == graphs_.end() ? nullptr : it->second.get();
}

int ModelRunner::PaddedSize(int n) const {
  for (int s : capture_sizes_) {
    if (s >= n) return s;
  }
  return 0;
}

AttentionMetadata ModelRunner::Metadata(int num_tokens, int num_seqs, bool decode_only) const {
  AttentionMetadata m;
  m.num_tokens = num_tokens;
  m.num_seqs = num_seqs;
  m.decode_only = decode_only;
  m.input_ids = Rows(input_ids_, num_tokens);
  m.positions = Rows(positions_, num_tokens);
  m.slot_mapping = Rows(slot_mapping_, num_tokens);
  m.block_table = Rows(block_table_, num_seqs);
  m.seq_lens = Rows(seq_lens_, num_seqs);
  m.query_start_loc = Rows(query_start_loc_, num_seqs + 1);
  m.logits_indices = Rows(logits_indices_, num_seqs);
  return m;
}

absl::Status ModelRunner::RunOps(const AttentionMetadata& meta) {
  const int B = meta.num_seqs;
  {
    // First: tokens the previous step sampled, where this step takes them
    // from the device (every feed_src is -1 otherwise: no row changes).
    NodeScope s(*stream_, "feed_sampled", OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(FeedSampledTokens(*stream_, Rows(feed_src_, B), Rows(stop_ids_, B),
                                           meta.query_start_loc, sampled_, meta.input_ids,
                                           meta.slot_mapping));
  }
  MLAG_RETURN_IF_ERROR(model_->Forward(*stream_, meta));
  {
    // logit_bias and the penalties (every offset is 0 in a step without).
    NodeScope s(*stream_, "adjust_logits", OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(AdjustLogits(*stream_, model_->logits(B), Rows(adjust_offsets_, B + 1),
                                      adjust_tokens_, adjust_deltas_));
  }
  NodeScope s(*stream_, "sample", OpKind::kKernel);
  return Sample(*stream_, model_->logits(B), Rows(temperature_, B), Rows(top_k_, B),
                Rows(top_p_, B), Rows(seeds_, B), Rows(steps_, B), Rows(sampled_, B));
}

int ModelRunner::steps_in_flight() const {
  return (slots_[0].step.id != 0 ? 1 : 0) + (slots_[1].step.id != 0 ? 1 : 0);
}

absl::Status ModelRunner::RefuseWhileInFlight(absl::string_view what) const {
  if (steps_in_flight() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, " with ", steps_in_flight(), " step(s) in flight: collect them first"));
}

absl::StatusOr<ModelRunner::Staging> ModelRunner::BeginStaging(int rows, int seqs) {
  // The slot's pinned memory is the source of an upload and the target of
  // copies back that may still be queued: wait for its last use before
  // writing over it (a failed wait leaves it queued, so it is not touched).
  Slot& slot = slots_[slot_];
  if (slot.step.id != 0) {
    return absl::FailedPreconditionError(
        "two steps are in flight: collect the older before launching another");
  }
  MLAG_RETURN_IF_ERROR(slot.done->Wait());
  const StagedInputs& in = slot.staged;
  Staging st;
  st.ids = in.input_ids.data_as<int32_t>();
  st.positions = in.positions.data_as<int32_t>();
  st.slots = in.slot_mapping.data_as<int64_t>();
  st.block_table = in.block_table.data_as<int32_t>();
  st.seq_lens = in.seq_lens.data_as<int32_t>();
  st.qsl = in.query_start_loc.data_as<int32_t>();
  st.logits_idx = in.logits_indices.data_as<int32_t>();
  st.temperature = in.temperature.data_as<float>();
  st.top_k = in.top_k.data_as<int32_t>();
  st.top_p = in.top_p.data_as<float>();
  st.seeds = in.seeds.data_as<int64_t>();
  st.steps = in.steps.data_as<int64_t>();
  st.logprobs_k = in.logprobs_k.data_as<int32_t>();
  st.feed_src = in.feed_src.data_as<int32_t>();
  st.stop_ids = in.stop_ids.data_as<int32_t>();
  st.adjust_offsets = in.adjust_offsets.data_as<int32_t>();
  // Dummy values in the rows this step uses: token 0, position 0, slot -1,
  // null blocks, seq_len 0, greedy sampling, no log-probabilities, nothing
  // fed from the previous step, no logit adjustments.
  std::fill_n(st.ids, rows, 0);
  std::fill_n(st.positions, rows, 0);
  std::fill_n(st.slots, rows, int64_t{-1});
  std::fill_n(st.block_table, static_cast<size_t>(seqs) * max_blocks_per_seq_, 0);
  std::fill_n(st.seq_lens, seqs, 0);
  std::fill_n(st.qsl, seqs + 1, 0);
  std::fill_n(st.logits_idx, seqs, 0);
  std::fill_n(st.temperature, seqs, 0.0f);
  std::fill_n(st.top_k, seqs, 0);
  std::fill_n(st.top_p, seqs, 1.0f);
  std::fill_n(st.seeds, seqs, int64_t{0});
  std::fill_n(st.steps, seqs, int64_t{0});
  std::fill_n(st.logprobs_k, seqs, 0);
  std::fill_n(st.feed_src, seqs, -1);
  std::fill_n(st.stop_ids, static_cast<size_t>(seqs) * kMaxFeedStopIds, -1);
  std::fill_n(st.adjust_offsets, seqs + 1, 0);
  return st;
}

absl::Status ModelRunner::UploadStaging(int seqs) {
  const size_t bytes =
      block_table_offset_ + static_cast<size_t>(seqs) * max_blocks_per_seq_ * sizeof(int32_t);
  return stream_->CopyFromHost(inputs_.data(), slots_[slot_].staging.data(), bytes);
}

absl::Status ModelRunner::EndSlot() {
  MLAG_RETURN_IF_ERROR(slots_[slot_].done->Record());
  slot_ ^= 1;
  return absl::OkStatus();
}

absl::Status ModelRunner::FillDummy(const StepPlan& plan) {
  const int rows = plan.rows;
  const int seqs = plan.decode ? rows : 1;
  MLAG_ASSIGN_OR_RETURN(Staging st, BeginStaging(rows, seqs));
  if (plan.decode) {
    for (int i = 0; i < rows; ++i) {
      st.qsl[i + 1] = i + 1;
      st.logits_idx[i] = i;
    }
  }  // else one empty sequence: qsl = [0, 0], every token row belongs to none
  MLAG_RETURN_IF_ERROR(UploadStaging(seqs));
  feedable_seqs_ = 0;  // the dummy run's sampling replaces sampled_
  return EndSlot();
}

absl::Status ModelRunner::DummyStep(const StepPlan& plan) {
  MLAG_RETURN_IF_ERROR(RefuseWhileInFlight("a dummy step"));
  const int limit = plan.decode ? std::min(max_rows_, max_seq_rows_) : max_rows_;
  if (plan.rows < 1 || plan.rows > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("dummy step of ", plan.rows, " rows; the runner holds at most ", limit));
  }
  MLAG_RETURN_IF_ERROR(FillDummy(plan));
  ++stats_.dummy_steps;
  last_rows_ = plan.decode ? plan.rows : 1;
  auto it = plan.decode ? graphs_.find(plan.rows) : graphs_.end();
  if (it != graphs_.end()) {
    // Wait for the replay as the eager path does: the next step's uploads
    // overwrite the input buffers this graph reads.
    MLAG_RETURN_IF_ERROR(it->second->Replay(*stream_));
  } else {
    MLAG_RETURN_IF_ERROR(
        RunOps(plan.decode ? Metadata(plan.rows, plan.rows, true) : Metadata(plan.rows, 1, false)));
  }
  return stream_->Synchronize();
}

absl::Status ModelRunner::SaveAndClearMetadata() {
  MLAG_RETURN_IF_ERROR(RefuseWhileInFlight("saving the metadata"));
  saved_metadata_.clear();
  for (const Tensor* t : {&slot_mapping_, &block_table_, &seq_lens_, &query_start_loc_,
                          &logits_indices_, &positions_, &input_ids_, &feed_src_}) {
    std::vector<char> bytes(t->nbytes());
    MLAG_RETURN_IF_ERROR(device_->CopyToHost(bytes.data(), t->data(), bytes.size()));
    saved_metadata_.push_back(std::move(bytes));
  }
  return FillDummy(StepPlan{std::min(max_rows_, max_seq_rows_), true});
}

absl::Status ModelRunner::RestoreMetadata() {
  if (saved_metadata_.empty()) return absl::FailedPreconditionError("no saved metadata");
  // The dummy upload from a pinned slot may still be queued: it must land
  // before the saved values do.
  MLAG_RETURN_IF_ERROR(stream_->Synchronize());
  size_t i = 0;
  for (const Tensor* t : {&slot_mapping_, &block_table_, &seq_lens_, &query_start_loc_,
                          &logits_indices_, &positions_, &input_ids_, &feed_src_}) {
    MLAG_RETURN_IF_ERROR(
        device_->CopyFromHost(t->data(), saved_metadata_[i].data(), saved_metadata_[i].size()));
    ++i;
  }
  saved_metadata_.clear();
  return absl::OkStatus();
}

StepPlan ModelRunner::Plan(absl::Span<const StepSequence> seqs) const {
  int tokens = 0;
  bool decode = !seqs.empty();
  for (const StepSequence& s : seqs) {
    tokens += static_cast<int>(s.new_tokens.size());
    decode &= s.new_tokens.size() == 1;
  }
  if (!decode) return StepPlan{tokens, false};
  return Agree(static_cast<int>(seqs.size()), true);
}

StepPlan ModelRunner::Agree(int max_rows, bool all_decode) const {
  if (!all_decode) return StepPlan{max_rows, false};
  const int padded = PaddedSize(max_rows);
  return StepPlan{padded > 0 ? padded : max_rows, true};
}

absl::Status ModelRunner::CaptureGraphs() {
  MLAG_RETURN_IF_ERROR(RefuseWhileInFlight("capturing graphs"));
  graphs_.clear();
  stats_.warmup_seconds = 0.0;
  stats_.capture_seconds = 0.0;
  if (config_.graph_mode == GraphMode::kNone) return absl::OkStatus();
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  for (auto it = capture_sizes_.rbegin(); it != capture_sizes_.rend(); ++it) {
    const int size = *it;
    MLAG_RETURN_IF_ERROR(FillDummy(StepPlan{size, true}));
    // An eager dummy step first makes every lazy allocation and first launch
    // happen outside the capture. On the host one step at the largest size
    // does that for all sizes (its scratch only grows); CUDA warms each size,
    // as kernels chosen for one size may first load at that size.
    if (device_->is_cuda() || it == capture_sizes_.rbegin()) {
      const Clock::time_point t_warm = Clock::now();
      MLAG_RETURN_IF_ERROR(RunOps(Metadata(size, size, true)));
      MLAG_RETURN_IF_ERROR(stream_->Synchronize());
      stats_.warmup_seconds += seconds_since(t_warm);
    }
    const Clock::time_point t_capture = Clock::now();
    MLAG_RETURN_IF_ERROR(stream_->BeginCapture());
    absl::Status recorded = RunOps(Metadata(size, size, true));
    auto graph = stream_->EndCapture();
    MLAG_RETURN_IF_ERROR(recorded);
    if (!graph.ok()) return graph.status();
    graphs_[size] = std::move(*graph);
    stats_.capture_seconds += seconds_since(t_capture);
  }
  const Clock::time_point t_sync = Clock::now();
  MLAG_RETURN_IF_ERROR(stream_->Synchronize());
  stats_.capture_seconds += seconds_since(t_sync);
  return absl::OkStatus();
}

bool ModelRunner::LogprobsOnDevice(int k) const {
  return stream_->is_cuda() && k <= kMaxTopLogprobs;
}

absl::StatusOr<StepResult> ModelRunner::Execute(absl::Span<const StepSequence> seqs,
                                                const StepPlan* plan) {
  MLAG_ASSIGN_OR_RETURN(StepTicket ticket, Launch(seqs, plan));
  return Collect(ticket);
}

absl::StatusOr<StepTicket> ModelRunner::Launch(absl::Span<const StepSequence> seqs,
                                               const StepPlan* plan_in) {
  const int B = static_cast<int>(seqs.size());
  int T = 0;
  bool decode_only = B > 0;
  for (const StepSequence& s : seqs) {
    T += static_cast<int>(s.new_tokens.size());
    decode_only &= s.new_tokens.size() == 1;
  }
  if (B == 0 || T == 0) return absl::InvalidArgumentError("empty step");
  if (B > config_.max_num_seqs || T > config_.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step of ", B, " sequences / ", T, " tokens exceeds max_num_seqs ", config_.max_num_seqs,
        " / max_num_batched_tokens ", config_.max_num_batched_tokens));
  }
  // Pure decode batches are padded to the smallest capture size in both graph
  // modes: kNone runs the padded batch eagerly, so the two modes do the same
  // arithmetic and give bit-identical results.
  const StepPlan plan = plan_in != nullptr ? *plan_in : Plan(seqs);
  if ((plan.decode && (!decode_only || plan.rows < B || plan.rows > max_seq_rows_)) ||
      (!plan.decode && (plan.rows < T || plan.rows > max_rows_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("step plan of ", plan.rows, " rows (", plan.decode ? "decode" : "mixed",
                     ") does not fit ", B, " sequences / ", T, " tokens"));
  }
  // What a fed sequence needs (model_runner.h), checked before anything is
  // staged.
  const int bs = config_.block_size, mb = max_blocks_per_seq_;
  for (int b = 0; b < B; ++b) {
    const StepSequence& s = seqs[b];
    const int n = static_cast<int>(s.new_tokens.size());
    const int end = s.start_position + n;
    if (end > config_.max_model_len || static_cast<int64_t>(s.block_table.size()) * bs < end ||
        static_cast<int>(s.block_table.size()) > mb) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b, ": ", end, " tokens do not fit its ", s.block_table.size(),
                       " blocks or max_model_len ", config_.max_model_len));
    }
    const int V = model_->config().vocab_size;
    const absl::Span<const LogitAdjustment> adj = s.logit_adjustments;
    if (static_cast<int64_t>(adj.size()) > kMaxLogitAdjustmentsPerSeq) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, ": ", adj.size(),
                                                     " logit adjustments, at most ",
                                                     kMaxLogitAdjustmentsPerSeq));
    }
    for (size_t i = 0; i < adj.size(); ++i) {
      if (adj[i].token < 0 || adj[i].token >= V || (i > 0 && adj[i].token <= adj[i - 1].token)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b, ": logit adjustment ", i, " (token ", adj[i].token,
                         ") is outside [0, ", V, ") or not after the one before"));
      }
    }
    if (s.prompt_logprob_targets.size() > s.new_tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b, ": ", s.prompt_logprob_targets.size(),
                       " prompt log-probability targets for ", n, " tokens"));
    }
    for (int32_t target : s.prompt_logprob_targets) {
      if (target < 0 || target >= V) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b, ": prompt token ", target,
                                                       " is outside the vocabulary [0, ", V, ")"));
      }
    }
    if (s.feed_from < 0) continue;
    if (s.feed_from >= feedable_seqs_ || n != 1 ||
        static_cast<int>(s.stop_token_ids.size()) > kMaxFeedStopIds) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", b, " takes the token of sequence ", s.feed_from,
          " of the previous step, which ran ", feedable_seqs_, " sampling sequences; a fed ",
          "sequence has one new token and at most ", kMaxFeedStopIds, " stop tokens (it has ", n,
          " and ", s.stop_token_ids.size(), ")"));
    }
  }
  const bool replay = plan.decode && graphs_enabled_ && graphs_.count(plan.rows) > 0;
  const int rows = plan.rows;
  const int seq_rows = plan.decode ? plan.rows : B;

  MLAG_ASSIGN_OR_RETURN(Staging st, BeginStaging(rows, seq_rows));
  Slot& slot = slots_[slot_];
  InFlight& step = slot.step;
  step = InFlight();
  step.seqs = B;
  step.seq_rows = seq_rows;
  step.rows = rows;
  step.replayed = replay;
  step.sample.assign(B, 0);
  step.logprobs_k.assign(B, 0);
  // On CUDA the top log-probabilities of rows asking for at most
  // kMaxTopLogprobs come from the device, K columns per row; other rows copy
  // their logits to the host at Collect.
  const int V = model_->config().vocab_size;
  int K = 0;
  int t = 0;
  int32_t A = 0;  // logit adjustments staged
  int32_t* adjust_tokens = static_cast<int32_t*>(slot.adjustments_host.data());
  float* adjust_deltas = reinterpret_cast<float*>(adjust_tokens + adjust_tokens_.numel());
  step.prompt_k.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    const StepSequence& s = seqs[b];
    const int n = static_cast<int>(s.new_tokens.size());
    const int end = s.start_position + n;
    for (size_t i = 0; i < s.prompt_logprob_targets.size(); ++i) {
      step.prompt_rows.push_back(t + static_cast<int32_t>(i));
      step.prompt_targets.push_back(s.prompt_logprob_targets[i]);
      step.prompt_seq.push_back(b);
    }
    step.prompt_k[b] = std::max(0, std::min(s.sampling.prompt_logprobs, V));
    st.adjust_offsets[b] = A;
    if (s.sample) {
      for (const LogitAdjustment& a : s.logit_adjustments) {
        adjust_tokens[A] = a.token;
        adjust_deltas[A] = a.delta;
        ++A;
      }
      step.penalties |= s.sampling.has_penalties();
    }
    st.adjust_offsets[b + 1] = A;
    for (int i = 0; i < n; ++i, ++t) {
      const int pos = s.start_position + i;
      st.ids[t] = s.new_tokens[i];
      st.positions[t] = pos;
      st.slots[t] = int64_t{s.block_table[pos / bs]} * bs + pos % bs;
    }
    std::copy(s.block_table.begin(), s.block_table.end(), st.block_table + int64_t{b} * mb);
    st.seq_lens[b] = end;
    st.qsl[b + 1] = t;
    st.logits_idx[b] = t - 1;
    st.temperature[b] = s.sampling.temperature;
    st.top_k[b] = s.sampling.top_k;
    st.top_p[b] = s.sampling.top_p;
    st.seeds[b] = static_cast<int64_t>(s.sampling.seed);
    st.steps[b] = s.output_index;
    if (s.feed_from >= 0) {
      st.feed_src[b] = s.feed_from;
      std::copy(s.stop_token_ids.begin(), s.stop_token_ids.end(),
                st.stop_ids + int64_t{b} * kMaxFeedStopIds);
    }
    step.sample[b] = s.sample ? 1 : 0;
    const int k = s.sample ? std::max(0, std::min(s.sampling.logprobs, V)) : 0;
    step.logprobs_k[b] = k;
    st.logprobs_k[b] = k > 0 && LogprobsOnDevice(k) ? k : 0;
    step.host_logprobs |= k > 0 && !LogprobsOnDevice(k);
    K = std::max(K, st.logprobs_k[b]);
  }
  step.top_k_cols = K;
  // Padding (decode plans): dummy tokens, one per padded sequence. Mixed plans
  // pad with token rows of no sequence (already dummy in the staging).
  for (int b = B; b < seq_rows; ++b) {
    st.qsl[b + 1] = st.qsl[b] + 1;
    st.logits_idx[b] = st.qsl[b];
    st.adjust_offsets[b + 1] = A;
  }
  MLAG_RETURN_IF_ERROR(UploadStaging(seq_rows));
  if (A > 0) {
    // Only the entries the offsets name.
    MLAG_RETURN_IF_ERROR(
        stream_->CopyFromHost(adjust_tokens_.data(), adjust_tokens, A * sizeof(int32_t)));
    MLAG_RETURN_IF_ERROR(
        stream_->CopyFromHost(adjust_deltas_.data(), adjust_deltas, A * sizeof(float)));
  }

  last_rows_ = seq_rows;
  if (replay) {
    MLAG_RETURN_IF_ERROR(graphs_[plan.rows]->Replay(*stream_));
    ++stats_.graph_replays[plan.rows];
  } else {
    MLAG_RETURN_IF_ERROR(RunOps(Metadata(rows, seq_rows, plan.decode)));
    ++stats_.eager_steps;
  }
  MLAG_RETURN_IF_ERROR(
      stream_->CopyToHost(slot.sampled_host.data(), sampled_.data(), B * sizeof(int32_t)));
  // Tokens [B, K] then logprobs [B, K], contiguous: one copy back.
  if (K > 0) {
    const int64_t top_count = int64_t{B} * K;
    int32_t* out = static_cast<int32_t*>(top_logprobs_.data());
    const Tensor out_tokens(out, DType::kI32, {B, K}, device_->kind());
    const Tensor out_logprobs(out + top_count, DType::kF32, {B, K}, device_->kind());
    MLAG_RETURN_IF_ERROR(TopLogprobs(*stream_, Rows(model_->logits(seq_rows), B),
                                     Rows(logprobs_k_, B), out_tokens, out_logprobs));
    MLAG_RETURN_IF_ERROR(stream_->CopyToHost(slot.top_logprobs_host.data(), top_logprobs_.data(),
                                             2 * top_count * sizeof(int32_t)));
  }
  step.id = next_ticket_++;
  last_launched_ = step.id;
  feedable_seqs_ = B;
  MLAG_RETURN_IF_ERROR(EndSlot());
  return StepTicket{step.id};
}

absl::Status ModelRunner::PromptLogprobs(const InFlight& step, StepResult* result) {
  result->prompt_logprobs.resize(step.seqs);
  if (step.prompt_rows.empty()) return absl::OkStatus();
  // The LM head over the step's hidden states at the asked rows, in groups
  // that fit the logits buffer (the step's own logits are read by now).
  // Rare (echo): the logits travel to the host and are ranked there.
  const int V = model_->config().vocab_size;
  const int64_t total = static_cast<int64_t>(step.prompt_rows.size());
  std::vector<float> logits;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
  for (int64_t g = 0; g < total; g += max_seq_rows_) {
    const int n = static_cast<int>(std::min<int64_t>(max_seq_rows_, total - g));
    MLAG_RETURN_IF_ERROR(
        stream_->CopyFromHost(logits_indices_.data(), &step.prompt_rows[g], n * sizeof(int32_t)));
    MLAG_RETURN_IF_ERROR(model_->LogitsOfRows(*stream_, Rows(logits_indices_, n)));
    logits.resize(static_cast<size_t>(n) * V);
    MLAG_RETURN_IF_ERROR(stream_->CopyToHost(logits.data(), model_->logits(n).data(),
                                             logits.size() * sizeof(float)));
    MLAG_RETURN_IF_ERROR(stream_->Synchronize());
    for (int i = 0; i < n; ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * V;
      const int b = step.prompt_seq[g + i];
      PromptLogprob entry;
      entry.logprob = host::TokenLogprob(row, V, step.prompt_targets[g + i]);
      const int k = step.prompt_k[b];
      top_tokens.resize(k);
      top_logprobs.resize(k);
      const int m = host::TopLogprobs(row, V, k, top_tokens.data(), top_logprobs.data());
      for (int j = 0; j < m; ++j) entry.top.push_back({top_tokens[j], top_logprobs[j]});
      result->prompt_logprobs[b].push_back(std::move(entry));
    }
  }
  result->logits_replaced = true;
  return absl::OkStatus();
}

bool ModelRunner::NeedsCollectBeforeNextLaunch(StepTicket ticket) const {
  for (const Slot& slot : slots_) {
    if (slot.step.id == ticket.id) {
      return slot.step.host_logprobs || slot.step.penalties || !slot.step.prompt_rows.empty();
    }
  }
  return false;
}

absl::StatusOr<StepResult> ModelRunner::Collect(StepTicket ticket) {
  Slot* found = nullptr;
  uint64_t oldest = 0;
  for (Slot& slot : slots_) {
    if (slot.step.id == 0) continue;
    if (oldest == 0 || slot.step.id < oldest) oldest = slot.step.id;
    if (slot.step.id == ticket.id) found = &slot;
  }
  if (found == nullptr || ticket.id != oldest) {
    return absl::FailedPreconditionError(
        absl::StrCat("collecting step ", ticket.id, ", which is ",
                     found == nullptr ? "not in flight" : "not the oldest in flight"));
  }
  Slot& slot = *found;
  const InFlight& step = slot.step;
  if ((step.host_logprobs || !step.prompt_rows.empty()) && last_launched_ != step.id) {
    return absl::FailedPreconditionError(
        "a step whose log-probabilities come from its logits or hidden states was collected "
        "after a later launch replaced them");
  }
  MLAG_RETURN_IF_ERROR(slot.done->Wait());
  const int B = step.seqs, K = step.top_k_cols;
  const int V = model_->config().vocab_size;
  StepResult result;
  result.replayed = step.replayed;
  result.padded_size = step.rows;
  result.tokens.assign(B, -1);
  result.logprobs.resize(B);
  const int32_t* sampled = static_cast<const int32_t*>(slot.sampled_host.data());
  const int32_t* device_tokens = static_cast<const int32_t*>(slot.top_logprobs_host.data());
  const float* device_logprobs = reinterpret_cast<const float*>(device_tokens + int64_t{B} * K);
  std::vector<float> row, top_logprobs;
  std::vector<int32_t> top_tokens;
  for (int b = 0; b < B; ++b) {
    if (!step.sample[b]) continue;
    result.tokens[b] = sampled[b];
    const int k = step.logprobs_k[b];
    if (k <= 0) continue;
    // Top-k log-probabilities of the model's distribution at this position.
    if (LogprobsOnDevice(k)) {
      for (int i = 0; i < k; ++i) {
        const int64_t at = int64_t{b} * K + i;
        result.logprobs[b].push_back({device_tokens[at], device_logprobs[at]});
      }
      continue;
    }
    row.resize(V);
    MLAG_RETURN_IF_ERROR(stream_->CopyToHost(
        row.data(),
        static_cast<const float*>(model_->logits(step.seq_rows).data()) + int64_t{b} * V,
        V * sizeof(float)));  // into pageable memory: returns with the data
    top_tokens.resize(k);
    top_logprobs.resize(k);
    const int n = host::TopLogprobs(row.data(), V, k, top_tokens.data(), top_logprobs.data());
    for (int i = 0; i < n; ++i) result.logprobs[b].push_back({top_tokens[i], top_logprobs[i]});
  }
  MLAG_RETURN_IF_ERROR(PromptLogprobs(step, &result));
  slot.step = InFlight();
  return result;
}

}  // namespace mlag
