// Host implementations behind kernels/rms_norm.h. Arguments are validated by
// the caller (kernels/rms_norm.cc).
//
// Arithmetic: the sum of squares of a row is accumulated in double (the row is
// held in f32); everything else is f32, with the normalised value rounded to
// the input's dtype before the weight multiplies it (as DeepseekV2RMSNorm in
// the Hugging Face modeling_deepseek.py).
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

void RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y);

// residual = round_to_residual_dtype(residual + x); y = RmsNorm(residual),
// with the normalised value rounded to residual's dtype.
void AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                const Tensor& y);

}  // namespace mlag::host
