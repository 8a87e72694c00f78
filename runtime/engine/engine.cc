#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/sampling.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/status.h"
#include "runtime/engine/model_tokenizer.h"

namespace mlag {

DType DefaultKvCacheDtype(const Device& device) {
  return device.is_cuda() ? DType::kBF16 : DType::kF32;
}

absl::StatusOr<MemoryPlanRequest> MemoryPlanRequestFor(const EngineOptions& options,
                                                       const Device& device) {
  MemoryPlanRequest r;
  RunnerConfig& rc = r.runner;
  rc.kv_dtype = DefaultKvCacheDtype(device);
  if (options.kv_cache_dtype != "auto") {
    MLAG_ASSIGN_OR_RETURN(rc.kv_dtype, ParseDType(options.kv_cache_dtype));
    if (rc.kv_dtype != DType::kF32 && rc.kv_dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache dtype '", options.kv_cache_dtype,
                                                     "': expected auto, f32 or bf16"));
    }
  }
  rc.max_num_seqs = options.max_num_seqs;
  rc.max_num_batched_tokens = options.max_num_batched_tokens;
  rc.max_model_len = options.max_model_len;
  rc.block_size = options.block_size;
  rc.graph_mode = options.graph_mode;
  MLAG_ASSIGN_OR_RETURN(rc.weight_format, ParseWeightFormat(options.weight_dtype));
  rc.capture_sizes = options.capture_sizes;
  rc.local_experts = options.local_experts;
  rc.max_ep_ranks =
      std::max(options.max_ep_ranks, options.ep_group != nullptr ? options.ep_group->size() : 1);
  r.kv_cache_bytes = options.kv_cache_bytes;
  r.reconfiguration_expert_slots = options.reconfiguration_expert_slots;
  r.memory_utilization = options.memory_utilization;
  // Host ranks of an expert-parallel group share the host's memory: each
  // plans for its part of the largest group it may join.
  r.memory_share = options.memory_share / (device.is_cuda() ? 1 : rc.max_ep_ranks);
  return r;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  if (options.block_size < 1) return absl::InvalidArgumentError("block size must be >= 1");
  constexpr int kMaxSeqs = 1 << 16, kMaxTokens = 1 << 20, kMaxBlockSize = 1 << 16;
  if (options.max_num_seqs < 1 || options.max_num_seqs > kMaxSeqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs must be in [1, ", kMaxSeqs, "], got ", options.max_num_seqs));
  }
  if (options.max_num_batched_tokens < 1 || options.max_num_batched_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_num_batched_tokens must be in [1, ",
                                                   kMaxTokens, "], got ",
                                                   options.max_num_batched_tokens));
  }
  if (options.block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block size must be at most ", kMaxBlockSize, ", got ", options.block_size));
  }
  MLAG_ASSIGN_OR_RETURN(e->device_, Device::Create(options.device));
  const absl::Time t_open = absl::Now();
  MLAG_ASSIGN_OR_RETURN(ModelSource source, OpenModel(options.model));
  e->open_model_seconds_ = absl::ToDoubleSeconds(absl::Now() - t_open);
  source.weights->SetScanNonFinite(!options.trust_weights);
  e->description_ = source.description;
  e->model_config_ = source.config;
  if (options.chat_format != "auto") {
    MLAG_RETURN_IF_ERROR(ParseChatFormat(options.chat_format).status());
  }
  if (options.step_overlap != "auto" && options.step_overlap != "on" &&
      options.step_overlap != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("step overlap '", options.step_overlap, "': expected auto, on or off"));
  }
  if (options.step_overlap == "on" && options.ep_group != nullptr) {
    return absl::InvalidArgumentError(
        "step overlap is not available with an expert-parallel group (its ranks agree on each "
        "step's shape before launching it)");
  }
  e->overlap_ =
      options.ep_group == nullptr &&
      (options.step_overlap == "on" || (options.step_overlap == "auto" && e->device_->is_cuda()));
  // Everything sized before anything is allocated.
  MLAG_ASSIGN_OR_RETURN(MemoryPlanRequest plan_request, MemoryPlanRequestFor(options, *e->device_));
  MLAG_ASSIGN_OR_RETURN(e->memory_plan_, PlanMemory(source, e->device_.get(), plan_request));
  e->max_model_len_ = e->memory_plan_.max_model_len;
  RunnerConfig rc = plan_request.runner;
  rc.max_model_len = e->max_model_len_;
  rc.num_blocks = e->memory_plan_.kv_blocks;
  MLAG_ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(source, e->device_.get(), rc));
  if (options.ep_peer_timeout > absl::ZeroDuration()) {
    Engine* engine = e.get();
    e->runner_->stream().SetWatchdog(
        options.ep_peer_timeout,
        [engine]() -> absl::Status {
          const EngineOptions& o = engine->options_;
          if (o.ep_control != nullptr) MLAG_RETURN_IF_ERROR(o.ep_control->Health());
          return o.ep_group != nullptr ? o.ep_group->Health() : absl::OkStatus();
        },
        [engine](absl::Duration waited) {
          // The device work cannot say which peer it waits for.
          const Communicator* group = engine->options_.ep_group;
          return PeerTimeoutError(group != nullptr ? group->rank() : -1,
                                  group != nullptr ? group->size() : 0,
                                  "the step's collectives (stream watchdog)", waited);
        });
  }
  MLAG_RETURN_IF_ERROR(e->runner_->SetExpertGroup(options.ep_group));
  if (options.ep_group != nullptr) {
    // Every rank has loaded its model before any waits in a collective with
    // the (shorter) peer timeout.
    Communicator* rendezvous =
        options.ep_control != nullptr ? options.ep_control : options.ep_group;
    const absl::Duration bound = options.ep_startup_timeout > absl::ZeroDuration()
                                     ? options.ep_startup_timeout
                                     : options.ep_peer_timeout;
    MLAG_RETURN_IF_ERROR(
        AtStep(bound > absl::ZeroDuration() ? rendezvous->Barrier(bound) : rendezvous->Barrier(),
               "start-up (the ranks loading their models)"));
  }
  absl::Status captured = e->runner_->CaptureGraphs();
  if (IsPeerTimeout(captured)) captured = AtStep(captured, "start-up (graph capture)");
  MLAG_RETURN_IF_ERROR(captured);
  e->kv_ =
      std::make_unique<KvCacheManager>(rc.num_blocks, rc.block_size, options.enable_prefix_caching);
  SchedulerConfig sc;
  sc.max_num_seqs = options.max_num_seqs;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_model_len = e->max_model_len_;
  sc.max_fed_stop_ids = e->overlap_ ? kMaxFeedStopIds : 0;
  e->scheduler_ = std::make_unique<Scheduler>(sc, e->kv_.get());
  return e;
}

absl::StatusOr<const Tokenizer*> Engine::tokenizer() const {
  std::lock_guard<std::mutex> lock(tokenizer_mu_);
  if (!tokenizer_loaded_) {
    tokenizer_loaded_ = true;
    tokenizer_ = OpenModelTokenizer(options_.model, model_config_);
    if (!tokenizer_.ok() && absl::IsNotFound(tokenizer_.status())) {
      tokenizer_ = absl::FailedPreconditionError(
          absl::StrCat("model ", options_.model,
                       " has no tokenizer.json: text needs one (token ids work without)"));
    }
    if (tokenizer_.ok() && options_.chat_format != "auto") {
      (*tokenizer_)->set_chat_format(*ParseChatFormat(options_.chat_format));
    }
  }
  if (!tokenizer_.ok()) return tokenizer_.status();
  return tokenizer_->get();
}

absl::StatusOr<RequestId> Engine::AddRequest(const RequestSpec& spec) {
  return AddRequestWithId(spec, next_id_);
}

absl::StatusOr<RequestId> Engine::AddRequestWithId(const RequestSpec& spec, RequestId id) {
  if (requests_.count(id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("request id ", id, " is already in use"));
  }
  MLAG_RETURN_IF_ERROR(ValidateRequest(spec));
  auto req = std::make_unique<Request>();
  req->id = id;
  next_id_ = std::max(next_id_, id + 1);
  req->spec = spec;
  req->tokens = spec.prompt;
  req->num_prompt_tokens = static_cast<int>(spec.prompt.size());
  Request* raw = req.get();
  requests_[raw->id] = std::move(req);
  scheduler_->Add(raw);
  return raw->id;
}

absl::Status Engine::ValidateRequest(const RequestSpec& spec) const {
  const int vocab = config().vocab_size;
  if (spec.prompt.empty()) return absl::InvalidArgumentError("request has an empty prompt");
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " has id ", spec.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (spec.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens is ", spec.max_tokens, "; it must be at least 1"));
  }
  const int64_t total = static_cast<int64_t>(spec.prompt.size()) + spec.max_tokens;
  if (total > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", spec.prompt.size(),
                                                   " tokens) + max_tokens (", spec.max_tokens,
                                                   ") exceeds max_model_len ", max_model_len_));
  }
  const int64_t blocks_needed = (total + kv_->block_size() - 1) / kv_->block_size();
  if (blocks_needed > kv_->num_blocks() - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request needs ", blocks_needed, " KV blocks but the pool holds ",
                     kv_->num_blocks() - 1, "; raise --kv-cache-bytes"));
  }
  for (int32_t stop : spec.stop_token_ids) {
    if (stop < 0 || stop >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", stop, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const SamplingParams& sp = spec.sampling;
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p is ", sp.top_p, "; it must be in (0, 1]"));
  }
  if (sp.logprobs < 0 || sp.logprobs > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs is ", sp.logprobs, "; it must be in [0, ", vocab, "]"));
  }
  if (!std::isfinite(sp.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature is ", sp.temperature, "; it must be a finite number"));
  }
  if (static_cast<int64_t>(sp.logit_bias.size()) > kMaxLogitBias) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias has ", sp.logit_bias.size(), " entries; at most ", kMaxLogitBias));
  }
  std::set<int32_t> biased;
  for (const LogitAdjustment& b : sp.logit_bias) {
    if (b.token < 0 || b.token >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ", b.token, " is outside the vocabulary [0, ", vocab, ")"));
    }
    if (!(b.delta >= -100.0f && b.delta <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias of token ", b.token, " is ",
                                                     b.delta, "; it must be in [-100, 100]"));
    }
    if (!biased.insert(b.token).second) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias names token ", b.token, " twice"));
    }
  }
  for (const auto& [name, value] :
       {std::pair<const char*, float>{"presence_penalty", sp.presence_penalty},
        {"frequency_penalty", sp.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is ", value, "; it must be in [-2, 2]"));
    }
  }
  // A step's adjustments of one sequence: its bias plus, with penalties, one
  // per distinct token generated.
  const int64_t adjustments =
      static_cast<int64_t>(sp.logit_bias.size()) + (sp.has_penalties() ? spec.max_tokens : 0);
  if (adjustments > kMaxLogitAdjustmentsPerSeq) {
    return absl::InvalidArgumentError(
        absl::StrCat("with presence or frequency penalties, max_tokens (", spec.max_tokens,
                     ") + logit_bias entries (", sp.logit_bias.size(), ") must be at most ",
                     kMaxLogitAdjustmentsPerSeq));
  }
  if (sp.prompt_logprobs < -1 || sp.prompt_logprobs > vocab) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs is ", sp.prompt_logprobs,
                                                   "; it must be -1 (none) or in [0, ", vocab,
                                                   "]"));
  }
  return absl::OkStatus();
}

namespace {

// Appends what `from` collected to `into` (the steps in order).
// Logits rows stay only when every token came from the one step collected.
void AppendCollected(StepOutput from, StepOutput* into) {
  if (into->new_tokens.empty()) {
    into->logits_rows = std::move(from.logits_rows);
  } else {
    into->logits_rows.clear();
  }
  into->new_tokens.insert(into->new_tokens.end(), from.new_tokens.begin(), from.new_tokens.end());
  into->finished.insert(into->finished.end(), from.finished.begin(), from.finished.end());
  into->preempted.insert(into->preempted.end(), from.preempted.begin(), from.preempted.end());
  into->num_tokens += from.num_tokens;
  if (from.padded_size > 0) {
    into->replayed = from.replayed;
    into->padded_size = from.padded_size;
  }
}

}  // namespace

absl::StatusOr<StepOutput> Engine::Step() {
  StepOutput out = std::move(undelivered_);
  undelivered_ = StepOutput();
  if (!in_flight_.empty()) scheduler_->RetireEndingByLength(in_flight_.back().sched);
  SchedulerOutput sched = scheduler_->Schedule();
  out.preempted.insert(out.preempted.end(), sched.preempted.begin(), sched.preempted.end());
  // A pending token is fed from the step in flight, which sampled it (at
  // most one step is in flight here): its row there.
  std::map<RequestId, int> fed_rows;
  if (!in_flight_.empty()) {
    const std::vector<RequestId>& ids = in_flight_.back().ids;
    for (size_t i = 0; i < ids.size(); ++i) fed_rows[ids[i]] = static_cast<int>(i);
  }
  static const int32_t kPlaceholder = 0;
  std::vector<StepSequence> seqs(sched.scheduled.size());
  std::vector<std::vector<LogitAdjustment>> adjustments(sched.scheduled.size());
  for (size_t i = 0; i < sched.scheduled.size(); ++i) {
    const ScheduledRequest& s = sched.scheduled[i];
    const Request& r = *s.request;
    StepSequence& q = seqs[i];
    if (s.fed) {
      auto row = fed_rows.find(r.id);
      if (row == fed_rows.end()) {
        return absl::InternalError(
            absl::StrCat("request ", r.id, " has a pending token but no step in flight"));
      }
      q.new_tokens = absl::Span<const int32_t>(&kPlaceholder, 1);
      q.feed_from = row->second;
      q.stop_token_ids = r.spec.stop_token_ids;
    } else {
      q.new_tokens = absl::Span<const int32_t>(r.tokens.data() + r.num_computed_tokens,
                                               static_cast<size_t>(s.num_new_tokens));
    }
    q.start_position = r.num_computed_tokens;
    q.block_table = kv_->block_table(r.id);
    q.sample = s.samples;
    q.sampling = r.spec.sampling;
    q.output_index = r.num_output_tokens() + r.num_pending_tokens;
    const SamplingParams& sp = r.spec.sampling;
    if (q.sample && (!sp.logit_bias.empty() || sp.has_penalties())) {
      // Penalized steps are collected before the next launch (the runner
      // says so), so every token the request generated is known here.
      if (sp.has_penalties() && r.num_pending_tokens > 0) {
        return absl::InternalError(
            absl::StrCat("request ", r.id, " has penalties and a token not yet collected"));
      }
      adjustments[i] =
          LogitAdjustments(sp, absl::MakeConstSpan(r.tokens).subspan(r.num_prompt_tokens));
      q.logit_adjustments = adjustments[i];
    }
    if (sp.prompt_logprobs >= 0 && !s.fed) {
      // Row j of this chunk predicts token start + j + 1, for those in the
      // prompt.
      const int start = r.num_computed_tokens;
      const int m = std::max(0, std::min(s.num_new_tokens, r.num_prompt_tokens - 1 - start));
      q.prompt_logprob_targets = absl::MakeConstSpan(r.tokens).subspan(start + 1, m);
    }
  }
  StepPlan plan = sched.empty() ? StepPlan{0, true} : runner_->Plan(seqs);
  Communicator* group = options_.ep_group;
  if (group != nullptr) {
    // Lockstep: one shape for every rank of the group (never overlapped).
    MLAG_ASSIGN_OR_RETURN(int64_t rows, group->AllReduceScalar(plan.rows, ReduceOp::kMax));
    MLAG_ASSIGN_OR_RETURN(int64_t all_decode,
                          group->AllReduceScalar(plan.decode ? 1 : 0, ReduceOp::kMin));
    if (rows == 0) return out;  // no rank has work
    plan = runner_->Agree(static_cast<int>(rows), all_decode == 1);
    if (sched.empty()) {
      MLAG_RETURN_IF_ERROR(runner_->DummyStep(plan));
      out.dummy = true;
      out.padded_size = plan.rows;
      return out;
    }
  }
  bool launched = false;
  if (!sched.empty()) {
    MLAG_ASSIGN_OR_RETURN(StepTicket ticket, runner_->Launch(seqs, &plan));
    scheduler_->Launched(sched);
    ++steps_;
    if (!in_flight_.empty()) ++overlapped_steps_;
    for (const StepSequence& q : seqs) fed_tokens_ += q.feed_from >= 0;
    launched = true;
    last_launched_ = ticket.id;
    InFlightStep step{ticket, std::move(sched), {}, {}};
    for (const ScheduledRequest& s : step.sched.scheduled) step.ids.push_back(s.request->id);
    for (const StepSequence& q : seqs) step.prompt_from.push_back(q.start_position + 1);
    in_flight_.push_back(std::move(step));
  }
  // Without the overlap every step is collected at once; with it, the one
  // just launched stays in flight, unless its log-probabilities come from
  // its logits, which the next launch replaces.
  const bool keep_newest =
      overlap_ && launched && !runner_->NeedsCollectBeforeNextLaunch(in_flight_.back().ticket);
  while (in_flight_.size() > (keep_newest ? 1u : 0u)) {
    StepOutput collected;
    MLAG_RETURN_IF_ERROR(CollectOldest(&collected));
    AppendCollected(std::move(collected), &out);
  }
  return out;
}

absl::Status Engine::CollectOldest(StepOutput* out) {
  InFlightStep step = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  MLAG_ASSIGN_OR_RETURN(StepResult result, runner_->Collect(step.ticket));
  // A request released since is gone: its entry is dropped.
  for (size_t i = 0; i < step.sched.scheduled.size(); ++i) {
    auto it = requests_.find(step.ids[i]);
    step.sched.scheduled[i].request = it == requests_.end() ? nullptr : it->second.get();
  }
  out->num_tokens = step.sched.num_tokens;
  out->replayed = result.replayed;
  out->padded_size = result.padded_size;
  const bool logits_valid = step.ticket.id == last_launched_ && !result.logits_replaced;
  for (size_t i = 0; i < step.sched.scheduled.size(); ++i) {
    const ScheduledRequest& s = step.sched.scheduled[i];
    if (!s.samples || s.request == nullptr || s.request->finished()) continue;
    out->new_tokens.emplace_back(s.request->id, result.tokens[i]);
    if (logits_valid) out->logits_rows.push_back(static_cast<int>(i));
    if (s.request->spec.sampling.logprobs > 0) {
      s.request->logprobs.push_back(std::move(result.logprobs[i]));
    }
  }
  // Prompt log-probabilities, in prompt order: a chunk computed again (after
  // a preemption) adds only what is missing. Entry j - 1 is token j's.
  for (size_t i = 0; i < step.sched.scheduled.size(); ++i) {
    Request* r = step.sched.scheduled[i].request;
    if (r == nullptr || result.prompt_logprobs[i].empty()) continue;
    const int first = step.prompt_from[i];  // the token of entry 0
    for (size_t j = 0; j < result.prompt_logprobs[i].size(); ++j) {
      if (static_cast<size_t>(first) + j == r->prompt_logprobs.size() + 1) {
        r->prompt_logprobs.push_back(std::move(result.prompt_logprobs[i][j]));
      }
    }
  }
  for (Request* r : scheduler_->Sampled(step.sched, result.tokens)) {
    out->finished.push_back(r->id);
  }
  return absl::OkStatus();
}

absl::Status Engine::Drain() {
  while (!in_flight_.empty()) {
    StepOutput collected;
    MLAG_RETURN_IF_ERROR(CollectOldest(&collected));
    AppendCollected(std::move(collected), &undelivered_);
  }
  return absl::OkStatus();
}

std::vector<std::unique_ptr<Request>> Engine::TakeUnfinished() {
  // A step in flight still gives its requests their tokens. If it fails, the
  // requests leave with the tokens known (the failed step's are lost with
  // it, as a failed Step's are).
  Drain().IgnoreError();
  in_flight_.clear();
  std::vector<std::unique_ptr<Request>> taken;
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (it->second->finished()) {
      ++it;
      continue;
    }
    scheduler_->Remove(it->second.get());
    taken.push_back(std::move(it->second));
    it = requests_.erase(it);
  }
  return taken;
}

absl::Status Engine::AdoptRequest(std::unique_ptr<Request> request) {
  if (requests_.count(request->id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("request id ", request->id, " is already in use"));
  }
  // It was validated by the engine it came from, whose limits may differ.
  MLAG_RETURN_IF_ERROR(ValidateRequest(request->spec));
  request->num_computed_tokens = 0;
  request->state = RequestState::kWaiting;
  next_id_ = std::max(next_id_, request->id + 1);
  Request* raw = request.get();
  requests_[raw->id] = std::move(request);
  scheduler_->Add(raw);
  return absl::OkStatus();
}

absl::Status Engine::SetExpertGroup(Communicator* group) {
  MLAG_RETURN_IF_ERROR(Drain());
  if (overlap_ && group != nullptr) {
    // Ranks agree on each step's shape before launching it.
    overlap_ = false;
    scheduler_->set_max_fed_stop_ids(0);
  }
  runner_->DropGraphs();
  MLAG_RETURN_IF_ERROR(runner_->SetExpertGroup(group));
  options_.ep_group = group;
  return absl::OkStatus();
}

absl::Status Engine::Abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  scheduler_->Abort(it->second.get());
  return absl::OkStatus();
}

absl::Status Engine::Release(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  if (!it->second->finished()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, " has not finished"));
  }
  requests_.erase(it);
  return absl::OkStatus();
}

const Request* Engine::request(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

std::vector<RequestId> Engine::request_ids() const {
  std::vector<RequestId> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  return ids;
}

absl::Status Engine::CheckFitsPlan(size_t extra_bytes, absl::string_view what) const {
  size_t held = 0;
  for (const auto& [item, bytes] : runner_->AllocatedBytes()) held += bytes;
  const MemoryPlan& p = memory_plan_;
  // The runtime reserve stays a margin.
  const size_t reserve = p.item_bytes("runtime reserve");
  if (static_cast<double>(held) + reserve + extra_bytes <= static_cast<double>(p.usable_bytes)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " ", FormatBytes(static_cast<double>(extra_bytes)), " + the ",
      FormatBytes(static_cast<double>(held)), " the plan's items hold + runtime reserve ",
      FormatBytes(static_cast<double>(reserve)), " exceed ",
      FormatBytes(static_cast<double>(p.usable_bytes)), " usable (", p.memory_utilization, " of ",
      FormatBytes(static_cast<double>(p.budget.available)), " available: ", p.budget.source,
      ") on ", p.device,
      "; plan for it at start-up (reconfigurations given up front reserve it) or lower "
      "--kv-cache-bytes"));
}

EngineStats Engine::Stats() const {
  EngineStats s;
  const RunnerStats& rs = runner_->stats();
  s.steps = steps_;
  s.overlapped_steps = overlapped_steps_;
  s.fed_tokens = fed_tokens_;
  s.graph_replays = rs.graph_replays;
  s.eager_steps = rs.eager_steps;
  s.dummy_steps = rs.dummy_steps;
  s.prefix_cache_hit_rate = kv_->prefix_cache_hit_rate();
  s.prefix_cache_hit_tokens = kv_->hit_tokens();
  s.kv_blocks_total = kv_->num_blocks() - 1;
  s.kv_blocks_free = kv_->num_free_blocks();
  s.kv_blocks_used = s.kv_blocks_total - s.kv_blocks_free;
  s.kv_bytes_per_token = runner_->kv_bytes_per_token();
  s.kv_block_size = kv_->block_size();
  s.open_model_seconds = open_model_seconds_;
  s.build_model_seconds = rs.build_model_seconds;
  s.kv_pool_seconds = rs.kv_pool_seconds;
  s.warmup_seconds = rs.warmup_seconds;
  s.capture_seconds = rs.capture_seconds;
  s.preemptions = scheduler_->num_preemptions();
  s.num_graphs = runner_->num_graphs();
  s.memory_planned_bytes = memory_plan_.planned_bytes();
  s.memory_usable_bytes = memory_plan_.usable_bytes;
  for (const auto& [item, bytes] : runner_->AllocatedBytes()) s.memory_allocated_bytes += bytes;
  return s;
}

}  // namespace mlag
