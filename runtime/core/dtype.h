// Element types of tensors, and the scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/common/half.h"

namespace mlag {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8 };

// Bytes per element.
size_t DTypeSize(DType dtype);

// Lower-case name as used in messages and checkpoints' own spelling aside:
// "f32", "bf16", "f16", "i32", "i64", "u8".
absl::string_view DTypeName(DType dtype);

// Parses the names DTypeName() returns.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// True for f32, bf16 and f16.
bool IsFloat(DType dtype);

// Converts `n` elements of a floating dtype to f32 / from f32 (round to
// nearest even). `src` and `dst` must not overlap.
void ConvertToF32(DType src_dtype, const void* src, float* dst, size_t n);
void ConvertFromF32(const float* src, DType dst_dtype, void* dst, size_t n);

// Reads element `i` of a floating array as f32.
inline float LoadAsF32(DType dtype, const void* base, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    default: return 0.0f;
  }
}

// Writes `v` as element `i` of a floating array.
inline void StoreFromF32(DType dtype, void* base, size_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = F32ToBf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = F32ToF16(v); break;
    default: break;
  }
}

}  // namespace mlag
