// A DeepSeekMoE feed-forward block: the router (gate linear in f32, then
// MoeRoute), the routed experts this rank holds, and the shared experts:
// FFN(x) = sum_k w_k f_{id_k}(x) + f_shared(x)  (DeepseekV2MoE in the Hugging
// Face modeling_deepseek.py).
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
#include "comm/communicator.h"
#include "comm/expert_placement.h"
#include "layers/activation_buffers.h"
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
  // The bytes Load takes, routed experts included (WeightPlan), without
  // loading.
  void PlanWeights(WeightPlan& plan) const;

  // out[0:T] = FFN(x[0:T]), T = x.size(0). When `routing_record` is set (eager
  // runs only), the chosen expert ids [T * K] are copied into it after routing.
  //
  // With an expert-parallel group `ep` of N > 1 ranks (every rank calling
  // with the same T), the routed part runs as: dispatch (all-gather the
  // tokens, ids and weights of every rank), the local experts over all N*T
  // rows, combine (reduce-scatter the partial sums back to their ranks). The
  // shared experts run on the rank's own tokens.
  absl::Status Forward(Stream& stream, const ActivationBuffers& acts, const Tensor& x,
                       const Tensor& out, std::vector<int32_t>* routing_record = nullptr,
                       Communicator* ep = nullptr) const;

  // Moves the routed experts from placement `from` to placement `to` (both
  // over the ranks of `world`, group rank == world rank): an expert that
  // stays on this rank is copied locally, one that moves is sent by its old
  // owner and received by its new one. Every rank of `world` calls it, in the
  // same order for every layer. A rank outside `to` ends with no experts.
  absl::Status MigrateExperts(Stream& stream, Communicator& world, const ExpertPlacement& from,
                              const ExpertPlacement& to);

  // The expert weights of local slot `slot`: gate|up [2*Im, D] and down
  // [D, Im] (device memory).
  LinearWeight expert_gate_up(int slot) const { return experts_.gate_up.Select(slot); }
  LinearWeight expert_down(int slot) const { return experts_.down.Select(slot); }

  // Bytes of one routed expert's weights (gate, up and down, with scales).
  size_t expert_bytes() const;
  // Bytes of the routed-expert buffers this block holds (owned here, not in
  // the model's weight arena).
  size_t expert_buffer_bytes() const { return experts_.buffer.bytes(); }
  // Host: the routed experts' bytes on huge pages (Device::HostHugePageShare).
  double expert_huge_page_bytes() const {
    return Device::HostHugePageShare(experts_.buffer.data(), experts_.buffer.bytes()) *
           static_cast<double>(experts_.buffer.bytes());
  }

  const std::vector<int>& local_experts() const { return local_experts_; }
  // The routed experts' dtype (their fp8 scales aside).
  DType expert_dtype() const { return expert_dtype_; }

  // The routed-expert buffer of `slots` local experts (at least one slot) in
  // `dtype`: values of gate|up and down, then (fp8) their scales, each
  // 64-byte aligned.
  struct ExpertBufferLayout {
    size_t gate_up = 0, down = 0, gate_up_scales = 0, down_scales = 0, total = 0;
  };
  ExpertBufferLayout ExpertLayout(int64_t slots, DType dtype) const;

 private:
  std::string Node(const char* op) const;

  int layer_;
  const ModelConfig& config_;
  std::vector<int> local_experts_;
  Tensor w_gate_;           // [E, D]
  Tensor correction_bias_;  // [E] (noaux_tc) or empty
  Tensor route_counter_;    // i32 [1], 0 between launches (CUDA: MoeGateRoute)
  // Installs `experts` as the local set: expert_map_ follows.
  absl::Status SetLocalExperts(std::vector<int> experts);
  // The routed experts' weights in one buffer, owned here: migration
  // replaces it.
  struct Experts {
    Buffer buffer;
    LinearWeight gate_up;  // [max(L,1), 2*Im, D]
    LinearWeight down;     // [max(L,1), D, Im]
  };
  // Allocates expert weights for `slots` local experts (at least one slot)
  // in expert_dtype_.
  absl::StatusOr<Experts> AllocateExperts(int64_t slots) const;
  // Copies or moves one expert's weights (values and scales) between slots.
  absl::Status CopyExpert(Stream& stream, const LinearWeight& src, const LinearWeight& dst) const;

  Device* device_ = nullptr;
  DType expert_dtype_ = DType::kF32;
  Tensor expert_map_;  // i32 [E]
  Experts experts_;
  std::unique_ptr<Mlp> shared_;
};

}  // namespace mlag
