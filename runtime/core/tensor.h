// Tensor: a non-owning, strided view of device or host memory.
//
// A Tensor never owns memory: it is a pointer plus dtype, up to kMaxDims
// sizes, strides (in elements, not bytes) and the kind of device the pointer
// belongs to. Owning memory comes from Device::Allocate (a Buffer) or from a
// Workspace arena. Views are cheap to copy and are what kernels take.
//
// Example:
//   Buffer buf = device.Allocate(4 * 8 * sizeof(float)).value();
//   Tensor x = buf.AsTensor(DType::kF32, {4, 8});
//   Tensor row2 = x.Select(0, 2);          // [8]
//   Tensor cols = x.Slice(1, 2, 6);        // [4, 4], strides {8, 1}
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/core/dtype.h"

namespace mlag {

enum class DeviceKind : uint8_t { kHost, kCuda };

absl::string_view DeviceKindName(DeviceKind kind);

inline constexpr int kMaxDims = 4;

class Tensor {
 public:
  Tensor() = default;

  // A contiguous (row-major) view of `data`.
  Tensor(void* data, DType dtype, absl::Span<const int64_t> shape,
         DeviceKind device = DeviceKind::kHost);
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
         DeviceKind device = DeviceKind::kHost)
      : Tensor(data, dtype, absl::Span<const int64_t>(shape.begin(), shape.size()), device) {}

  // An arbitrary strided view. Strides are in elements.
  static Tensor Strided(void* data, DType dtype, absl::Span<const int64_t> shape,
                        absl::Span<const int64_t> strides, DeviceKind device = DeviceKind::kHost);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  DeviceKind device() const { return device_; }
  int ndim() const { return ndim_; }
  // size(-1) is the last dimension.
  int64_t size(int dim) const { return shape_[Wrap(dim)]; }
  int64_t stride(int dim) const { return strides_[Wrap(dim)]; }
  absl::Span<const int64_t> shape() const { return {shape_.data(), static_cast<size_t>(ndim_)}; }
  absl::Span<const int64_t> strides() const {
    return {strides_.data(), static_cast<size_t>(ndim_)};
  }
  int64_t numel() const;
  // Bytes spanned by a contiguous view (numel * element size).
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool is_contiguous() const;

  // Elements [begin, end) of dimension `dim`; the other dimensions unchanged.
  Tensor Slice(int dim, int64_t begin, int64_t end) const;
  // Element `index` of dimension `dim`, which is removed from the view.
  Tensor Select(int dim, int64_t index) const;
  // A contiguous view with a new shape of the same element count.
  absl::StatusOr<Tensor> Reshape(absl::Span<const int64_t> shape) const;
  absl::StatusOr<Tensor> Reshape(std::initializer_list<int64_t> shape) const {
    return Reshape(absl::Span<const int64_t>(shape.begin(), shape.size()));
  }

  // Address of the element at `index` (one entry per dimension).
  void* ElementPtr(absl::Span<const int64_t> index) const;

  // "[4, 8] bf16" — for messages.
  std::string ShapeString() const;

 private:
  int Wrap(int dim) const { return dim < 0 ? dim + ndim_ : dim; }

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  DeviceKind device_ = DeviceKind::kHost;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace mlag
