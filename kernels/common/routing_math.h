// MoE routing math shared by the host router and the CUDA router
// (MoEGate in the Hugging Face modeling_deepseek.py): the ranking rule and the
// small top-k selections.
//
// Ranking rule, everywhere in routing: a higher score wins; equal scores go to
// the lower index (expert id or group id). The rule is a strict total order on
// (score, index) pairs for non-NaN scores, so every selection below gives one
// answer whatever the scan order or thread layout. -inf (a masked expert) is an
// ordinary score: it loses to every finite score and ties among -inf go to the
// lower index.
#pragma once

#include <cmath>

#include "runtime/core/host_device.h"

namespace mlag {

// True when (score_a, index_a) ranks strictly before (score_b, index_b).
MLAG_HD bool RoutingBetter(float score_a, int index_a, float score_b, int index_b) {
  return score_a > score_b || (score_a == score_b && index_a < index_b);
}

// Logistic sigmoid in f32, the sigmoid scoring function.
MLAG_HD float RoutingSigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Offers (score, index) to a best-first list of at most `k` entries held in
// scores[0..*count) / indices[0..*count). The list stays sorted by
// RoutingBetter; an entry that does not rank among the best k is dropped.
MLAG_HD void TopKInsert(float score, int index, int k, float* scores, int* indices, int* count) {
  int pos = *count;
  if (pos == k) {
    if (k == 0 || !RoutingBetter(score, index, scores[k - 1], indices[k - 1])) return;
    pos = k - 1;  // the last entry falls off
  } else {
    ++*count;
  }
  while (pos > 0 && RoutingBetter(score, index, scores[pos - 1], indices[pos - 1])) {
    scores[pos] = scores[pos - 1];
    indices[pos] = indices[pos - 1];
    --pos;
  }
  scores[pos] = score;
  indices[pos] = index;
}

// The best `k` (k <= n) of values[0..n), best first, as indices into
// `values` (out_indices) and their scores (out_scores). O(n * k): meant for the
// small k of routing.
MLAG_HD void TopKSelect(const float* values, int n, int k, float* out_scores, int* out_indices) {
  int count = 0;
  for (int i = 0; i < n; ++i) TopKInsert(values[i], i, k, out_scores, out_indices, &count);
}

// group_limited_greedy's group score: the largest value of values[0..n).
MLAG_HD float GroupScoreMax(const float* values, int n) {
  float best = values[0];
  for (int i = 1; i < n; ++i) best = values[i] > best ? values[i] : best;
  return best;
}

// noaux_tc's group score: the sum of the two largest values of values[0..n)
// (the single value when n == 1). The larger is added first.
MLAG_HD float GroupScoreTop2Sum(const float* values, int n) {
  float s[2];
  int idx[2];
  int count = 0;
  for (int i = 0; i < n; ++i) TopKInsert(values[i], i, 2, s, idx, &count);
  return count == 1 ? s[0] : s[0] + s[1];
}

}  // namespace mlag
