// Host implementations behind kernels/moe.h. Arguments are validated by the
// caller (kernels/moe.cc).
#pragma once

#include "kernels/linear.h"
#include "kernels/moe.h"
#include "runtime/core/tensor.h"

namespace mlag::host {

void MoeRoute(const RoutingParams& params, const Tensor& logits, const Tensor& correction_bias,
              const Tensor& topk_ids, const Tensor& topk_weights);

// out: [T, D] summed, or [T, K, D] weighted choices (see kernels/moe.h).
void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                const Tensor& expert_map, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                const Tensor& out);

// out[t] = sum over k, in k order, of per_choice[t, k] ([T, K, D] -> [T, D]).
void MoeSumChoices(const float* per_choice, int64_t T, int64_t K, int64_t D, float* out);

}  // namespace mlag::host
