#include "runtime/core/tensor.h"

#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlag {

absl::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? "cuda" : "host";
}

Tensor::Tensor(void* data, DType dtype, absl::Span<const int64_t> shape, DeviceKind device)
    : data_(data), dtype_(dtype), device_(device), ndim_(static_cast<int>(shape.size())) {
  assert(shape.size() <= static_cast<size_t>(kMaxDims));
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    shape_[d] = shape[d];
    strides_[d] = stride;
    stride *= shape[d];
  }
}

Tensor Tensor::Strided(void* data, DType dtype, absl::Span<const int64_t> shape,
                       absl::Span<const int64_t> strides, DeviceKind device) {
  assert(shape.size() == strides.size() && shape.size() <= static_cast<size_t>(kMaxDims));
  Tensor t(data, dtype, shape, device);
  for (size_t d = 0; d < strides.size(); ++d) t.strides_[d] = strides[d];
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != stride) return false;
    stride *= shape_[d];
  }
  return true;
}

Tensor Tensor::Slice(int dim, int64_t begin, int64_t end) const {
  dim = Wrap(dim);
  assert(0 <= begin && begin <= end && end <= shape_[dim]);
  Tensor t = *this;
  t.data_ =
      static_cast<char*>(data_) + begin * strides_[dim] * static_cast<int64_t>(DTypeSize(dtype_));
  t.shape_[dim] = end - begin;
  return t;
}

Tensor Tensor::Select(int dim, int64_t index) const {
  dim = Wrap(dim);
  assert(0 <= index && index < shape_[dim]);
  Tensor t = *this;
  t.data_ =
      static_cast<char*>(data_) + index * strides_[dim] * static_cast<int64_t>(DTypeSize(dtype_));
  for (int d = dim; d + 1 < ndim_; ++d) {
    t.shape_[d] = shape_[d + 1];
    t.strides_[d] = strides_[d + 1];
  }
  t.ndim_ = ndim_ - 1;
  t.shape_[t.ndim_] = 0;
  t.strides_[t.ndim_] = 0;
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshape(absl::Span<const int64_t> shape) const {
  if (!is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape non-contiguous tensor ", ShapeString()));
  }
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat("reshape to more than ", kMaxDims, " dims"));
  }
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n != numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeString(), " to [", absl::StrJoin(shape, ", "), "]"));
  }
  return Tensor(data_, dtype_, shape, device_);
}

void* Tensor::ElementPtr(absl::Span<const int64_t> index) const {
  int64_t off = 0;
  for (int d = 0; d < ndim_; ++d) off += index[d] * strides_[d];
  return static_cast<char*>(data_) + off * static_cast<int64_t>(DTypeSize(dtype_));
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape(), ", "), "] ", DTypeName(dtype_));
}

}  // namespace mlag
