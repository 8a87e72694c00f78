// Host implementations behind kernels/rope.h. Arguments are validated by the
// caller.
#pragma once

#include <vector>

#include "runtime/core/tensor.h"

namespace mlag::host {

// table: f32 [P, dr] contiguous; inv_freq: dr / 2 entries; scale multiplies
// cos and sin.
void FillRopeTable(const std::vector<float>& inv_freq, float scale, const Tensor& table);

// See ApplyRope in kernels/rope.h.
void ApplyRope(const Tensor& positions, const Tensor& table, const Tensor& q_pe,
               const Tensor& k_pe);

}  // namespace mlag::host
