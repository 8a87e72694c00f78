// Loads and stores of float elements by dtype code, for CUDA kernels.
// Codes follow mlag::DType: 0 f32, 1 bf16, 2 f16.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"

namespace mlag::cuda {

__device__ __forceinline__ float LoadF32(const void* base, int dtype, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(base)[i];
  uint16_t h = static_cast<const uint16_t*>(base)[i];
  return dtype == 1 ? Bf16ToF32(h) : F16ToF32(h);
}

__device__ __forceinline__ void StoreF32(void* base, int dtype, int64_t i, float v) {
  if (dtype == 0) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = dtype == 1 ? F32ToBf16(v) : F32ToF16(v);
  }
}

}  // namespace mlag::cuda
