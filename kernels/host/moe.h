// Host implementations behind kernels/moe.h. Arguments are validated by the
// caller (kernels/moe.cc).
#pragma once

#include "kernels/moe.h"
#include "runtime/core/tensor.h"

namespace mlag::host {

void MoeRoute(const RoutingParams& params, const Tensor& logits, const Tensor& correction_bias,
              const Tensor& topk_ids, const Tensor& topk_weights);

void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                const Tensor& expert_map, const Tensor& w_gate_up, const Tensor& w_down,
                const Tensor& out);

}  // namespace mlag::host
