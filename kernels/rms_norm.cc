#include "kernels/rms_norm.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/rms_norm.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/rms_norm.cuh"
#endif

namespace mlag {
namespace {

constexpr std::initializer_list<DType> kNormDTypes = {DType::kF32, DType::kBF16};

absl::Status CheckEps(float eps) {
  if (std::isfinite(eps) && eps >= 0.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("eps: must be finite and >= 0, got ", eps));
}

// Checks shared by RmsNorm and AddRmsNorm for the normalised input `in`
// (x, or residual), the weight and the output.
absl::Status CheckNormArgs(const Stream& stream, const Tensor& in, absl::string_view in_arg,
                           const Tensor& weight, float eps, const Tensor& y) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, in, in_arg));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, weight, "weight"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, y, "y"));
  MLAG_RETURN_IF_ERROR(CheckDType(in, in_arg, kNormDTypes));
  MLAG_RETURN_IF_ERROR(CheckDType(weight, "weight", kNormDTypes));
  MLAG_RETURN_IF_ERROR(CheckDType(y, "y", kNormDTypes));
  MLAG_RETURN_IF_ERROR(CheckShape(in, in_arg, {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckShape(weight, "weight", {in.size(1)}));
  MLAG_RETURN_IF_ERROR(CheckSameShape(y, "y", in, in_arg));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(in, in_arg));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(weight, "weight"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(y, "y"));
  return CheckEps(eps);
}

// y may be the very tensor `x` (each row is read before it is written) but
// not the same memory under another dtype or row stride.
absl::Status CheckInPlace(const Tensor& x, const Tensor& y) {
  if (y.data() != x.data() || x.numel() == 0) return absl::OkStatus();
  if (y.dtype() == x.dtype() && (y.size(0) <= 1 || y.stride(0) == x.stride(0))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "y: aliases x with a different dtype or row stride; in place needs the same view");
}

}  // namespace

absl::Status RmsNorm(Stream& stream, const Tensor& x, const Tensor& weight, float eps,
                     const Tensor& y) {
  MLAG_RETURN_IF_ERROR(CheckNormArgs(stream, x, "x", weight, eps, y));
  MLAG_RETURN_IF_ERROR(CheckInPlace(x, y));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "rms_norm", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchRmsNorm(
              x.data(), x.dtype(), x.stride(0), weight.data(), weight.dtype(), y.data(), y.dtype(),
              y.stride(0), x.size(0), x.size(1), eps, static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&x, &weight, &y}));
#endif
  }
  return stream.LaunchHost("rms_norm", OpKind::kKernel, [x, weight, eps, y] {
    host::RmsNorm(x, weight, eps, y);
    return absl::OkStatus();
  });
}

absl::Status AddRmsNorm(Stream& stream, const Tensor& x, const Tensor& residual,
                        const Tensor& weight, float eps, const Tensor& y) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", kNormDTypes));
  MLAG_RETURN_IF_ERROR(CheckShape(x, "x", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckSameShape(residual, "residual", x, "x"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(x, "x"));
  MLAG_RETURN_IF_ERROR(CheckNormArgs(stream, residual, "residual", weight, eps, y));
  MLAG_RETURN_IF_ERROR(CheckInPlace(x, y));
  if (y.data() == residual.data() && y.numel() > 0) {
    return absl::InvalidArgumentError("y: must not alias residual, which keeps the sum");
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "add_rms_norm", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchAddRmsNorm(
              x.data(), x.dtype(), x.stride(0), residual.data(), residual.dtype(),
              residual.stride(0), weight.data(), weight.dtype(), y.data(), y.dtype(), y.stride(0),
              x.size(0), x.size(1), eps, static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&x, &residual, &residual, &weight, &y}));  // residual read and written
#endif
  }
  return stream.LaunchHost("add_rms_norm", OpKind::kKernel, [x, residual, weight, eps, y] {
    host::AddRmsNorm(x, residual, weight, eps, y);
    return absl::OkStatus();
  });
}

}  // namespace mlag
