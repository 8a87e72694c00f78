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
  std::vector<int32_t> map(E, -1);
  for (int64_t slot = 0; slot < L; ++slot) {
    int e = local_experts_[slot];
    if (e < 0 || e >= E || map[e] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer_, ": bad or repeated local expert id ", e));
    }
    map[e] = static_cast<int32_t>(slot);
  }
  MLAG_ASSIGN_OR_RETURN(expert_map_, arena.Allocate({E}, DType::kI32));
  MLAG_RETURN_IF_ERROR(arena.Upload(map, expert_map_));
  MLAG_ASSIGN_OR_RETURN(w_gate_up_, arena.Allocate({std::max<int64_t>(L, 1), 2 * I, D}));
  MLAG_ASSIGN_OR_RETURN(w_down_, arena.Allocate({std::max<int64_t>(L, 1), D, I}));
  for (int64_t slot = 0; slot < L; ++slot) {
    const std::string e = absl::StrCat(p, "experts.", local_experts_[slot], ".");
    const Tensor gu = w_gate_up_.Select(0, slot);
    MLAG_RETURN_IF_ERROR(arena.LoadInto(source, e + "gate_proj.weight", {I, D}, gu.Slice(0, 0, I)));
    MLAG_RETURN_IF_ERROR(arena.LoadInto(source, e + "up_proj.weight", {I, D}, gu.Slice(0, I, 2 * I)));
    MLAG_RETURN_IF_ERROR(
        arena.LoadInto(source, e + "down_proj.weight", {D, I}, w_down_.Select(0, slot)));
  }
  if (shared_) MLAG_RETURN_IF_ERROR(shared_->Load(arena, source));
  return absl::OkStatus();
}

size_t Moe::expert_bytes() const {
  return size_t{3} * config_.moe_intermediate_size * config_.hidden_size * sizeof(float);
}

absl::Status Moe::Forward(Stream& stream, const Activations& acts, const Tensor& x,
                          const Tensor& out, std::vector<int32_t>* routing_record) const {
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
  {
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
