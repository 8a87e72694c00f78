#include "runtime/core/fp8_blocks.h"

#include <algorithm>
#include <cmath>

namespace mlag {

void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  const int64_t col_blocks = Fp8Blocks(cols);
  for (int64_t br = 0; br < Fp8Blocks(rows); ++br) {
    const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
    for (int64_t bc = 0; bc < col_blocks; ++bc) {
      const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      scale[br * col_blocks + bc] = s;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = F32ToF8E4M3(w[r * cols + c] / s);
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
