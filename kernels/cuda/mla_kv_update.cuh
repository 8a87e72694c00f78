// CUDA launcher behind kernels/mla_kv_update.h. CUDA and the standard library
// only; it enqueues on `stream` and returns the launch's cudaError_t. It never
// allocates, synchronises or reads device memory on the host, so it can be
// captured into a CUDA graph.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// One thread block per token t < num_tokens (the length of slot_mapping):
// slot = slot_mapping[t * slot_mapping_stride]; a slot < 0 or >= num_slots
// (num_blocks * block_size) writes nothing. Otherwise cache row `slot`
// (the cache is contiguous [num_slots, rkv + dr]) receives
// [kv_c[t, 0:rkv] | k_pe[t, 0:dr]] cast to the cache dtype: bit copies when
// the dtypes agree, round-to-nearest-even f32 -> bf16, exact bf16 -> f32.
// Row strides are in elements. Dtypes are f32 or bf16 (the only ones
// accepted here). Rows are copied 16 bytes at a time where both
// the source row and the cache row are aligned for it, element by element
// otherwise.
cudaError_t LaunchMlaKvUpdate(const void* kv_c, DType kv_c_dtype, int64_t kv_c_row_stride,
                              const void* k_pe, DType k_pe_dtype, int64_t k_pe_row_stride,
                              const int64_t* slot_mapping, int64_t slot_mapping_stride,
                              int64_t num_tokens, void* cache, DType cache_dtype, int64_t num_slots,
                              int64_t rkv, int64_t dr, cudaStream_t stream);

// The rope of one step fused into its cache write (MlaRopeKvUpdate): one
// thread block per token t < num_tokens (the length of positions). With p =
// positions[t] in [0, table_rows) it rotates q_pe[t, h, :] for every head h
// and k_pe[t, :] in place as LaunchApplyRope (kernels/cuda/rope.cuh) does;
// then, for t < num_slot_tokens with a slot as above, it writes [kv_c[t] |
// k_pe[t]] (rotated; kv_c normalised first when norm_weight is set) to the
// cache as LaunchMlaKvUpdate. q_pe, k_pe and the table are f32; kv_c and the
// cache f32 or bf16.
struct RopeKvUpdateArgs {
  const int32_t* positions;
  int64_t position_stride;
  const float* table;  // [table_rows, 2 half]: cos | sin
  int64_t table_rows, table_row_stride;
  float* q_pe;
  int64_t q_token_stride, q_head_stride, heads;
  float* k_pe;
  int64_t k_pe_row_stride;
  int64_t num_tokens, half;
  const void* kv_c;
  DType kv_c_dtype;
  int64_t kv_c_row_stride;
  const int64_t* slot_mapping;
  int64_t slot_mapping_stride, num_slot_tokens;
  void* cache;
  DType cache_dtype;
  int64_t num_slots, rkv;
  // Optional: the latent's RMSNorm before it is written (norm_weight
  // [rkv], f32 or bf16); nullptr writes kv_c as it is. The cache then
  // receives exactly LaunchRmsNorm's f32 result for that row, cast to the
  // cache dtype (same reduction: 256 threads, a double sum, one CUB block
  // reduction), and kv_c is only read.
  const void* norm_weight;
  DType norm_weight_dtype;
  float norm_eps;
};
cudaError_t LaunchMlaRopeKvUpdate(const RopeKvUpdateArgs& args, cudaStream_t stream);

}  // namespace mlag::cuda
