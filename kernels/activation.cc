#include "kernels/activation.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/activation.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/activation.cuh"
#endif

namespace mlag {

absl::Status SiluAndMul(Stream& stream, const Tensor& gate_up, const Tensor& out) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, gate_up, "gate_up"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));
  MLAG_RETURN_IF_ERROR(CheckDType(gate_up, "gate_up", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckShape(gate_up, "gate_up", {-1, -1}));
  if (gate_up.size(1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gate_up: last dimension ", gate_up.size(1),
                                                   " is odd, expected 2I (gate then up)"));
  }
  MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {gate_up.size(0), gate_up.size(1) / 2}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(gate_up, "gate_up"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(out, "out"));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "silu_and_mul", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchSiluAndMul(
              gate_up.data(), gate_up.dtype(), gate_up.stride(0), out.data(), out.dtype(),
              out.stride(0), out.size(0), out.size(1), static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&gate_up, &out}));
#endif
  }
  return stream.LaunchHost("silu_and_mul", OpKind::kKernel, [gate_up, out] {
    host::SiluAndMul(gate_up, out);
    return absl::OkStatus();
  });
}

}  // namespace mlag
