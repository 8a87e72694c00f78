#include "kernels/moe.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/moe.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

absl::Status ValidateRoutingParams(const RoutingParams& p) {
  const bool grouped = p.method != TopkMethod::kGreedy;
  if (p.num_experts <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.num_experts: must be positive, got ", p.num_experts));
  }
  if (p.top_k <= 0 || p.top_k > p.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("params.top_k: must be in [1, num_experts=",
                                                   p.num_experts, "], got ", p.top_k));
  }
  if (p.n_group <= 0 || p.num_experts % p.n_group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("params.n_group: must divide num_experts=",
                                                   p.num_experts, ", got ", p.n_group));
  }
  if (p.topk_group <= 0 || p.topk_group > p.n_group) {
    return absl::InvalidArgumentError(absl::StrCat("params.topk_group: must be in [1, n_group=",
                                                   p.n_group, "], got ", p.topk_group));
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

}  // namespace

absl::Status MoeRoute(Stream& stream, const RoutingParams& params, const Tensor& logits,
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
  if (stream.is_cuda()) return absl::UnimplementedError("moe_route: no CUDA kernel yet");
  return stream.LaunchHost("moe_route", OpKind::kKernel,
                           [params, logits, correction_bias, topk_ids, topk_weights] {
                             host::MoeRoute(params, logits, correction_bias, topk_ids,
                                            topk_weights);
                             return absl::OkStatus();
                           });
}

absl::Status MoeExperts(Stream& stream, const Tensor& x, const Tensor& topk_ids,
                        const Tensor& topk_weights, const Tensor& expert_map,
                        const Tensor& w_gate_up, const Tensor& w_down, const Tensor& out) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_ids, "topk_ids"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, topk_weights, "topk_weights"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, expert_map, "expert_map"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, w_gate_up, "w_gate_up"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, w_down, "w_down"));
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
  MLAG_RETURN_IF_ERROR(CheckDType(w_gate_up, "w_gate_up", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(w_gate_up, "w_gate_up", {-1, -1, D}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(w_gate_up, "w_gate_up"));
  const int64_t L = w_gate_up.size(0);
  if (w_gate_up.size(1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "w_gate_up: shape ", w_gate_up.ShapeString(), ", dim 1 must be 2*I (even)"));
  }
  const int64_t I = w_gate_up.size(1) / 2;
  MLAG_RETURN_IF_ERROR(CheckDType(w_down, "w_down", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(w_down, "w_down", {L, D, I}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(w_down, "w_down"));
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {T, D}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(out, "out"));
  // sgemm takes int dimensions.
  constexpr int64_t kIntMax = 0x7fffffff;
  if (T * K > kIntMax || 2 * I > kIntMax || D > kIntMax) {
    return absl::InvalidArgumentError("moe_experts: dimensions exceed the int range of sgemm");
  }
  if (stream.is_cuda()) return absl::UnimplementedError("moe_experts: no CUDA kernel yet");
  return stream.LaunchHost("moe_experts", OpKind::kGemm,
                           [x, topk_ids, topk_weights, expert_map, w_gate_up, w_down, out] {
                             host::MoeExperts(x, topk_ids, topk_weights, expert_map, w_gate_up,
                                              w_down, out);
                             return absl::OkStatus();
                           });
}

}  // namespace mlag
