// Host implementations behind kernels/elementwise.h. Arguments are validated
// by the caller.
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

void Fill(const Tensor& t, double value);
void Scale(const Tensor& x, float alpha, const Tensor& y);
void Add(const Tensor& a, const Tensor& b, const Tensor& out);
void Copy2D(const Tensor& src, const Tensor& dst);

}  // namespace mlag::host
