// Block-scaled fp8 weights, as DeepSeek-V3 publishes them: each weight
// matrix [rows, cols] is stored as e4m3 values plus one f32 scale per
// 128 x 128 block ("<name>_scale_inv", shape [ceil(rows/128), ceil(cols/128)]),
// and the weight the model means is value * scale.
//
// The dequantized weight is defined here once, as the f32 product of the
// e4m3 value and its scale, rounded once (Fp8Dequantize). The loader's f32
// path, export, and the host GEMM (which dequantizes in registers) all
// compute exactly that product, so an fp8 checkpoint and the same weights
// dequantized to f32 give bit-identical results.
#pragma once

#include <cstdint>

#include "runtime/core/scalar_types.h"

namespace mlag {

constexpr int64_t kFp8BlockSize = 128;

// Blocks of kFp8BlockSize covering n elements.
constexpr int64_t Fp8Blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// Largest block scale the runtime takes: the host GEMM reads e4m3 bits as an
// f32 2^120 times too small and multiplies the scale by 2^120 to undo it,
// which must stay finite.
constexpr float kFp8MaxScale = 0x1p7f;

inline float Fp8Dequantize(uint8_t value, float scale) { return F8E4M3ToF32(value) * scale; }

// Quantizes `w` [rows, cols] (row-major) to e4m3 `q` [rows, cols] and
// `scale` [Fp8Blocks(rows), Fp8Blocks(cols)]: each block's scale is its
// largest magnitude / 448 (1 for an all-zero block), and q = round(w / scale)
// to nearest even. Non-finite inputs give NaN codes (the loader refuses them).
void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale);

// Dequantizes `q` [rows, cols] with block scales `scale` into `w` (f32).
void DequantizeFp8Blocks(const uint8_t* q, const float* scale, int64_t rows, int64_t cols,
                         float* w);

// The per-row form the runtime keeps: row_scale [rows, Fp8Blocks(cols)] with
// row r's entries those of block row r / 128, so rows of different matrices
// can be stacked (a fused gate|up projection) whatever their block alignment.
void ExpandFp8RowScales(const float* block_scale, int64_t rows, int64_t cols, float* row_scale);

}  // namespace mlag
