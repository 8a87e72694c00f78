// Gated activation of the MLP and experts.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i], silu(z) = z * sigmoid(z).
//   gate_up: f32/bf16 [T, 2I] row-major (gate half first, then up);
//   out: f32/bf16 [T, I] row-major.
absl::Status SiluAndMul(Stream& stream, const Tensor& gate_up, const Tensor& out);

}  // namespace mlag
