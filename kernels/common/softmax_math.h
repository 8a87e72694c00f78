// Online softmax and log-sum-exp merging, shared by the host and CUDA
// attention kernels (the host runs the per-tile step vectorised across
// queries, with its own exp: kernels/host/attention_softmax.h; it keeps the
// state, the final division and the merges here). Standard library only
// (see runtime/core/host_device.h).
//
// A softmax over a stream of scores keeps a running maximum m and a running
// sum l = sum exp(score - m); an accumulator o = sum exp(score - m) v is
// rescaled whenever m grows. The result is o / l with log-sum-exp m + ln l.
// Partial results over disjoint key ranges (split-K decode) are combined
// through their log-sum-exps: lse = ln sum_i exp(lse_i), and
// out = sum_i exp(lse_i - lse) out_i for normalised partial outputs out_i.
// Masked or empty inputs are -inf scores; an empty softmax has l = 0, lse
// -inf and a zero output.
#pragma once

#include <math.h>

#include "runtime/core/host_device.h"

namespace mlag {

struct OnlineSoftmaxState {
  float max;  // running maximum score, -inf before the first unmasked score
  float sum;  // sum of exp(score - max) so far
};

MLAG_HD OnlineSoftmaxState OnlineSoftmaxInit() { return {-INFINITY, 0.0f}; }

// exp(x - m), and exactly 0 for x = -inf (also when m is -inf).
MLAG_HD float ExpShifted(float x, float m) { return x == -INFINITY ? 0.0f : expf(x - m); }

// Starts a tile of scores whose maximum is `tile_max`: raises the running max,
// rescales the running sum and returns the factor the caller must apply to its
// accumulator (1 when the max did not change, 0 when nothing was seen yet).
// Afterwards add p = ExpShifted(score, state->max) to state->sum and p * v to
// the accumulator for each score of the tile.
MLAG_HD float OnlineSoftmaxRescale(OnlineSoftmaxState* state, float tile_max) {
  float m_new = state->max > tile_max ? state->max : tile_max;
  float alpha = ExpShifted(state->max, m_new);
  state->max = m_new;
  state->sum *= alpha;
  return alpha;
}

// 1 / sum, or 0 for an empty softmax (so the output is zeros).
MLAG_HD float OnlineSoftmaxInvSum(const OnlineSoftmaxState& state) {
  return state.sum > 0.0f ? 1.0f / state.sum : 0.0f;
}

// Natural log-sum-exp of the scores seen, -inf when none.
MLAG_HD float OnlineSoftmaxLse(const OnlineSoftmaxState& state) {
  return state.sum > 0.0f ? state.max + logf(state.sum) : -INFINITY;
}

// ln(exp(a) + exp(b)), stable, with -inf as the identity.
MLAG_HD float LseAdd(float a, float b) {
  float m = a > b ? a : b;
  if (m == -INFINITY) return -INFINITY;
  return m + log1pf(expf(-fabsf(a - b)));
}

// Weight of a normalised partial output with log-sum-exp `lse_part` in a
// merge whose total log-sum-exp is `lse_total`; 0 for an empty part.
MLAG_HD float LseMergeWeight(float lse_part, float lse_total) {
  return ExpShifted(lse_part, lse_total);
}

}  // namespace mlag
