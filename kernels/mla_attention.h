// MLA attention over the paged latent cache, in the absorbed form
// (SPEC-deepseek §3): MQA with shared key [c_kv; k_pe] and shared value c_kv.
// These kernels only read the cache; the kv_update node writes it first.
//
// Shapes and dtypes (all f32 unless noted):
//   q_latent: [N, H, Rkv]  W_UK^T q_nope per head (last dim unit-stride)
//   q_pe:     [N, H, dr]   rotated (last dim unit-stride)
//   cache:    f32/bf16 [num_blocks, block_size, Rkv + dr], contiguous
//   block_table: i32 [B, max_blocks]; entry j holds the cache block of the
//                sequence's tokens [j*block_size, (j+1)*block_size)
//   seq_lens: i32 [B]  tokens of each sequence in the cache, new ones included
//   out_latent: [N, H, Rkv]  softmax-weighted sum of c_kv (the attention output
//               before W_UV), contiguous
//   lse:      [N, H]  log-sum-exp of the scaled scores (natural log), contiguous
// score(s) = scale * (q_latent . c_kv(s) + q_pe . k_pe(s)); softmax in f32.
// A sequence with seq_len 0 produces zeros in out_latent and -inf in lse.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// Decode: one query token per sequence (N == B), attending to all seq_len
// cached tokens. Long sequences are split across threads (partial softmax per
// split, merged through the LSE) so one sequence can use every core.
absl::Status MlaDecode(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                       const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                       float scale, const Tensor& out_latent, const Tensor& lse);

// Prefill / chunked prefill: several query tokens per sequence.
//   query_start_loc: i32 [B + 1]; sequence b owns query rows
//     [query_start_loc[b], query_start_loc[b+1]) of q_latent / q_pe (N total).
// With q_len = the number of rows of sequence b, its row i sits at position
// seq_lens[b] - q_len + i and attends causally to cache positions
// [0, seq_lens[b] - q_len + i] (cached prefix plus new tokens up to itself).
absl::Status MlaPrefill(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                        const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                        const Tensor& query_start_loc, float scale, const Tensor& out_latent,
                        const Tensor& lse);

}  // namespace mlag
