#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/common/rope_math.h"
#include "kernels/host/rope.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/rope.cuh"
#endif

namespace mlag {
namespace {

absl::Status CheckRopeParams(const RopeParams& params) {
  if (params.rotary_dim <= 0 || params.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: rotary_dim must be positive and even, got ", params.rotary_dim));
  }
  if (!(params.theta > 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("rope: theta must be > 1, got ", params.theta));
  }
  return absl::OkStatus();
}

}  // namespace

YarnRange ComputeYarnRange(const RopeParams& params) {
  const int dim = params.rotary_dim;
  const double lo = std::floor(
      YarnCorrectionDim(params.beta_fast, dim, params.theta, params.original_max_position));
  const double hi = std::ceil(
      YarnCorrectionDim(params.beta_slow, dim, params.theta, params.original_max_position));
  YarnRange range;
  range.lo = static_cast<float>(std::max(lo, 0.0));
  range.hi = static_cast<float>(std::min(hi, static_cast<double>(dim - 1)));
  if (range.lo == range.hi) range.hi += 0.001f;  // avoid a zero-width ramp
  return range;
}

std::vector<float> ComputeInvFreq(const RopeParams& params) {
  const int half = params.rotary_dim / 2;
  const float base = static_cast<float>(params.theta);
  std::vector<float> inv_freq(half > 0 ? half : 0);
  const YarnRange range = params.yarn ? ComputeYarnRange(params) : YarnRange{0.0f, 1.0f};
  for (int i = 0; i < half; ++i) {
    const float inv0 = RopeBaseInvFreq(i, params.rotary_dim, base);
    inv_freq[i] = params.yarn
                      ? YarnInvFreq(inv0, i, static_cast<float>(params.factor), range.lo, range.hi)
                      : inv0;
  }
  return inv_freq;
}

float YarnMscale(double factor, double mscale) {
  return static_cast<float>(YarnGetMscale(factor, mscale));
}

float RopeCosSinScale(const RopeParams& params) {
  if (!params.yarn) return 1.0f;
  return static_cast<float>(YarnGetMscale(params.factor, params.mscale) /
                            YarnGetMscale(params.factor, params.mscale_all_dim));
}

float MlaSoftmaxScale(int qk_head_dim, const RopeParams& params) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (params.yarn) {
    const double g = YarnGetMscale(params.factor, params.mscale_all_dim);
    scale *= g * g;
  }
  return static_cast<float>(scale);
}

absl::Status FillRopeTable(const RopeParams& params, const Tensor& table) {
  MLAG_RETURN_IF_ERROR(CheckRopeParams(params));
  if (table.device() != DeviceKind::kHost) {
    return absl::InvalidArgumentError("table: must be host memory");
  }
  if (table.data() == nullptr && table.numel() > 0) {
    return absl::InvalidArgumentError("table: null data pointer");
  }
  MLAG_RETURN_IF_ERROR(CheckDType(table, "table", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(table, "table", {-1, params.rotary_dim}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(table, "table"));
  host::FillRopeTable(ComputeInvFreq(params), RopeCosSinScale(params), table);
  return absl::OkStatus();
}

absl::Status CheckApplyRopeArgs(Stream& stream, const Tensor& positions, const Tensor& table,
                                const Tensor& q_pe, const Tensor& k_pe) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, positions, "positions"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, table, "table"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, q_pe, "q_pe"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, k_pe, "k_pe"));
  MLAG_RETURN_IF_ERROR(CheckDType(positions, "positions", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckDType(table, "table", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(q_pe, "q_pe", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(k_pe, "k_pe", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(positions, "positions", {-1}));
  const int64_t num_tokens = positions.size(0);
  MLAG_RETURN_IF_ERROR(CheckShape(q_pe, "q_pe", {num_tokens, -1, -1}));
  const int64_t dr = q_pe.size(2);
  if (dr % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_pe: rope dim must be even, got ", dr));
  }
  MLAG_RETURN_IF_ERROR(CheckShape(k_pe, "k_pe", {num_tokens, dr}));
  MLAG_RETURN_IF_ERROR(CheckShape(table, "table", {-1, dr}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(q_pe, "q_pe"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(k_pe, "k_pe"));
  return CheckRowMajor(table, "table");
}

absl::Status ApplyRope(Stream& stream, const Tensor& positions, const Tensor& table,
                       const Tensor& q_pe, const Tensor& k_pe) {
  MLAG_RETURN_IF_ERROR(CheckApplyRopeArgs(stream, positions, table, q_pe, k_pe));
  const int64_t num_tokens = positions.size(0);
  const int64_t dr = q_pe.size(2);
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "rope", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchApplyRope(
              positions.data_as<const int32_t>(), positions.stride(0), table.data_as<const float>(),
              table.size(0), table.stride(0), q_pe.data_as<float>(), q_pe.stride(0), q_pe.stride(1),
              q_pe.size(1), k_pe.data_as<float>(), k_pe.stride(0), num_tokens, dr / 2,
              static_cast<cudaStream_t>(s)));
        },
        [&] {
          // q_pe and k_pe read and written; one table row per token.
          OpCost c = MovedBytes({&q_pe, &q_pe, &k_pe, &k_pe, &positions});
          c.bytes += static_cast<double>(num_tokens) * dr * sizeof(float);
          return c;
        }());
#endif
  }
  return stream.LaunchHost("rope", OpKind::kKernel, [positions, table, q_pe, k_pe] {
    host::ApplyRope(positions, table, q_pe, k_pe);
    return absl::OkStatus();
  });
}

}  // namespace mlag
