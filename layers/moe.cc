#include "layers/moe.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/moe.h"
#include "runtime/core/fp8_blocks.h"
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
  // Zeroed, as the fused router's counter must start (it leaves it 0).
  if (arena.device().is_cuda()) {
    MLAG_ASSIGN_OR_RETURN(route_counter_, arena.Allocate({1}, DType::kI32));
  }
  if (c.topk_method == TopkMethod::kNoauxTc) {
    MLAG_ASSIGN_OR_RETURN(correction_bias_,
                          arena.Load(source, p + "gate.e_score_correction_bias", {E}));
  }
  device_ = &arena.device();
  MLAG_ASSIGN_OR_RETURN(expert_map_, arena.Allocate({E}, DType::kI32));
  MLAG_RETURN_IF_ERROR(SetLocalExperts(local_experts_));
  // Every expert in one dtype: that of the first held (all are alike in a
  // checkpoint).
  const int first = L > 0 ? local_experts_[0] : 0;
  expert_dtype_ =
      arena.LinearDType(source, absl::StrCat(p, "experts.", first, ".gate_proj.weight"));
  MLAG_ASSIGN_OR_RETURN(experts_, AllocateExperts(L));
  for (int64_t slot = 0; slot < L; ++slot) {
    const std::string e = absl::StrCat(p, "experts.", local_experts_[slot], ".");
    const LinearWeight gu = expert_gate_up(static_cast<int>(slot));
    MLAG_RETURN_IF_ERROR(
        arena.LoadLinearInto(source, e + "gate_proj.weight", {I, D}, gu.SliceRows(0, I)));
    MLAG_RETURN_IF_ERROR(
        arena.LoadLinearInto(source, e + "up_proj.weight", {I, D}, gu.SliceRows(I, 2 * I)));
    LinearWeight down = expert_down(static_cast<int>(slot));
    MLAG_RETURN_IF_ERROR(arena.LoadLinearInto(source, e + "down_proj.weight", {D, I}, down));
    // Read row-major; now in the device's layout (AllocateExperts marked it).
    LinearWeight gate_up = gu;
    MLAG_RETURN_IF_ERROR(PackForLinear(arena.device(), gate_up));
    MLAG_RETURN_IF_ERROR(PackForLinear(arena.device(), down));
  }
  if (shared_) MLAG_RETURN_IF_ERROR(shared_->Load(arena, source));
  return absl::OkStatus();
}

void Moe::PlanWeights(WeightPlan& plan) const {
  const ModelConfig& c = config_;
  const std::string p = absl::StrCat("model.layers.", layer_, ".mlp.");
  const int64_t D = c.hidden_size, E = c.n_routed_experts;
  plan.Add({E, D});
  if (plan.device().is_cuda()) plan.Add({1}, DType::kI32);
  if (c.topk_method == TopkMethod::kNoauxTc) plan.Add({E});
  plan.Add({E}, DType::kI32);
  const int64_t L = static_cast<int64_t>(local_experts_.size());
  const int first = L > 0 ? local_experts_[0] : 0;
  const DType dtype = plan.LinearDType(absl::StrCat(p, "experts.", first, ".gate_proj.weight"));
  plan.AddBytes(ExpertLayout(L, dtype).total);
  if (shared_) shared_->PlanWeights(plan);
}

Moe::ExpertBufferLayout Moe::ExpertLayout(int64_t slots, DType dtype) const {
  const int64_t D = config_.hidden_size, I = config_.moe_intermediate_size;
  const int64_t L = std::max<int64_t>(slots, 1);
  const bool fp8 = dtype == DType::kF8E4M3;
  // Values of gate|up and down, then (fp8) their scales, each 64-byte aligned.
  const size_t esize = DTypeSize(dtype);
  auto align = [](size_t n) { return (n + 63) / 64 * 64; };
  ExpertBufferLayout l;
  l.gate_up = align(static_cast<size_t>(L * 2 * I * D) * esize);
  l.down = align(static_cast<size_t>(L * D * I) * esize);
  l.gate_up_scales = fp8 ? align(static_cast<size_t>(L * 2 * I * Fp8Blocks(D)) * sizeof(float)) : 0;
  l.down_scales = fp8 ? align(static_cast<size_t>(L * D * Fp8Blocks(I)) * sizeof(float)) : 0;
  l.total = l.gate_up + l.down + l.gate_up_scales + l.down_scales;
  return l;
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

absl::StatusOr<Moe::Experts> Moe::AllocateExperts(int64_t slots) const {
  const int64_t D = config_.hidden_size, I = config_.moe_intermediate_size;
  const int64_t L = std::max<int64_t>(slots, 1);
  const bool fp8 = expert_dtype_ == DType::kF8E4M3;
  const ExpertBufferLayout layout = ExpertLayout(slots, expert_dtype_);
  const size_t gu_bytes = layout.gate_up, dn_bytes = layout.down,
               gu_scale_bytes = layout.gate_up_scales, total = layout.total;
  Experts e;
  MLAG_ASSIGN_OR_RETURN(e.buffer, device_->Allocate(total));
  if (slots == 0) {
    // The placeholder slot is never routed to (the map has no entry for it),
    // but keep it deterministic.
    MLAG_RETURN_IF_ERROR(device_->Zero(e.buffer.data(), total));
  }
  char* base = static_cast<char*>(e.buffer.data());
  const DeviceKind kind = device_->kind();
  e.gate_up.values = Tensor(base, expert_dtype_, {L, 2 * I, D}, kind);
  e.down.values = Tensor(base + gu_bytes, expert_dtype_, {L, D, I}, kind);
  // The host keeps experts packed (PackForLinear): Load packs each as it is
  // read, and migration copies packed bytes between like ranks.
  e.gate_up.host_row_groups = e.down.host_row_groups = !device_->is_cuda();
  if (fp8) {
    e.gate_up.scales =
        Tensor(base + gu_bytes + dn_bytes, DType::kF32, {L, 2 * I, Fp8Blocks(D)}, kind);
    e.down.scales = Tensor(base + gu_bytes + dn_bytes + gu_scale_bytes, DType::kF32,
                           {L, D, Fp8Blocks(I)}, kind);
  }
  return e;
}

absl::Status Moe::CopyExpert(Stream& stream, const LinearWeight& src,
                             const LinearWeight& dst) const {
  MLAG_RETURN_IF_ERROR(Copy(stream, src.values, dst.values));
  if (!src.has_scales()) return absl::OkStatus();
  return Copy(stream, src.scales, dst.scales);
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
  MLAG_ASSIGN_OR_RETURN(Experts next_experts, AllocateExperts(static_cast<int64_t>(next.size())));
  const LinearWeight& new_gu = next_experts.gate_up;
  const LinearWeight& new_dn = next_experts.down;
  // Values then scales (fp8) of gate|up and of down: the same order on the
  // sending and the receiving rank.
  auto parts = [](const LinearWeight& gu, const LinearWeight& dn) {
    std::vector<Tensor> t = {gu.values, dn.values};
    if (gu.has_scales()) t.insert(t.end(), {gu.scales, dn.scales});
    return t;
  };
  // Every rank walks the experts in the same order: each transfer involves
  // one sender and one receiver, so blocking sends cannot deadlock.
  for (int e = 0; e < E; ++e) {
    const int src = from.owner[e], dst = to.owner[e];
    if (me != src && me != dst) continue;
    if (me == src && me == dst) {
      NodeScope s(stream, Node("migrate_local"), OpKind::kCopy);
      MLAG_RETURN_IF_ERROR(
          CopyExpert(stream, expert_gate_up(from.slot[e]), new_gu.Select(to.slot[e])));
      MLAG_RETURN_IF_ERROR(
          CopyExpert(stream, expert_down(from.slot[e]), new_dn.Select(to.slot[e])));
    } else if (me == src) {
      NodeScope s(stream, Node("migrate_send"), OpKind::kComm);
      for (const Tensor& t : parts(expert_gate_up(from.slot[e]), expert_down(from.slot[e]))) {
        MLAG_RETURN_IF_ERROR(world.Send(stream, t, dst));
      }
    } else {
      NodeScope s(stream, Node("migrate_recv"), OpKind::kComm);
      for (const Tensor& t : parts(new_gu.Select(to.slot[e]), new_dn.Select(to.slot[e]))) {
        MLAG_RETURN_IF_ERROR(world.Recv(stream, t, src));
      }
    }
  }
  MLAG_RETURN_IF_ERROR(stream.Synchronize());
  experts_ = std::move(next_experts);
  return SetLocalExperts(std::move(next));
}

size_t Moe::expert_bytes() const { return expert_gate_up(0).nbytes() + expert_down(0).nbytes(); }

absl::Status Moe::Forward(Stream& stream, const ActivationBuffers& acts, const Tensor& x,
                          const Tensor& out, std::vector<int32_t>* routing_record,
                          Communicator* ep) const {
  const int64_t T = x.size(0);
  const Tensor logits = Rows(acts.router_logits, T);
  const Tensor ids = Rows(acts.topk_ids, T);
  const Tensor weights = Rows(acts.topk_weights, T);
  {
    // One launch for decode batches on CUDA (kernels/moe.h).
    NodeScope s(stream, Node("router"), OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(MoeGateRoute(stream, config_.routing(), x, w_gate_, correction_bias_,
                                      logits, route_counter_, ids, weights));
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
    if (acts.ep_choices.data() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert-parallel group of ", N, " ranks, activations sized for fewer"));
    }
    {
      NodeScope s(stream, Node("dispatch"), OpKind::kComm);
      const std::pair<Tensor, Tensor> gathers[] = {
          {x, x_all}, {ids, ids_all}, {weights, weights_all}};
      MLAG_RETURN_IF_ERROR(ep->AllGatherMany(stream, gathers));
    }
    if (!stream.is_cuda()) {
      // Host: every token's weighted choices travel whole (each is nonzero on
      // exactly one rank, so the reduction adds only zeros to it) and are
      // summed in k order, as without expert parallelism: the result does not
      // depend on the group size.
      {
        NodeScope s(stream, Node("experts"), OpKind::kGemm);
        MLAG_RETURN_IF_ERROR(MoeExperts(stream, x_all, ids_all, weights_all, expert_map_,
                                        experts_.gate_up, experts_.down,
                                        ViewAs(acts.ep_y, {N * T, K, D})));
      }
      const Tensor choices = ViewAs(acts.ep_choices, {T, K, D});
      {
        NodeScope s(stream, Node("combine"), OpKind::kComm);
        MLAG_RETURN_IF_ERROR(ep->ReduceScatter(stream, ViewAs(acts.ep_y, {N * T, K * D}),
                                               ViewAs(acts.ep_choices, {T, K * D})));
      }
      NodeScope s(stream, Node("sum_choices"), OpKind::kKernel);
      MLAG_RETURN_IF_ERROR(MoeSumChoices(stream, choices, out));
    } else {
      {
        NodeScope s(stream, Node("experts"), OpKind::kGemm);
        MLAG_RETURN_IF_ERROR(MoeExperts(stream, x_all, ids_all, weights_all, expert_map_,
                                        experts_.gate_up, experts_.down, y_all));
      }
      NodeScope s(stream, Node("combine"), OpKind::kComm);
      MLAG_RETURN_IF_ERROR(ep->ReduceScatter(stream, y_all, out));
    }
  } else {
    NodeScope s(stream, Node("experts"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(
        MoeExperts(stream, x, ids, weights, expert_map_, experts_.gate_up, experts_.down, out));
  }
  if (!shared_) return absl::OkStatus();
  const Tensor shared_out = Rows(acts.shared_out, T);
  MLAG_RETURN_IF_ERROR(shared_->Forward(stream, x, acts.gate_up, acts.act, shared_out));
  NodeScope s(stream, Node("add_shared"), OpKind::kKernel);
  return Add(stream, out, shared_out, out);
}

}  // namespace mlag
