// Host implementations behind kernels/mla_attention.h. Shapes, dtypes and
// strides are validated by the caller; the data-dependent checks (seq_lens,
// block-table entries, query_start_loc) are done here, before anything is
// written, and fail with InvalidArgument.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/core/tensor.h"

namespace mlag::host {

// Key tokens per decode split for a batch holding `total_tokens` cached tokens
// on `num_threads` threads: long enough that the LSE merge is cheap (at least
// kMinDecodeSplitTokens), short enough that about two work items per thread
// exist. A sequence of L tokens is cut into ceil(L / split) splits of nearly
// equal length; a sequence of at most `split` tokens is not split.
inline constexpr int64_t kMinDecodeSplitTokens = 256;
int64_t DecodeSplitTokens(int64_t total_tokens, int num_threads);

// See MlaDecode in kernels/mla_attention.h. split_tokens > 0 forces the split
// length (tests); <= 0 uses DecodeSplitTokens.
absl::Status MlaDecode(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                       const Tensor& block_table, const Tensor& seq_lens, float scale,
                       const Tensor& out_latent, const Tensor& lse, int64_t split_tokens = 0);

// See MlaPrefill in kernels/mla_attention.h.
absl::Status MlaPrefill(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                        const Tensor& block_table, const Tensor& seq_lens,
                        const Tensor& query_start_loc, float scale, const Tensor& out_latent,
                        const Tensor& lse);

}  // namespace mlag::host
