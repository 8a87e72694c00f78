#include "kernels/embedding.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/embedding.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/embedding.cuh"
#endif

namespace mlag {
namespace {

constexpr std::initializer_list<DType> kFloat = {DType::kF32, DType::kBF16, DType::kF16};

// GatherRows under the kernel name `name`, with the index tensor called
// `indices_arg` in error messages.
absl::Status LaunchGatherRows(Stream& stream, absl::string_view name, absl::string_view indices_arg,
                              const Tensor& indices, const Tensor& table, const Tensor& out) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, indices, indices_arg));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, table, "table"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));
  MLAG_RETURN_IF_ERROR(CheckDType(indices, indices_arg, {DType::kI32, DType::kI64}));
  MLAG_RETURN_IF_ERROR(CheckDType(table, "table", kFloat));
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", kFloat));
  MLAG_RETURN_IF_ERROR(CheckShape(indices, indices_arg, {-1}));
  MLAG_RETURN_IF_ERROR(CheckShape(table, "table", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {indices.size(0), table.size(1)}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(table, "table"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(out, "out"));
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        name, OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchGatherRows(
              indices.data(), indices.dtype() == DType::kI64, indices.stride(0), table.data(),
              table.dtype(), table.size(0), table.stride(0), out.data(), out.dtype(), out.stride(0),
              out.size(0), out.size(1), static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&indices, &out, &out}));  // one table row per output row
#endif
  }
  return stream.LaunchHost(name, OpKind::kKernel, [indices, table, out] {
    host::GatherRows(indices, table, out);
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status GatherRows(Stream& stream, const Tensor& indices, const Tensor& table,
                        const Tensor& out) {
  return LaunchGatherRows(stream, "gather_rows", "indices", indices, table, out);
}

absl::Status Embedding(Stream& stream, const Tensor& token_ids, const Tensor& table,
                       const Tensor& out) {
  return LaunchGatherRows(stream, "embedding", "token_ids", token_ids, table, out);
}

}  // namespace mlag
