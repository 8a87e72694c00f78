#include "kernels/mla_attention.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/mla_attention.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

// The checks MlaDecode and MlaPrefill share. `num_seqs` is B.
absl::Status CheckAttentionArgs(const Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                                const Tensor& cache, const Tensor& block_table,
                                const Tensor& seq_lens, const Tensor& out_latent,
                                const Tensor& lse, int64_t num_seqs) {
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

}  // namespace

absl::Status MlaDecode(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                       const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                       float scale, const Tensor& out_latent, const Tensor& lse) {
  MLAG_RETURN_IF_ERROR(CheckAttentionArgs(stream, q_latent, q_pe, cache, block_table, seq_lens,
                                          out_latent, lse, q_latent.size(0)));
  if (stream.is_cuda()) return absl::UnimplementedError("mla_decode: no CUDA kernel yet");
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
  if (stream.is_cuda()) return absl::UnimplementedError("mla_prefill: no CUDA kernel yet");
  return stream.LaunchHost("mla_prefill", OpKind::kKernel,
                           [q_latent, q_pe, cache, block_table, seq_lens, query_start_loc, scale,
                            out_latent, lse] {
                             return host::MlaPrefill(q_latent, q_pe, cache, block_table, seq_lens,
                                                     query_start_loc, scale, out_latent, lse);
                           });
}

}  // namespace mlag
