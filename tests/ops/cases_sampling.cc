// Cases of Sample, TopLogprobs, AdjustLogits and FeedSampledTokens (kernels/sampling.h):
// every token exact on every backend.
//
// The sampling rule is kernels/common/sampling_math.h's: tokens ranked by
// logit (higher first, the lower id among equal logits, NaN below -inf, -0
// equal to +0), integer masses, top-k as the first k by rank, top-p as the
// shortest prefix reaching SampleTopPTarget, and an inverse-CDF draw at
// SampleDrawTarget(UniformFromCounter(seed, step)); greedy (the top-ranked
// token) for temperature <= 0 or NaN, or when the largest logit is not finite.
// RefSampleRow below is that rule in plain scalar code: it takes the
// per-element primitives from sampling_math.h and random.h (a token's mass,
// the two targets, the uniform draw), but does the ranking (a stable sort by
// logit), the top-k, the top-p cut and the inverse-CDF selection itself. Every
// sampled row's token must equal its answer (ExpectInts).
//
// That the rule samples softmax(logits / T) restricted to top-k / top-p is
// checked statistically (chi-square of draws over steps 0..N-1 against
// probabilities from a double softmax; the backend draws the first 1000, the
// reference the rest), and the rule's corner cases (ties,
// -inf, NaN, signed zeros, +inf, degenerate temperatures and top-k / top-p
// values) by the adversarial rows of AdversarialCase.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/common/random.h"
#include "kernels/common/sampling_math.h"
#include "kernels/sampling.h"
#include "tests/ops/harness.h"

namespace mlag::ops_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

size_t Index(int64_t i) { return static_cast<size_t>(i); }

// ---- The reference -----------------------------------------------------------------------

// The token the rule draws from row `l` [V].
int32_t RefSampleRow(const float* l, int64_t V, float temperature, int32_t top_k, float top_p,
                     int64_t seed, int64_t step) {
  // Rank: higher logit first, NaN last; a stable sort keeps equal logits
  // (-0 and +0 included) in id order.
  std::vector<int32_t> order(Index(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool a_nan = std::isnan(l[a]), b_nan = std::isnan(l[b]);
    if (a_nan || b_nan) return !a_nan && b_nan;
    return l[a] > l[b];
  });
  const float max_logit = l[order[0]];
  if (!(temperature > 0.0f) || !std::isfinite(max_logit)) return order[0];

  const int shift = SampleMassShift(V);
  const double inv_temperature = SampleInvTemperature(temperature);
  auto mass = [&](int64_t rank) {
    return SampleTokenMass(l[order[Index(rank)]], max_logit, inv_temperature, shift);
  };
  int64_t kept = top_k <= 0 || top_k >= V ? V : top_k;
  uint64_t kept_mass = 0;
  for (int64_t i = 0; i < kept; ++i) kept_mass += mass(i);
  if (top_p < 1.0f) {  // top_p >= 1 (or NaN): all kept
    const uint64_t target = SampleTopPTarget(kept_mass, top_p);
    uint64_t cum = 0;
    int64_t n = 0;
    while (n < kept && cum < target) cum += mass(n++);
    kept = n;
    kept_mass = cum;
  }
  const uint64_t target = SampleDrawTarget(
      UniformFromCounter(static_cast<uint64_t>(seed), static_cast<uint64_t>(step)), kept_mass);
  uint64_t cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += mass(i);
    if (cum >= target) return order[Index(i)];
  }
  ADD_FAILURE() << "the draw's target exceeds the kept mass";
  return -1;
}

// The tokens a row may draw with their probabilities, in double: softmax of
// logits / T, the top_k most likely, then the shortest prefix (by descending
// probability) whose renormalised mass reaches top_p, renormalised.
std::map<int32_t, double> AllowedTokens(const std::vector<float>& logits, double temperature,
                                        int top_k, double top_p) {
  const int V = static_cast<int>(logits.size());
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(Index(V));
  double sum = 0.0;
  for (int v = 0; v < V; ++v) sum += p[Index(v)] = std::exp((logits[Index(v)] - m) / temperature);
  for (double& q : p) q /= sum;
  std::vector<int32_t> order(Index(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[Index(a)] > p[Index(b)]; });
  int kept = top_k <= 0 || top_k >= V ? V : top_k;
  double mass = 0.0;
  for (int i = 0; i < kept; ++i) mass += p[Index(order[Index(i)])];
  if (top_p < 1.0) {
    double cum = 0.0;
    int n = 0;
    while (n < kept) {
      cum += p[Index(order[Index(n++)])] / mass;
      if (cum >= top_p) break;
    }
    kept = n;
  }
  double total = 0.0;
  for (int i = 0; i < kept; ++i) total += p[Index(order[Index(i)])];
  std::map<int32_t, double> allowed;
  for (int i = 0; i < kept; ++i) allowed[order[Index(i)]] = p[Index(order[Index(i)])] / total;
  return allowed;
}

// ---- Running Sample ----------------------------------------------------------------------

// A batch of rows of one vocabulary size.
struct Rows {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<int64_t> seed, step;

  int64_t size() const { return static_cast<int64_t>(temperature.size()); }
  const float* row(int64_t r) const { return logits.data() + r * vocab; }
  void Add(const std::vector<float>& l, float t, int32_t k, float p, int64_t s, int64_t st) {
    vocab = static_cast<int64_t>(l.size());
    logits.insert(logits.end(), l.begin(), l.end());
    temperature.push_back(t);
    top_k.push_back(k);
    top_p.push_back(p);
    seed.push_back(s);
    step.push_back(st);
  }
};

// Samples `rows` in one batch (logits in padded rows, every argument inside
// a larger buffer) and checks every token against RefSampleRow. Returns the
// tokens.
std::vector<int32_t> RunSample(Context& ctx, const Rows& rows, bool graph = true) {
  const int64_t B = rows.size(), V = rows.vocab;
  Buf& logits = ctx.Make("logits", DType::kF32, {B, V}, 5, 3, 1);
  ctx.Randomize(logits);  // the padding too
  for (int64_t r = 0; r < B; ++r) {
    std::copy(rows.row(r), rows.row(r) + V, logits.HostData<float>() + r * logits.strides[0]);
  }
  ctx.Upload(logits);
  auto per_row = [&](const char* name, DType dtype, const auto& values) -> Buf& {
    Buf& b = ctx.Make(name, dtype, {B}, 0, 1, 2);
    using T = typename std::decay_t<decltype(values)>::value_type;
    std::copy(values.begin(), values.end(), b.HostData<T>());
    ctx.Upload(b);
    return b;
  };
  Buf& temperature = per_row("temperature", DType::kF32, rows.temperature);
  Buf& top_k = per_row("top_k", DType::kI32, rows.top_k);
  Buf& top_p = per_row("top_p", DType::kF32, rows.top_p);
  Buf& seeds = per_row("seeds", DType::kI64, rows.seed);
  Buf& steps = per_row("steps", DType::kI64, rows.step);
  Buf& tokens = ctx.Output("tokens", DType::kI32, {B}, 0, 2, 1);
  ctx.RunOp(
      {&tokens},
      [&](Stream& s) {
        return Sample(s, logits.t, temperature.t, top_k.t, top_p.t, seeds.t, steps.t, tokens.t);
      },
      graph);
  std::vector<int64_t> want;
  for (int64_t r = 0; r < B; ++r) {
    want.push_back(RefSampleRow(rows.row(r), V, rows.temperature[Index(r)], rows.top_k[Index(r)],
                                rows.top_p[Index(r)], rows.seed[Index(r)], rows.step[Index(r)]));
  }
  ctx.ExpectInts(tokens, want);
  std::vector<int32_t> got;
  for (double t : ctx.DeviceValues(tokens)) got.push_back(static_cast<int32_t>(t));
  return got;
}

std::vector<float> Uniform(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(Index(n));
  for (float& x : v) x = u(rng);
  return v;
}

// ---- Cases -------------------------------------------------------------------------------

// temperature <= 0: the largest logit, the lowest id among equal ones;
// top-k and top-p play no part.
void GreedyCase(Context& ctx) {
  Rows rows;
  rows.Add({0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f, 0.0f}, 0.0f, 0, 1.0f, 1234, 0);  // ties 1, 3, 5
  rows.Add({-3.0f, -2.0f, -2.5f, -2.0f, -9.0f, -4.0f, -2.0001f}, -1.0f, 0, 1.0f, 1235, 1);
  rows.Add({1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, 0.0f, 3, 1.0f, 1236, 2);
  rows.Add({0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 7.0f}, 0.0f, 0, 0.1f, 1237, 3);
  rows.Add({-0.0f, 0.0f, -1.0f, 0.0f, -0.0f, -2.0f, -0.5f}, 0.0f, 0, 1.0f, 1238, 4);  // -0 == +0
  EXPECT_EQ(RunSample(ctx, rows), (std::vector<int32_t>{1, 1, 0, 6, 0}));
}

// Draws from one row of random logits at steps 0..N-1. The backend samples
// the first `device_draws` of them (each the rule's token, inside the allowed
// set); the reference continues the sequence to `draws`, enough for the
// chi-square to see a wrong distribution (the backend is held to the rule
// token for token, the rule to softmax statistically).
void DistributionCase(Context& ctx, float temperature, int top_k, float top_p, int64_t device_draws,
                      int64_t draws) {
  const int64_t V = 37;
  std::mt19937 rng(ctx.NextSeed());
  const std::vector<float> logits = Uniform(rng, V, -2.0f, 2.0f);
  const int64_t seed = static_cast<int64_t>(rng());
  Rows rows;
  for (int64_t i = 0; i < device_draws; ++i) rows.Add(logits, temperature, top_k, top_p, seed, i);
  // Eager only: the adversarial cases replay graphs, and these are large.
  std::vector<int32_t> tokens = RunSample(ctx, rows, false);
  const std::map<int32_t, double> allowed = AllowedTokens(logits, temperature, top_k, top_p);
  for (int32_t token : tokens) {
    ASSERT_TRUE(allowed.count(token)) << "token " << token << " outside the allowed set";
  }
  for (int64_t i = device_draws; i < draws; ++i) {
    tokens.push_back(RefSampleRow(logits.data(), V, temperature, top_k, top_p, seed, i));
  }
  std::map<int32_t, int64_t> count;
  for (int32_t token : tokens) {
    ASSERT_TRUE(allowed.count(token)) << "reference token " << token << " outside the allowed set";
    ++count[token];
  }
  // Pearson chi-square over the allowed tokens. The bound is generous (the
  // statistic's mean is df, its sd sqrt(2 df)) yet far below what a wrong
  // distribution gives at this N (a temperature 20% off gives ~10 times it).
  double chi2 = 0.0;
  for (const auto& [token, prob] : allowed) {
    const double expected = prob * static_cast<double>(draws);
    const double d = static_cast<double>(count[token]) - expected;
    chi2 += d * d / expected;
  }
  const double df = std::max<double>(1.0, static_cast<double>(allowed.size()) - 1.0);
  EXPECT_LT(chi2, df + 8.0 * std::sqrt(2.0 * df) + 10.0) << allowed.size() << " tokens allowed";
  // Truncation must show: top-k / top-p leave tokens out.
  if (top_k > 0 || top_p < 1.0f) {
    EXPECT_LT(static_cast<int64_t>(allowed.size()), V);
  }
}

// top_k 1 and top_p 0 keep only the most likely token, whatever the draw.
void TopKOneAndTinyTopPCase(Context& ctx) {
  std::mt19937 rng(ctx.NextSeed());
  const std::vector<float> logits = Uniform(rng, 50, -3.0f, 3.0f);
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Rows rows;
  for (int64_t i = 0; i < 201; ++i) {
    rows.Add(logits, 1.5f, i % 3 == 0 ? 1 : 0, i % 3 == 1 ? 0.0f : (i % 3 == 2 ? 1e-6f : 1.0f), 99,
             i);
  }
  for (int32_t token : RunSample(ctx, rows)) EXPECT_EQ(token, argmax);
}

// A row's token depends on its own logits, parameters, seed and step only:
// 100 rows sampled as one batch and again each at position 3 of a group of
// 7 with unrelated neighbours (the same seed at other steps, other logits,
// greedy or not) give the same tokens.
void BatchPositionCase(Context& ctx) {
  std::mt19937 rng(ctx.NextSeed());
  const int64_t V = 64;
  const std::vector<float> logits = Uniform(rng, V, -1.0f, 1.0f);
  Rows alone, mixed;
  for (int64_t i = 0; i < 100; ++i) {
    const float temperature = 0.9f;
    const int32_t top_k = i % 3 == 0 ? 20 : 0;
    const float top_p = i % 2 == 0 ? 0.9f : 1.0f;
    const int64_t seed = 1000 + i % 7, step = i * 13;
    alone.Add(logits, temperature, top_k, top_p, seed, step);
    for (int64_t j = 0; j < 7; ++j) {
      if (j == 3) {
        mixed.Add(logits, temperature, top_k, top_p, seed, step);
      } else {
        mixed.Add(Uniform(rng, V, -1.0f, 1.0f), j % 2 == 0 ? 1.0f : 0.0f, 0, 1.0f, seed,
                  step + j + 1);
      }
    }
  }
  const std::vector<int32_t> a = RunSample(ctx, alone);
  const std::vector<int32_t> m = RunSample(ctx, mixed);
  int differing_neighbours = 0;
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(m[Index(7 * i + 3)], a[Index(i)]) << "row " << i;
    differing_neighbours += m[Index(7 * i + 2)] != a[Index(i)] ? 1 : 0;
  }
  EXPECT_GT(differing_neighbours, 0) << "the neighbours drew the same tokens: nothing shown";
}

// Equal logits (every draw informative): the same (seed, steps) repeat the
// same tokens, another seed draws others.
void SeedsCase(Context& ctx) {
  auto sequence = [&](int64_t seed) {
    Rows rows;
    for (int64_t i = 0; i < 64; ++i)
      rows.Add(std::vector<float>(32, 0.37f), 1.0f, 0, 1.0f, seed, i);
    return RunSample(ctx, rows);
  };
  const std::vector<int32_t> a = sequence(7), a2 = sequence(7), b = sequence(8);
  EXPECT_EQ(a, a2);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i] ? 1 : 0;
  EXPECT_LT(same, 16);  // about 2 expected for independent uniform draws
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 16u);
}

// Rows built to hit every corner of the rule: logits with heavy ties, few
// levels, -inf, NaN, zeros of both signs at the top, +inf, no finite logit,
// all NaN; temperatures 0, negative, NaN, tiny, large, +inf; top_k 0,
// negative, 1, V - 1, V, above V; top_p 1, above 1, 0, negative, tiny, the
// largest float below 1, NaN (not below 1: all kept).
void AdversarialCase(Context& ctx, int64_t B, int64_t V) {
  const float kTemperatures[] = {0.0f, -1.0f, kNaN, 1e-30f, 1e-4f, 20.0f, kInf};
  const int32_t kTopKs[] = {
      0, -3, 1, 50, static_cast<int32_t>(std::max<int64_t>(1, V - 1)), static_cast<int32_t>(V)};
  const float kTopPs[] = {1.0f, 1.5f, 0.0f, -0.5f, 1e-7f, 0.99999994f, kNaN};
  std::mt19937 rng(ctx.NextSeed());
  Rows rows;
  int64_t sampled = 0;
  for (int64_t r = 0; r < B; ++r) {
    const int shape = static_cast<int>(r % 9);
    std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(r % 4));
    std::vector<float> l(Index(V));
    for (float& x : l) {
      x = normal(rng);
      if (shape == 1) x = std::round(x * 2.0f) / 2.0f;    // heavy ties
      if (shape == 2) x = static_cast<float>(rng() % 3);  // three levels
      if (shape == 3 && rng() % 4 == 0) x = -kInf;        // masked
      if (shape == 4 && rng() % 97 == 0) x = kNaN;        // stray NaNs
      if (shape == 5) x = rng() % 3 == 0 ? (rng() % 2 ? 0.0f : -0.0f) : -std::abs(x);
      if (shape == 6 && rng() % 500 == 0) x = kInf;       // greedy
      if (shape == 7) x = rng() % 5 == 0 ? kNaN : -kInf;  // no finite logit
      if (shape == 8) x = kNaN;
    }
    // Every other row samples at an ordinary temperature; the others take an
    // edge value half the time.
    const uint32_t t_pick = r % 2 == 0 ? 99 : rng() % 14;
    const float temperature =
        t_pick < 7 ? kTemperatures[t_pick] : 0.3f + static_cast<float>(rng() % 100) / 50.0f;
    const uint32_t k_pick = rng() % 10;
    const int32_t top_k = k_pick < 6
                              ? kTopKs[k_pick]
                              : 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(V + 3));
    const uint32_t p_pick = rng() % 12;
    const float top_p = p_pick < 7 ? kTopPs[p_pick] : static_cast<float>(rng() % 1000) / 1000.0f;
    sampled += temperature > 0.0f && shape < 6 ? 1 : 0;
    rows.Add(l, temperature, top_k, top_p, static_cast<int64_t>(rng()),
             static_cast<int64_t>(rng() % 100000));
  }
  const std::vector<int32_t> got = RunSample(ctx, rows);
  EXPECT_GT(sampled, B / 3) << "too few rows are sampled rather than greedy";
  // Sampling, not only argmax, happened: some token is not the top-ranked one.
  if (V > 1) {
    int64_t not_top = 0;
    for (int64_t r = 0; r < B; ++r) {
      not_top += got[Index(r)] != RefSampleRow(rows.row(r), V, 0.0f, 0, 1.0f, 0, 0) ? 1 : 0;
    }
    EXPECT_GT(not_top, 0);
  }
}

// ---- Top log-probabilities ---------------------------------------------------------------

// The `k` most likely tokens of row `l` [V] (k already clamped to [0, V]):
// ids by logit descending, the lower id first among equal logits (-0 equal
// to +0); log-softmax in double, unrounded.
struct RefTop {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
  double log_sum_exp = 0.0;
};

RefTop RefTopLogprobs(const float* l, int64_t V, int64_t k) {
  std::vector<int32_t> order(Index(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < V; ++v) max_logit = std::max(max_logit, double{l[v]});
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double{l[v]} - max_logit);
  RefTop ref;
  ref.log_sum_exp = max_logit + std::log(sum);
  for (int64_t i = 0; i < k; ++i) {
    ref.tokens.push_back(order[Index(i)]);
    ref.logprobs.push_back(double{l[order[Index(i)]]} - ref.log_sum_exp);
  }
  return ref;
}

// Rows of `V` logits, row r of kind r % 9, each with its own k.
std::vector<float> TopLogprobsRow(std::mt19937& rng, int64_t V, int kind) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(Index(V));
  for (float& x : l) {
    x = normal(rng);
    if (kind == 1) x = std::round(x * 2.0f) / 2.0f;    // heavy ties
    if (kind == 2) x = static_cast<float>(rng() % 3);  // three levels: k-th inside a tie
    if (kind == 3 && rng() % 4 == 0) x = rng() % 2 ? -kInf : -1e30f;  // masked, very negative
    if (kind == 4) x = 0.25f;                                         // one level
    if (kind == 5) x = -kInf;                                         // no finite logit: NaN
    if (kind == 6) x = rng() % 3 == 0 ? (rng() % 2 ? 0.0f : -0.0f) : -std::abs(x);
    if (kind == 7) x *= 1000.0f;  // large magnitudes
  }
  if (kind == 8) l[Index(static_cast<int64_t>(rng() % static_cast<uint32_t>(V)))] = 60.0f;
  return l;  // kind 8: one token holds nearly all the mass, logprob ~ -1e-20
}

// TopLogprobs over `B` rows of V logits into K columns, row r asking for
// ks[r % size]: every token exactly the reference's, every logprob within a
// float ulp of the reference plus what a double log-sum-exp may be off by
// (its sum's rounding in any order of addition is below V * 2^-53 relative,
// an absolute error in its log; the log and the add round too).
void TopLogprobsCase(Context& ctx, int64_t B, int64_t V, int64_t K, std::vector<int32_t> ks) {
  std::mt19937 rng(ctx.NextSeed());
  Buf& logits = ctx.Make("logits", DType::kF32, {B, V}, 3, 2, 1);
  ctx.Randomize(logits);  // the padding too
  std::vector<std::vector<float>> rows;
  for (int64_t r = 0; r < B; ++r) {
    rows.push_back(TopLogprobsRow(rng, V, static_cast<int>(r % 9)));
    std::copy(rows.back().begin(), rows.back().end(),
              logits.HostData<float>() + r * logits.strides[0]);
  }
  ctx.Upload(logits);
  Buf& k = ctx.Make("k", DType::kI32, {B}, 0, 1, 2);
  for (int64_t r = 0; r < B; ++r) k.HostData<int32_t>()[r] = ks[Index(r) % ks.size()];
  ctx.Upload(k);
  Buf& tokens = ctx.Output("tokens", DType::kI32, {B, K}, 2, 1, 3);
  Buf& logprobs = ctx.Output("logprobs", DType::kF32, {B, K}, 1, 3, 2);
  ctx.RunOp({&tokens, &logprobs},
            [&](Stream& s) { return TopLogprobs(s, logits.t, k.t, tokens.t, logprobs.t); });

  std::vector<int64_t> want_tokens;
  std::vector<double> want_logprobs, bound;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t n = std::clamp<int64_t>(ks[Index(r) % ks.size()], 0, std::min(K, V));
    const RefTop ref = RefTopLogprobs(rows[Index(r)].data(), V, n);
    const double lse_error =
        static_cast<double>(V + 8) * std::ldexp(1.0 + std::abs(ref.log_sum_exp), -53);
    for (int64_t i = 0; i < K; ++i) {
      want_tokens.push_back(i < n ? ref.tokens[Index(i)] : -1);
      const double want = i < n ? ref.logprobs[Index(i)] : -kInf;
      want_logprobs.push_back(want);
      bound.push_back(std::ldexp(std::abs(want), -23) + lse_error);
    }
  }
  ctx.ExpectInts(tokens, want_tokens);
  // Unwritten elements, NaN and infinities where the reference has them, the
  // bytes around the view; the tight bound per element below.
  ctx.ExpectClose(logprobs, want_logprobs, Tolerance::F32(1e-6));
  const std::vector<double> got = ctx.DeviceValues(logprobs);
  int64_t over = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want_logprobs[i])) continue;  // ExpectClose compared them exactly
    if (!(std::abs(got[i] - want_logprobs[i]) <= bound[i]) && over++ == 0) {
      first = absl::StrCat("element ", i, ": ", got[i], ", want ", want_logprobs[i]);
    }
  }
  EXPECT_EQ(over, 0) << "logprobs beyond a float ulp plus the log-sum-exp's rounding; " << first;
}

// FeedSampledTokens on B sequences of 1-3 token rows each: every third
// takes a token from prev_tokens (P of them), some of those with the token
// among their stop ids (slot -1), some with it only beyond the first -1
// entries or as a negative id; sources outside prev_tokens are left alone.
// The reference is the contract in kernels/sampling.h, in plain code.
void FeedCase(Context& ctx, int64_t B, int64_t P) {
  std::mt19937 rng(ctx.NextSeed());
  const int S = kMaxFeedStopIds;
  std::vector<int32_t> qsl(Index(B + 1), 0);
  for (int64_t b = 0; b < B; ++b)
    qsl[Index(b + 1)] = qsl[Index(b)] + 1 + static_cast<int>(rng() % 3);
  const int64_t T = qsl[Index(B)];
  std::vector<int32_t> prev(Index(P)), src(Index(B), -1), stops(Index(B * S), -1);
  for (int32_t& t : prev) t = static_cast<int32_t>(rng() % 50);  // repeats: stop hits
  for (int64_t b = 0; b < B; ++b) {
    if (b % 3 != 0) continue;
    // In range mostly; one in 7 past the end, one in 11 negative.
    src[Index(b)] = b % 7 == 6    ? static_cast<int32_t>(P + b)
                    : b % 11 == 9 ? -2
                                  : static_cast<int32_t>(rng() % P);
    const int n = static_cast<int>(rng() % (S + 1));
    for (int i = 0; i < n; ++i) stops[Index(b * S + i)] = static_cast<int32_t>(rng() % 50);
    if (b % 2 == 0 && n > 0 && src[Index(b)] >= 0 && src[Index(b)] < P) {
      stops[Index(b * S + rng() % n)] = prev[Index(src[Index(b)])];  // a stop
    }
  }
  auto upload = [&](const std::string& name, const std::vector<int32_t>& v,
                    std::vector<int64_t> shape) -> Buf& {
    Buf& buf = ctx.Make(name, DType::kI32, std::move(shape), 0, 1, 2);
    for (size_t i = 0; i < v.size(); ++i) buf.HostData<int32_t>()[i] = v[i];
    ctx.Upload(buf);
    return buf;
  };
  Buf& src_buf = upload("src", src, {B});
  Buf& stop_buf = upload("stop_ids", stops, {B, S});
  Buf& qsl_buf = upload("query_start_loc", qsl, {B + 1});
  Buf& prev_buf = upload("prev_tokens", prev, {P});
  Buf& ids = ctx.Make("input_ids", DType::kI32, {T}, 0, 2, 1);
  Buf& slots = ctx.Make("slot_mapping", DType::kI64, {T}, 0, 1, 2);
  std::vector<int64_t> want_ids(Index(T)), want_slots(Index(T));
  for (int64_t t = 0; t < T; ++t) {
    want_ids[Index(t)] = 1000 + t;
    want_slots[Index(t)] = 5000 + 3 * t;
    ids.HostData<int32_t>()[t] = static_cast<int32_t>(want_ids[Index(t)]);
    slots.HostData<int64_t>()[t] = want_slots[Index(t)];
  }
  ctx.Upload(ids);
  ctx.Upload(slots);
  int fed = 0, stopped = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t from = src[Index(b)];
    if (from < 0 || from >= P) continue;
    const int64_t t = qsl[Index(b)];
    want_ids[Index(t)] = prev[Index(from)];
    ++fed;
    for (int i = 0; i < S; ++i) {
      if (stops[Index(b * S + i)] >= 0 && stops[Index(b * S + i)] == prev[Index(from)]) {
        want_slots[Index(t)] = -1;
      }
    }
    stopped += want_slots[Index(t)] == -1;
  }
  ASSERT_GT(fed, 0);
  if (B >= 30) {
    ASSERT_GT(stopped, 0);
  }
  ctx.RunOp({&ids, &slots},
            [&](Stream& s) {
              return FeedSampledTokens(s, src_buf.t, stop_buf.t, qsl_buf.t, prev_buf.t, ids.t,
                                       slots.t);
            },
            true, {&ids, &slots});
  ctx.ExpectInts(ids, want_ids);
  ctx.ExpectInts(slots, want_slots);
}

// AdjustLogits on B rows of V logits (rows strided by `pad` extra
// elements): each row gets 0 to `per_row` distinct tokens, some outside
// [0, V) (skipped), and the last offset points past the entries (clamped).
// The reference is the contract in plain code: one f32 add per entry.
void AdjustCase(Context& ctx, int64_t B, int64_t V, int per_row, int64_t pad) {
  std::mt19937 rng(ctx.NextSeed());
  Buf& logits = ctx.Make("logits", DType::kF32, {B, V}, pad, 3, 2);
  ctx.Randomize(logits, -20.0, 20.0);
  std::vector<int32_t> offsets(Index(B + 1), 0), tokens;
  std::vector<float> deltas;
  std::vector<double> want = logits.Values();
  for (int64_t b = 0; b < B; ++b) {
    const int n = static_cast<int>(rng() % (per_row + 1));
    std::set<int32_t> picked;
    while (static_cast<int>(picked.size()) < std::min<int64_t>(n, V + 2)) {
      const int32_t t = static_cast<int32_t>(rng() % (V + 2)) - (rng() % 5 == 0 ? 1 : 0);
      picked.insert(t);  // -1 and V, V + 1 are outside
    }
    for (int32_t t : picked) {
      const float d = std::uniform_real_distribution<float>(-100.0f, 100.0f)(rng);
      tokens.push_back(t);
      deltas.push_back(d);
      if (t >= 0 && t < V) {
        const int64_t at = b * V + t;
        want[Index(at)] = static_cast<double>(static_cast<float>(want[Index(at)]) + d);
      }
    }
    offsets[Index(b + 1)] = static_cast<int32_t>(tokens.size());
  }
  const int64_t A = static_cast<int64_t>(tokens.size());
  offsets[Index(B)] += 5;  // past the entries: clamped to A
  Buf& off_buf = ctx.Make("offsets", DType::kI32, {B + 1}, 0, 1, 2);
  for (int64_t i = 0; i <= B; ++i) off_buf.HostData<int32_t>()[i] = offsets[Index(i)];
  ctx.Upload(off_buf);
  Buf& tok_buf = ctx.Make("tokens", DType::kI32, {std::max<int64_t>(A, 1)}, 0, 2, 1);
  Buf& delta_buf = ctx.Make("deltas", DType::kF32, {std::max<int64_t>(A, 1)}, 0, 1, 3);
  for (int64_t i = 0; i < std::max<int64_t>(A, 1); ++i) {
    tok_buf.HostData<int32_t>()[i] = i < A ? tokens[Index(i)] : 0;
    delta_buf.HostData<float>()[i] = i < A ? deltas[Index(i)] : 0.0f;
  }
  ctx.Upload(tok_buf);
  ctx.Upload(delta_buf);
  ctx.RunOp({&logits},
            [&](Stream& s) { return AdjustLogits(s, logits.t, off_buf.t, tok_buf.t, delta_buf.t); },
            true, {&logits});
  ctx.ExpectClose(logits, want, Tolerance::Exact());
}

}  // namespace

void AddSamplingCases(CaseList& cases) {
  for (auto [B, V, per_row, pad] : {std::tuple<int64_t, int64_t, int, int64_t>{1, 1, 3, 0},
                                    {5, 7, 9, 1},
                                    {33, 1000, 40, 0},
                                    {64, 129280, 300, 5},
                                    {3, 32003, 4096, 0}}) {
    cases.Add("adjust_logits", absl::StrCat(B, " rows V ", V, " up to ", per_row, " entries"),
              [B = B, V = V, per_row = per_row, pad = pad](Context& ctx) {
                AdjustCase(ctx, B, V, per_row, pad);
              });
  }
  for (auto [B, P] : {std::pair<int64_t, int64_t>{1, 1}, {7, 3}, {40, 40}, {300, 97}}) {
    cases.Add("feed_sampled", absl::StrCat(B, " sequences from ", P, " tokens"),
              [B = B, P = P](Context& ctx) { FeedCase(ctx, B, P); });
  }
  cases.Add("sample", "greedy is argmax lowest id on ties", GreedyCase);
  struct Dist {
    const char* name;
    float temperature;
    int top_k;
    float top_p;
  };
  for (const Dist& d :
       {Dist{"temperature 0.8", 0.8f, 0, 1.0f}, Dist{"top_k 5", 1.0f, 5, 1.0f},
        Dist{"top_p 0.6", 0.7f, 0, 0.6f}, Dist{"top_k 12 then top_p 0.75", 1.3f, 12, 0.75f}}) {
    cases.Add("sample", absl::StrCat("distribution ", d.name), [d](Context& ctx) {
      DistributionCase(ctx, d.temperature, d.top_k, d.top_p, 1000, 40000);
    });
  }
  cases.Add("sample", "top_k 1 and tiny top_p are argmax", TopKOneAndTinyTopPCase);
  cases.Add("sample", "independent of batch position", BatchPositionCase);
  cases.Add("sample", "same seed repeats and seeds differ", SeedsCase);
  for (auto [B, V] : {std::pair<int64_t, int64_t>{18, 1},
                      {64, 7},
                      {96, 300},
                      {45, 2000},
                      {9, 32000},
                      {9, 129280}}) {
    cases.Add("sample", absl::StrCat("adversarial ", B, " rows V ", V),
              [B = B, V = V](Context& ctx) { AdversarialCase(ctx, B, V); });
  }
  // k per row cycles through 1, 5, the most columns, V, none, a negative k
  // and a few others; 9 kinds of rows cycle beside them.
  const int32_t kMax = kMaxTopLogprobs;
  for (auto [B, V] : {std::pair<int64_t, int64_t>{20, 1},
                      {40, 7},
                      {40, 64},
                      {37, 1000},
                      {19, 32003},
                      {4, 129280}}) {
    const int32_t v = static_cast<int32_t>(V);
    cases.Add("top_logprobs", absl::StrCat(B, " rows V ", V), [B = B, V = V, v](Context& ctx) {
      TopLogprobsCase(ctx, B, V, kMax, {1, 5, kMax, v, 0, -3, 2, kMax - 1, kMax + 9, 17, v - 1});
    });
  }
  cases.Add("top_logprobs", "narrower output clamps k", [](Context& ctx) {
    TopLogprobsCase(ctx, 27, 300, 5, {1, 4, 5, 6, kMax, 300});
  });
  cases.Add("top_logprobs", "no columns", [](Context& ctx) {
    TopLogprobsCase(ctx, 3, 10, 0, {1, 5});
  });
}

}  // namespace mlag::ops_test
