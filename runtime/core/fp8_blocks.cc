#include "runtime/core/fp8_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mlag {

namespace {

// Four lanes: every x86-64 CPU has them (SSE2), and GNU vectors compile to
// the target's own elsewhere.
typedef float F4 __attribute__((vector_size(16)));
typedef uint32_t U4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));

// F32ToF8E4M3 (scalar_types.h) of x / s in four lanes, without branches:
// every case is computed and the right one selected. The same codes as the
// scalar function for every input (the tests compare the two).
inline U4 QuantizeLanes(F4 x, F4 s) {
  const F4 f = x / s;
  U4 u;
  std::memcpy(&u, &f, sizeof(u));
  const U4 sign = (u >> 24) & 0x80u;
  const U4 abs = u & 0x7fffffffu;
  // Normal: keep 3 mantissa bits, round the 20 dropped ones to nearest even.
  const U4 r = abs + 0x7ffffu + ((abs >> 20) & 1u);
  U4 normal = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
  normal = normal > 0x7eu ? U4{} + 0x7eu : normal;
  // Below 2^-6: m * 2^-9 with m = round-to-even(|f| * 512), by adding and
  // subtracting 2^23 (|f| capped first, so the conversion is in range).
  const U4 capped = abs < 0x3c800000u ? abs : U4{} + 0x3c800000u;
  F4 scaled;
  std::memcpy(&scaled, &capped, sizeof(scaled));
  scaled = (scaled * 512.0f + 0x1p23f) - 0x1p23f;
  const U4 subnormal = reinterpret_cast<U4>(__builtin_convertvector(scaled, I4));
  U4 code = abs < 0x3c800000u ? subnormal : normal;
  code = abs >= 0x43e00000u ? U4{} + 0x7eu : code;  // >= 448: saturate
  code = abs > 0x7f800000u ? U4{} + 0x7fu : code;   // NaN
  return sign | code;
}

}  // namespace

void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  const int64_t col_blocks = Fp8Blocks(cols);
  for (int64_t br = 0; br < Fp8Blocks(rows); ++br) {
    const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
    // Each row read whole, in order (one stream the prefetchers follow),
    // for the block maxima and then for the codes.
    float* s = scale + br * col_blocks;
    std::fill(s, s + col_blocks, 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = w + r * cols;
      for (int64_t bc = 0; bc < col_blocks; ++bc) {
        const int64_t c1 = std::min(cols, (bc + 1) * kFp8BlockSize);
        float amax = s[bc];
#pragma omp simd reduction(max : amax)
        for (int64_t c = bc * kFp8BlockSize; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
        s[bc] = amax;
      }
    }
    for (int64_t bc = 0; bc < col_blocks; ++bc) s[bc] = s[bc] > 0.0f ? s[bc] / 448.0f : 1.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = w + r * cols;
      uint8_t* q_row = q + r * cols;
      for (int64_t bc = 0; bc < col_blocks; ++bc) {
        const int64_t c1 = std::min(cols, (bc + 1) * kFp8BlockSize);
        const F4 s4 = F4{} + s[bc];
        int64_t c = bc * kFp8BlockSize;
        for (; c + 4 <= c1; c += 4) {
          F4 x;
          std::memcpy(&x, row + c, sizeof(x));
          const U4 code = QuantizeLanes(x, s4);
          for (int i = 0; i < 4; ++i) q_row[c + i] = static_cast<uint8_t>(code[i]);
        }
        for (; c < c1; ++c) q_row[c] = F32ToF8E4M3(row[c] / s[bc]);
      }
    }
  }
}

void DequantizeFp8Blocks(const uint8_t* q, const float* scale, int64_t rows, int64_t cols,
                         float* w) {
  const int64_t col_blocks = Fp8Blocks(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale + (r / kFp8BlockSize) * col_blocks;
    for (int64_t c = 0; c < cols; ++c) {
      w[r * cols + c] = Fp8Dequantize(q[r * cols + c], s[c / kFp8BlockSize]);
    }
  }
}

void ExpandFp8RowScales(const float* block_scale, int64_t rows, int64_t cols, float* row_scale) {
  const int64_t col_blocks = Fp8Blocks(cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(block_scale + (r / kFp8BlockSize) * col_blocks,
              block_scale + (r / kFp8BlockSize + 1) * col_blocks, row_scale + r * col_blocks);
  }
}

}  // namespace mlag
