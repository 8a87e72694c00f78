// The MLA KV-cache write: the `kv_update` graph node of every MLA layer.
//
// Contract (the same as vLLM's concat_and_cache_mla):
//   kv_c:  f32/bf16 [T', Rkv]  normalised latent, last dim unit-stride, own row stride
//   k_pe:  f32/bf16 [T', dr]   rotated rope key, last dim unit-stride, own row stride
//   slot_mapping: i64 [T], T <= T' — the token count comes from slot_mapping,
//     so inputs may be longer (graph padding) and only their first T rows are read
//   cache: f32/bf16 [num_blocks, block_size, Rkv + dr], contiguous
// For t < T: slot = slot_mapping[t]; slot < 0 means "no write" (dummy runs,
// padding rows); otherwise block = slot / block_size, offset = slot %
// block_size, and cache[block, offset, 0:Rkv] = kv_c[t],
// cache[block, offset, Rkv:] = k_pe[t], cast to the cache dtype. A slot at or
// past num_blocks * block_size is skipped too (never written out of bounds).
// Nothing else in the cache is touched.
//
// CUDA (kernels/cuda/mla_kv_update.cu): one thread block per slot_mapping
// entry, leaving at once for a skipped slot; 16-byte copies where the rows
// are aligned for them. The same bytes as the host kernel.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

absl::Status MlaKvUpdate(Stream& stream, const Tensor& kv_c, const Tensor& k_pe,
                         const Tensor& slot_mapping, const Tensor& cache);

// The latent's RMSNorm (kv_a_layernorm), for MlaRopeKvUpdate to apply
// before the write: weight [Rkv] f32 or bf16.
struct KvLatentNorm {
  Tensor weight;
  float eps = 0.0f;
};

// ApplyRope(positions, table, q_pe, k_pe) (kernels/rope.h) and then
// MlaKvUpdate(kv_c, k_pe, slot_mapping, cache), as one op: the same bytes in
// q_pe, k_pe and the cache as the two calls. With `latent_norm`, kv_c is the
// latent before its norm, and the cache receives what RmsNorm(kv_c, weight,
// eps) into an f32 buffer and then MlaKvUpdate from that buffer would write
// (kv_c itself is only read). The arguments are those of the ops (k_pe f32,
// as rope takes it), and slot_mapping has at most as many entries as
// positions. CUDA runs it all in one launch, one thread block per token (a
// step's `kv_update` graph node then carries the norm and the rope too);
// the host runs the host kernels one after the other.
absl::Status MlaRopeKvUpdate(Stream& stream, const Tensor& positions, const Tensor& table,
                             const Tensor& q_pe, const Tensor& kv_c, const Tensor& k_pe,
                             const Tensor& slot_mapping, const Tensor& cache,
                             const KvLatentNorm* latent_norm = nullptr);

}  // namespace mlag
