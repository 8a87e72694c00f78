#include "runtime/core/dtype.h"

#include "absl/strings/str_cat.h"

namespace mlag {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kF8E4M3:
      return "fp8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8,
                  DType::kF8E4M3}) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

void ConvertToF32(DType src_dtype, const void* src, float* dst, size_t n) {
  switch (src_dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      break;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      break;
    }
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F8E4M3ToF32(s[i]);
      break;
    }
    default:
      break;
  }
}

void ConvertFromF32(const float* src, DType dst_dtype, void* dst, size_t n) {
  switch (dst_dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = src[i];
      break;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      break;
    }
    case DType::kF8E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF8E4M3(src[i]);
      break;
    }
    default:
      break;
  }
}

}  // namespace mlag
