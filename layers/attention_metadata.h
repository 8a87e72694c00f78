// What one forward pass is run over: the tokens, where they go in the paged KV
// cache, and which sequence each belongs to. Prefill, chunked prefill, decode
// and dummy runs are all described this way, so the model has one code path.
#pragma once

#include "runtime/core/tensor.h"

namespace mlag {

// All tensors live on the model's device. T = num_tokens, B = num_seqs.
struct AttentionMetadata {
  int num_tokens = 0;  // T, rows of input_ids (graph-padded rows included)
  int num_seqs = 0;    // B, sequences (padded rows count as sequences of length 0)
  // True when every sequence has exactly one new token (T == B): attention
  // runs the decode kernel. Otherwise the prefill kernel.
  bool decode_only = false;

  Tensor input_ids;  // i32 [T]
  Tensor positions;  // i32 [T]; position of each token in its sequence
  // i64 [T]; cache slot (block * block_size + offset) each token's latent is
  // written to; -1 = write nothing (dummy and padding rows).
  Tensor slot_mapping;
  Tensor block_table;      // i32 [B, max_blocks_per_seq]
  Tensor seq_lens;         // i32 [B]; tokens in the cache after this step, 0 = dummy
  Tensor query_start_loc;  // i32 [B + 1]; sequence b owns token rows [qsl[b], qsl[b+1])
  Tensor logits_indices;   // i32 [B]; the token row whose logits are wanted
};

}  // namespace mlag
