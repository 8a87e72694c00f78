#include "kernels/host/mla_kv_update.h"

#include <cstring>

#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

// Copies n elements, casting when the dtypes differ (same dtype: bit-exact).
void CopyCast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype));
    return;
  }
  for (int64_t i = 0; i < n; ++i) StoreFromF32(dst_dtype, dst, i, LoadAsF32(src_dtype, src, i));
}

}  // namespace

void MlaKvUpdate(const Tensor& kv_c, const Tensor& k_pe, const Tensor& slot_mapping,
                 const Tensor& cache) {
  const int64_t num_tokens = slot_mapping.size(0);
  const int64_t num_slots = cache.size(0) * cache.size(1);
  const int64_t rkv = kv_c.size(1);
  const int64_t dr = k_pe.size(1);
  const int64_t row = cache.size(2);  // rkv + dr
  const size_t cache_esize = DTypeSize(cache.dtype());
  const int64_t* slots = slot_mapping.data_as<int64_t>();
  ParallelFor(
      num_tokens,
      [&](int64_t t) {
        const int64_t slot = slots[t * slot_mapping.stride(0)];
        if (slot < 0 || slot >= num_slots) return;  // dummy/padding row, or out of range
        // The cache is contiguous, so slot = block * block_size + offset indexes
        // its rows directly.
        char* dst = static_cast<char*>(cache.data()) + slot * row * cache_esize;
        const char* src_c = static_cast<const char*>(kv_c.data()) +
                            t * kv_c.stride(0) * static_cast<int64_t>(DTypeSize(kv_c.dtype()));
        const char* src_pe = static_cast<const char*>(k_pe.data()) +
                             t * k_pe.stride(0) * static_cast<int64_t>(DTypeSize(k_pe.dtype()));
        CopyCast(kv_c.dtype(), src_c, cache.dtype(), dst, rkv);
        CopyCast(k_pe.dtype(), src_pe, cache.dtype(), dst + rkv * cache_esize, dr);
      },
      /*min_parallel=*/64);
}

}  // namespace mlag::host
