#include "kernels/moe.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/moe.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/moe.cuh"
#include "kernels/cuda_blas.h"
#include "runtime/core/cuda_status.h"
#endif

namespace mlag {
namespace {

absl::Status ValidateRoutingParams(const RoutingParams& p) {
  const bool grouped = p.method != TopkMethod::kGreedy;
  if (p.num_experts <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.num_experts: must be positive, got ", p.num_experts));
  }
  if (p.top_k <= 0 || p.top_k > p.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.top_k: must be in [1, num_experts=", p.num_experts, "], got ", p.top_k));
  }
  if (p.n_group <= 0 || p.num_experts % p.n_group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.n_group: must divide num_experts=", p.num_experts, ", got ", p.n_group));
  }
  if (p.topk_group <= 0 || p.topk_group > p.n_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.topk_group: must be in [1, n_group=", p.n_group, "], got ", p.topk_group));
  }
  if (grouped) {
    const int selectable = p.topk_group * (p.num_experts / p.n_group);
    if (p.top_k > selectable) {
      return absl::InvalidArgumentError(
          absl::StrCat("params.top_k: ", p.top_k, " exceeds the ", selectable,
                       " experts of the topk_group=", p.topk_group, " kept groups"));
    }
  }
  return absl::OkStatus();
}

#if MLAG_HAVE_CUDA
constexpr int64_t kCudaIntMax = std::numeric_limits<int>::max();

cuda::MoeRouteParams CudaRouteParams(const RoutingParams& params) {
  cuda::MoeRouteParams p;
  p.num_experts = params.num_experts;
  p.top_k = params.top_k;
  p.n_group = params.n_group;
  p.topk_group = params.topk_group;
  p.sigmoid = params.scoring == ScoringFunc::kSigmoid;
  switch (params.method) {
    case TopkMethod::kGreedy:
      p.method = cuda::kMoeGreedy;
      break;
    case TopkMethod::kGroupLimitedGreedy:
      p.method = cuda::kMoeGroupLimitedGreedy;
      break;
    case TopkMethod::kNoauxTc:
      p.method = cuda::kMoeNoauxTc;
      break;
  }
  p.norm_topk_prob = params.norm_topk_prob;
  p.routed_scaling_factor = params.routed_scaling_factor;
  return p;
}

absl::Status MoeRouteCuda(Stream& stream, const RoutingParams& params, const Tensor& logits,
                          const Tensor& correction_bias, const Tensor& topk_ids,
                          const Tensor& topk_weights) {
  if (params.num_experts > cuda::kMoeRouteMaxExperts) {
    return absl::UnimplementedError(absl::StrCat("moe_route: the CUDA router handles at most ",
                                                 cuda::kMoeRouteMaxExperts, " experts, got ",
                                                 params.num_experts));
  }
  const cuda::MoeRouteParams p = CudaRouteParams(params);
  const float* bias =
      params.method == TopkMethod::kNoauxTc ? correction_bias.data_as<const float>() : nullptr;
  return stream.LaunchCuda(
      "moe_route", OpKind::kKernel,
      [&](void* s) {
        return static_cast<int>(
            cuda::LaunchMoeRoute(p, logits.data_as<const float>(), logits.stride(0), bias,
                                 logits.size(0), topk_ids.data_as<int32_t>(),
                                 topk_weights.data_as<float>(), static_cast<cudaStream_t>(s)));
      },
      MovedBytes({&logits, &topk_ids, &topk_weights}));
}

absl::Status MoeExpertsCuda(Stream& stream, const Tensor& x, const Tensor& topk_ids,
                            const Tensor& topk_weights, const Tensor& expert_map,
                            const LinearWeight& gate_up, const LinearWeight& down,
                            const Tensor& out, const Tensor& workspace) {
  const Tensor& w_gate_up = gate_up.values;
  const int64_t T = x.size(0), D = x.size(1), K = topk_ids.size(1), E = expert_map.size(0);
  const int64_t L = w_gate_up.size(0), I = w_gate_up.size(1) / 2;
  if (L > cuda::kMoeMaxLocalExperts) {
    return absl::UnimplementedError(absl::StrCat("moe_experts: the CUDA kernels handle at most ",
                                                 cuda::kMoeMaxLocalExperts, " local experts, got ",
                                                 L));
  }
  if (D > cuda::kMoeMaxColumns || I > cuda::kMoeMaxColumns) {
    return absl::UnimplementedError(absl::StrCat(
        "moe_experts: D=", D, " or I=", I, " exceeds the CUDA limit of ", cuda::kMoeMaxColumns));
  }
  if (T > kCudaIntMax || E > kCudaIntMax || K > kCudaIntMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_experts: T=", T, ", K=", K, " or E=", E, " exceeds the int range"));
  }
  const size_t needed = cuda::MoeExpertsWorkspaceBytes(T, K, D, I, L);
  void* scratch = nullptr;
  size_t scratch_bytes = needed;
  if (workspace.data() != nullptr) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, workspace, "workspace"));
    MLAG_RETURN_IF_ERROR(CheckContiguous(workspace, "workspace"));
    if (workspace.nbytes() < needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workspace: ", workspace.nbytes(), " bytes, moe_experts needs ", needed,
          " (MoeExpertsWorkspaceBytes(T=", T, ", K=", K, ", D=", D, ", I=", I, ", L=", L, "))"));
    }
    if (reinterpret_cast<uintptr_t>(workspace.data()) % 4 != 0) {
      return absl::InvalidArgumentError("workspace: must be 4-byte aligned");
    }
    scratch = workspace.data();
    scratch_bytes = workspace.nbytes();
  } else {
    MLAG_ASSIGN_OR_RETURN(scratch, cuda_blas::Scratch(stream, needed, "moe_experts"));
  }
  cuda::MoeExpertsArgs a;
  a.x = x.data_as<const float>();
  a.x_ld = x.stride(0);
  a.topk_ids = topk_ids.data_as<const int32_t>();
  a.topk_weights = topk_weights.data_as<const float>();
  a.expert_map = expert_map.data_as<const int32_t>();
  a.w_gate_up = w_gate_up.data();
  a.w_down = down.values.data();
  a.w_dtype = w_gate_up.dtype();
  if (gate_up.has_scales()) {
    a.w_gate_up_scales = gate_up.scales.data_as<const float>();
    a.w_down_scales = down.scales.data_as<const float>();
  }
  a.out = out.data_as<float>();
  a.workspace = scratch;
  a.workspace_bytes = scratch_bytes;
  a.T = static_cast<int>(T);
  a.K = static_cast<int>(K);
  a.E = static_cast<int>(E);
  a.L = static_cast<int>(L);
  a.D = static_cast<int>(D);
  a.I = static_cast<int>(I);
  // Every (token, expert) pair's gate_up [2I, D] and down [D, I]; the
  // weights of the experts the batch routes to depend on the routing and are
  // not counted here.
  OpCost cost = MovedBytes({&x, &topk_ids, &topk_weights, &out});
  cost.flops = 6.0 * T * K * D * I;
  cost.math = w_gate_up.dtype();
  return stream.LaunchCuda(
      "moe_experts", OpKind::kGemm,
      [&](void* s) {
        return static_cast<int>(cuda::LaunchMoeExperts(a, static_cast<cudaStream_t>(s)));
      },
      cost);
}
#endif  // MLAG_HAVE_CUDA

}  // namespace

absl::StatusOr<bool> MoeExpertsOnTensorCores(const Device& device, DType w_dtype) {
  if (!device.is_cuda()) return false;
#if MLAG_HAVE_CUDA
  bool yes = false;
  MLAG_CUDA_RETURN_IF_ERROR(cuda::MoeExpertsOnTensorCores(device.index(), w_dtype, &yes));
  return yes;
#else
  (void)w_dtype;
  return false;
#endif
}

size_t MoeExpertsWorkspaceBytes(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L) {
#if MLAG_HAVE_CUDA
  return cuda::MoeExpertsWorkspaceBytes(T, K, D, I, L);
#else
  (void)T;
  (void)K;
  (void)D;
  (void)I;
  (void)L;
  return 0;
#endif
}

namespace {

// MoeRoute's argument checks (MoeGateRoute's fused path makes them too).
absl::Status CheckRouteArgs(Stream& stream, const RoutingParams& params, const Tensor& logits,
                            const Tensor& correction_bias, const Tensor& topk_ids,
                            const Tensor& topk_weights) {
  MLAG_RETURN_IF_ERROR(ValidateRoutingParams(params));
  const int64_t E = params.num_experts;
  const int64_t K = params.top_k;
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, logits, "logits"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_ids, "topk_ids"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_weights, "topk_weights"));
  MLAG_RETURN_IF_ERROR(CheckDType(logits, "logits", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(logits, "logits", {-1, E}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(logits, "logits"));
  const int64_t T = logits.size(0);
  MLAG_RETURN_IF_ERROR(CheckDType(topk_ids, "topk_ids", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(topk_ids, "topk_ids", {T, K}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(topk_ids, "topk_ids"));
  MLAG_RETURN_IF_ERROR(CheckDType(topk_weights, "topk_weights", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(topk_weights, "topk_weights", {T, K}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(topk_weights, "topk_weights"));
  if (params.method == TopkMethod::kNoauxTc) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, correction_bias, "correction_bias"));
    MLAG_RETURN_IF_ERROR(CheckDType(correction_bias, "correction_bias", {DType::kF32}));
    MLAG_RETURN_IF_ERROR(CheckShape(correction_bias, "correction_bias", {E}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(correction_bias, "correction_bias"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRoute(Stream& stream, const RoutingParams& params, const Tensor& logits,
                      const Tensor& correction_bias, const Tensor& topk_ids,
                      const Tensor& topk_weights) {
  MLAG_RETURN_IF_ERROR(
      CheckRouteArgs(stream, params, logits, correction_bias, topk_ids, topk_weights));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return MoeRouteCuda(stream, params, logits, correction_bias, topk_ids, topk_weights);
#endif
  }
  return stream.LaunchHost(
      "moe_route", OpKind::kKernel, [params, logits, correction_bias, topk_ids, topk_weights] {
        host::MoeRoute(params, logits, correction_bias, topk_ids, topk_weights);
        return absl::OkStatus();
      });
}

absl::Status MoeGateRoute(Stream& stream, const RoutingParams& params, const Tensor& x,
                          const Tensor& w_gate, const Tensor& correction_bias, const Tensor& logits,
                          const Tensor& counter, const Tensor& topk_ids,
                          const Tensor& topk_weights) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, w_gate, "w_gate"));
  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(x, "x", {logits.ndim() == 2 ? logits.size(0) : -1, -1}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(x, "x"));
  MLAG_RETURN_IF_ERROR(CheckDType(w_gate, "w_gate", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(w_gate, "w_gate", {params.num_experts, x.size(1)}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(w_gate, "w_gate"));
#if MLAG_HAVE_CUDA
  const int64_t T = x.size(0);
  if (stream.is_cuda() && T <= cuda::kMoeGateRouteMaxTokens &&
      cuda::MoeGateRouteFits(params.num_experts, params.n_group) && counter.data() != nullptr) {
    // The routing arguments as MoeRoute checks them, then one launch.
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, counter, "counter"));
    MLAG_RETURN_IF_ERROR(CheckDType(counter, "counter", {DType::kI32}));
    MLAG_RETURN_IF_ERROR(CheckShape(counter, "counter", {1}));
    MLAG_RETURN_IF_ERROR(CheckShape(logits, "logits", {T, -1}));
    MLAG_RETURN_IF_ERROR(
        CheckRouteArgs(stream, params, logits, correction_bias, topk_ids, topk_weights));
    const bool noaux = params.method == TopkMethod::kNoauxTc;
    const cuda::MoeRouteParams p = CudaRouteParams(params);
    return stream.LaunchCuda(
        "moe_gate_route", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchMoeGateRoute(
              p, x.data_as<const float>(), x.stride(0), w_gate.data_as<const float>(), x.size(1),
              noaux ? correction_bias.data_as<const float>() : nullptr, T, logits.data_as<float>(),
              logits.stride(0), counter.data_as<int32_t>(), topk_ids.data_as<int32_t>(),
              topk_weights.data_as<float>(), static_cast<cudaStream_t>(s)));
        },
        OpCost{static_cast<double>(w_gate.nbytes() + x.nbytes() + logits.nbytes() +
                                   topk_ids.nbytes() + topk_weights.nbytes()),
               2.0 * static_cast<double>(T) * x.size(1) * params.num_experts, DType::kF32});
  }
#endif
  MLAG_RETURN_IF_ERROR(Linear(stream, x, w_gate, logits));
  return MoeRoute(stream, params, logits, correction_bias, topk_ids, topk_weights);
}

absl::Status MoeExperts(Stream& stream, const Tensor& x, const Tensor& topk_ids,
                        const Tensor& topk_weights, const Tensor& expert_map,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down,
                        const Tensor& out, const Tensor& workspace) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_ids, "topk_ids"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_weights, "topk_weights"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, expert_map, "expert_map"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));

  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(x, "x", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(x, "x"));
  const int64_t T = x.size(0);
  const int64_t D = x.size(1);
  MLAG_RETURN_IF_ERROR(CheckDType(topk_ids, "topk_ids", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(topk_ids, "topk_ids", {T, -1}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(topk_ids, "topk_ids"));
  const int64_t K = topk_ids.size(1);
  MLAG_RETURN_IF_ERROR(CheckDType(topk_weights, "topk_weights", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(topk_weights, "topk_weights", {T, K}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(topk_weights, "topk_weights"));
  MLAG_RETURN_IF_ERROR(CheckDType(expert_map, "expert_map", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(expert_map, "expert_map", {-1}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(expert_map, "expert_map"));
  MLAG_RETURN_IF_ERROR(
      CheckLinearWeight(stream, w_gate_up, "w_gate_up", {-1, -1, D}, /*cuda_fp8=*/true));
  const int64_t L = w_gate_up.values.size(0);
  if (w_gate_up.values.size(1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "w_gate_up: shape ", w_gate_up.values.ShapeString(), ", dim 1 must be 2*I (even)"));
  }
  const int64_t I = w_gate_up.values.size(1) / 2;
  MLAG_RETURN_IF_ERROR(CheckLinearWeight(stream, w_down, "w_down", {L, D, I}, /*cuda_fp8=*/true));
  if (w_down.dtype() != w_gate_up.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("w_down: dtype ", DTypeName(w_down.dtype()),
                                                   ", w_gate_up's is ",
                                                   DTypeName(w_gate_up.dtype())));
  }
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", {DType::kF32}));
  if (out.ndim() == 3 && !stream.is_cuda()) {
    MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {T, K, D}));
  } else {
    MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {T, D}));
  }
  MLAG_RETURN_IF_ERROR(CheckContiguous(out, "out"));
  constexpr int64_t kIntMax = 0x7fffffff;
  if (T * K > kIntMax || 2 * I > kIntMax || D > kIntMax) {
    return absl::InvalidArgumentError("moe_experts: dimensions exceed the int range");
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return MoeExpertsCuda(stream, x, topk_ids, topk_weights, expert_map, w_gate_up, w_down, out,
                          workspace);
#endif
  }
  (void)workspace;  // the host needs no scratch from the caller
  return stream.LaunchHost("moe_experts", OpKind::kGemm,
                           [x, topk_ids, topk_weights, expert_map, w_gate_up, w_down, out] {
                             host::MoeExperts(x, topk_ids, topk_weights, expert_map, w_gate_up,
                                              w_down, out);
                             return absl::OkStatus();
                           });
}

absl::Status MoeSumChoices(Stream& stream, const Tensor& per_choice, const Tensor& out) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, per_choice, "per_choice"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));
  if (stream.is_cuda()) {
    return absl::UnimplementedError("moe_sum_choices: host only");
  }
  MLAG_RETURN_IF_ERROR(CheckDType(per_choice, "per_choice", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(per_choice, "per_choice", {-1, -1, -1}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(per_choice, "per_choice"));
  const int64_t T = per_choice.size(0), D = per_choice.size(2);
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {T, D}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(out, "out"));
  return stream.LaunchHost("moe_sum_choices", OpKind::kKernel, [per_choice, out] {
    host::MoeSumChoices(per_choice.data_as<const float>(), per_choice.size(0), per_choice.size(1),
                        per_choice.size(2), out.data_as<float>());
    return absl::OkStatus();
  });
}

}  // namespace mlag
