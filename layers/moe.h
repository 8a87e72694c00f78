// A DeepSeekMoE feed-forward block: the router (gate linear in f32, then
// MoeRoute), the routed experts this rank holds, and the shared experts:
// FFN(x) = sum_k w_k f_{id_k}(x) + f_shared(x)  (SPEC-deepseek §4).
//
// The block holds a subset of the routed experts, named by their global ids;
// expert_map sends each global id to its local slot or -1. With every expert
// local this is the single-rank MoE; expert parallelism gives each rank a
// share and sums the partial outputs across ranks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "layers/activations.h"
#include "layers/mlp.h"
#include "layers/model_config.h"
#include "layers/weight_arena.h"

namespace mlag {

class Moe {
 public:
  // `local_experts`: global ids of the routed experts held here (empty: all).
  Moe(int layer, const ModelConfig& config, std::vector<int> local_experts);

  // Reads the gate, the correction bias (noaux_tc), the local experts and the
  // shared experts of model.layers.<i>.mlp.
  absl::Status Load(WeightArena& arena, WeightSource& source);

  // out[0:T] = FFN(x[0:T]), T = x.size(0). When `routing_record` is set (eager
  // runs only), the chosen expert ids [T * K] are copied into it after routing.
  absl::Status Forward(Stream& stream, const Activations& acts, const Tensor& x,
                       const Tensor& out, std::vector<int32_t>* routing_record = nullptr) const;

  // Bytes of one routed expert's weights (gate, up and down).
  size_t expert_bytes() const;

  const std::vector<int>& local_experts() const { return local_experts_; }

 private:
  std::string Node(const char* op) const;

  int layer_;
  const ModelConfig& config_;
  std::vector<int> local_experts_;
  Tensor w_gate_;           // [E, D]
  Tensor correction_bias_;  // [E] (noaux_tc) or empty
  Tensor expert_map_;       // i32 [E]
  Tensor w_gate_up_;        // [L, 2*Im, D]
  Tensor w_down_;           // [L, D, Im]
  std::unique_ptr<Mlp> shared_;
};

}  // namespace mlag
