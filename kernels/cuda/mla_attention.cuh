// CUDA launchers behind kernels/mla_attention.h: MLA decode (split-KV
// flash-decoding over the paged latent cache) and prefill. CUDA and the
// standard library only. Launchers enqueue on `stream` and return the first
// failing cudaError_t; they never allocate, synchronise or read device memory
// on the host, so they can be captured into a CUDA graph, and a captured
// graph stays valid for any seq_lens / block_table / query_start_loc contents
// (every data-dependent decision is taken on the device).
//
// Data-dependent checks the host path makes (seq_len within the block table,
// block ids within the cache, query_start_loc monotone) cannot be made here
// without reading device memory; the kernels clamp instead: a seq_len is
// clamped to [0, max_blocks * block_size], a block id outside the cache reads
// as zero rows, and a query row outside [0, num_rows) is skipped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"
#include "kernels/mla_decode_kernel.h"

namespace mlag::cuda {

// One attention call. Pointers are device memory; strides are in elements.
struct MlaAttentionArgs {
  const float* q_latent = nullptr;  // [num_rows, heads, rkv], last dim unit-stride
  int64_t q_latent_stride0 = 0, q_latent_stride1 = 0;
  const float* q_pe = nullptr;  // [num_rows, heads, dr], last dim unit-stride
  int64_t q_pe_stride0 = 0, q_pe_stride1 = 0;
  const void* cache = nullptr;      // [num_blocks, block_size, rkv + dr], contiguous
  DType cache_dtype = DType::kF32;  // f32 or bf16
  int64_t num_blocks = 0, block_size = 0;
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks], row stride below
  int64_t block_table_stride = 0, max_blocks = 0;
  const int32_t* seq_lens = nullptr;  // [num_seqs]
  int64_t num_seqs = 0;
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]; prefill only
  int64_t num_rows = 0;                      // decode: == num_seqs
  int64_t heads = 0, rkv = 0, dr = 0;
  float scale = 1.0f;
  float* out_latent = nullptr;                             // [num_rows, heads, rkv], contiguous
  float* lse = nullptr;                                    // [num_rows, heads], contiguous
  MlaDecodeKernel decode_kernel = MlaDecodeKernel::kAuto;  // decode only
};

// The kernels hold a cache row and a query vector in shared memory.
inline constexpr int64_t kMlaMaxRkv = 512;
inline constexpr int64_t kMlaMaxRowWidth = 576;  // rkv + dr
inline bool MlaAttentionSupported(int64_t rkv, int64_t dr) {
  return rkv > 0 && dr >= 0 && rkv <= kMlaMaxRkv && rkv + dr <= kMlaMaxRowWidth;
}

// The tensor-core decode kernels need a bf16 cache, rows of a multiple of 16
// elements and rkv a multiple of 8 (and, checked at launch, a GPU of compute
// capability 8.0 or newer and a 16-byte aligned cache).
inline bool MlaDecodeMmaSupported(int64_t rkv, int64_t dr, DType cache_dtype) {
  return cache_dtype == DType::kBF16 && MlaAttentionSupported(rkv, dr) && (rkv + dr) % 16 == 0 &&
         rkv % 8 == 0;
}

// ---- Decode workspace -------------------------------------------------------
//
// Decode splits long sequences into KV ranges ("items"), each computed by its
// own thread blocks into a partial output and LSE, then merged. The number of
// items a batch may use is bounded by the workspace: one item per sequence
// plus extra items handed to the long sequences. Layout of the caller-owned
// workspace (256-byte aligned regions): the plan, int32 [num_items + 2]
// (item_start per sequence, the total, the split length), then the partial
// LSEs, f32 [num_items, heads], then the partial outputs, f32
// [num_items, heads, rkv].
//
// Bytes for `batch * max_splits` items: every batch of up to `batch`
// sequences can then split into `batch * max_splits` items in total (a long
// sequence may take more than max_splits of them).
size_t MlaDecodeWorkspaceBytes(int64_t batch, int64_t heads, int64_t rkv, int64_t max_splits);

// How many items a workspace of `bytes` holds for (heads, rkv).
int64_t MlaDecodeWorkspaceItems(size_t bytes, int64_t heads, int64_t rkv);

// Extra items the launcher asks for beyond one per sequence (about two waves
// of thread blocks on GPUs with up to 160 SMs), and the max_splits that
// provides them for any batch up to max_batch: 1 + ceil(kMlaDecodeExtraItems
// / max_batch).
inline constexpr int64_t kMlaDecodeExtraItems = 320;
inline int64_t MlaDecodeDefaultMaxSplits(int64_t max_batch) {
  if (max_batch < 1) max_batch = 1;
  return 1 + (kMlaDecodeExtraItems + max_batch - 1) / max_batch;
}

// Decode: num_rows == num_seqs, row b attends to tokens [0, seq_lens[b]).
// With `workspace` (at least MlaDecodeWorkspaceBytes(num_seqs, heads, rkv, 1)
// bytes, else cudaErrorInvalidValue) three kernels run: a one-block planner
// that computes the split length from the batch's total tokens and the item
// ranges per sequence, the attention kernel over (item, head group), and a
// combine kernel merging the items of split sequences through their LSEs.
// With workspace == nullptr no sequence is split (one kernel).
// args.decode_kernel picks the attention kernel; an explicit tensor-core
// choice the shapes or the GPU do not allow gives cudaErrorNotSupported.
cudaError_t LaunchMlaDecode(const MlaAttentionArgs& args, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream);

// Prefill: sequence b owns query rows [query_start_loc[b], query_start_loc[b+1]);
// with q_len rows, its row i attends causally to [0, seq_lens[b] - q_len + i].
// Rows outside [query_start_loc[0], query_start_loc[num_seqs]) get zeros and
// lse -inf. One thread block per (block of query rows, head group); no split.
cudaError_t LaunchMlaPrefill(const MlaAttentionArgs& args, cudaStream_t stream);

}  // namespace mlag::cuda
