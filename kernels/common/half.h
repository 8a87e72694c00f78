// bf16 and f16 <-> f32 conversion, round to nearest even, shared by host and
// CUDA code. Storage types are plain uint16_t so this header needs neither
// cuda_bf16.h nor any compiler extension.
//
// Contract:
//   - f32 -> bf16/f16 rounds to nearest, ties to even.
//   - NaN stays NaN (sign kept, quiet bit set); +-inf stays +-inf.
//   - f32 -> f16 overflows to +-inf and produces f16 subnormals below 2^-14.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace mlag {

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

}  // namespace mlag
