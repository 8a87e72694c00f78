// Host implementation behind kernels/activation.h. Arguments are validated by
// the caller (kernels/activation.cc).
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i], in f32, rounded once
// to out's dtype.
void SiluAndMul(const Tensor& gate_up, const Tensor& out);

}  // namespace mlag::host
