#include "layers/mlp.h"

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"
#include "kernels/linear.h"
#include "layers/activation_buffers.h"
#include "runtime/core/status.h"

namespace mlag {

Mlp::Mlp(std::string node_prefix, std::string weight_prefix, int hidden, int width)
    : node_prefix_(std::move(node_prefix)),
      weight_prefix_(std::move(weight_prefix)),
      hidden_(hidden),
      width_(width) {}

absl::Status Mlp::Load(WeightArena& arena, WeightSource& source) {
  const int64_t D = hidden_, W = width_;
  const std::string gate = weight_prefix_ + "gate_proj.weight";
  MLAG_ASSIGN_OR_RETURN(w_gate_up_,
                        arena.AllocateLinear({2 * W, D}, arena.LinearDType(source, gate)));
  // Block scales (CUDA fp8) when the up half starts on a 128-row block.
  if (W % kFp8BlockSize == 0) MLAG_RETURN_IF_ERROR(arena.AddBlockScales(w_gate_up_));
  MLAG_RETURN_IF_ERROR(arena.LoadLinearInto(source, gate, {W, D}, w_gate_up_.SliceRows(0, W)));
  MLAG_RETURN_IF_ERROR(arena.LoadLinearInto(source, weight_prefix_ + "up_proj.weight", {W, D},
                                            w_gate_up_.SliceRows(W, 2 * W)));
  MLAG_RETURN_IF_ERROR(PackForLinear(arena.device(), w_gate_up_));
  MLAG_ASSIGN_OR_RETURN(w_down_,
                        arena.LoadLinear(source, weight_prefix_ + "down_proj.weight", {D, W}));
  return absl::OkStatus();
}

void Mlp::PlanWeights(WeightPlan& plan) const {
  const int64_t D = hidden_, W = width_;
  plan.AddLinearAs({2 * W, D}, plan.LinearDType(weight_prefix_ + "gate_proj.weight"),
                   /*block_scales=*/W % kFp8BlockSize == 0);
  plan.AddLinear(weight_prefix_ + "down_proj.weight", {D, W});
}

absl::Status Mlp::Forward(Stream& stream, const Tensor& x, const Tensor& gate_up_scratch,
                          const Tensor& act_scratch, const Tensor& out) const {
  const int64_t T = x.size(0), W = width_;
  const Tensor gate_up = ViewAs(gate_up_scratch, {T, 2 * W});
  const Tensor act = ViewAs(act_scratch, {T, W});
  {
    NodeScope s(stream, absl::StrCat(node_prefix_, ".gate_up"), OpKind::kGemm);
    MLAG_RETURN_IF_ERROR(Linear(stream, x, w_gate_up_, gate_up));
  }
  {
    NodeScope s(stream, absl::StrCat(node_prefix_, ".act"), OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(SiluAndMul(stream, gate_up, act));
  }
  NodeScope s(stream, absl::StrCat(node_prefix_, ".down"), OpKind::kGemm);
  return Linear(stream, act, w_down_, out);
}

}  // namespace mlag
