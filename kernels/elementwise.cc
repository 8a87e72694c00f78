#include "kernels/elementwise.h"

#include <utility>

#include "kernels/check.h"
#include "kernels/host/elementwise.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/elementwise.cuh"
#endif

namespace mlag {
namespace {

constexpr std::initializer_list<DType> kFloat = {DType::kF32, DType::kBF16, DType::kF16};

}  // namespace

absl::Status Fill(Stream& stream, const Tensor& t, double value) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, t, "t"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(t, "t"));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    if (t.dtype() == DType::kU8) {
      return stream.LaunchCuda(
          "fill", OpKind::kKernel,
          [&](void* s) {
            return static_cast<int>(cudaMemsetAsync(t.data(), static_cast<int>(value), t.numel(),
                                                    static_cast<cudaStream_t>(s)));
          },
          MovedBytes({&t}));
    }
    return stream.LaunchCuda(
        "fill", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchFill(t.data(), t.dtype(), t.numel(), value,
                                                   static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&t}));
#endif
  }
  return stream.LaunchHost("fill", OpKind::kKernel, [t, value] {
    host::Fill(t, value);
    return absl::OkStatus();
  });
}

absl::Status Scale(Stream& stream, const Tensor& x, float alpha, const Tensor& y) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, y, "y"));
  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", kFloat));
  MLAG_RETURN_IF_ERROR(CheckDType(y, "y", kFloat));
  MLAG_RETURN_IF_ERROR(CheckSameShape(x, "x", y, "y"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(x, "x"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(y, "y"));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "scale", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchScale(x.data(), x.dtype(), alpha, y.data(), y.dtype(),
                                                    x.numel(), static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&x, &y}));
#endif
  }
  return stream.LaunchHost("scale", OpKind::kKernel, [x, alpha, y] {
    host::Scale(x, alpha, y);
    return absl::OkStatus();
  });
}

absl::Status Add(Stream& stream, const Tensor& a, const Tensor& b, const Tensor& out) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, a, "a"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, b, "b"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));
  MLAG_RETURN_IF_ERROR(CheckDType(a, "a", kFloat));
  MLAG_RETURN_IF_ERROR(CheckDType(b, "b", kFloat));
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", kFloat));
  MLAG_RETURN_IF_ERROR(CheckSameShape(a, "a", b, "b"));
  MLAG_RETURN_IF_ERROR(CheckSameShape(a, "a", out, "out"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(a, "a"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(b, "b"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(out, "out"));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "add", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchAdd(a.data(), a.dtype(), b.data(), b.dtype(),
                                                  out.data(), out.dtype(), a.numel(),
                                                  static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&a, &b, &out}));
#endif
  }
  return stream.LaunchHost("add", OpKind::kKernel, [a, b, out] {
    host::Add(a, b, out);
    return absl::OkStatus();
  });
}

absl::Status Copy(Stream& stream, const Tensor& src, const Tensor& dst) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, src, "src"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, dst, "dst"));
  MLAG_RETURN_IF_ERROR(CheckSameShape(src, "src", dst, "dst"));
  if (src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError("copy: src and dst dtypes differ");
  }
  if (src.ndim() > 2) {
    MLAG_RETURN_IF_ERROR(CheckContiguous(src, "src"));
    MLAG_RETURN_IF_ERROR(CheckContiguous(dst, "dst"));
  }
  MLAG_RETURN_IF_ERROR(CheckRowMajor(src, "src"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(dst, "dst"));
  // Overlap is refused on both backends: cudaMemcpy's result is undefined
  // for it, and the host must not accept what CUDA cannot do. The byte
  // ranges [first element, last element] are compared, so interleaved
  // strided views count as overlapping too.
  if (src.numel() > 0) {
    const auto span = [](const Tensor& t) {
      const char* first = static_cast<const char*>(t.data());
      int64_t last = 0;
      for (int i = 0; i < t.ndim(); ++i) last += (t.size(i) - 1) * t.stride(i);
      return std::make_pair(first, first + (last + 1) * static_cast<int64_t>(DTypeSize(t.dtype())));
    };
    const auto a = span(src), b = span(dst);
    if (a.first < b.second && b.first < a.second) {
      return absl::InvalidArgumentError("copy: src and dst overlap");
    }
  }
  // Views with more than 2 dims are contiguous here: copy them flat.
  Tensor s = src.ndim() > 2 ? Tensor(src.data(), src.dtype(), {src.numel()}, src.device()) : src;
  Tensor d = dst.ndim() > 2 ? Tensor(dst.data(), dst.dtype(), {dst.numel()}, dst.device()) : dst;
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "copy", OpKind::kCopy,
        [&](void* cs) {
          const size_t esize = DTypeSize(s.dtype());
          if (s.ndim() <= 1) {
            return static_cast<int>(cudaMemcpyAsync(d.data(), s.data(), s.numel() * esize,
                                                    cudaMemcpyDeviceToDevice,
                                                    static_cast<cudaStream_t>(cs)));
          }
          return static_cast<int>(cudaMemcpy2DAsync(
              d.data(), d.stride(0) * esize, s.data(), s.stride(0) * esize, s.size(1) * esize,
              s.size(0), cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(cs)));
        },
        MovedBytes({&s, &d}));
#endif
  }
  return stream.LaunchHost("copy", OpKind::kCopy, [s, d] {
    host::Copy2D(s, d);
    return absl::OkStatus();
  });
}

}  // namespace mlag
