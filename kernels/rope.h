// Rotary position embedding with YaRN scaling, on interleaved pairs
// as DeepSeek's checkpoints store the rope dims: pair i of a rope vector is
// (x[2i], x[2i+1]) and rotates
// by angle p * inv_freq[i].
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// Rope parameters as config.json gives them. `yarn` false means plain rope
// (factor and the other YaRN fields are ignored).
struct RopeParams {
  int rotary_dim = 64;  // dr, even
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// YaRN correction range [lo, hi] in pair indices (yarn_find_correction_range in
// modeling_deepseek.py), as f32 math.
struct YarnRange {
  float lo;
  float hi;
};
YarnRange ComputeYarnRange(const RopeParams& params);

// inv_freq[i], i < rotary_dim / 2, in f32 (YaRN-blended when params.yarn).
std::vector<float> ComputeInvFreq(const RopeParams& params);

// g(F, m) = 1 if F <= 1 else 0.1 * m * ln(F) + 1.
float YarnMscale(double factor, double mscale);

// The factor cos and sin are multiplied by: g(F, mscale) / g(F, mscale_all_dim)
// under YaRN, 1 otherwise.
float RopeCosSinScale(const RopeParams& params);

// MLA softmax scale: qk_head_dim^-1/2, times g(F, mscale_all_dim)^2 under YaRN.
float MlaSoftmaxScale(int qk_head_dim, const RopeParams& params);

// Fills `table` (f32 [max_positions, rotary_dim], contiguous, host memory)
// with, for position p, [cos(p*inv_freq[i]) * s for i < dr/2] followed by
// [sin(p*inv_freq[i]) * s for i < dr/2], s = RopeCosSinScale(params). The
// angle is computed in f32 as f32(p) * inv_freq[i], as the reference does.
absl::Status FillRopeTable(const RopeParams& params, const Tensor& table);

// Rotates in place, for every token t at position positions[t]:
//   q_pe: f32 [T, H, dr] (last dim unit-stride; any other strides) — every head;
//   k_pe: f32 [T, dr] (last dim unit-stride; rows may be strided).
//   positions: i32 [T]; table: f32 [P, dr] from FillRopeTable.
// Rows whose position is outside [0, P) are left unchanged (positions are
// validated before they reach the kernel).
absl::Status ApplyRope(Stream& stream, const Tensor& positions, const Tensor& table,
                       const Tensor& q_pe, const Tensor& k_pe);

// The argument checks of ApplyRope, for ops that fuse it (MlaRopeKvUpdate).
absl::Status CheckApplyRopeArgs(Stream& stream, const Tensor& positions, const Tensor& table,
                                const Tensor& q_pe, const Tensor& k_pe);

}  // namespace mlag
