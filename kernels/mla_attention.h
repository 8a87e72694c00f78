// MLA attention over the paged latent cache, in the absorbed form
// (DeepSeek-V2 paper, arXiv:2405.04434, §2.1.2): MQA with shared key
// [c_kv; k_pe] and shared value c_kv.
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
//
// CUDA: the kernels hold a cache row in shared memory, so Rkv <= 512 and
// Rkv + dr <= 576 (DeepSeek V2/V3: 512 + 64). The data-dependent checks of
// the host path (seq_lens within the block table, block ids within the cache,
// query_start_loc) would need a read of device memory, which a launch may not
// do (it must be capturable); the CUDA kernels clamp instead: a seq_len is
// clamped to [0, max_blocks * block_size], a block id outside the cache reads
// as zero rows, and query rows outside the output are skipped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/mla_decode_kernel.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// Persistent scratch of MlaDecode on a CUDA device: the split plan, the
// partial outputs and the partial LSEs of split sequences (flash-decoding).
// The host path needs none; on the host Create returns an empty workspace.
//
// Allocate it once, before any graph capture (allocation is refused during a
// capture), sized for the largest padded decode batch the stream will run,
// with the model's head count and kv_lora_rank. Every MlaDecode call on one
// stream may share it (calls on a stream run one after another), including
// all layers and all captured batch sizes; streams that run concurrently need
// one each. A captured graph binds the workspace's address, so keep it alive
// as long as the graphs.
//
//   MLAG_ASSIGN_OR_RETURN(MlaDecodeWorkspace ws,
//       MlaDecodeWorkspace::Create(device, max_batch, num_heads, kv_lora_rank));
//   ...
//   MLAG_RETURN_IF_ERROR(MlaDecode(stream, ..., out_latent, lse, &ws));
//
// Without a workspace (nullptr) CUDA decode still works but never splits a
// sequence: one thread block per sequence and head group, slow for few long
// sequences.
class MlaDecodeWorkspace {
 public:
  MlaDecodeWorkspace() = default;
  MlaDecodeWorkspace(MlaDecodeWorkspace&&) = default;
  MlaDecodeWorkspace& operator=(MlaDecodeWorkspace&&) = default;

  // A workspace on `device` for batches of up to `max_batch` sequences of
  // `heads` heads and latent width `rkv`. `max_splits` sets the capacity to
  // max_batch * max_splits KV ranges in total (long sequences take more than
  // their share); <= 0 picks enough for about two waves of thread blocks at
  // any batch size: max_splits = 1 + ceil(320 / max_batch), so at least
  // max_batch + 320 ranges of f32 [heads, rkv + 1] each (32 MiB for
  // max_batch 512, 16 heads, rkv 512).
  static absl::StatusOr<MlaDecodeWorkspace> Create(Device& device, int64_t max_batch, int64_t heads,
                                                   int64_t rkv, int64_t max_splits = 0);

  // The bytes Create allocates on a CUDA device for these arguments; 0 when
  // they are invalid or the build has no CUDA.
  static size_t CudaBytes(int64_t max_batch, int64_t heads, int64_t rkv, int64_t max_splits = 0);

  bool empty() const { return buffer_.bytes() == 0; }
  void* data() const { return buffer_.data(); }
  size_t bytes() const { return buffer_.bytes(); }
  DeviceKind device() const { return buffer_.device(); }
  int64_t max_batch() const { return max_batch_; }
  int64_t heads() const { return heads_; }
  int64_t rkv() const { return rkv_; }

 private:
  Buffer buffer_;
  int64_t max_batch_ = 0;
  int64_t heads_ = 0;
  int64_t rkv_ = 0;
};

const char* MlaDecodeKernelName(MlaDecodeKernel kernel);

// Decode: one query token per sequence (N == B), attending to all seq_len
// cached tokens. Long sequences are split (partial softmax per split, merged
// through the LSE) so one sequence can use every core: on the host across
// threads; on CUDA across thread blocks, with the split lengths planned on
// the device from seq_lens (one captured graph serves any seq_lens).
// `workspace`: see MlaDecodeWorkspace; ignored on the host. On CUDA it must
// match (heads, rkv) and hold B sequences, else InvalidArgument. `kernel`:
// see MlaDecodeKernel; an explicit tensor-core kernel the shapes or dtype do
// not allow is InvalidArgument, one the GPU does not support fails at launch.
absl::Status MlaDecode(Stream& stream, const Tensor& q_latent, const Tensor& q_pe,
                       const Tensor& cache, const Tensor& block_table, const Tensor& seq_lens,
                       float scale, const Tensor& out_latent, const Tensor& lse,
                       const MlaDecodeWorkspace* workspace = nullptr,
                       MlaDecodeKernel kernel = MlaDecodeKernel::kAuto);

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
