// RMSNorm, and the fused residual-add + RMSNorm of a decoder layer.
//
// y = w * cast_to_x_dtype(x32 * rsqrt(mean(x32^2) + eps)), computed in f32
// (DeepseekV2RMSNorm in the Hugging Face modeling_deepseek.py). Row-major
// tensors, rows may be strided.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// x: [T, D] f32/bf16; weight: [D] f32/bf16; y: [T, D] f32/bf16 (may alias x).
absl::Status RmsNorm(Stream& stream, const Tensor& x, const Tensor& weight, float eps,
                     const Tensor& y);

// residual += x (in residual's dtype), then y = RmsNorm(residual).
// x, residual, y: [T, D]; y may alias x but not residual.
absl::Status AddRmsNorm(Stream& stream, const Tensor& x, const Tensor& residual,
                        const Tensor& weight, float eps, const Tensor& y);

}  // namespace mlag
