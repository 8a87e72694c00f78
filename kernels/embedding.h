// Row gathers: the embedding lookup, and picking the last token of each
// sequence before the lm_head.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// out[t, :] = table[indices[t], :].
//   indices: i32 or i64 [T]; table: f32/bf16/f16 [N, D], row-major (rows may
//   be strided); out: f32/bf16/f16 [T, D], row-major.
// An index outside [0, N) writes a row of zeros (never reads out of bounds);
// callers validate ids before they reach a kernel.
absl::Status GatherRows(Stream& stream, const Tensor& indices, const Tensor& table,
                        const Tensor& out);

// The embedding lookup: GatherRows of token ids from the embedding table,
// recorded under the kernel name "embedding".
absl::Status Embedding(Stream& stream, const Tensor& token_ids, const Tensor& table,
                       const Tensor& out);

}  // namespace mlag
