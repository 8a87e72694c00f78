#include "kernels/host/rope.h"

#include <cmath>

#include "kernels/common/rope_math.h"
#include "kernels/host/parallel.h"

namespace mlag::host {

void FillRopeTable(const std::vector<float>& inv_freq, float scale, const Tensor& table) {
  const int64_t positions = table.size(0);
  const int64_t dr = table.size(1);
  const int64_t half = dr / 2;
  ParallelFor(
      positions,
      [&](int64_t p) {
        float* row = table.data_as<float>() + p * table.stride(0);
        for (int64_t i = 0; i < half; ++i) {
          // The angle is rounded to f32 before cos/sin, as the reference does.
          const float angle = static_cast<float>(p) * inv_freq[i];
          row[i] = std::cos(angle) * scale;
          row[half + i] = std::sin(angle) * scale;
        }
      },
      /*min_parallel=*/64);
}

void ApplyRope(const Tensor& positions, const Tensor& table, const Tensor& q_pe,
               const Tensor& k_pe) {
  const int64_t num_tokens = positions.size(0);
  const int64_t num_positions = table.size(0);
  const int64_t heads = q_pe.size(1);
  const int half = static_cast<int>(table.size(1) / 2);
  const int32_t* pos = positions.data_as<int32_t>();
  ParallelFor(
      num_tokens,
      [&](int64_t t) {
        const int64_t p = pos[t * positions.stride(0)];
        if (p < 0 || p >= num_positions) return;  // left unchanged (see the contract)
        const float* cos_row = table.data_as<float>() + p * table.stride(0);
        const float* sin_row = cos_row + half;
        float* q = q_pe.data_as<float>() + t * q_pe.stride(0);
        for (int64_t h = 0; h < heads; ++h) {
          RopeRotateInterleaved(q + h * q_pe.stride(1), cos_row, sin_row, half);
        }
        RopeRotateInterleaved(k_pe.data_as<float>() + t * k_pe.stride(0), cos_row, sin_row, half);
      },
      /*min_parallel=*/16);
}

}  // namespace mlag::host
