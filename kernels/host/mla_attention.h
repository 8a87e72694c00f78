// Host implementations behind kernels/mla_attention.h. Shapes, dtypes and
// strides are validated by the caller; the data-dependent checks (seq_lens,
// block-table entries, query_start_loc) are done here, before anything is
// written, and fail with InvalidArgument.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/core/tensor.h"

namespace mlag::host {

// Key tokens per attention split. A query at position p attends its keys
// [0, p] in splits [k * S, (k + 1) * S), each an online softmax from a fresh
// state, merged through their LSEs in split order (one split: no merge). The
// splits depend on the position only, never on the batch, the thread count
// or whether the token is decoded or prefilled, so attention is
// batch-invariant and prefill gives decode's bits. A multiple of the key tile.
inline constexpr int64_t kAttentionSplitTokens = 256;

// See MlaDecode in kernels/mla_attention.h. split_tokens > 0 forces another
// split length (tests; prefill then no longer gives the same bits);
// <= 0 uses kAttentionSplitTokens.
absl::Status MlaDecode(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                       const Tensor& block_table, const Tensor& seq_lens, float scale,
                       const Tensor& out_latent, const Tensor& lse, int64_t split_tokens = 0);

// See MlaPrefill in kernels/mla_attention.h.
absl::Status MlaPrefill(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                        const Tensor& block_table, const Tensor& seq_lens,
                        const Tensor& query_start_loc, float scale, const Tensor& out_latent,
                        const Tensor& lse);

}  // namespace mlag::host
