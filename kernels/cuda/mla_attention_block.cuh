// The block-level pieces of the MLA attention kernels (kernels/cuda/
// mla_attention.cu) that the tensor-core decode kernel shares with the f32
// kernel: launch constants, cp.async copies, the kernel parameters, the
// per-block work description and its resolution for decode. Device code
// only; included by mla_attention.cu, which -Demulate_cuda=true builds
// compile for the CPU emulation (kernels/cuda/emulation/) with
// MLAG_CUDA_EMULATION defined.
#pragma once

#include <cstdint>

#include "kernels/cuda/mla_attention.cuh"
#include "kernels/cuda/warp_ops.cuh"

namespace mlag::cuda::mla_block {

inline constexpr int kThreads = 256;
inline constexpr int kVecs = 16;          // query vectors per block
inline constexpr int kNoSplit = 1 << 30;  // split length meaning "never split"

// cp.async copies (kernels/cuda/warp_ops.cuh).
using ::mlag::cuda::CpAsync16;
using ::mlag::cuda::CpAsyncCommit;
using ::mlag::cuda::CpAsyncWait;
using ::mlag::cuda::CpAsyncWaitAll;

__host__ __device__ __forceinline__ int ClampLen(int len, int capacity) {
  return len < 0 ? 0 : (len > capacity ? capacity : len);
}

// ---- Parameters and per-block state ----------------------------------------

struct KernelParams {
  MlaAttentionArgs a;
  int pitch;           // elements per shared-memory row (rkv + dr rounded up to 16 bytes)
  int vec_loads;       // 1: 16-byte cp.async row copies (rows 16-byte aligned)
  int capacity;        // max_blocks * block_size, clamped to kNoSplit
  int head_groups;     // ceil(heads / 16)
  int heads_per_item;  // prefill: min(heads, 16)
  int rows_per_item;   // prefill: 16 / heads_per_item
  int prefill;         // 0 decode, 1 prefill
  const int* plan;     // decode: the planner's output, or nullptr (no split)
  float* part_out;     // decode with plan: [items, heads, rkv]
  float* part_lse;     // decode with plan: [items, heads]
};

// What a block works on, resolved by its first threads.
struct BlockItem {
  int exit;                  // 1: no work for this block
  int b;                     // sequence
  int begin, end;            // cache tokens [begin, end) read by this block
  int item;                  // decode: item index (partial slot)
  int direct;                // decode: 1 when the item is the whole sequence
  int row0, row1;            // prefill: query rows [row0, row1) of sequence b
  int context;               // prefill: cached tokens before the sequence's first query row
  int q0;                    // prefill: query_start_loc[b]
  int found_b, found_block;  // search result: sequence, prefill row block
  // Per query vector; q_latent == nullptr marks an unused vector.
  const float* q_latent[kVecs];
  const float* q_pe[kVecs];
  float* out[kVecs];
  float* lse[kVecs];
  int limit[kVecs];  // the vector sees tokens [begin, limit)
  float alpha[kVecs];
  float inv_sum[kVecs];
  float lse_value[kVecs];
};

// Decode: block -> (item, head group) -> (sequence, token range).
__device__ inline void ResolveDecode(const KernelParams& p, BlockItem& it) {
  const int num_seqs = static_cast<int>(p.a.num_seqs);
  const int item = static_cast<int>(blockIdx.x) / p.head_groups;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) it.found_b = -1;
  __syncthreads();
  if (p.plan != nullptr) {
    // The sequence owning `item`: plan[b] <= item < plan[b + 1] (item_start
    // is strictly increasing, every sequence has at least one item), so at
    // most one thread matches.
    for (int b = tid; b < num_seqs; b += kThreads) {
      if (p.plan[b] <= item && item < p.plan[b + 1]) it.found_b = b;
    }
  } else if (tid == 0 && item < num_seqs) {
    it.found_b = item;
  }
  __syncthreads();
  if (tid == 0) {
    const int b = it.found_b;
    it.exit = b < 0;
    it.item = item;
    if (b >= 0) {
      const int len = ClampLen(p.a.seq_lens[b], p.capacity);
      it.b = b;
      it.begin = 0;
      it.end = len;
      it.direct = 1;
      if (p.plan != nullptr && p.plan[b + 1] - p.plan[b] > 1) {
        const int chunk = p.plan[num_seqs + 1];
        it.direct = 0;
        it.begin = (item - p.plan[b]) * chunk;
        it.end = min(len, it.begin + chunk);
      }
    }
  }
  __syncthreads();
  if (it.exit) return;
  const int v = threadIdx.x;
  if (v < kVecs) {
    const int heads = static_cast<int>(p.a.heads);
    const int h = (static_cast<int>(blockIdx.x) % p.head_groups) * kVecs + v;
    const bool used = h < heads;
    const int64_t b = it.b;
    const int64_t rkv = p.a.rkv;
    it.q_latent[v] =
        used ? p.a.q_latent + b * p.a.q_latent_stride0 + h * p.a.q_latent_stride1 : nullptr;
    it.q_pe[v] = used ? p.a.q_pe + b * p.a.q_pe_stride0 + h * p.a.q_pe_stride1 : nullptr;
    it.limit[v] = used ? it.end : 0;
    const int64_t slot = it.direct ? b * heads + h : static_cast<int64_t>(it.item) * heads + h;
    it.out[v] = used ? (it.direct ? p.a.out_latent : p.part_out) + slot * rkv : nullptr;
    it.lse[v] = used ? (it.direct ? p.a.lse : p.part_lse) + slot : nullptr;
  }
}

// The cache row of token `tok` of sequence it.b (rows `row_width` elements
// wide), or nullptr when the token is past it.end or its block table entry
// is outside the cache: the tile loaders turn such rows into zeros.
template <typename CacheT>
__device__ __forceinline__ const CacheT* CacheRow(const KernelParams& p, const BlockItem& it,
                                                  int tok, int row_width) {
  if (tok >= it.end) return nullptr;
  const int block_size = static_cast<int>(p.a.block_size);
  const int block =
      p.a.block_table[static_cast<int64_t>(it.b) * p.a.block_table_stride + tok / block_size];
  if (block < 0 || block >= p.a.num_blocks) return nullptr;
  return static_cast<const CacheT*>(p.a.cache) +
         (static_cast<int64_t>(block) * block_size + tok % block_size) * row_width;
}

}  // namespace mlag::cuda::mla_block
