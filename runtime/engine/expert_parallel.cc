#include "runtime/engine/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "comm/local_communicator.h"
#include "kernels/host/thread_pool.h"
#include "mlag_config.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/status.h"
#if MLAG_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif
#if MLAG_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace mlag {
namespace {

using Clock = std::chrono::steady_clock;

// `status` with ", at <where>" when it is a peer timeout (which names the
// rank and the peer, but not the step), else unchanged.
absl::Status AtPeerFault(const absl::Status& status, absl::string_view where) {
  return IsPeerTimeout(status) ? AtStep(status, where) : status;
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(int64_t v) {
  uint32_t u = static_cast<uint32_t>(v);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Requests travel between ranks as flat int64 records:
//   id, prompt_len, num_tokens, max_tokens, finish, state, n_stop, stops...,
//   temperature, top_k, top_p, seed, logprobs, presence, frequency,
//   prompt_logprobs, n_bias, (token, bias) * n_bias, tokens..., n_lp, per
//   entry: k, (token, logprob) * k, n_plp, per entry: logprob, k,
//   (token, logprob) * k
void Serialize(const Request& r, std::vector<int64_t>* out) {
  out->push_back(r.id);
  out->push_back(r.num_prompt_tokens);
  out->push_back(r.num_tokens());
  out->push_back(r.spec.max_tokens);
  out->push_back(static_cast<int64_t>(r.finish_reason));
  out->push_back(static_cast<int64_t>(r.state));
  out->push_back(static_cast<int64_t>(r.spec.stop_token_ids.size()));
  for (int32_t s : r.spec.stop_token_ids) out->push_back(s);
  out->push_back(FloatBits(r.spec.sampling.temperature));
  out->push_back(r.spec.sampling.top_k);
  out->push_back(FloatBits(r.spec.sampling.top_p));
  out->push_back(static_cast<int64_t>(r.spec.sampling.seed));
  out->push_back(r.spec.sampling.logprobs);
  out->push_back(FloatBits(r.spec.sampling.presence_penalty));
  out->push_back(FloatBits(r.spec.sampling.frequency_penalty));
  out->push_back(r.spec.sampling.prompt_logprobs);
  out->push_back(static_cast<int64_t>(r.spec.sampling.logit_bias.size()));
  for (const LogitAdjustment& b : r.spec.sampling.logit_bias) {
    out->push_back(b.token);
    out->push_back(FloatBits(b.delta));
  }
  for (int32_t t : r.tokens) out->push_back(t);
  out->push_back(static_cast<int64_t>(r.logprobs.size()));
  for (const auto& entry : r.logprobs) {
    out->push_back(static_cast<int64_t>(entry.size()));
    for (const TokenLogprob& lp : entry) {
      out->push_back(lp.token);
      out->push_back(FloatBits(lp.logprob));
    }
  }
  out->push_back(static_cast<int64_t>(r.prompt_logprobs.size()));
  for (const PromptLogprob& entry : r.prompt_logprobs) {
    out->push_back(FloatBits(entry.logprob));
    out->push_back(static_cast<int64_t>(entry.top.size()));
    for (const TokenLogprob& lp : entry.top) {
      out->push_back(lp.token);
      out->push_back(FloatBits(lp.logprob));
    }
  }
}

absl::StatusOr<std::vector<std::unique_ptr<Request>>> Deserialize(const std::vector<int64_t>& in) {
  std::vector<std::unique_ptr<Request>> out;
  size_t i = 0;
  auto next = [&]() -> absl::StatusOr<int64_t> {
    if (i >= in.size()) return absl::DataLossError("truncated request record");
    return in[i++];
  };
  while (i < in.size()) {
    auto r = std::make_unique<Request>();
    MLAG_ASSIGN_OR_RETURN(r->id, next());
    MLAG_ASSIGN_OR_RETURN(int64_t prompt_len, next());
    MLAG_ASSIGN_OR_RETURN(int64_t num_tokens, next());
    MLAG_ASSIGN_OR_RETURN(int64_t max_tokens, next());
    MLAG_ASSIGN_OR_RETURN(int64_t finish, next());
    MLAG_ASSIGN_OR_RETURN(int64_t state, next());
    MLAG_ASSIGN_OR_RETURN(int64_t n_stop, next());
    const int64_t left = static_cast<int64_t>(in.size() - i);
    if (prompt_len < 1 || num_tokens < prompt_len || n_stop < 0 || n_stop > left ||
        num_tokens > left) {
      return absl::DataLossError("malformed request record");
    }
    r->num_prompt_tokens = static_cast<int>(prompt_len);
    r->spec.max_tokens = static_cast<int>(max_tokens);
    r->finish_reason = static_cast<FinishReason>(finish);
    r->state = static_cast<RequestState>(state);
    for (int64_t k = 0; k < n_stop; ++k) {
      MLAG_ASSIGN_OR_RETURN(int64_t s, next());
      r->spec.stop_token_ids.push_back(static_cast<int32_t>(s));
    }
    MLAG_ASSIGN_OR_RETURN(int64_t temp, next());
    MLAG_ASSIGN_OR_RETURN(int64_t top_k, next());
    MLAG_ASSIGN_OR_RETURN(int64_t top_p, next());
    MLAG_ASSIGN_OR_RETURN(int64_t seed, next());
    MLAG_ASSIGN_OR_RETURN(int64_t logprobs, next());
    MLAG_ASSIGN_OR_RETURN(int64_t presence, next());
    MLAG_ASSIGN_OR_RETURN(int64_t frequency, next());
    MLAG_ASSIGN_OR_RETURN(int64_t prompt_logprobs, next());
    MLAG_ASSIGN_OR_RETURN(int64_t n_bias, next());
    if (n_bias < 0 || 2 * n_bias > static_cast<int64_t>(in.size() - i)) {
      return absl::DataLossError("malformed request record");
    }
    for (int64_t k = 0; k < n_bias; ++k) {
      MLAG_ASSIGN_OR_RETURN(int64_t tok, next());
      MLAG_ASSIGN_OR_RETURN(int64_t bias, next());
      r->spec.sampling.logit_bias.push_back({static_cast<int32_t>(tok), BitsFloat(bias)});
    }
    if (num_tokens > static_cast<int64_t>(in.size() - i)) {
      return absl::DataLossError("malformed request record");
    }
    r->spec.sampling.presence_penalty = BitsFloat(presence);
    r->spec.sampling.frequency_penalty = BitsFloat(frequency);
    r->spec.sampling.prompt_logprobs = static_cast<int>(prompt_logprobs);
    r->spec.sampling.temperature = BitsFloat(temp);
    r->spec.sampling.top_k = static_cast<int>(top_k);
    r->spec.sampling.top_p = BitsFloat(top_p);
    r->spec.sampling.seed = static_cast<uint64_t>(seed);
    r->spec.sampling.logprobs = static_cast<int>(logprobs);
    for (int64_t k = 0; k < num_tokens; ++k) {
      MLAG_ASSIGN_OR_RETURN(int64_t t, next());
      r->tokens.push_back(static_cast<int32_t>(t));
    }
    r->spec.prompt.assign(r->tokens.begin(), r->tokens.begin() + prompt_len);
    MLAG_ASSIGN_OR_RETURN(int64_t n_lp, next());
    if (n_lp < 0 || n_lp > static_cast<int64_t>(in.size() - i)) {
      return absl::DataLossError("malformed request record");
    }
    for (int64_t e = 0; e < n_lp; ++e) {
      MLAG_ASSIGN_OR_RETURN(int64_t k, next());
      if (k < 0 || 2 * k > static_cast<int64_t>(in.size() - i)) {
        return absl::DataLossError("malformed request record");
      }
      std::vector<TokenLogprob> entry;
      for (int64_t j = 0; j < k; ++j) {
        MLAG_ASSIGN_OR_RETURN(int64_t tok, next());
        MLAG_ASSIGN_OR_RETURN(int64_t lp, next());
        entry.push_back({static_cast<int32_t>(tok), BitsFloat(lp)});
      }
      r->logprobs.push_back(std::move(entry));
    }
    MLAG_ASSIGN_OR_RETURN(int64_t n_plp, next());
    if (n_plp < 0 || 2 * n_plp > static_cast<int64_t>(in.size() - i)) {
      return absl::DataLossError("malformed request record");
    }
    for (int64_t e = 0; e < n_plp; ++e) {
      PromptLogprob entry;
      MLAG_ASSIGN_OR_RETURN(int64_t lp, next());
      MLAG_ASSIGN_OR_RETURN(int64_t k, next());
      if (k < 0 || 2 * k > static_cast<int64_t>(in.size() - i)) {
        return absl::DataLossError("malformed request record");
      }
      entry.logprob = BitsFloat(lp);
      for (int64_t j = 0; j < k; ++j) {
        MLAG_ASSIGN_OR_RETURN(int64_t tok, next());
        MLAG_ASSIGN_OR_RETURN(int64_t tlp, next());
        entry.top.push_back({static_cast<int32_t>(tok), BitsFloat(tlp)});
      }
      r->prompt_logprobs.push_back(std::move(entry));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

absl::StatusOr<ReconfigureAt> ParseReconfigureAt(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  ReconfigureAt r;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.step) ||
      !absl::SimpleAtoi(parts[1], &r.size) || r.step < 0 || r.size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reconfigure-at '", text, "': expected STEP:SIZE with STEP >= 0, SIZE >= 1"));
  }
  return r;
}

absl::StatusOr<EpFault> ParseEpFault(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  EpFault f;
  double hang_seconds = 0;
  const bool fail = parts.size() == 3 && parts[0] == "fail";
  const bool hang = parts.size() == 4 && parts[0] == "hang" &&
                    absl::SimpleAtod(parts[3], &hang_seconds) && hang_seconds > 0 &&
                    hang_seconds < 3600;
  if ((!fail && !hang) || !absl::SimpleAtoi(parts[1], &f.rank) ||
      !absl::SimpleAtoi(parts[2], &f.step) || f.rank < 0 || f.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", text,
                     "': expected fail:RANK:STEP or hang:RANK:STEP:SECONDS (0 < SECONDS < 3600)"));
  }
  f.kind = fail ? EpFault::Kind::kFail : EpFault::Kind::kHang;
  f.hang = absl::Seconds(hang_seconds);
  return f;
}

absl::StatusOr<EpBackend> ParseEpBackend(absl::string_view name) {
  if (name == "local") return EpBackend::kLocal;
  if (name == "nccl") return EpBackend::kNccl;
  if (name == "mpi") return EpBackend::kMpi;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown expert-parallel backend '", name, "' (expected local, nccl or mpi)"));
}

absl::string_view EpBackendName(EpBackend backend) {
  switch (backend) {
    case EpBackend::kLocal:
      return "local";
    case EpBackend::kNccl:
      return "nccl";
    case EpBackend::kMpi:
      return "mpi";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<EpRank>> EpRank::Create(Communicator* world,
                                                       const EngineOptions& options,
                                                       const EpOptions& ep, Communicator* control) {
  if (world == nullptr || world->size() != ep.world) {
    return absl::InvalidArgumentError(absl::StrCat("expert parallelism over ", ep.world,
                                                   " ranks needs a world of that size, got ",
                                                   world == nullptr ? 0 : world->size()));
  }
  if (ep.peer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the expert-parallel peer timeout must be positive");
  }
  for (const EpFault& f : ep.faults) {
    if (f.rank >= ep.world) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault on rank ", f.rank, ": the world has ", ep.world, " ranks"));
    }
  }
  int last_step = -1;
  for (const ReconfigureAt& r : ep.reconfigure) {
    if (r.size < 1 || r.size > ep.world) {
      return absl::InvalidArgumentError(
          absl::StrCat("reconfiguration to ", r.size, " ranks: must be in [1, ", ep.world, "]"));
    }
    if (r.step < last_step) {
      return absl::InvalidArgumentError("reconfigurations must be given in step order");
    }
    last_step = r.step;
  }
  if (control == nullptr) control = world;
  if (control->size() != world->size() || control->rank() != world->rank()) {
    return absl::InvalidArgumentError("control and data communicators must have the same ranks");
  }
  std::unique_ptr<EpRank> rank(new EpRank());
  rank->world_ = world;
  rank->control_ = control;
  rank->ep_ = ep;
  // A peer's abort cannot reach an NCCL communicator's host waits; its
  // control group's can (a local group; MPI's abort ends the process).
  if (control != world) world->SetPeerHealth([control] { return control->Health(); });
  // A failure on this rank (a model that does not load, an allocation)
  // would leave the peers waiting at the start-up rendezvous or in the
  // engine's first collectives: abort the groups so they fail with it.
  absl::Status started = rank->Start(options);
  if (!started.ok()) {
    started = rank->PreferPeerReport(std::move(started));
    rank->AbortGroups(started);
    return started;
  }
  return rank;
}

absl::Status EpRank::Start(const EngineOptions& options) {
  MLAG_ASSIGN_OR_RETURN(host_device_, Device::Create("host"));
  MLAG_ASSIGN_OR_RETURN(host_stream_, Stream::Create(host_device_.get()));
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group, world_->Split(0, world_->rank()));
  MLAG_RETURN_IF_ERROR(group_.Replace(std::move(group)));
  active_ = world_->size();
  return BuildEngine(options);
}

absl::Status EpRank::BuildEngine(const EngineOptions& options) {
  // The model's expert count decides the placement; every rank reads the
  // same config.
  MLAG_ASSIGN_OR_RETURN(ModelSource probe, OpenModel(options.model));
  const int E = probe.config.n_routed_experts;
  if (E < ep_.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert parallelism over ", ep_.world, " ranks needs at least that many routed experts; ",
        options.model, " has ", E));
  }
  placement_ = EvenPlacement(E, ep_.world);
  EngineOptions o = options;
  o.local_experts = placement_.ExpertsOf(world_->rank());
  o.ep_group = group_.get();
  o.max_ep_ranks = ep_.world;
  o.ep_peer_timeout = ep_.peer_timeout;
  o.ep_control = control_;
  o.ep_startup_timeout = ep_.startup_timeout;
  // The expert sets reconfigurations given up front give this rank: the plan
  // holds back what migration needs beside the old buffers.
  for (const ReconfigureAt& r : ep_.reconfigure) {
    o.reconfiguration_expert_slots.push_back(
        static_cast<int>(EvenPlacement(E, r.size).ExpertsOf(world_->rank()).size()));
  }
  MLAG_ASSIGN_OR_RETURN(engine_, Engine::Create(o));
  group_.Bind(engine_.get());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> EpRank::ExchangeAll(
    const std::vector<int64_t>& mine) {
  const int n = control_->size();
  int64_t my_size = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(n);
  MLAG_RETURN_IF_ERROR(control_->AllGather(*host_stream_, Tensor(&my_size, DType::kI64, {1}),
                                           Tensor(sizes.data(), DType::kI64, {n})));
  std::vector<std::vector<int64_t>> all(n);
  for (int root = 0; root < n; ++root) {
    if (sizes[root] == 0) continue;
    all[root] = root == control_->rank() ? mine : std::vector<int64_t>(sizes[root]);
    MLAG_RETURN_IF_ERROR(control_->Broadcast(
        *host_stream_, Tensor(all[root].data(), DType::kI64, {sizes[root]}), root));
  }
  return all;
}

absl::StatusOr<ReconfigurationReport> EpRank::Reconfigure(int step, int new_size) {
  ReconfigurationReport report;
  report.step = step;
  report.from = active_;
  report.to = new_size;
  const int me = world_->rank();
  const bool in_old = me < active_, in_new = me < new_size;
  const bool survivor = in_old && in_new;
  ModelRunner& runner = engine_->runner();
  auto phase = [&](const char* name, Clock::time_point t0) {
    report.seconds.emplace_back(name, Since(t0));
  };

  // Every rank's new expert buffers must fit its memory plan beside the old
  // ones, or no rank moves anything: refused before any page moves.
  const ExpertPlacement to = EvenPlacement(placement_.num_experts, new_size);
  const std::vector<int> next = in_new ? to.ExpertsOf(me) : std::vector<int>();
  absl::Status fits = absl::OkStatus();
  if (next != placement_.ExpertsOf(me)) {
    fits = engine_->CheckFitsPlan(
        runner.model().ExpertBufferBytes(static_cast<int>(next.size())),
        absl::StrCat("expert migration to ", new_size, " ranks: rank ", me, "'s new buffers (",
                     next.empty() ? std::string("a one-slot placeholder")
                                  : absl::StrCat(next.size(), " routed experts"),
                     " a layer)"));
  }
  MLAG_ASSIGN_OR_RETURN(const int64_t all_fit,
                        control_->AllReduceScalar(fits.ok() ? 1 : 0, ReduceOp::kMin));
  if (!fits.ok()) return fits;
  if (all_fit == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expert migration to ", new_size,
        " ranks refused: another rank's new expert buffers do not fit its memory plan"));
  }

  MLAG_ASSIGN_OR_RETURN(
      report.prefix_hit_tokens_before,
      control_->AllReduceScalar(engine_->kv_cache().hit_tokens(), ReduceOp::kSum));
  auto t0 = Clock::now();
  // The pages whose contents matter (in use or prefix-cached); the same list
  // is checked after the reconfiguration.
  const std::vector<int> live = engine_->kv_cache().LiveBlocks();
  uint64_t before = 0;
  if (survivor) {
    MLAG_ASSIGN_OR_RETURN(before, runner.KvChecksum(live));
  }
  phase("checksum", t0);

  t0 = Clock::now();
  MLAG_RETURN_IF_ERROR(runner.SaveAndClearMetadata());
  phase("save_metadata", t0);

  t0 = Clock::now();
  // Held where AbortGroups finds it: if this rank fails before the group is
  // installed, peers already using it must be woken too.
  MLAG_ASSIGN_OR_RETURN(pending_group_, world_->Split(in_new ? 0 : -1, me));
  phase("split", t0);

  t0 = Clock::now();
  MLAG_RETURN_IF_ERROR(runner.model().MigrateExperts(runner.stream(), *world_, placement_, to));
  placement_ = to;
  phase("migrate", t0);

  t0 = Clock::now();
  std::vector<int64_t> payload;
  if (in_old && !in_new) {
    for (const auto& r : engine_->TakeUnfinished()) Serialize(*r, &payload);
  }
  MLAG_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> moved, ExchangeAll(payload));
  int64_t counter = 0;  // the same walk on every rank: request j -> rank j % new_size
  for (const auto& from_rank : moved) {
    MLAG_ASSIGN_OR_RETURN(auto requests, Deserialize(from_rank));
    for (auto& r : requests) {
      if (counter++ % new_size == me) MLAG_RETURN_IF_ERROR(engine_->AdoptRequest(std::move(r)));
    }
  }
  phase("requeue", t0);

  t0 = Clock::now();
  // From here on the rank's state is the new configuration's, whatever
  // happens: a failure leaves the rank outside any group (no dangling group
  // pointer) and is reported; the run cannot continue on it.
  active_ = new_size;
  // The old group's graphs go before the old group (ExpertGroup::Replace).
  MLAG_RETURN_IF_ERROR(group_.Replace(std::move(pending_group_)));
  if (in_new) {
    absl::Status captured = runner.CaptureGraphs();
    if (!captured.ok()) {
      group_.Replace(nullptr).IgnoreError();
      return captured;
    }
  }
  phase("recapture", t0);

  t0 = Clock::now();
  MLAG_RETURN_IF_ERROR(runner.RestoreMetadata());
  phase("restore_metadata", t0);

  t0 = Clock::now();
  int64_t unchanged = 1;
  if (survivor) {
    MLAG_ASSIGN_OR_RETURN(uint64_t after, runner.KvChecksum(live));
    unchanged = after == before ? 1 : 0;
  }
  MLAG_ASSIGN_OR_RETURN(int64_t all_unchanged,
                        control_->AllReduceScalar(unchanged, ReduceOp::kMin));
  report.kv_pages_unchanged = all_unchanged == 1;
  phase("verify", t0);

  return report;
}

absl::StatusOr<EpRunResult> EpRank::Run(const std::vector<RequestSpec>& requests) {
  EpRunResult result;
  result.capture_seconds = engine_->runner().stats().capture_seconds;
  // Every rank validates every request, so a bad one fails all ranks alike
  // instead of leaving the others waiting in a collective.
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::Status valid = engine_->ValidateRequest(requests[i]);
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("request ", i, ": ", valid.message()));
    }
  }
  absl::StatusOr<EpRunResult> driven = Drive(requests, std::move(result));
  if (driven.ok()) return driven;
  const absl::Status failure = PreferPeerReport(driven.status());
  AbortGroups(failure);
  return failure;
}

absl::Status EpRank::PreferPeerReport(absl::Status failure) {
  if (!IsPeerTimeout(failure)) return failure;
  const absl::Time give_up = absl::Now() + kPeerReportGrace;
  do {
    for (Communicator* c : {control_, world_, group_.get(), pending_group_.get()}) {
      if (c == nullptr) continue;
      absl::Status report = c->Health();
      // A peer's own error; a peer that timed out too passes on the same
      // classification as this rank's, which names this rank.
      if (!report.ok() && !absl::StrContains(report.message(), kPeerFaultPrefix)) return report;
    }
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() < give_up);
  return failure;
}

void EpRank::AbortGroups(const absl::Status& reason) {
  // Peers aborted by another rank's failure pass its reason on unchanged; a
  // peer timeout names the rank that saw it already.
  const absl::Status why = reason.code() == absl::StatusCode::kAborted || IsPeerTimeout(reason)
                               ? reason
                               : absl::Status(reason.code(), absl::StrCat("rank ", world_->rank(),
                                                                          ": ", reason.message()));
  // The control group first, so a peer learns the reason before any error
  // the data groups' aborts cause there (an NCCL error would read as that
  // peer's own failure). MPI's abort ends the process, so it goes last.
  const bool control_ends_process = control_->backend() == "mpi";
  if (!control_ends_process) control_->Abort(why);
  if (pending_group_ != nullptr) pending_group_->Abort(why);
  group_.Abort(why);
  if (control_ != world_) world_->Abort(why);
  if (control_ends_process) control_->Abort(why);
}

absl::Status EpRank::InjectFault(int64_t step) {
  for (const EpFault& f : ep_.faults) {
    if (f.rank != world_->rank() || f.step != step) continue;
    if (f.kind == EpFault::Kind::kFail) {
      return absl::InternalError(absl::StrCat("injected failure at step ", step));
    }
    if (f.kind == EpFault::Kind::kHang) {
      // Said when it begins, so a test can time how long the peers take
      // to give up on this rank.
      std::fprintf(stderr, "rank %d: injected hang of %s at step %lld\n", world_->rank(),
                   absl::FormatDuration(f.hang).c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      absl::SleepFor(f.hang);  // stops answering, then goes on
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EpRunResult> EpRank::Drive(const std::vector<RequestSpec>& requests,
                                          EpRunResult result) {
  const int me = world_->rank();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (static_cast<int>(i % active_) != me) continue;
    absl::StatusOr<RequestId> id =
        engine_->AddRequestWithId(requests[i], static_cast<RequestId>(i));
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat("request ", i, ": ", id.status().message()));
    }
  }
  size_t next_event = 0;
  int64_t step = 0;
  for (;; ++step) {
    while (next_event < ep_.reconfigure.size() && ep_.reconfigure[next_event].step == step) {
      absl::StatusOr<ReconfigurationReport> r =
          Reconfigure(static_cast<int>(step), ep_.reconfigure[next_event].size);
      if (!r.ok()) {
        return AtPeerFault(r.status(), absl::StrCat("the reconfiguration before step ", step));
      }
      result.reconfigurations.push_back(*std::move(r));
      ++next_event;
    }
    MLAG_RETURN_IF_ERROR(InjectFault(step));
    if (me < active_) {
      MLAG_RETURN_IF_ERROR(AtPeerFault(engine_->Step().status(), absl::StrCat("step ", step)));
    }
    absl::StatusOr<int64_t> unfinished =
        control_->AllReduceScalar(engine_->HasUnfinished() ? 1 : 0, ReduceOp::kMax);
    if (!unfinished.ok()) return AtPeerFault(unfinished.status(), absl::StrCat("step ", step));
    if (*unfinished == 0) break;
    if (step > 10'000'000) return absl::InternalError("expert-parallel run does not finish");
  }
  result.driver_steps = step + 1;
  if (next_event < ep_.reconfigure.size()) {
    // Every rank ends at the same step (the all-reduce above), so every rank
    // reports this alike.
    return absl::InvalidArgumentError(
        absl::StrCat("reconfiguration at step ", ep_.reconfigure[next_event].step,
                     " never happened: the run ended after ", step + 1, " steps"));
  }
  result.device = engine_->device().name();

  // Gather every rank's finished requests and counters on every rank.
  std::vector<int64_t> payload;
  const EngineStats stats = engine_->Stats();
  payload.push_back(stats.steps);
  payload.push_back(stats.eager_steps);
  payload.push_back(stats.dummy_steps);
  payload.push_back(stats.preemptions);
  payload.push_back(engine_->kv_cache().hit_tokens());
  payload.push_back(engine_->kv_cache().queried_tokens());
  payload.push_back(static_cast<int64_t>(stats.graph_replays.size()));
  for (const auto& [size, count] : stats.graph_replays) {
    payload.push_back(size);
    payload.push_back(count);
  }
  for (RequestId id : engine_->request_ids()) Serialize(*engine_->request(id), &payload);
  MLAG_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> all, ExchangeAll(payload));
  std::map<RequestId, RequestResult> by_id;
  for (const auto& p : all) {
    if (p.size() < 7) return absl::DataLossError("short result record");
    result.engine_steps += p[0];
    result.eager_steps += p[1];
    result.dummy_steps += p[2];
    result.preemptions += p[3];
    result.prefix_hit_tokens += p[4];
    result.prefix_queried_tokens += p[5];
    if (p[6] < 0 || static_cast<size_t>(7 + 2 * p[6]) > p.size()) {
      return absl::DataLossError("malformed result record");
    }
    size_t i = 7;
    for (int64_t k = 0; k < p[6]; ++k, i += 2)
      result.graph_replays[static_cast<int>(p[i])] += p[i + 1];
    MLAG_ASSIGN_OR_RETURN(auto reqs, Deserialize(std::vector<int64_t>(p.begin() + i, p.end())));
    for (auto& r : reqs) {
      by_id[r->id] = ResultOf(*r);
    }
  }
  for (auto& [id, r] : by_id) result.requests.push_back(std::move(r));
  MLAG_ASSIGN_OR_RETURN(int64_t capture_us,
                        control_->AllReduceScalar(
                            static_cast<int64_t>(result.capture_seconds * 1e6), ReduceOp::kMax));
  result.capture_seconds = capture_us / 1e6;
  return result;
}

absl::StatusOr<EpRunResult> RunThreadedExpertParallel(
    const EngineOptions& options, const EpOptions& ep, const std::vector<RequestSpec>& requests,
    const std::vector<Communicator*>& worlds, const std::vector<Communicator*>& controls,
    const std::vector<std::string>& devices, std::vector<absl::Status>* rank_status) {
  const int n = static_cast<int>(worlds.size());
  if (n != ep.world || static_cast<int>(devices.size()) != n ||
      (!controls.empty() && static_cast<int>(controls.size()) != n)) {
    return absl::InvalidArgumentError("one communicator and one device per rank are needed");
  }
  std::vector<absl::StatusOr<EpRunResult>> results(n, absl::UnknownError("not run"));
  // The rank threads share the host cores: each gets an equal share of host
  // worker threads (SetNumThreads applies to the calling thread).
  const int threads = std::max(1, host::NumThreads() / n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      host::SetNumThreads(threads);
      EngineOptions o = options;
      o.device = devices[r];
      auto rank = EpRank::Create(worlds[r], o, ep, controls.empty() ? nullptr : controls[r]);
      if (!rank.ok()) {
        results[r] = rank.status();
        return;
      }
      results[r] = (*rank)->Run(requests);
    });
  }
  for (std::thread& t : ranks) t.join();
  if (rank_status != nullptr) {
    rank_status->clear();
    for (const auto& r : results) rank_status->push_back(r.status());
  }
  // Report the cause: a rank's own failure (the others were aborted by it
  // or timed out waiting on it), else a peer timeout, else an abort passed
  // on; the lowest rank among equals.
  auto precedence = [](const absl::Status& s) {
    if (s.ok()) return 3;
    if (s.code() == absl::StatusCode::kAborted) return 2;
    return IsPeerTimeout(s) ? 1 : 0;
  };
  int reported = 0;
  for (int r = 1; r < n; ++r) {
    if (precedence(results[r].status()) < precedence(results[reported].status())) reported = r;
  }
  const absl::Status& s = results[reported].status();
  if (s.ok()) return std::move(results[0]);
  if (IsPeerTimeout(s)) return s;  // it names the rank already
  return absl::Status(s.code(), absl::StrCat("rank ", reported, ": ", s.message()));
}

absl::StatusOr<EpRunResult> RunLocalExpertParallel(const EngineOptions& options,
                                                   const EpOptions& ep,
                                                   const std::vector<RequestSpec>& requests,
                                                   std::vector<absl::Status>* rank_status) {
  if (ep.world < 1) return absl::InvalidArgumentError("--ep must be >= 1");
  std::vector<std::unique_ptr<Communicator>> comms =
      LocalCommunicator::CreateGroup(ep.world, ep.peer_timeout);
  std::vector<Communicator*> worlds;
  for (auto& c : comms) worlds.push_back(c.get());
  // Thread ranks share one host.
  return RunThreadedExpertParallel(options, ep, requests, worlds, {},
                                   std::vector<std::string>(ep.world, "host"), rank_status);
}

namespace {

bool IsCudaSpec(const std::string& device) {
  return device == "cuda" || absl::StartsWith(device, "cuda:");
}

absl::StatusOr<EpRunResult> RunNcclThreadRanks(const EngineOptions& options, const EpOptions& ep,
                                               const std::vector<RequestSpec>& requests,
                                               std::vector<absl::Status>* rank_status) {
#if MLAG_HAVE_NCCL
  if (options.device != "cuda" && options.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep-backend nccl runs rank r on cuda:r: pass --device cuda (or auto), not '",
                     options.device, "'"));
  }
  const int gpus = Device::CudaDeviceCount();
  if (gpus < ep.world) {
    return absl::FailedPreconditionError(absl::StrCat("--ep ", ep.world,
                                                      " with --ep-backend nccl needs ", ep.world,
                                                      " CUDA devices, found ", gpus));
  }
  std::vector<int> devices(static_cast<size_t>(ep.world));
  std::vector<std::string> names;
  for (int r = 0; r < ep.world; ++r) {
    devices[static_cast<size_t>(r)] = r;
    names.push_back(absl::StrCat("cuda:", r));
  }
  // The controls outlive the NCCL worlds, whose waits poll them.
  std::vector<std::unique_ptr<Communicator>> control =
      LocalCommunicator::CreateGroup(ep.world, ep.peer_timeout);
  MLAG_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> data,
                        NcclCommunicator::InitAll(devices, ep.peer_timeout));
  std::vector<Communicator*> worlds, controls;
  for (int r = 0; r < ep.world; ++r) {
    worlds.push_back(data[static_cast<size_t>(r)].get());
    controls.push_back(control[static_cast<size_t>(r)].get());
  }
  return RunThreadedExpertParallel(options, ep, requests, worlds, controls, names, rank_status);
#else
  (void)options;
  (void)ep;
  (void)requests;
  (void)rank_status;
  return absl::FailedPreconditionError("--ep-backend nccl: this build has no CUDA and NCCL");
#endif
}

absl::StatusOr<EpRunResult> RunMpiRank(const EngineOptions& options, const EpOptions& ep,
                                       const std::vector<RequestSpec>& requests, int* rank) {
#if MLAG_HAVE_MPI
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> mpi, MpiCommunicator::World(ep.peer_timeout));
  if (rank != nullptr) *rank = mpi->rank();
  // The device of this rank: host, the named GPU, or the local rank's GPU.
  EngineOptions o = options;
  const int gpus = Device::CudaDeviceCount();
  if (o.device == "auto") o.device = gpus > 0 ? "cuda" : "host";
  if (o.device == "cuda") {
    if (gpus == 0) return absl::FailedPreconditionError("--device cuda: no CUDA device is usable");
    MLAG_ASSIGN_OR_RETURN(int local_rank, MpiCommunicator::LocalRank());
    o.device = absl::StrCat("cuda:", local_rank % gpus);
  }
  if (!IsCudaSpec(o.device)) {
    MLAG_ASSIGN_OR_RETURN(std::unique_ptr<EpRank> r, EpRank::Create(mpi.get(), o, ep));
    return r->Run(requests);
  }
#if MLAG_HAVE_NCCL
  // GPUs: NCCL for the data, bootstrapped over MPI, which carries control.
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Device> current, Device::Create(o.device));
  MLAG_RETURN_IF_ERROR(current->MakeCurrent());
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> data,
                        NcclCommunicator::CreateOverMpi(*mpi, current->index(), ep.peer_timeout));
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<EpRank> r, EpRank::Create(data.get(), o, ep, mpi.get()));
  return r->Run(requests);
#else
  return absl::FailedPreconditionError(
      absl::StrCat("--ep-backend mpi on ", o.device, ": this build has no NCCL"));
#endif
#else
  (void)options;
  (void)ep;
  (void)requests;
  (void)rank;
  return absl::FailedPreconditionError("--ep-backend mpi: this build has no MPI");
#endif
}

}  // namespace

absl::StatusOr<EpRunResult> RunExpertParallel(const EngineOptions& options, const EpOptions& ep,
                                              EpBackend backend,
                                              const std::vector<RequestSpec>& requests, int* rank,
                                              std::vector<absl::Status>* rank_status) {
  if (rank != nullptr) *rank = 0;
  if (ep.world < 1) return absl::InvalidArgumentError("--ep must be >= 1");
  switch (backend) {
    case EpBackend::kLocal: {
      if (IsCudaSpec(options.device)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--ep-backend local runs its ranks on the host, not on ", options.device,
            ": use --ep-backend nccl for CUDA thread ranks, or mpi for one process per GPU"));
      }
      EngineOptions o = options;
      o.device = "host";
      return RunLocalExpertParallel(o, ep, requests, rank_status);
    }
    case EpBackend::kNccl:
      return RunNcclThreadRanks(options, ep, requests, rank_status);
    case EpBackend::kMpi: {
      absl::StatusOr<EpRunResult> result = RunMpiRank(options, ep, requests, rank);
      if (rank_status != nullptr) *rank_status = {result.status()};
      return result;
    }
  }
  return absl::InvalidArgumentError("unknown expert-parallel backend");
}

}  // namespace mlag
