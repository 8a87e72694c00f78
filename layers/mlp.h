// The gated MLP f(x) = W_down (silu(W_gate x) * (W_up x)), used as the dense
// FFN of the first layers and as the shared experts of MoE layers. gate and up
// are fused into one [2W, D] matrix at load.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "layers/weight_arena.h"
#include "runtime/core/stream.h"

namespace mlag {

class Mlp {
 public:
  // node_prefix names the graph nodes ("layers.0.mlp" -> layers.0.mlp.gate_up,
  // .act, .down); weight_prefix names the tensors ("model.layers.0.mlp." ->
  // gate_proj.weight, up_proj.weight, down_proj.weight).
  Mlp(std::string node_prefix, std::string weight_prefix, int hidden, int width);

  absl::Status Load(WeightArena& arena, WeightSource& source);
  // The bytes Load leaves in the arena (WeightPlan), without loading.
  void PlanWeights(WeightPlan& plan) const;

  // out[0:T] = f(x[0:T]); gate_up [>=T, >=2W] and act [>=T, >=W] are scratch.
  absl::Status Forward(Stream& stream, const Tensor& x, const Tensor& gate_up_scratch,
                       const Tensor& act_scratch, const Tensor& out) const;

 private:
  std::string node_prefix_, weight_prefix_;
  int hidden_, width_;
  LinearWeight w_gate_up_;  // [2W, D]
  LinearWeight w_down_;     // [D, W]
};

}  // namespace mlag
