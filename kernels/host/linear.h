// Host implementations behind kernels/linear.h, on OpenBLAS. Arguments are
// validated by the caller (kernels/linear.cc): f32 everywhere, unit-stride
// last dimensions, row strides that are valid BLAS leading dimensions, and
// every size within BLAS's int range.
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

// y = x W^T: cblas_sgemv for one row, cblas_sgemm otherwise.
void Linear(const Tensor& x, const Tensor& weight, const Tensor& y);

// One cblas_sgemm per head (see kernels/linear.h for the two layouts).
void HeadMatmul(const Tensor& x, const Tensor& weight, bool transpose_w, const Tensor& out);

}  // namespace mlag::host
