#include "kernels/sampling.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/sampling.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/sampling.cuh"
#endif

namespace mlag {

absl::Status Sample(Stream& stream, const Tensor& logits, const Tensor& temperature,
                    const Tensor& top_k, const Tensor& top_p, const Tensor& seeds,
                    const Tensor& steps, const Tensor& out_tokens) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, logits, "logits"));
  MLAG_RETURN_IF_ERROR(CheckDType(logits, "logits", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(logits, "logits", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(logits, "logits"));
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  if (V <= 0 || V > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits: vocabulary size must be in [1, 2^31), got ", V));
  }
  struct PerRow {
    const Tensor& t;
    const char* name;
    DType dtype;
  };
  for (const PerRow& r :
       {PerRow{temperature, "temperature", DType::kF32}, PerRow{top_k, "top_k", DType::kI32},
        PerRow{top_p, "top_p", DType::kF32}, PerRow{seeds, "seeds", DType::kI64},
        PerRow{steps, "steps", DType::kI64}, PerRow{out_tokens, "out_tokens", DType::kI32}}) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, r.t, r.name));
    MLAG_RETURN_IF_ERROR(CheckDType(r.t, r.name, {r.dtype}));
    MLAG_RETURN_IF_ERROR(CheckShape(r.t, r.name, {B}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(r.t, r.name));
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda("sample", OpKind::kKernel, [&](void* s) {
      return static_cast<int>(cuda::LaunchSample(
          logits.data_as<const float>(), B, V, logits.stride(0), temperature.data_as<const float>(),
          top_k.data_as<const int32_t>(), top_p.data_as<const float>(),
          seeds.data_as<const int64_t>(), steps.data_as<const int64_t>(),
          out_tokens.data_as<int32_t>(), static_cast<cudaStream_t>(s)));
    });
#endif
  }
  return stream.LaunchHost(
      "sample", OpKind::kKernel, [logits, temperature, top_k, top_p, seeds, steps, out_tokens] {
        host::Sample(logits, temperature, top_k, top_p, seeds, steps, out_tokens);
        return absl::OkStatus();
      });
}

}  // namespace mlag
