#include "kernels/mla_kv_update.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/mla_kv_update.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/mla_kv_update.cuh"
#endif

namespace mlag {

absl::Status MlaKvUpdate(Stream& stream, const Tensor& kv_c, const Tensor& k_pe,
                         const Tensor& slot_mapping, const Tensor& cache) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, kv_c, "kv_c"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, k_pe, "k_pe"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, slot_mapping, "slot_mapping"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, cache, "cache"));
  MLAG_RETURN_IF_ERROR(CheckDType(kv_c, "kv_c", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckDType(k_pe, "k_pe", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckDType(slot_mapping, "slot_mapping", {DType::kI64}));
  MLAG_RETURN_IF_ERROR(CheckDType(cache, "cache", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckShape(slot_mapping, "slot_mapping", {-1}));
  MLAG_RETURN_IF_ERROR(CheckShape(kv_c, "kv_c", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckShape(k_pe, "k_pe", {-1, -1}));
  const int64_t num_tokens = slot_mapping.size(0);
  const int64_t rkv = kv_c.size(1);
  const int64_t dr = k_pe.size(1);
  MLAG_RETURN_IF_ERROR(CheckShape(cache, "cache", {-1, -1, rkv + dr}));
  if (kv_c.size(0) < num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_c: ", kv_c.size(0), " rows, fewer than slot_mapping's ", num_tokens));
  }
  if (k_pe.size(0) < num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("k_pe: ", k_pe.size(0), " rows, fewer than slot_mapping's ", num_tokens));
  }
  MLAG_RETURN_IF_ERROR(CheckRowMajor(kv_c, "kv_c"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(k_pe, "k_pe"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(cache, "cache"));
#if MLAG_HAVE_CUDA
  if (stream.is_cuda()) {
    if (num_tokens > 0x7fffffff || rkv + dr > 0x7fffffff) {
      return absl::InvalidArgumentError(absl::StrCat("mla_kv_update: ", num_tokens,
                                                     " tokens of width ", rkv + dr,
                                                     " exceed the CUDA kernel's 32-bit grid"));
    }
    return stream.LaunchCuda(
        "mla_kv_update", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchMlaKvUpdate(
              kv_c.data(), kv_c.dtype(), kv_c.stride(0), k_pe.data(), k_pe.dtype(), k_pe.stride(0),
              slot_mapping.data_as<const int64_t>(), slot_mapping.stride(0), num_tokens,
              cache.data(), cache.dtype(), cache.size(0) * cache.size(1), rkv, dr,
              static_cast<cudaStream_t>(s)));
        },
        [&] {
          // Each token's latent and rope part read and written as one cache row.
          OpCost c = MovedBytes({&slot_mapping});
          c.bytes += static_cast<double>(num_tokens) * (rkv + dr) *
                     (DTypeSize(kv_c.dtype()) + DTypeSize(cache.dtype()));
          return c;
        }());
  }
#endif
  return stream.LaunchHost("mla_kv_update", OpKind::kKernel, [kv_c, k_pe, slot_mapping, cache] {
    host::MlaKvUpdate(kv_c, k_pe, slot_mapping, cache);
    return absl::OkStatus();
  });
}

}  // namespace mlag
