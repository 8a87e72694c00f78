// Host implementation behind kernels/sampling.h. Arguments are validated by
// the caller (kernels/sampling.cc).
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

void Sample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
            const Tensor& top_p, const Tensor& seeds, const Tensor& steps,
            const Tensor& out_tokens);

}  // namespace mlag::host
