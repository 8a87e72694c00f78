// Element types (DType) and the bf16 / f16 / fp8 <-> f32 conversions, shared by
// host and CUDA code. Standard library only: .cu files include this header
// (and pass DType to their launchers), so it needs neither cuda_bf16.h nor
// any compiler extension; the 16-bit storage types are plain uint16_t.
// Names, parsing and array conversions of DType are in runtime/core/dtype.h.
//
// Contract:
//   - f32 -> bf16/f16 rounds to nearest, ties to even.
//   - NaN stays NaN (sign kept, quiet bit set); +-inf stays +-inf.
//   - f32 -> f16 overflows to +-inf and produces f16 subnormals below 2^-14.
//   - fp8 is e4m3 "fn" (OCP FP8, as DeepSeek-V3 stores weights): no
//     infinities, 0x7f / 0xff are NaN, the largest finite value is 448 and
//     subnormals are m * 2^-9. f32 -> fp8 rounds to nearest even and
//     saturates to +-448 (a quantizer's scale keeps values in range).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/core/host_device.h"

namespace mlag {

// Element type of a tensor. The values are stable: CUDA kernels switch on
// them and checkpoints' dtypes map onto them.
enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kI32 = 3,
  kI64 = 4,
  kU8 = 5,
  kF8E4M3 = 6,
};

// Bytes per element.
MLAG_HD constexpr size_t DTypeSize(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kI32    ? 4
         : dtype == DType::kI64                          ? 8
         : dtype == DType::kBF16 || dtype == DType::kF16 ? 2
                                                         : 1;
}

MLAG_HD uint32_t F32Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

MLAG_HD float F32FromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

MLAG_HD float Bf16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }

MLAG_HD uint16_t F32ToBf16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force quiet bit
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit.
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

MLAG_HD float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;  // +-0
    } else {     // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return F32FromBits(u);
}

MLAG_HD uint16_t F32ToF16(float f) {
  uint32_t u = F32Bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is an f16 subnormal (or zero): value = mant * 2^-24.
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // in [14, 24]; result = mant >> shift
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round 13 dropped mantissa bits to nearest even.
  uint32_t lsb = (abs >> 13) & 1u;
  abs += 0xfffu + lsb;
  abs -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (abs >> 13));
}

MLAG_HD float F8E4M3ToF32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  if (mag == 0x7fu) return F32FromBits(sign | 0x7fc00000u);  // NaN
  if (mag < 8u) {                                            // subnormal (or zero): mag * 2^-9
    return F32FromBits(F32Bits(static_cast<float>(mag) * (1.0f / 512.0f)) | sign);
  }
  return F32FromBits(sign | (((mag >> 3) + 120u) << 23) | ((mag & 7u) << 20));
}

MLAG_HD uint8_t F32ToF8E4M3(float f) {
  const uint32_t u = F32Bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448: saturate
  if (abs < 0x3c800000u) {
    // Below 2^-6: a subnormal m * 2^-9, m = round-to-even(|f| * 512) in [0, 8]
    // (8 is the smallest normal, whose encoding is also 8).
    const float scaled = F32FromBits(abs) * 512.0f;  // exact: a power-of-two scale
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);
  }
  // Normal: keep 3 mantissa bits, round the 20 dropped ones to nearest even.
  abs += 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exp = (abs >> 23) - 120u;
  const uint32_t code = (exp << 3) | ((abs >> 20) & 7u);
  return static_cast<uint8_t>(sign | (code > 0x7eu ? 0x7eu : code));
}

// Reads element `i` of a floating array as f32.
MLAG_HD float LoadAsF32(DType dtype, const void* base, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3:
      return F8E4M3ToF32(static_cast<const uint8_t*>(base)[i]);
    default:
      return 0.0f;
  }
}

// Writes `v` as element `i` of a floating array.
MLAG_HD void StoreFromF32(DType dtype, void* base, size_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = F32ToBf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = F32ToF16(v);
      break;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(base)[i] = F32ToF8E4M3(v);
      break;
    default:
      break;
  }
}

}  // namespace mlag
