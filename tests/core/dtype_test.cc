// dtype conversions against a table worked out by hand from the IEEE-754
// encodings (ties, subnormals, overflow, NaN and infinities), and the fp8
// block quantizer against the scalar conversion.
#include "runtime/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/fp8_blocks.h"

namespace mlag {
namespace {

float Bits(uint32_t u) { return F32FromBits(u); }

struct Case {
  uint32_t f32_bits;
  uint16_t expected;
  const char* what;
};

TEST(DTypeTest, F32ToBf16RoundsToNearestEven) {
  const Case cases[] = {
      {0x3F800000u, 0x3F80, "1.0 exact"},
      {0x3F808000u, 0x3F80, "1+2^-8: tie, even is down"},
      {0x3F818000u, 0x3F82, "tie between 0x3F81 and 0x3F82: even is up"},
      {0x3F808001u, 0x3F81, "just above a tie rounds up"},
      {0x3F807FFFu, 0x3F80, "just below a tie rounds down"},
      {0xC0200000u, 0xC020, "-2.5 exact"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x7F800000u, 0x7F80, "+inf"},
      {0xFF800000u, 0xFF80, "-inf"},
      {0x7F7FFFFFu, 0x7F80, "FLT_MAX rounds up to inf"},
      {0x7FC00000u, 0x7FC0, "quiet NaN"},
      {0x7F800001u, 0x7FC0, "signalling NaN with low payload stays NaN"},
      {0xFFC00001u, 0xFFC0, "negative NaN keeps its sign"},
      {0x00010000u, 0x0001, "subnormal kept"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(F32ToBf16(Bits(c.f32_bits)), c.expected) << c.what;
  }
}

TEST(DTypeTest, Bf16ToF32IsExact) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xC020), -2.5f);
  EXPECT_EQ(Bf16ToF32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16ToF32(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7FC0)));
  EXPECT_EQ(F32Bits(Bf16ToF32(0x8000)), 0x80000000u);
}

TEST(DTypeTest, F32ToF16RoundsToNearestEven) {
  const Case cases[] = {
      {0x3F800000u, 0x3C00, "1.0"},
      {0x3F801000u, 0x3C00, "1+2^-11: tie, even is down"},
      {0x3F803000u, 0x3C02, "1+3*2^-11: tie, even is up"},
      {0x3F801001u, 0x3C01, "just above a tie"},
      {0x477FE000u, 0x7BFF, "65504, the largest f16"},
      {0x477FEFFFu, 0x7BFF, "just below 65520 stays finite"},
      {0x477FF000u, 0x7C00, "65520 rounds to inf"},
      {0x7F800000u, 0x7C00, "+inf"},
      {0xFF800000u, 0xFC00, "-inf"},
      {0x38800000u, 0x0400, "2^-14, the smallest normal"},
      {0x33800000u, 0x0001, "2^-24, the smallest subnormal"},
      {0x33000000u, 0x0000, "2^-25: tie with 0, even is 0"},
      {0x33400000u, 0x0001, "1.5*2^-25 rounds up to 2^-24"},
      {0x33C00000u, 0x0002, "3*2^-25 = 1.5 ulp: tie between 1 and 2 ulp, even is 2"},
      {0x34400000u, 0x0003, "3*2^-24 = 3 ulp exactly"},
      {0x387FC000u, 0x03FF, "largest subnormal 1023*2^-24"},
      {0x387FE000u, 0x0400, "tie at the top of the subnormals rounds to the smallest normal"},
      {0x80000000u, 0x8000, "-0"},
      {0x7FC00000u, 0x7E00, "NaN"},
      {0xC0200000u, 0xC100, "-2.5"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(F32ToF16(Bits(c.f32_bits)), c.expected) << c.what;
  }
}

TEST(DTypeTest, F16ToF32IsExact) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0xC100), -2.5f);
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_EQ(F32Bits(F16ToF32(0x8000)), 0x80000000u);
}

TEST(DTypeTest, EveryF16RoundTripsThroughF32) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, EveryBf16RoundTripsThroughF32) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBf16(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, SizesNamesAndParsing) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBF16);
  EXPECT_FALSE(ParseDType("fp64").ok());
}

TEST(DTypeTest, BulkConversionMatchesScalar) {
  const float src[] = {1.0f, -2.5f, 3.14159f, 1e-6f, 65504.0f, -0.0f};
  uint16_t bf[6], hf[6];
  ConvertFromF32(src, DType::kBF16, bf, 6);
  ConvertFromF32(src, DType::kF16, hf, 6);
  float back[6];
  ConvertToF32(DType::kBF16, bf, back, 6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(bf[i], F32ToBf16(src[i]));
    EXPECT_EQ(hf[i], F32ToF16(src[i]));
    EXPECT_EQ(F32Bits(back[i]), F32Bits(Bf16ToF32(bf[i])));
  }
}

TEST(DTypeTest, F32ToF8E4M3RoundsToNearestEvenAndSaturates) {
  struct Fp8Case {
    float value;
    uint8_t expected;
    const char* what;
  };
  const Fp8Case cases[] = {
      {1.0f, 0x38, "1.0: exponent field 7, mantissa 0"},
      {-1.0f, 0xb8, "-1.0"},
      {1.0625f, 0x38, "tie between 1 and 1.125: even is down"},
      {1.1875f, 0x3a, "tie between 1.125 and 1.25: even is up"},
      {1.0626f, 0x39, "just above a tie rounds up"},
      {448.0f, 0x7e, "the largest finite"},
      {500.0f, 0x7e, "above it saturates"},
      {-INFINITY, 0xfe, "-inf saturates"},
      {0x1p-6f, 0x08, "the smallest normal"},
      {0x1p-9f, 0x01, "the smallest subnormal"},
      {0x1.8p-9f, 0x02, "subnormal tie between 1 and 2: even is up"},
      {0x1p-10f, 0x00, "tie between 0 and the smallest subnormal: even is 0"},
      {-0.0f, 0x80, "-0"},
      {std::numeric_limits<float>::quiet_NaN(), 0x7f, "NaN"},
  };
  for (const Fp8Case& c : cases) EXPECT_EQ(F32ToF8E4M3(c.value), c.expected) << c.what;
}

// QuantizeFp8Blocks (vectorised) against the scalar definition written
// here: block scale = largest magnitude / 448, each code F32ToF8E4M3(w /
// scale). Blocks whose largest magnitude is 448 have scale 1 and carry a
// sweep of every magnitude up to 448 (a stride through the bit patterns,
// both signs), so every rounding case of the conversion is met; a shape
// past whole blocks in both dimensions, and blocks with inf and NaN.
TEST(Fp8BlocksTest, QuantizeMatchesTheScalarDefinition) {
  constexpr int64_t kRows = 130, kCols = 2 * kFp8BlockSize + 35;
  std::vector<float> w(static_cast<size_t>(kRows * kCols));
  uint32_t bits = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    bits = (bits + 30011u) % 0x43e00001u;  // through every magnitude up to 448
    w[i] = F32FromBits(bits | (i % 3 == 0 ? 0x80000000u : 0u));
  }
  const int64_t col_blocks = Fp8Blocks(kCols);
  for (int64_t br = 0; br < Fp8Blocks(kRows); ++br) {
    for (int64_t bc = 0; bc < col_blocks; ++bc) {
      w[(br * kFp8BlockSize) * kCols + bc * kFp8BlockSize] = 448.0f;
    }
  }
  w[5 * kCols + 3] = 0.5f * std::numeric_limits<float>::infinity();  // block (0, 0): scale inf
  w[129 * kCols + 270] = std::numeric_limits<float>::quiet_NaN();    // block (1, 2)
  w[7 * kCols + 200] = 1e-30f;                                       // a code of 0
  // Exact ties of the normal and subnormal roundings, and a few exact
  // values, in block (0, 1) (scale 1).
  const float ties[] = {1.0625f,   1.1875f,  -1.1875f,  0x1.8p-9f,  0x1p-10f,
                        0x1.4p-6f, 0x1.ep7f, 0x1.1p-1f, -0x1.7p-8f, 0x1.cp-9f};
  for (size_t i = 0; i < std::size(ties); ++i) w[9 * kCols + kFp8BlockSize + 1 + i] = ties[i];

  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(static_cast<size_t>(Fp8Blocks(kRows) * col_blocks));
  QuantizeFp8Blocks(w.data(), kRows, kCols, q.data(), scale.data());
  for (int64_t br = 0; br < Fp8Blocks(kRows); ++br) {
    for (int64_t bc = 0; bc < col_blocks; ++bc) {
      const int64_t r1 = std::min(kRows, (br + 1) * kFp8BlockSize);
      const int64_t c1 = std::min(kCols, (bc + 1) * kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = br * kFp8BlockSize; r < r1; ++r) {
        for (int64_t c = bc * kFp8BlockSize; c < c1; ++c) {
          amax = std::max(amax, std::fabs(w[r * kCols + c]));  // NaN ignored
        }
      }
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      EXPECT_EQ(F32Bits(scale[br * col_blocks + bc]), F32Bits(s)) << "block " << br << ", " << bc;
      int mismatches = 0;
      for (int64_t r = br * kFp8BlockSize; r < r1; ++r) {
        for (int64_t c = bc * kFp8BlockSize; c < c1; ++c) {
          const uint8_t want = F32ToF8E4M3(w[r * kCols + c] / s);
          if (q[r * kCols + c] != want && mismatches++ < 5) {
            ADD_FAILURE() << "w[" << r << "][" << c << "] = " << w[r * kCols + c] << ": code "
                          << int{q[r * kCols + c]} << ", expected " << int{want};
          }
        }
      }
    }
  }
  EXPECT_EQ(q[129 * kCols + 270] & 0x7f, 0x7f);  // NaN stays NaN
  EXPECT_EQ(scale[0], std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace mlag
