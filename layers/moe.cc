#include "layers/moe.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/moe.h"
#include "runtime/core/status.h"

namespace mlag {

Moe::Moe(int layer, const ModelConfig& config, std::vector<int> local_experts)
    : layer_(layer), config_(config), local_experts_(std::move(local_experts)) {
  if (local_experts_.empty()) {
    local_experts_.resize(config.n_routed_experts);
    std::iota(local_experts_.begin(), local_experts_.end(), 0);
  }
  if (config.n_shared_experts > 0) {
    shared_ = std::make_unique<Mlp>(absl::StrCat("layers.", layer, ".moe.shared"),
                                    absl::StrCat("model.layers.", layer, ".mlp.shared_experts."),
                                    config.hidden_size,
                                    config.n_shared_experts * config.moe_intermediate_size);
  }
}

std::string Moe::Node(const char* op) const { return absl::StrCat("layers.", layer_, ".moe.", op); }

absl::Status Moe::Load(WeightArena& arena, WeightSource& source) {
  const ModelConfig& c = config_;
  const std::string p = absl::StrCat("model.layers.", layer_, ".mlp.");
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const int64_t L = static_cast<int64_t>(local_experts_.size());
  MLAG_ASSIGN_OR_RETURN(w_gate_, arena.Load(source, p + "gate.weight", {E, D}));
  if (c.topk_method == TopkMethod::kNoauxTc) {
    MLAG_ASSIGN_OR_RETURN(correction_bias_,
                          arena.Load(source, p + "gate.e_score_correction_bias", {E}));
  }
  device_ = &arena.device();
  MLAG_ASSIGN_OR_RETURN(expert_map_, arena.Allocate({E}, DType::kI32));
  MLAG_RETURN_IF_ERROR(SetLocalExperts(local_experts_));
  MLAG_RETURN_IF_ERROR(AllocateExpertBuffers(L, &gate_up_buf_, &down_buf_));
  w_gate_up_ = gate_up_buf_.AsTensor(DType::kF32, {std::max<int64_t>(L, 1), 2 * I, D});
  w_down_ = down_buf_.AsTensor(DType::kF32, {std::max<int64_t>(L, 1), D, I});
  for (int64_t slot = 0; slot < L; ++slot) {
    const std::string e = absl::StrCat(p, "experts.", local_experts_[slot], ".");
    const Tensor gu = w_gate_up_.Select(0, slot);
    MLAG_RETURN_IF_ERROR(arena.LoadInto(source, e + "gate_proj.weight", {I, D}, gu.Slice(0, 0, I)));
    MLAG_RETURN_IF_ERROR(
        arena.LoadInto(source, e + "up_proj.weight", {I, D}, gu.Slice(0, I, 2 * I)));
    MLAG_RETURN_IF_ERROR(
        arena.LoadInto(source, e + "down_proj.weight", {D, I}, w_down_.Select(0, slot)));
  }
  if (shared_) MLAG_RETURN_IF_ERROR(shared_->Load(arena, source));
  return absl::OkStatus();
}

absl::Status Moe::SetLocalExperts(std::vector<int> experts) {
  const int E = config_.n_routed_experts;
  std::vector<int32_t> map(E, -1);
  for (size_t slot = 0; slot < experts.size(); ++slot) {
    const int e = experts[slot];
    if (e < 0 || e >= E || map[e] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer_, ": bad or repeated local expert id ", e));
    }
    map[e] = static_cast<int32_t>(slot);
  }
  MLAG_RETURN_IF_ERROR(
      device_->CopyFromHost(expert_map_.data(), map.data(), map.size() * sizeof(int32_t)));
  local_experts_ = std::move(experts);
  return absl::OkStatus();
}

absl::Status Moe::AllocateExpertBuffers(int64_t slots, Buffer* gate_up, Buffer* down) const {
  const int64_t D = config_.hidden_size, I = config_.moe_intermediate_size;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(slots, 1) * 2 * I * D) * sizeof(float);
  MLAG_ASSIGN_OR_RETURN(*gate_up, device_->Allocate(bytes));
  MLAG_ASSIGN_OR_RETURN(*down, device_->Allocate(bytes / 2));
  if (slots == 0) {
    // The placeholder slot is never routed to (the map has no entry for it),
    // but keep it deterministic.
    std::vector<char> zeros(bytes, 0);
    MLAG_RETURN_IF_ERROR(device_->CopyFromHost(gate_up->data(), zeros.data(), bytes));
    MLAG_RETURN_IF_ERROR(device_->CopyFromHost(down->data(), zeros.data(), bytes / 2));
  }
  return absl::OkStatus();
}

absl::Status Moe::MigrateExperts(Stream& stream, Communicator& world, const ExpertPlacement& from,
                                 const ExpertPlacement& to) {
  const int me = world.rank();
  const int E = config_.n_routed_experts;
  if (from.num_experts != E || to.num_experts != E) {
    return absl::InvalidArgumentError("expert placement does not match the model's experts");
  }
  std::vector<int> next = me < to.world ? to.ExpertsOf(me) : std::vector<int>();
  if (next == local_experts_) return absl::OkStatus();  // nothing moves on or off this rank
  const int64_t D = config_.hidden_size, I = config_.moe_intermediate_size;
  const int64_t L = static_cast<int64_t>(next.size());
  Buffer gate_up, down;
  MLAG_RETURN_IF_ERROR(AllocateExpertBuffers(L, &gate_up, &down));
  const Tensor new_gu = gate_up.AsTensor(DType::kF32, {std::max<int64_t>(L, 1), 2 * I, D});
  const Tensor new_dn = down.AsTensor(DType::kF32, {std::max<int64_t>(L, 1), D, I});
  // Every rank walks the experts in the same order: each transfer involves
  // one sender and one receiver, so blocking sends cannot deadlock.
  for (int e = 0; e < E; ++e) {
    const int src = from.owner[e], dst = to.owner[e];
    if (me != src && me != dst) continue;
    if (me == src && me == dst) {
      NodeScope s(stream, Node("migrate_local"), OpKind::kCopy);
      MLAG_RETURN_IF_ERROR(
          Copy(stream, expert_gate_up(from.slot[e]), new_gu.Select(0, to.slot[e])));
      MLAG_RETURN_IF_ERROR(Copy(stream, expert_down(from.slot[e]), new_dn.Select(0, to.slot[e])));
    } else if (me == src) {
      NodeScope s(stream, Node("migrate_send"), OpKind::kComm);
      MLAG_RETURN_IF_ERROR(world.Send(stream, expert_gate_up(from.slot[e]), dst));
      MLAG_RETURN_IF_ERROR(world.Send(stream, expert_down(from.slot[e]), dst));
    } else {
      NodeScope s(stream, Node("migrate_recv"), OpKind::kComm);
      MLAG_RETURN_IF_ERROR(world.Recv(stream, new_gu.Select(0, to.slot[e]), src));
      MLAG_RETURN_IF_ERROR(world.Recv(stream, new_dn.Select(0, to.slot[e]), src));
    }
  }
  MLAG_RETURN_IF_ERROR(stream.Synchronize());
  gate_up_buf_ = std::move(gate_up);
  down_buf_ = std::move(down);
  w_gate_up_ = new_gu;
  w_down_ = new_dn;
  return SetLocalExperts(std::move(next));
}

size_t Moe::expert_bytes() const {
  return size_t{3} * config_.moe_intermediate_size * config_.hidden_size * sizeof(float);
}

absl::Status Moe::Forward(Stream& stream, const ActivationBuffers& acts, const Tensor& x,
                          const Tensor& out, std::vector<int32_t>* routing_record,
                          Communicator* ep) const {
  const int64_t T = x.size(0);
  const Tensor logits = Rows(acts.router_logits, T);
  const Tensor ids = Rows(acts.topk_ids, T);
  const Tensor weights = Rows(acts.topk_weights, T);
  {
    NodeScope s(stream, Node("gate"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(Linear(stream, x, w_gate_, logits));
  }
  {
    NodeScope s(stream, Node("route"), OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(
        MoeRoute(stream, config_.routing(), logits, correction_bias_, ids, weights));
  }
  if (routing_record != nullptr) {
    if (stream.capturing()) {
      return absl::FailedPreconditionError("routing can only be recorded in eager runs");
    }
    MLAG_RETURN_IF_ERROR(stream.Synchronize());
    routing_record->resize(static_cast<size_t>(ids.numel()));
    MLAG_RETURN_IF_ERROR(stream.device().CopyToHost(routing_record->data(), ids.data(),
                                                    ids.numel() * sizeof(int32_t)));
  }
  if (ep != nullptr && ep->size() > 1) {
    const int64_t N = ep->size(), D = config_.hidden_size, K = config_.num_experts_per_tok;
    const Tensor x_all = ViewAs(acts.ep_x, {N * T, D});
    const Tensor ids_all = ViewAs(acts.ep_ids, {N * T, K});
    const Tensor weights_all = ViewAs(acts.ep_weights, {N * T, K});
    const Tensor y_all = ViewAs(acts.ep_y, {N * T, D});
    if (y_all.numel() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert-parallel group of ", N, " ranks, activations sized for fewer"));
    }
    {
      NodeScope s(stream, Node("dispatch"), OpKind::kComm);
      const std::pair<Tensor, Tensor> gathers[] = {
          {x, x_all}, {ids, ids_all}, {weights, weights_all}};
      MLAG_RETURN_IF_ERROR(ep->AllGatherMany(stream, gathers));
    }
    {
      NodeScope s(stream, Node("experts"), OpKind::kGemm);
      MLAG_RETURN_IF_ERROR(
          MoeExperts(stream, x_all, ids_all, weights_all, expert_map_, w_gate_up_, w_down_, y_all));
    }
    NodeScope s(stream, Node("combine"), OpKind::kComm);
    MLAG_RETURN_IF_ERROR(ep->ReduceScatter(stream, y_all, out));
  } else {
    NodeScope s(stream, Node("experts"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(
        MoeExperts(stream, x, ids, weights, expert_map_, w_gate_up_, w_down_, out));
  }
  if (!shared_) return absl::OkStatus();
  const Tensor shared_out = Rows(acts.shared_out, T);
  MLAG_RETURN_IF_ERROR(shared_->Forward(stream, x, acts.gate_up, acts.act, shared_out));
  NodeScope s(stream, Node("add_shared"), OpKind::kKernel);
  return Add(stream, out, shared_out, out);
}

}  // namespace mlag
