#include "kernels/mla_kv_update.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/mla_kv_update.h"
#include "kernels/host/rms_norm.h"
#include "kernels/host/rope.h"
#include "kernels/rope.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/mla_kv_update.cuh"
#endif

namespace mlag {

namespace {

absl::Status CheckMlaKvUpdateArgs(Stream& stream, const Tensor& kv_c, const Tensor& k_pe,
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
  if (stream.is_cuda() && (num_tokens > 0x7fffffff || rkv + dr > 0x7fffffff)) {
    return absl::InvalidArgumentError(absl::StrCat("mla_kv_update: ", num_tokens,
                                                   " tokens of width ", rkv + dr,
                                                   " exceed the CUDA kernel's 32-bit grid"));
  }
  return absl::OkStatus();
}

// Bytes a cache write moves: each token's latent and rope part read and
// written as one cache row.
double KvUpdateBytes(int64_t num_tokens, const Tensor& kv_c, const Tensor& k_pe,
                     const Tensor& cache) {
  return static_cast<double>(num_tokens) * static_cast<double>(kv_c.size(1) + k_pe.size(1)) *
         static_cast<double>(DTypeSize(kv_c.dtype()) + DTypeSize(cache.dtype()));
}

}  // namespace

absl::Status MlaKvUpdate(Stream& stream, const Tensor& kv_c, const Tensor& k_pe,
                         const Tensor& slot_mapping, const Tensor& cache) {
  MLAG_RETURN_IF_ERROR(CheckMlaKvUpdateArgs(stream, kv_c, k_pe, slot_mapping, cache));
  const int64_t num_tokens = slot_mapping.size(0);
  const int64_t rkv = kv_c.size(1);
  const int64_t dr = k_pe.size(1);
#if MLAG_HAVE_CUDA
  if (stream.is_cuda()) {
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
          OpCost c = MovedBytes({&slot_mapping});
          c.bytes += KvUpdateBytes(num_tokens, kv_c, k_pe, cache);
          return c;
        }());
  }
#endif
  return stream.LaunchHost("mla_kv_update", OpKind::kKernel, [kv_c, k_pe, slot_mapping, cache] {
    host::MlaKvUpdate(kv_c, k_pe, slot_mapping, cache);
    return absl::OkStatus();
  });
}

absl::Status MlaRopeKvUpdate(Stream& stream, const Tensor& positions, const Tensor& table,
                             const Tensor& q_pe, const Tensor& kv_c, const Tensor& k_pe,
                             const Tensor& slot_mapping, const Tensor& cache,
                             const KvLatentNorm* latent_norm) {
  MLAG_RETURN_IF_ERROR(CheckApplyRopeArgs(stream, positions, table, q_pe, k_pe));
  MLAG_RETURN_IF_ERROR(CheckMlaKvUpdateArgs(stream, kv_c, k_pe, slot_mapping, cache));
  if (latent_norm != nullptr) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, latent_norm->weight, "latent_norm.weight"));
    MLAG_RETURN_IF_ERROR(
        CheckDType(latent_norm->weight, "latent_norm.weight", {DType::kF32, DType::kBF16}));
    MLAG_RETURN_IF_ERROR(CheckShape(latent_norm->weight, "latent_norm.weight", {kv_c.size(1)}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(latent_norm->weight, "latent_norm.weight"));
  }
  const int64_t num_tokens = positions.size(0);
  const int64_t slot_tokens = slot_mapping.size(0);
  if (slot_tokens > num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_mapping: ", slot_tokens, " entries, more than positions' ", num_tokens));
  }
#if MLAG_HAVE_CUDA
  if (stream.is_cuda()) {
    cuda::RopeKvUpdateArgs a{};
    a.positions = positions.data_as<const int32_t>();
    a.position_stride = positions.stride(0);
    a.table = table.data_as<const float>();
    a.table_rows = table.size(0);
    a.table_row_stride = table.stride(0);
    a.q_pe = q_pe.data_as<float>();
    a.q_token_stride = q_pe.stride(0);
    a.q_head_stride = q_pe.stride(1);
    a.heads = q_pe.size(1);
    a.k_pe = k_pe.data_as<float>();
    a.k_pe_row_stride = k_pe.stride(0);
    a.num_tokens = num_tokens;
    a.half = k_pe.size(1) / 2;
    a.kv_c = kv_c.data();
    a.kv_c_dtype = kv_c.dtype();
    a.kv_c_row_stride = kv_c.stride(0);
    a.slot_mapping = slot_mapping.data_as<const int64_t>();
    a.slot_mapping_stride = slot_mapping.stride(0);
    a.num_slot_tokens = slot_tokens;
    a.cache = cache.data();
    a.cache_dtype = cache.dtype();
    a.num_slots = cache.size(0) * cache.size(1);
    a.rkv = kv_c.size(1);
    if (latent_norm != nullptr) {
      a.norm_weight = latent_norm->weight.data();
      a.norm_weight_dtype = latent_norm->weight.dtype();
      a.norm_eps = latent_norm->eps;
    }
    return stream.LaunchCuda(
        "mla_rope_kv_update", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchMlaRopeKvUpdate(a, static_cast<cudaStream_t>(s)));
        },
        [&] {
          // q_pe and k_pe read and written, one table row per token, and the
          // cache rows.
          OpCost c = MovedBytes({&q_pe, &q_pe, &k_pe, &k_pe, &positions, &slot_mapping});
          c.bytes +=
              static_cast<double>(num_tokens) * static_cast<double>(k_pe.size(1)) * sizeof(float) +
              KvUpdateBytes(slot_tokens, kv_c, k_pe, cache);
          return c;
        }());
  }
#endif
  Tensor norm_weight;
  float norm_eps = 0.0f;
  if (latent_norm != nullptr) {
    norm_weight = latent_norm->weight;
    norm_eps = latent_norm->eps;
  }
  return stream.LaunchHost(
      "mla_rope_kv_update", OpKind::kKernel,
      [positions, table, q_pe, kv_c, k_pe, slot_mapping, cache, norm_weight, norm_eps] {
        host::ApplyRope(positions, table, q_pe, k_pe);
        if (norm_weight.data() == nullptr) {
          host::MlaKvUpdate(kv_c, k_pe, slot_mapping, cache);
          return absl::OkStatus();
        }
        // The normalised latent of the rows written, in f32 (uninitialised:
        // RmsNorm writes every element).
        const int64_t rows = slot_mapping.size(0), rkv = kv_c.size(1);
        const std::unique_ptr<float[]> normed(new float[static_cast<size_t>(rows * rkv)]);
        const Tensor kv_normed(normed.get(), DType::kF32, {rows, rkv});
        host::RmsNorm(kv_c.Slice(0, 0, rows), norm_weight, norm_eps, kv_normed);
        host::MlaKvUpdate(kv_normed, k_pe, slot_mapping, cache);
        return absl::OkStatus();
      });
}

}  // namespace mlag
