// dtype conversions against a table worked out by hand from the IEEE-754
// encodings (ties, subnormals, overflow, NaN and infinities).
#include "runtime/core/dtype.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace mlag
