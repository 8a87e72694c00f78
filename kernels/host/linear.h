// Host implementations behind kernels/linear.h. Arguments are validated by
// the caller (kernels/linear.cc): f32 activations with unit-stride last
// dimensions and row strides at least the row length; weights contiguous, in
// f32, bf16 or fp8 with per-row block scales.
#pragma once

#include "kernels/host/gemm.h"
#include "kernels/linear.h"
#include "runtime/core/tensor.h"

namespace mlag::host {

// The GemmNT operand for `weight` ([.., out, in]), starting at its first row
// (of a stacked weight: of its first matrix; Select the others).
GemmWeights WeightsOf(const LinearWeight& weight);

// y = x W^T through GemmNT (kernels/host/gemm.h), output columns split over
// the threads: batch-invariant.
void Linear(const Tensor& x, const LinearWeight& weight, const Tensor& y);

// transpose_w: one GemmNT per head (batch-invariant; the layout the model
// uses, packed or not). Otherwise one cblas_sgemm per head (row-major
// weights), whose summation order depends on the row count.
void HeadMatmul(const Tensor& x, const LinearWeight& weight, bool transpose_w, const Tensor& out);

}  // namespace mlag::host
