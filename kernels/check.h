// Argument validation shared by every kernel launch function. Each check
// returns InvalidArgument naming the argument and what was expected, so a
// shape or dtype mismatch is reported before anything is launched.
#pragma once

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// The cost of an op that reads and writes each of `tensors` once and does no
// multiply-adds worth counting (an elementwise or gather kernel): the sum of
// their bytes (the elements a view covers, not its strides' gaps).
inline OpCost MovedBytes(std::initializer_list<const Tensor*> tensors) {
  OpCost cost;
  for (const Tensor* t : tensors) cost.bytes += static_cast<double>(t->nbytes());
  return cost;
}

// `t` has one of the `allowed` dtypes.
absl::Status CheckDType(const Tensor& t, absl::string_view arg,
                        std::initializer_list<DType> allowed);

// `t` has exactly `shape.size()` dims and each size equals `shape[d]`;
// an entry of -1 accepts any size.
absl::Status CheckShape(const Tensor& t, absl::string_view arg,
                        std::initializer_list<int64_t> shape);

// The last dimension is unit-stride (rows may have any stride).
absl::Status CheckRowMajor(const Tensor& t, absl::string_view arg);

// Fully contiguous row-major.
absl::Status CheckContiguous(const Tensor& t, absl::string_view arg);

// `t` lives on the stream's device and has a non-null pointer (unless empty).
absl::Status CheckOnStream(const Stream& stream, const Tensor& t, absl::string_view arg);

// Every dimension of `a` and `b` equal.
absl::Status CheckSameShape(const Tensor& a, absl::string_view a_arg, const Tensor& b,
                            absl::string_view b_arg);

}  // namespace mlag
