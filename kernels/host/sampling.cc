#include "kernels/host/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/common/random.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

// Greedy: the largest logit, lowest id on ties. NaN logits never win.
int32_t Argmax(const float* l, int64_t V) {
  int64_t best = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (std::isnan(l[v])) continue;
    if (best < 0 || l[v] > l[best]) best = v;
  }
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

// One row of temperature / top-k / top-p sampling. `p` and `order` are
// scratch of V entries.
int32_t SampleRow(const float* l, int64_t V, float temperature, int32_t top_k, float top_p,
                  uint64_t seed, uint64_t step, std::vector<double>& p,
                  std::vector<int32_t>& order) {
  // p = softmax(l / temperature) in double; NaN logits get probability 0.
  float lmax = -INFINITY;
  for (int64_t v = 0; v < V; ++v) {
    if (l[v] > lmax) lmax = l[v];
  }
  // All -inf / NaN, or a +inf logit: the distribution is a point mass (or
  // undefined); fall back to greedy.
  if (!std::isfinite(lmax)) return Argmax(l, V);
  const double inv_t = 1.0 / static_cast<double>(temperature);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    p[v] = std::isnan(l[v]) ? 0.0
                            : std::exp((static_cast<double>(l[v]) - static_cast<double>(lmax)) *
                                       inv_t);
    sum += p[v];
  }
  for (int64_t v = 0; v < V; ++v) p[v] /= sum;

  // Candidates by descending probability, lower id first among equals: a
  // strict total order, so the kept set does not depend on the sort used.
  std::iota(order.begin(), order.end(), 0);
  auto before = [&p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  int64_t kept = (top_k <= 0 || top_k >= V) ? V : top_k;
  if (kept < V) {
    std::nth_element(order.begin(), order.begin() + kept, order.end(), before);
  }
  std::sort(order.begin(), order.begin() + kept, before);

  // Top-p over the top-k survivors, measured on their renormalised
  // probabilities (as HF's and vLLM's top-k-then-top-p): the smallest prefix
  // whose mass reaches top_p; the first token always stays.
  double kept_mass = 0.0;
  for (int64_t i = 0; i < kept; ++i) kept_mass += p[order[i]];
  if (top_p < 1.0f) {
    const double target = static_cast<double>(top_p) * kept_mass;
    double cum = 0.0;
    int64_t n = 0;
    while (n < kept) {
      cum += p[order[n]];
      ++n;
      if (cum >= target) break;
    }
    kept = n;
    kept_mass = cum;
  }

  // Inverse-CDF draw over the kept tokens in their ranked order.
  const double u = static_cast<double>(UniformFromCounter(seed, step)) * kept_mass;
  double cum = 0.0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += p[order[i]];
    if (u < cum) return order[i];
  }
  // Rounding left u at the very top: the last kept token with mass.
  for (int64_t i = kept - 1; i > 0; --i) {
    if (p[order[i]] > 0.0) return order[i];
  }
  return order[0];
}

}  // namespace

void Sample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
            const Tensor& top_p, const Tensor& seeds, const Tensor& steps,
            const Tensor& out_tokens) {
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  const int64_t ld = logits.stride(0);
  const float* l = logits.data_as<const float>();
  const float* temp = temperature.data_as<const float>();
  const int32_t* tk = top_k.data_as<const int32_t>();
  const float* tp = top_p.data_as<const float>();
  const int64_t* seed = seeds.data_as<const int64_t>();
  const int64_t* step = steps.data_as<const int64_t>();
  int32_t* out = out_tokens.data_as<int32_t>();
  ParallelForDynamic(B, [&](int64_t b) {
    const float* row = l + b * ld;
    if (!(temp[b] > 0.0f)) {
      out[b] = Argmax(row, V);
      return;
    }
    std::vector<double> p(static_cast<size_t>(V));
    std::vector<int32_t> order(static_cast<size_t>(V));
    out[b] = SampleRow(row, V, temp[b], tk[b], tp[b], static_cast<uint64_t>(seed[b]),
                       static_cast<uint64_t>(step[b]), p, order);
  });
}

}  // namespace mlag::host
