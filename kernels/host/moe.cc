#include "kernels/host/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/routing_math.h"
#include "kernels/host/gemm.h"
#include "kernels/host/linear.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

constexpr int64_t kRouteChunk = 16;  // tokens per parallel routing work item

// `buf` grown (never shrunk) to at least n floats; its data.
float* Grow(std::vector<float>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// row[i] = silu(row[i]) * row[I + i] for i < I: the gate half becomes the
// activation, in place.
void SiluMulInPlace(float* row, int64_t I) {
  for (int64_t i = 0; i < I; ++i) {
    const float g = row[i];
    row[i] = g / (1.0f + std::exp(-g)) * row[I + i];
  }
}

// Routes one token: logits row `l` [E] -> ids / weights [K]. `s`, `sel` [E],
// `group_score` [G], `group_sel_score` [topk_group], `group_ids`
// [topk_group] and `top_scores` [K] are scratch.
void RouteToken(const RoutingParams& p, const float* l, const float* bias, int32_t* ids,
                float* weights, float* s, float* sel, float* group_score, float* group_sel_score,
                int* group_ids, float* top_scores) {
  const int E = p.num_experts;
  const int K = p.top_k;
  if (p.scoring == ScoringFunc::kSoftmax) {
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      s[e] = std::exp(l[e] - m);
      sum += s[e];
    }
    for (int e = 0; e < E; ++e) s[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) s[e] = RoutingSigmoid(l[e]);
  }
  // Selection scores: the bias only steers selection (noaux_tc), the weights
  // come from s.
  for (int e = 0; e < E; ++e) sel[e] = bias != nullptr ? s[e] + bias[e] : s[e];

  if (p.method != TopkMethod::kGreedy) {
    const int G = p.n_group;
    const int per_group = E / G;
    for (int g = 0; g < G; ++g) {
      const float* v = sel + static_cast<int64_t>(g) * per_group;
      group_score[g] = p.method == TopkMethod::kNoauxTc ? GroupScoreTop2Sum(v, per_group)
                                                        : GroupScoreMax(v, per_group);
    }
    TopKSelect(group_score, G, p.topk_group, group_sel_score, group_ids);
    // Mask the groups not kept with -inf (not 0: biased scores may be
    // negative, and a 0 would then outrank a kept expert).
    for (int g = 0; g < G; ++g) {
      bool kept = false;
      for (int j = 0; j < p.topk_group; ++j) kept = kept || group_ids[j] == g;
      if (kept) continue;
      float* v = sel + static_cast<int64_t>(g) * per_group;
      for (int i = 0; i < per_group; ++i) v[i] = -std::numeric_limits<float>::infinity();
    }
  }

  TopKSelect(sel, E, K, top_scores, ids);  // int32_t is int on every target

  for (int k = 0; k < K; ++k) weights[k] = s[ids[k]];
  const bool sigmoid = p.scoring == ScoringFunc::kSigmoid;
  if (p.norm_topk_prob) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += weights[k];
    if (sigmoid) sum += 1e-20f;
    for (int k = 0; k < K; ++k) weights[k] /= sum;
  }
  if (!p.norm_topk_prob || sigmoid) {
    for (int k = 0; k < K; ++k) weights[k] *= p.routed_scaling_factor;
  }
}

}  // namespace

void MoeRoute(const RoutingParams& params, const Tensor& logits, const Tensor& correction_bias,
              const Tensor& topk_ids, const Tensor& topk_weights) {
  const int64_t T = logits.size(0);
  const int E = params.num_experts;
  const int K = params.top_k;
  const int64_t ld = logits.stride(0);
  const float* bias =
      params.method == TopkMethod::kNoauxTc ? correction_bias.data_as<const float>() : nullptr;
  const float* l = logits.data_as<const float>();
  int32_t* ids = topk_ids.data_as<int32_t>();
  float* w = topk_weights.data_as<float>();
  const int64_t chunks = (T + kRouteChunk - 1) / kRouteChunk;
  ParallelFor(chunks, [&](int64_t c) {
    std::vector<float> s(E), sel(E), group_score(params.n_group),
        group_sel_score(params.topk_group), top_scores(K);
    std::vector<int> group_ids(params.topk_group);
    const int64_t end = std::min(T, (c + 1) * kRouteChunk);
    for (int64_t t = c * kRouteChunk; t < end; ++t) {
      RouteToken(params, l + t * ld, bias, ids + t * K, w + t * K, s.data(), sel.data(),
                 group_score.data(), group_sel_score.data(), group_ids.data(), top_scores.data());
    }
  });
}

void MoeSumChoices(const float* per_choice, int64_t T, int64_t K, int64_t D, float* out) {
  ParallelFor(T, [&](int64_t t) {
    float* orow = out + t * D;
    std::fill(orow, orow + D, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float* p = per_choice + (t * K + k) * D;
      for (int64_t d = 0; d < D; ++d) orow[d] += p[d];
    }
  });
}

void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                const Tensor& expert_map, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                const Tensor& out) {
  const int64_t T = x.size(0);
  const int64_t D = x.size(1);
  const int64_t ldx = x.stride(0);
  const int64_t K = topk_ids.size(1);
  const int64_t E = expert_map.size(0);
  const int64_t L = w_gate_up.values.size(0);
  const int64_t I = w_gate_up.values.size(1) / 2;
  const int32_t* ids = topk_ids.data_as<const int32_t>();
  const float* tw = topk_weights.data_as<const float>();
  const int32_t* map = expert_map.data_as<const int32_t>();
  const float* xp = x.data_as<const float>();

  // Group the (token, k) pairs by local slot, in ascending (token, k) order
  // within a slot: row_of[t*K+k] is the pair's row in the per-slot blocks of
  // the scratch matrices, or -1 when the expert is not held here.
  const int64_t pairs = T * K;
  std::vector<int64_t> row_of(static_cast<size_t>(pairs), -1);
  std::vector<int64_t> offset(static_cast<size_t>(L) + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= E) continue;
    const int32_t slot = map[e];
    if (slot < 0 || slot >= L) continue;
    row_of[i] = slot;  // the slot for now; replaced by the row below
    ++offset[slot + 1];
  }
  for (int64_t s = 0; s < L; ++s) offset[s + 1] += offset[s];
  const int64_t N = offset[L];
  std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
  std::vector<int64_t> token_of_row(static_cast<size_t>(N));
  for (int64_t i = 0; i < pairs; ++i) {
    if (row_of[i] < 0) continue;
    const int64_t row = cursor[row_of[i]]++;
    token_of_row[row] = i / K;
    row_of[i] = row;
  }
  std::vector<int64_t> active;  // slots with at least one token
  for (int64_t s = 0; s < L; ++s) {
    if (offset[s + 1] > offset[s]) active.push_back(s);
  }
  // Most rows first: the threads claim experts in this order, so the last
  // ones claimed, which decide when the loop ends, are the small ones.
  std::stable_sort(active.begin(), active.end(), [&](int64_t a, int64_t b) {
    return offset[a + 1] - offset[a] > offset[b + 1] - offset[b];
  });

  // Per-row scratch: gathered inputs [N, D], gate|up [N, 2I] (the activation
  // is written over the gate half) and expert outputs [N, D]; and the
  // weighted choices [T, K, D]. Kept per thread and only grown: fresh
  // megabytes every step would be page-faulted and zeroed by the kernel.
  // (The workers below use the pointers, so they see this thread's buffers.)
  thread_local std::vector<float> xg_buf, h_buf, y_buf, choices_buf;
  float* xg = Grow(xg_buf, N * D);
  float* h = Grow(h_buf, N * 2 * I);
  float* y = Grow(y_buf, N * D);
  std::fill(y, y + N * D, 0.0f);

  // Each expert streams its weights once for all its rows (GemmNT), and every
  // row's result is independent of the other rows routed with it.
  ParallelForDynamic(static_cast<int64_t>(active.size()), [&](int64_t j) {
    const int64_t s = active[j];
    const int64_t r0 = offset[s];
    const int64_t n = offset[s + 1] - r0;
    float* xs = xg + r0 * D;
    float* hs = h + r0 * 2 * I;
    float* ys = y + r0 * D;
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(xs + r * D, xp + token_of_row[r0 + r] * ldx, sizeof(float) * D);
    }
    if (I == 0 || D == 0) return;  // f_e == 0; y stays zero
    GemmNT(n, 2 * I, D, xs, D, WeightsOf(w_gate_up.Select(s)), hs, 2 * I);
    for (int64_t r = 0; r < n; ++r) SiluMulInPlace(hs + r * 2 * I, I);
    GemmNT(n, D, I, hs, 2 * I, WeightsOf(w_down.Select(s)), ys, D);
  });

  // Weighted choices [T, K, D] (zero where the expert is not held here),
  // then each token sums them in k order: the same bits whether the sum runs
  // here or after an expert-parallel exchange of the choices.
  const bool per_choice = out.ndim() == 3;
  float* choices = per_choice ? out.data_as<float>() : Grow(choices_buf, pairs * D);
  ParallelFor(T, [&](int64_t t) {
    for (int64_t k = 0; k < K; ++k) {
      float* c = choices + (t * K + k) * D;
      const int64_t row = row_of[t * K + k];
      if (row < 0) {
        std::fill(c, c + D, 0.0f);
        continue;
      }
      const float wk = tw[t * K + k];
      const float* yr = y + row * D;
      for (int64_t d = 0; d < D; ++d) c[d] = wk * yr[d];
    }
  });
  if (!per_choice) MoeSumChoices(choices, T, K, D, out.data_as<float>());
}

}  // namespace mlag::host
