#include "kernels/host/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/common/random.h"
#include "kernels/common/sampling_math.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

// One row, as kernels/common/sampling_math.h defines sampling: greedy, or
// top-k / top-p over integer masses in rank order and an inverse-CDF draw.
// `keys` is scratch of V entries.
int32_t SampleRow(const float* l, int64_t V, float temperature, int32_t top_k, float top_p,
                  uint64_t seed, uint64_t step, std::vector<uint64_t>& keys) {
  // The top-ranked token: the greedy answer, and the row's largest logit.
  // The largest order key first (a loop that vectorises), then the first id
  // that has it: the largest rank key, whose low half ~id prefers low ids.
  // (V >= 1: the launcher checks it.)
  uint32_t best_order = 0;
#pragma omp simd reduction(max : best_order)
  for (int64_t v = 0; v < V; ++v) best_order = std::max(best_order, SampleOrderKey(l[v]));
  int64_t first = 0;
  while (SampleOrderKey(l[first]) != best_order) ++first;
  const uint64_t best = SampleRankKey(best_order, static_cast<uint32_t>(first));
  const int32_t best_id = static_cast<int32_t>(SampleIdFromRankKey(best));
  const float max_logit = SampleLogitFromKey(SampleOrderKeyFromRankKey(best));
  // temperature <= 0 or NaN: greedy. All -inf / NaN, or a +inf logit: the
  // distribution is a point mass (or undefined): greedy too.
  if (!(temperature > 0.0f) || !std::isfinite(max_logit)) return best_id;

  const int shift = SampleMassShift(V);
  const double inv_t = SampleInvTemperature(temperature);
  auto mass = [&](uint64_t key) {
    return SampleTokenMass(l[SampleIdFromRankKey(key)], max_logit, inv_t, shift);
  };

  // Rank keys, best first. They are unique, so the kept set and its order do
  // not depend on the sort used.
  for (int64_t v = 0; v < V; ++v) {
    keys[v] = SampleRankKey(SampleOrderKey(l[v]), static_cast<uint32_t>(v));
  }
  int64_t kept = (top_k <= 0 || top_k >= V) ? V : top_k;
  if (kept < V) {
    std::nth_element(keys.begin(), keys.begin() + kept, keys.end(), std::greater<uint64_t>());
  }
  std::sort(keys.begin(), keys.begin() + kept, std::greater<uint64_t>());

  // Integer masses: exact sums, in any order.
  uint64_t kept_mass = 0;
  for (int64_t i = 0; i < kept; ++i) kept_mass += mass(keys[i]);
  if (top_p < 1.0f) {
    const uint64_t target = SampleTopPTarget(kept_mass, top_p);
    uint64_t cum = 0;
    int64_t n = 0;
    while (n < kept) {
      cum += mass(keys[n]);
      ++n;
      if (cum >= target) break;
    }
    kept = n;
    kept_mass = cum;
  }

  const uint64_t target = SampleDrawTarget(UniformFromCounter(seed, step), kept_mass);
  uint64_t cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += mass(keys[i]);
    if (cum >= target) return static_cast<int32_t>(SampleIdFromRankKey(keys[i]));
  }
  return best_id;  // unreachable: target <= kept_mass
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
    std::vector<uint64_t> keys(temp[b] > 0.0f ? static_cast<size_t>(V) : 0);
    out[b] = SampleRow(l + b * ld, V, temp[b], tk[b], tp[b], static_cast<uint64_t>(seed[b]),
                       static_cast<uint64_t>(step[b]), keys);
  });
}

namespace {

// log sum exp(logits) in double, shifted by the largest logit.
double LogSumExp(const float* logits, int vocab) {
  double max_logit = -INFINITY;
  for (int v = 0; v < vocab; ++v) max_logit = std::max(max_logit, double{logits[v]});
  double sum = 0.0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double{logits[v]} - max_logit);
  return max_logit + std::log(sum);
}

}  // namespace

float TokenLogprob(const float* logits, int vocab, int32_t token) {
  return static_cast<float>(logits[token] - LogSumExp(logits, vocab));
}

int TopLogprobs(const float* logits, int vocab, int k, int32_t* tokens, float* logprobs) {
  k = std::max(0, std::min(k, vocab));
  if (k == 0) return 0;
  const double log_sum_exp = LogSumExp(logits, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int v = 0; v < vocab; ++v) ids[v] = v;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int i = 0; i < k; ++i) {
    tokens[i] = ids[i];
    logprobs[i] = static_cast<float>(logits[ids[i]] - log_sum_exp);
  }
  return k;
}

void TopLogprobsRows(const Tensor& logits, const Tensor& k, const Tensor& out_tokens,
                     const Tensor& out_logprobs) {
  const int64_t B = logits.size(0);
  const int V = static_cast<int>(logits.size(1));
  const int cols = static_cast<int>(out_tokens.size(1));
  const int32_t* ks = k.data_as<const int32_t>();
  ParallelForDynamic(B, [&](int64_t b) {
    int32_t* tokens = out_tokens.data_as<int32_t>() + b * out_tokens.stride(0);
    float* logprobs = out_logprobs.data_as<float>() + b * out_logprobs.stride(0);
    const int n = TopLogprobs(logits.data_as<const float>() + b * logits.stride(0), V,
                              std::min(ks[b], cols), tokens, logprobs);
    std::fill(tokens + n, tokens + cols, -1);
    std::fill(logprobs + n, logprobs + cols, -INFINITY);
  });
}

void AdjustLogits(const Tensor& logits, const Tensor& offsets, const Tensor& tokens,
                  const Tensor& deltas) {
  const int64_t B = logits.size(0), V = logits.size(1), A = tokens.size(0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t begin = 0, end = 0;
    AdjustmentRange(offsets.data_as<const int32_t>(), b, A, &begin, &end);
    float* row = logits.data_as<float>() + b * logits.stride(0);
    for (int64_t i = begin; i < end; ++i) {
      AdjustLogit(row, V, tokens.data_as<const int32_t>(), deltas.data_as<const float>(), i);
    }
  }
}

void FeedSampledTokens(const Tensor& src, const Tensor& stop_ids, const Tensor& query_start_loc,
                       const Tensor& prev_tokens, const Tensor& input_ids,
                       const Tensor& slot_mapping) {
  const int64_t B = src.size(0);
  for (int64_t b = 0; b < B; ++b) {
    FeedSampledToken(b, src.data_as<const int32_t>(), stop_ids.data_as<const int32_t>(),
                     static_cast<int>(stop_ids.size(1)), query_start_loc.data_as<const int32_t>(),
                     prev_tokens.data_as<const int32_t>(), prev_tokens.size(0),
                     input_ids.data_as<int32_t>(), slot_mapping.data_as<int64_t>(),
                     input_ids.size(0));
  }
}

}  // namespace mlag::host
