#include "kernels/mla_attention.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/mla_attention.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/mla_attention.cuh"
#endif

namespace mlag {
namespace {

// The checks MlaDecode and MlaPrefill share. `num_seqs` is B.
absl::Status CheckAttentionArgs(const Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                                const Tensor& cache, const Tensor& block_table,
                                const Tensor& seq_lens, const Tensor& out_latent, const Tensor& lse,
                                int64_t num_seqs) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, q_latent, "q_latent"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, q_pe, "q_pe"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, cache, "cache"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, block_table, "block_table"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, seq_lens, "seq_lens"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out_latent, "out_latent"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, lse, "lse"));
  MLAG_RETURN_IF_ERROR(CheckDType(q_latent, "q_latent", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(q_pe, "q_pe", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(cache, "cache", {DType::kF32, DType::kBF16}));
  MLAG_RETURN_IF_ERROR(CheckDType(block_table, "block_table", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckDType(seq_lens, "seq_lens", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckDType(out_latent, "out_latent", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(lse, "lse", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(q_latent, "q_latent", {-1, -1, -1}));
  const int64_t num_rows = q_latent.size(0);
  const int64_t heads = q_latent.size(1);
  const int64_t rkv = q_latent.size(2);
  MLAG_RETURN_IF_ERROR(CheckShape(q_pe, "q_pe", {num_rows, heads, -1}));
  const int64_t dr = q_pe.size(2);
  MLAG_RETURN_IF_ERROR(CheckShape(cache, "cache", {-1, -1, rkv + dr}));
  MLAG_RETURN_IF_ERROR(CheckShape(block_table, "block_table", {num_seqs, -1}));
  MLAG_RETURN_IF_ERROR(CheckShape(seq_lens, "seq_lens", {num_seqs}));
  MLAG_RETURN_IF_ERROR(CheckShape(out_latent, "out_latent", {num_rows, heads, rkv}));
  MLAG_RETURN_IF_ERROR(CheckShape(lse, "lse", {num_rows, heads}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(q_latent, "q_latent"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(q_pe, "q_pe"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(cache, "cache"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(block_table, "block_table"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(seq_lens, "seq_lens"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(out_latent, "out_latent"));
  MLAG_RETURN_IF_ERROR(CheckContiguous(lse, "lse"));
  return absl::OkStatus();
}

#if MLAG_HAVE_CUDA
// The launch arguments shared by decode and prefill (shapes already checked).
cuda::MlaAttentionArgs CudaArgs(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                                const Tensor& block_table, const Tensor& seq_lens, float scale,
                                const Tensor& out_latent, const Tensor& lse) {
  cuda::MlaAttentionArgs a;
  a.q_latent = q_latent.data_as<const float>();
  a.q_latent_stride0 = q_latent.stride(0);
  a.q_latent_stride1 = q_latent.stride(1);
  a.q_pe = q_pe.data_as<const float>();
  a.q_pe_stride0 = q_pe.stride(0);
  a.q_pe_stride1 = q_pe.stride(1);
  a.cache = cache.data();
  a.cache_dtype = cache.dtype();
  a.num_blocks = cache.size(0);
  a.block_size = cache.size(1);
  a.block_table = block_table.data_as<const int32_t>();
  a.block_table_stride = block_table.stride(0);
  a.max_blocks = block_table.size(1);
  a.seq_lens = seq_lens.data_as<const int32_t>();
  a.num_seqs = seq_lens.size(0);
  a.num_rows = q_latent.size(0);
  a.heads = q_latent.size(1);
  a.rkv = q_latent.size(2);
  a.dr = q_pe.size(2);
  a.scale = scale;
  a.out_latent = out_latent.data_as<float>();
  a.lse = lse.data_as<float>();
  return a;
}

// What the CUDA kernels support beyond the shared checks.
absl::Status CheckCudaAttention(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                                const char* op) {
  const int64_t rkv = q_latent.size(2), dr = q_pe.size(2);
  if (!cuda::MlaAttentionSupported(rkv, dr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " on CUDA: kv_lora_rank ", rkv, " and rope dim ", dr,
                     " outside the kernels' limits (kv_lora_rank in [1, ", cuda::kMlaMaxRkv,
                     "], their sum <= ", cuda::kMlaMaxRowWidth, ")"));
  }
  if (cache.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache block_size is 0"));
  }
  if (q_latent.size(0) > (int64_t{1} << 30) || cache.size(0) > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": too many rows or cache blocks"));
  }
  return absl::OkStatus();
}
#endif  // MLAG_HAVE_CUDA

}  // namespace

const char* MlaDecodeKernelName(MlaDecodeKernel kernel) {
  switch (kernel) {
    case MlaDecodeKernel::kAuto:
      return "auto";
    case MlaDecodeKernel::kF32:
      return "f32";
    case MlaDecodeKernel::kTensorCore:
      return "tensor_core";
    case MlaDecodeKernel::kTensorCoreBf16Q:
      return "tensor_core_bf16q";
  }
  return "unknown";
}

size_t MlaDecodeWorkspace::CudaBytes(int64_t max_batch, int64_t heads, int64_t rkv,
                                     int64_t max_splits) {
#if MLAG_HAVE_CUDA
  if (max_batch < 1 || heads < 1 || rkv < 1) return 0;
  if (max_splits <= 0) max_splits = cuda::MlaDecodeDefaultMaxSplits(max_batch);
  return cuda::MlaDecodeWorkspaceBytes(max_batch, heads, rkv, max_splits);
#else
  (void)max_batch;
  (void)heads;
  (void)rkv;
  (void)max_splits;
  return 0;
#endif
}

absl::StatusOr<MlaDecodeWorkspace> MlaDecodeWorkspace::Create(Device& device, int64_t max_batch,
                                                              int64_t heads, int64_t rkv,
                                                              int64_t max_splits) {
  if (max_batch < 1 || heads < 1 || rkv < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MlaDecodeWorkspace: max_batch ", max_batch,
                                                   ", heads ", heads, ", rkv ", rkv,
                                                   " must all be >= 1"));
  }
  MlaDecodeWorkspace ws;
  ws.max_batch_ = max_batch;
  ws.heads_ = heads;
  ws.rkv_ = rkv;
  if (device.is_cuda()) {
    MLAG_ASSIGN_OR_RETURN(ws.buffer_,
                          device.Allocate(CudaBytes(max_batch, heads, rkv, max_splits)));
  }
  return ws;
}

absl::Status MlaDecode(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                       const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                       float scale, const Tensor& out_latent, const Tensor& lse,
                       const MlaDecodeWorkspace* workspace, MlaDecodeKernel kernel) {
  MLAG_RETURN_IF_ERROR(CheckAttentionArgs(stream, q_latent, q_pe, cache, block_table, seq_lens,
                                          out_latent, lse, q_latent.size(0)));
#if MLAG_HAVE_CUDA
  if (stream.is_cuda()) {
    MLAG_RETURN_IF_ERROR(CheckCudaAttention(q_latent, q_pe, cache, "mla_decode"));
    const int64_t batch = q_latent.size(0), heads = q_latent.size(1), rkv = q_latent.size(2);
    void* ws_data = nullptr;
    size_t ws_bytes = 0;
    if (workspace != nullptr && !workspace->empty()) {
      if (workspace->device() != DeviceKind::kCuda || workspace->heads() != heads ||
          workspace->rkv() != rkv || workspace->max_batch() < batch) {
        return absl::InvalidArgumentError(
            absl::StrCat("mla_decode: workspace made for ", workspace->max_batch(), " sequences, ",
                         workspace->heads(), " heads, rkv ", workspace->rkv(), " on ",
                         DeviceKindName(workspace->device()), "; this call has ", batch,
                         " sequences, ", heads, " heads, rkv ", rkv));
      }
      ws_data = workspace->data();
      ws_bytes = workspace->bytes();
    }
    const bool tensor_core =
        kernel == MlaDecodeKernel::kTensorCore || kernel == MlaDecodeKernel::kTensorCoreBf16Q;
    if (tensor_core && !cuda::MlaDecodeMmaSupported(rkv, q_pe.size(2), cache.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mla_decode: the ", MlaDecodeKernelName(kernel), " kernel needs a bf16 cache, ",
          "kv_lora_rank + rope dim a multiple of 16 and kv_lora_rank a multiple of 8; got ",
          DTypeName(cache.dtype()), ", ", rkv, " + ", q_pe.size(2)));
    }
    cuda::MlaAttentionArgs args =
        CudaArgs(q_latent, q_pe, cache, block_table, seq_lens, scale, out_latent, lse);
    args.decode_kernel = kernel;
    return stream.LaunchCuda(
        "mla_decode", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(
              cuda::LaunchMlaDecode(args, ws_data, ws_bytes, static_cast<cudaStream_t>(s)));
        },
        [&] {
          // The cached rows read (and their multiply-adds) depend on seq_lens,
          // on the device: not counted here.
          OpCost c = MovedBytes({&q_latent, &q_pe, &out_latent, &lse, &seq_lens});
          c.math = cache.dtype();
          return c;
        }());
  }
#else
  (void)workspace;
#endif
  (void)kernel;  // the host has one kernel
  return stream.LaunchHost("mla_decode", OpKind::kKernel,
                           [q_latent, q_pe, cache, block_table, seq_lens, scale, out_latent, lse] {
                             return host::MlaDecode(q_latent, q_pe, cache, block_table, seq_lens,
                                                    scale, out_latent, lse);
                           });
}

absl::Status MlaPrefill(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                        const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                        const Tensor& query_start_loc, float scale, const Tensor& out_latent,
                        const Tensor& lse) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, seq_lens, "seq_lens"));
  MLAG_RETURN_IF_ERROR(CheckShape(seq_lens, "seq_lens", {-1}));
  const int64_t num_seqs = seq_lens.size(0);
  MLAG_RETURN_IF_ERROR(CheckAttentionArgs(stream, q_latent, q_pe, cache, block_table, seq_lens,
                                          out_latent, lse, num_seqs));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, query_start_loc, "query_start_loc"));
  MLAG_RETURN_IF_ERROR(CheckDType(query_start_loc, "query_start_loc", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(query_start_loc, "query_start_loc", {num_seqs + 1}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(query_start_loc, "query_start_loc"));
#if MLAG_HAVE_CUDA
  if (stream.is_cuda()) {
    MLAG_RETURN_IF_ERROR(CheckCudaAttention(q_latent, q_pe, cache, "mla_prefill"));
    cuda::MlaAttentionArgs args =
        CudaArgs(q_latent, q_pe, cache, block_table, seq_lens, scale, out_latent, lse);
    args.query_start_loc = query_start_loc.data_as<const int32_t>();
    return stream.LaunchCuda("mla_prefill", OpKind::kKernel, [&](void* s) {
      return static_cast<int>(cuda::LaunchMlaPrefill(args, static_cast<cudaStream_t>(s)));
    });
  }
#endif
  return stream.LaunchHost(
      "mla_prefill", OpKind::kKernel,
      [q_latent, q_pe, cache, block_table, seq_lens, query_start_loc, scale, out_latent, lse] {
        return host::MlaPrefill(q_latent, q_pe, cache, block_table, seq_lens, query_start_loc,
                                scale, out_latent, lse);
      });
}

}  // namespace mlag
