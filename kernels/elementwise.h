// Elementwise ops: fill, scale, add, copy.
//
// Tensors are float (f32/bf16/f16; Fill also takes i32/i64) and live on the
// stream's device. Math is done in f32 and rounded to the output dtype.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// Sets every element of `t` (contiguous) to `value` (rounded for floats,
// truncated for integers).
absl::Status Fill(Stream& stream, const Tensor& t, double value);

// y = alpha * x. Same shape, both contiguous; x and y may alias.
absl::Status Scale(Stream& stream, const Tensor& x, float alpha, const Tensor& y);

// out = a + b. Same shape, contiguous; out may alias a or b.
absl::Status Add(Stream& stream, const Tensor& a, const Tensor& b, const Tensor& out);

// dst = src, same dtype and shape. Both row-major (last dim unit-stride) with
// up to 2 dims, rows of any stride: used to copy real rows into static graph
// input buffers. src and dst may not overlap (InvalidArgument). A launch of
// kind copy.
absl::Status Copy(Stream& stream, const Tensor& src, const Tensor& dst);

}  // namespace mlag
