// Element types of tensors: names, parsing and array conversions. The enum
// itself, its sizes and the scalar conversions are in scalar_types.h, which
// CUDA sources include too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/scalar_types.h"

namespace mlag {

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

}  // namespace mlag
