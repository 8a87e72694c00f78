#include "kernels/check.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlag {

absl::Status CheckDType(const Tensor& t, absl::string_view arg,
                        std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype() == d) return absl::OkStatus();
  }
  std::string names = absl::StrJoin(
      allowed, "/", [](std::string* out, DType d) { absl::StrAppend(out, DTypeName(d)); });
  return absl::InvalidArgumentError(
      absl::StrCat(arg, ": dtype ", DTypeName(t.dtype()), ", expected ", names));
}

absl::Status CheckShape(const Tensor& t, absl::string_view arg,
                        std::initializer_list<int64_t> shape) {
  bool ok = t.ndim() == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) {
    if (!ok) break;
    if (s >= 0 && t.size(d) != s) ok = false;
    ++d;
  }
  if (ok) return absl::OkStatus();
  std::string want = absl::StrJoin(shape, ", ", [](std::string* out, int64_t s) {
    absl::StrAppend(out, s < 0 ? std::string("*") : absl::StrCat(s));
  });
  return absl::InvalidArgumentError(
      absl::StrCat(arg, ": shape ", t.ShapeString(), ", expected [", want, "]"));
}

absl::Status CheckRowMajor(const Tensor& t, absl::string_view arg) {
  if (t.ndim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(arg, ": last dimension must be unit-stride, got stride ", t.stride(-1)));
}

absl::Status CheckContiguous(const Tensor& t, absl::string_view arg) {
  if (t.is_contiguous()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(arg, ": must be contiguous, strides [", absl::StrJoin(t.strides(), ", "), "]"));
}

absl::Status CheckOnStream(const Stream& stream, const Tensor& t, absl::string_view arg) {
  if (t.device() != stream.device().kind()) {
    return absl::InvalidArgumentError(absl::StrCat(arg, ": tensor on ", DeviceKindName(t.device()),
                                                   ", stream on ",
                                                   DeviceKindName(stream.device().kind())));
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(arg, ": null data pointer"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const Tensor& a, absl::string_view a_arg, const Tensor& b,
                            absl::string_view b_arg) {
  bool same = a.ndim() == b.ndim();
  for (int d = 0; same && d < a.ndim(); ++d) same = a.size(d) == b.size(d);
  if (same) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(a_arg, " ", a.ShapeString(), " and ", b_arg, " ",
                                                 b.ShapeString(), " must have the same shape"));
}

}  // namespace mlag
