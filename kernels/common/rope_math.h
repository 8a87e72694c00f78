// Rotary-embedding math shared by the host and CUDA rope kernels
// (DeepSeek-V2 paper, arXiv:2405.04434, §2.1.3; the YaRN functions of the Hugging
// Face modeling_deepseek.py): interleaved pair rotation and the YaRN inverse
// frequencies. Standard library only (see runtime/core/host_device.h).
//
// Layout: a rope vector x of length dr holds dr/2 interleaved pairs
// (x[2i], x[2i+1]); pair i rotates by angle p * inv_freq[i]. A rope table row
// for position p holds dr/2 cosines followed by dr/2 sines, both already
// multiplied by the YaRN cos/sin scale.
#pragma once

#include <math.h>

#include "runtime/core/host_device.h"

namespace mlag {

// a * b rounded to f32 on its own. nvcc would otherwise fuse x0 * c - x1 * s
// into an fma, and the CUDA kernel would round differently from the host
// (baseline x86-64, no FMA): with it both backends rotate bit for bit alike.
MLAG_HD float RopeMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// y = rotation of the pair (x0, x1) by the angle whose (scaled) cosine and
// sine are c and s: y0 = x0 c - x1 s, y1 = x0 s + x1 c, every product
// rounded to f32 before the sum.
MLAG_HD void RopeRotatePair(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = RopeMul(x0, c) - RopeMul(x1, s);
  *y1 = RopeMul(x0, s) + RopeMul(x1, c);
}

// Rotates the `half` interleaved pairs of x in place with one table row:
// cos_row[i] and sin_row[i] are the cosine and sine of pair i.
MLAG_HD void RopeRotateInterleaved(float* x, const float* cos_row, const float* sin_row, int half) {
  for (int i = 0; i < half; ++i) {
    float y0, y1;
    RopeRotatePair(x[2 * i], x[2 * i + 1], cos_row[i], sin_row[i], &y0, &y1);
    x[2 * i] = y0;
    x[2 * i + 1] = y1;
  }
}

// Unscaled inverse frequency of pair i, in f32 as the reference computes it:
// 1 / base^(f32(2i) / f32(dim)).
MLAG_HD float RopeBaseInvFreq(int i, int dim, float base) {
  return 1.0f / powf(base, static_cast<float>(2 * i) / static_cast<float>(dim));
}

// YaRN correction dimension: dim * ln(L / (2 pi r)) / (2 ln base), in double
// as the reference (Python math) computes it.
MLAG_HD double YarnCorrectionDim(double num_rotations, int dim, double base,
                                 double original_max_position) {
  const double kPi = 3.14159265358979323846;
  return dim * log(original_max_position / (num_rotations * 2.0 * kPi)) / (2.0 * log(base));
}

// YaRN-blended inverse frequency of pair i (f32): the ramp runs from 0 at
// pair `lo` to 1 at pair `hi`, blending inv0 (extrapolation) into inv0 /
// factor (interpolation).
MLAG_HD float YarnInvFreq(float inv0, int i, float factor, float lo, float hi) {
  float ramp = (static_cast<float>(i) - lo) / (hi - lo);
  ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
  return inv0 * (1.0f - ramp) + (inv0 / factor) * ramp;
}

// g(F, m) = 1 if F <= 1 else 0.1 m ln(F) + 1 (double).
MLAG_HD double YarnGetMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

}  // namespace mlag
