// Host tests of the __host__ __device__ math in kernels/common/ that both
// backends run: random.h, rope_math.h, softmax_math.h, routing_math.h and
// sampling_math.h (the bf16/f16 conversions of runtime/core/scalar_types.h
// are covered by tests/core/dtype_test.cc). Each function is checked
// against a double-precision or sort-based reference written here, on fresh
// random inputs.
//
// The sampling section also emulates, step for step with the shared helpers,
// the CUDA sampler's radix descent (kernels/cuda/sampling.cu) and requires
// the very token host::Sample picks on thousands of rows: the two backends
// share every arithmetic step, so this is what makes their picks identical.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/random.h"
#include "kernels/common/rope_math.h"
#include "kernels/common/routing_math.h"
#include "kernels/common/sampling_math.h"
#include "kernels/common/softmax_math.h"
#include "kernels/sampling.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Distance in units in the last place between two finite doubles of the same
// sign (0 when equal).
int64_t UlpDistance(double a, double b) {
  int64_t ia, ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  if (ia < 0) ia = std::numeric_limits<int64_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int64_t>::min() - ib;
  return ia > ib ? ia - ib : ib - ia;
}

// ==== random.h ===================================================================

TEST(RandomTest, DeterministicAndKeyedBySeedAndCounter) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xffffffffffffffffull}) {
    for (uint64_t counter : {0ull, 1ull, 7ull, 1000000ull}) {
      EXPECT_EQ(UniformFromCounter(seed, counter), UniformFromCounter(seed, counter));
    }
  }
  // Neighbouring seeds and counters give unrelated values.
  int same_seed = 0, same_counter = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += UniformFromCounter(i, 5) == UniformFromCounter(i + 1, 5) ? 1 : 0;
    same_counter += UniformFromCounter(9, i) == UniformFromCounter(9, i + 1) ? 1 : 0;
  }
  EXPECT_LE(same_seed, 2);
  EXPECT_LE(same_counter, 2);
  // Mix64 is a bijection: no collisions among many inputs.
  std::set<uint64_t> seen;
  for (uint64_t z = 0; z < 100000; ++z) seen.insert(Mix64(z * 0x9e3779b97f4a7c15ull));
  EXPECT_EQ(seen.size(), 100000u);
  EXPECT_NE(Mix64(0), Mix64(1));
}

TEST(RandomTest, RangeResolutionAndUniformity) {
  constexpr int kBuckets = 16;
  constexpr int kDraws = 320000;
  std::vector<int> count(kBuckets, 0);
  double sum = 0.0, lo = 1.0, hi = 0.0;
  for (int i = 0; i < kDraws; ++i) {
    const float u = UniformFromCounter(1234 + i % 7, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    // 24 random bits: u * 2^24 is an integer.
    const float scaled = u * 16777216.0f;
    ASSERT_EQ(scaled, std::floor(scaled));
    sum += u;
    lo = std::min<double>(lo, u);
    hi = std::max<double>(hi, u);
    ++count[static_cast<int>(u * kBuckets)];
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  EXPECT_LT(lo, 1e-4);
  EXPECT_GT(hi, 1.0 - 1e-4);
  double chi2 = 0.0;
  const double expected = static_cast<double>(kDraws) / kBuckets;
  for (int c : count) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 60.0);  // df 15: mean 15, sd 5.5
}

// ==== rope_math.h ==================================================================

TEST(RopeMathTest, RotatePairMatchesDoubleRotation) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> x(-4.0f, 4.0f);
  std::uniform_real_distribution<double> angle(-100.0, 100.0);
  double worst = 0.0;
  for (int i = 0; i < 20000; ++i) {
    const float x0 = x(rng), x1 = x(rng);
    const double a = angle(rng);
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float y0, y1;
    RopeRotatePair(x0, x1, c, s, &y0, &y1);
    // Reference in double from the same (f32) c and s.
    const double r0 = static_cast<double>(x0) * c - static_cast<double>(x1) * s;
    const double r1 = static_cast<double>(x0) * s + static_cast<double>(x1) * c;
    const double scale = std::abs(x0) + std::abs(x1);
    worst = std::max({worst, std::abs(y0 - r0) / scale, std::abs(y1 - r1) / scale});
    // A rotation keeps the length (to f32 rounding of c and s).
    const double n_in = std::hypot(static_cast<double>(x0), static_cast<double>(x1));
    const double n_out = std::hypot(static_cast<double>(y0), static_cast<double>(y1));
    ASSERT_NEAR(n_out, n_in * std::hypot(static_cast<double>(c), static_cast<double>(s)),
                1e-6 * scale);
  }
  // Two products rounded to f32 and one rounded sum: about 2^-23 of the scale.
  EXPECT_LT(worst, 2.5e-7);
  // Exact special angles.
  float y0, y1;
  RopeRotatePair(1.5f, -2.25f, 1.0f, 0.0f, &y0, &y1);
  EXPECT_EQ(y0, 1.5f);
  EXPECT_EQ(y1, -2.25f);
  RopeRotatePair(1.5f, -2.25f, 0.0f, 1.0f, &y0, &y1);
  EXPECT_EQ(y0, 2.25f);
  EXPECT_EQ(y1, 1.5f);
}

TEST(RopeMathTest, RotateInterleavedRotatesPairsInPlaceAndStopsAtTheEnd) {
  constexpr int kHalf = 5;
  std::vector<float> x = testing::RandomFloats(2 * kHalf + 3, 12, -2.0f, 2.0f);
  const std::vector<float> original = x;
  std::vector<float> cos_row(kHalf), sin_row(kHalf);
  for (int i = 0; i < kHalf; ++i) {
    cos_row[i] = static_cast<float>(std::cos(0.3 + i));
    sin_row[i] = static_cast<float>(std::sin(0.3 + i));
  }
  RopeRotateInterleaved(x.data(), cos_row.data(), sin_row.data(), kHalf);
  for (int i = 0; i < kHalf; ++i) {
    // Pair i is (x[2i], x[2i+1]) — not (x[i], x[i + half]).
    float y0, y1;
    RopeRotatePair(original[2 * i], original[2 * i + 1], cos_row[i], sin_row[i], &y0, &y1);
    EXPECT_EQ(x[2 * i], y0) << i;
    EXPECT_EQ(x[2 * i + 1], y1) << i;
  }
  for (size_t j = 2 * kHalf; j < x.size(); ++j) EXPECT_EQ(x[j], original[j]) << j;
}

TEST(RopeMathTest, BaseInverseFrequencies) {
  for (int dim : {16, 64, 128}) {
    for (float base : {10000.0f, 500000.0f}) {
      EXPECT_EQ(RopeBaseInvFreq(0, dim, base), 1.0f);
      for (int i = 0; i < dim / 2; ++i) {
        const double want = std::pow(static_cast<double>(base), -2.0 * i / dim);
        EXPECT_NEAR(RopeBaseInvFreq(i, dim, base), want, 2e-6 * want) << dim << " " << i;
      }
    }
  }
}

TEST(RopeMathTest, YarnPiecesMatchTheSpec) {
  // V2/V3: dim 64, base 10000, original 4096 positions, beta 32 / 1: the
  // ramp runs from pair 10 to pair 23 (yarn_find_correction_range in the
  // Hugging Face modeling_deepseek.py gives the same).
  const double lo = YarnCorrectionDim(32.0, 64, 10000.0, 4096.0);
  const double hi = YarnCorrectionDim(1.0, 64, 10000.0, 4096.0);
  EXPECT_EQ(std::floor(lo), 10.0);
  EXPECT_EQ(std::ceil(hi), 23.0);
  const double kPi = 3.14159265358979323846;
  EXPECT_NEAR(lo, 64 * std::log(4096.0 / (32.0 * 2 * kPi)) / (2 * std::log(10000.0)), 1e-12);

  // The ramp: extrapolation below lo, interpolation (inv0 / factor) above hi,
  // linear in between.
  const float inv0 = 0.037f, factor = 40.0f;
  EXPECT_EQ(YarnInvFreq(inv0, 3, factor, 10.0f, 23.0f), inv0);
  EXPECT_EQ(YarnInvFreq(inv0, 10, factor, 10.0f, 23.0f), inv0);
  EXPECT_FLOAT_EQ(YarnInvFreq(inv0, 23, factor, 10.0f, 23.0f), inv0 / factor);
  EXPECT_FLOAT_EQ(YarnInvFreq(inv0, 30, factor, 10.0f, 23.0f), inv0 / factor);
  for (int i = 11; i < 23; ++i) {
    const double ramp = (i - 10.0) / 13.0;
    const double want = inv0 * (1 - ramp) + inv0 / factor * ramp;
    EXPECT_NEAR(YarnInvFreq(inv0, i, factor, 10.0f, 23.0f), want, 1e-6 * inv0) << i;
  }

  // g(F, m) and the V3 softmax scale 192^-1/2 * g(40, 1)^2 = 0.135234.
  EXPECT_EQ(YarnGetMscale(1.0, 0.707), 1.0);
  EXPECT_EQ(YarnGetMscale(0.5, 1.0), 1.0);
  EXPECT_NEAR(YarnGetMscale(40.0, 1.0), 0.1 * std::log(40.0) + 1.0, 1e-15);
  const double g = YarnGetMscale(40.0, 1.0);
  EXPECT_NEAR(g * g / std::sqrt(192.0), 0.135234, 5e-7);
}

// ==== softmax_math.h ===============================================================

// One-pass double reference: out = sum softmax(scores)_j v_j and lse; masked
// scores are -inf. Returns false when everything is masked.
bool DoubleSoftmax(const std::vector<float>& scores, const std::vector<float>& values, double* out,
                   double* lse) {
  double m = -std::numeric_limits<double>::infinity();
  for (float s : scores) m = std::max<double>(m, s);
  if (m == -std::numeric_limits<double>::infinity()) return false;
  double sum = 0.0, acc = 0.0;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double p = std::exp(static_cast<double>(scores[j]) - m);
    sum += p;
    acc += p * values[j];
  }
  *out = acc / sum;
  *lse = m + std::log(sum);
  return true;
}

// Online softmax over scores[begin, end) in chunks of `chunk`: the normalised
// output, the state's lse and sum.
struct OnlineResult {
  float out;
  float lse;
  float sum;
};
OnlineResult RunOnline(const std::vector<float>& scores, const std::vector<float>& values,
                       size_t begin, size_t end, size_t chunk) {
  OnlineSoftmaxState st = OnlineSoftmaxInit();
  float acc = 0.0f;
  for (size_t c = begin; c < end; c += chunk) {
    const size_t c_end = std::min(end, c + chunk);
    float tile_max = -kInf;
    for (size_t j = c; j < c_end; ++j) tile_max = std::max(tile_max, scores[j]);
    acc *= OnlineSoftmaxRescale(&st, tile_max);
    for (size_t j = c; j < c_end; ++j) {
      const float p = ExpShifted(scores[j], st.max);
      st.sum += p;
      acc += p * values[j];
    }
  }
  return {acc * OnlineSoftmaxInvSum(st), OnlineSoftmaxLse(st), st.sum};
}

TEST(SoftmaxMathTest, OnlineOverChunksMatchesOnePassDouble) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<float> scores = testing::RandomFloats(n, 100 + trial, -30.0f, 30.0f);
    const std::vector<float> values = testing::RandomFloats(n, 900 + trial, -1.0f, 1.0f);
    for (int j = 0; j < n; ++j) {
      if (rng() % 5 == 0) scores[j] = -kInf;  // masked
    }
    scores[rng() % n] = 5.0f;  // at least one unmasked score
    double want, want_lse;
    ASSERT_TRUE(DoubleSoftmax(scores, values, &want, &want_lse));
    const size_t chunk = 1 + rng() % 64;
    const OnlineResult got = RunOnline(scores, values, 0, n, chunk);
    EXPECT_NEAR(got.out, want, 1e-5) << "n " << n << " chunk " << chunk;
    EXPECT_NEAR(got.lse, want_lse, 1e-5 * std::max(1.0, std::abs(want_lse)));
  }
}

TEST(SoftmaxMathTest, EmptyAndMaskedSoftmaxGiveZeroOutputAndMinusInfLse) {
  const OnlineSoftmaxState init = OnlineSoftmaxInit();
  EXPECT_EQ(init.max, -kInf);
  EXPECT_EQ(init.sum, 0.0f);
  EXPECT_EQ(OnlineSoftmaxInvSum(init), 0.0f);
  EXPECT_EQ(OnlineSoftmaxLse(init), -kInf);
  const std::vector<float> scores(7, -kInf), values(7, 3.0f);
  const OnlineResult got = RunOnline(scores, values, 0, scores.size(), 3);
  EXPECT_EQ(got.out, 0.0f);
  EXPECT_EQ(got.lse, -kInf);
  EXPECT_EQ(got.sum, 0.0f);
  EXPECT_EQ(ExpShifted(-kInf, -kInf), 0.0f);
  EXPECT_EQ(ExpShifted(-kInf, 3.0f), 0.0f);
  EXPECT_EQ(ExpShifted(2.0f, 2.0f), 1.0f);
  // The first tile rescales "nothing seen yet" by 0, later equal maxima by 1.
  OnlineSoftmaxState st = OnlineSoftmaxInit();
  EXPECT_EQ(OnlineSoftmaxRescale(&st, 1.5f), 0.0f);
  EXPECT_EQ(st.max, 1.5f);
  st.sum = 2.0f;
  EXPECT_EQ(OnlineSoftmaxRescale(&st, 1.0f), 1.0f);
  EXPECT_EQ(st.sum, 2.0f);
  EXPECT_NEAR(OnlineSoftmaxRescale(&st, 3.5f), std::exp(-2.0), 1e-7);
  EXPECT_NEAR(st.sum, 2.0 * std::exp(-2.0), 1e-7);
}

TEST(SoftmaxMathTest, LseAddIsStableWithMinusInfAsIdentity) {
  EXPECT_EQ(LseAdd(-kInf, -kInf), -kInf);
  EXPECT_EQ(LseAdd(-kInf, 2.5f), 2.5f);
  EXPECT_EQ(LseAdd(2.5f, -kInf), 2.5f);
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> u(-80.0f, 80.0f);
  for (int i = 0; i < 10000; ++i) {
    const float a = u(rng), b = u(rng);
    const double m = std::max<double>(a, b);
    const double want = m + std::log(std::exp(a - m) + std::exp(b - m));
    EXPECT_NEAR(LseAdd(a, b), want, 1e-5 * std::max(1.0, std::abs(want)));
    EXPECT_EQ(LseAdd(a, b), LseAdd(b, a));
  }
  // Large magnitudes do not overflow.
  EXPECT_NEAR(LseAdd(1000.0f, 1000.0f), 1000.0f + std::log(2.0f), 1e-3);
}

TEST(SoftmaxMathTest, MergingTwoToFivePartialsMatchesOneSoftmax) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 400; ++trial) {
    const int parts = 2 + trial % 4;
    const int n = parts + static_cast<int>(rng() % 200);
    std::vector<float> scores = testing::RandomFloats(n, 300 + trial, -20.0f, 20.0f);
    const std::vector<float> values = testing::RandomFloats(n, 700 + trial, -1.0f, 1.0f);
    // Cut points; some parts empty, and in some trials a part fully masked.
    std::vector<size_t> cuts = {0, static_cast<size_t>(n)};
    for (int p = 1; p < parts; ++p) cuts.push_back(rng() % (n + 1));
    std::sort(cuts.begin(), cuts.end());
    if (trial % 3 == 0) {
      const int masked = static_cast<int>(rng() % parts);
      for (size_t j = cuts[masked]; j < cuts[masked + 1]; ++j) scores[j] = -kInf;
    }
    double want, want_lse;
    if (!DoubleSoftmax(scores, values, &want, &want_lse)) continue;
    std::vector<OnlineResult> part(parts);
    float total = -kInf;
    for (int p = 0; p < parts; ++p) {
      part[p] = RunOnline(scores, values, cuts[p], cuts[p + 1], 16);
      total = LseAdd(total, part[p].lse);
    }
    float out = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float w = LseMergeWeight(part[p].lse, total);
      if (part[p].lse == -kInf) {
        EXPECT_EQ(w, 0.0f);
        EXPECT_EQ(part[p].out, 0.0f);
      }
      out += w * part[p].out;
    }
    EXPECT_NEAR(out, want, 2e-5) << "parts " << parts << " n " << n;
    EXPECT_NEAR(total, want_lse, 1e-5 * std::max(1.0, std::abs(want_lse)));
  }
  // Every part empty: lse -inf, nothing to weigh.
  EXPECT_EQ(LseMergeWeight(-kInf, -kInf), 0.0f);
}

// ==== routing_math.h ================================================================

// Reference ranking: higher score first, lower index on ties.
bool RefBetter(const std::pair<float, int>& a, const std::pair<float, int>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

TEST(RoutingMathTest, BetterIsAStrictOrderWithLowerIndexOnTies) {
  EXPECT_TRUE(RoutingBetter(2.0f, 5, 1.0f, 0));
  EXPECT_FALSE(RoutingBetter(1.0f, 0, 2.0f, 5));
  EXPECT_TRUE(RoutingBetter(1.0f, 2, 1.0f, 3));
  EXPECT_FALSE(RoutingBetter(1.0f, 3, 1.0f, 2));
  EXPECT_FALSE(RoutingBetter(1.0f, 3, 1.0f, 3));  // irreflexive
  EXPECT_TRUE(RoutingBetter(-kInf, 1, -kInf, 4));
  EXPECT_TRUE(RoutingBetter(-1e30f, 9, -kInf, 0));
  EXPECT_NEAR(RoutingSigmoid(0.0f), 0.5f, 0.0f);
  for (float x : {-20.0f, -3.0f, -0.5f, 0.25f, 4.0f, 30.0f}) {
    EXPECT_NEAR(RoutingSigmoid(x), 1.0 / (1.0 + std::exp(-static_cast<double>(x))), 1e-7) << x;
  }
}

TEST(RoutingMathTest, TopKSelectMatchesStdSortWithTies) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 80);
    const int k = static_cast<int>(rng() % (n + 1));
    std::vector<float> v(n);
    for (float& x : v) {
      const int r = static_cast<int>(rng() % 12);
      x = r == 0 ? -kInf : static_cast<float>(r % 6) * 0.25f - 0.5f;  // many ties
    }
    std::vector<std::pair<float, int>> ref(n);
    for (int i = 0; i < n; ++i) ref[i] = {v[i], i};
    std::sort(ref.begin(), ref.end(), RefBetter);
    std::vector<float> scores(std::max(k, 1));
    std::vector<int> idx(std::max(k, 1));
    TopKSelect(v.data(), n, k, scores.data(), idx.data());
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(idx[i], ref[i].second) << "trial " << trial << " rank " << i;
      EXPECT_EQ(scores[i], ref[i].first);
    }
  }
  // k = 0 keeps nothing.
  float s = 7.0f;
  int i = -1, count = 0;
  TopKInsert(1.0f, 0, 0, &s, &i, &count);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(i, -1);
}

TEST(RoutingMathTest, GroupScores) {
  const std::vector<float> v = {0.5f, 2.0f, -1.0f, 2.0f, 1.5f};
  EXPECT_EQ(GroupScoreMax(v.data(), 5), 2.0f);
  EXPECT_EQ(GroupScoreMax(v.data(), 1), 0.5f);
  EXPECT_EQ(GroupScoreTop2Sum(v.data(), 5), 4.0f);  // the tied 2.0s
  EXPECT_EQ(GroupScoreTop2Sum(v.data(), 3), 2.5f);
  EXPECT_EQ(GroupScoreTop2Sum(v.data(), 1), 0.5f);  // one value: itself
  const std::vector<float> masked = {-kInf, 0.25f, -kInf};
  EXPECT_EQ(GroupScoreTop2Sum(masked.data(), 3), -kInf);
  EXPECT_EQ(GroupScoreMax(masked.data(), 3), 0.25f);
  std::mt19937 rng(32);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 30);
    std::vector<float> x = testing::RandomFloats(n, 40 + trial, -3.0f, 3.0f);
    std::vector<float> sorted = x;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    EXPECT_EQ(GroupScoreMax(x.data(), n), sorted[0]);
    EXPECT_EQ(GroupScoreTop2Sum(x.data(), n), sorted[0] + sorted[1]);  // larger added first
  }
}

// ==== sampling_math.h ===============================================================

TEST(SamplingMathTest, OrderKeyFollowsTheOrderOfLogits) {
  const std::vector<float> ascending = {-kInf,
                                        -std::numeric_limits<float>::max(),
                                        -1e10f,
                                        -2.5f,
                                        -1.0f,
                                        -std::numeric_limits<float>::min(),
                                        -std::numeric_limits<float>::denorm_min(),
                                        0.0f,
                                        std::numeric_limits<float>::denorm_min(),
                                        std::numeric_limits<float>::min(),
                                        1.0f,
                                        std::nextafter(1.0f, 2.0f),
                                        3e20f,
                                        std::numeric_limits<float>::max(),
                                        kInf};
  EXPECT_EQ(SampleOrderKey(kNaN), 0u);
  EXPECT_EQ(SampleOrderKey(-kNaN), 0u);
  EXPECT_LT(0u, SampleOrderKey(-kInf));
  for (size_t i = 0; i + 1 < ascending.size(); ++i) {
    EXPECT_LT(SampleOrderKey(ascending[i]), SampleOrderKey(ascending[i + 1])) << ascending[i];
  }
  EXPECT_EQ(SampleOrderKey(-0.0f), SampleOrderKey(0.0f));
  for (float f : ascending) {
    EXPECT_EQ(SampleLogitFromKey(SampleOrderKey(f)), f);
  }
  EXPECT_TRUE(std::isnan(SampleLogitFromKey(0u)));
  std::mt19937 rng(41);
  for (int i = 0; i < 100000; ++i) {
    float a, b;
    const uint32_t ua = static_cast<uint32_t>(rng()), ub = static_cast<uint32_t>(rng());
    std::memcpy(&a, &ua, 4);
    std::memcpy(&b, &ub, 4);
    if (std::isnan(a) || std::isnan(b)) continue;
    ASSERT_EQ(a < b, SampleOrderKey(a) < SampleOrderKey(b)) << a << " " << b;
    ASSERT_EQ(a == b, SampleOrderKey(a) == SampleOrderKey(b)) << a << " " << b;
  }
}

TEST(SamplingMathTest, RankKeySortsByLogitThenLowerIdWithNaNLast) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 500);
    std::vector<float> l(n);
    for (float& x : l) {
      const int r = static_cast<int>(rng() % 20);
      x = r == 0 ? kNaN : r == 1 ? -kInf : r == 2 ? -0.0f : static_cast<float>(r % 7) - 3.0f;
    }
    std::vector<int> want(n);
    std::iota(want.begin(), want.end(), 0);
    std::sort(want.begin(), want.end(), [&](int a, int b) {
      const bool na = std::isnan(l[a]), nb = std::isnan(l[b]);
      if (na != nb) return nb;  // numbers before NaN
      if (!na && l[a] != l[b]) return l[a] > l[b];
      return a < b;
    });
    std::vector<uint64_t> keys(n);
    for (int v = 0; v < n; ++v) keys[v] = SampleRankKey(SampleOrderKey(l[v]), v);
    std::sort(keys.begin(), keys.end(), std::greater<uint64_t>());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(static_cast<int>(SampleIdFromRankKey(keys[i])), want[i]) << trial << " " << i;
      ASSERT_EQ(SampleOrderKeyFromRankKey(keys[i]), SampleOrderKey(l[want[i]]));
    }
  }
  EXPECT_EQ(SampleIdFromRankKey(SampleRankKey(123u, 0x7ffffffeu)), 0x7ffffffeu);
}

TEST(SamplingMathTest, MassShiftKeepsEveryVocabularySumBelow2To62) {
  for (int64_t v : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{32000},
                    int64_t{102400}, int64_t{129280}, int64_t{131072}, int64_t{0x7fffffff}}) {
    const int shift = SampleMassShift(v);
    ASSERT_GE(shift, 31);
    ASSERT_LE(shift, 61);
    // v * 2^shift < 2^62, and one more bit would not fit for the largest v
    // of the same bit length.
    EXPECT_LT(static_cast<unsigned __int128>(v) << shift, static_cast<unsigned __int128>(1) << 62)
        << v;
    int bits = 0;
    while ((int64_t{1} << bits) <= v) ++bits;
    EXPECT_EQ(shift, 62 - bits) << v;
  }
  EXPECT_EQ(SampleMassShift(129280), 45);
}

TEST(SamplingMathTest, ExpIsWithinTwoUlpsMonotoneAndExactAtZero) {
  EXPECT_EQ(SampleExp(0.0), 1.0);
  EXPECT_EQ(SampleExp(-0.0), 1.0);
  EXPECT_EQ(SampleExp(-45.0), std::exp(-45.0));
  EXPECT_EQ(SampleExp(std::nextafter(-45.0, -50.0)), 0.0);
  EXPECT_EQ(SampleExp(-1000.0), 0.0);
  EXPECT_EQ(SampleExp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(SampleExp(std::numeric_limits<double>::quiet_NaN()), 0.0);
  std::mt19937_64 rng(43);
  std::uniform_real_distribution<double> u(-45.0, 0.0);
  int64_t worst = 0;
  for (int i = 0; i < 1000000; ++i) {
    const double x = u(rng);
    worst = std::max(worst, UlpDistance(SampleExp(x), std::exp(x)));
  }
  // Range-reduction boundaries x = -(k + 1/2) ln 2 and tiny arguments.
  for (int k = 0; k <= 64; ++k) {
    const double x = -(k + 0.5) * 0.6931471805599453;
    for (double d : {-1e-12, 0.0, 1e-12}) {
      if (x + d < -45.0) continue;
      worst = std::max(worst, UlpDistance(SampleExp(x + d), std::exp(x + d)));
    }
  }
  for (double x : {-1e-300, -1e-17, -1e-9, -1e-3}) {
    worst = std::max(worst, UlpDistance(SampleExp(x), std::exp(x)));
  }
  std::printf("max_ulp_err SampleExp vs std::exp on [-45, 0]: %lld\n",
              static_cast<long long>(worst));
  EXPECT_LE(worst, 2);
  // Monotone (non-decreasing) along a dense sorted grid.
  double prev = 0.0;
  for (double x = -45.0; x <= 0.0; x += 1.0 / 4096) {
    const double e = SampleExp(x);
    ASSERT_GE(e, prev) << x;
    ASSERT_LE(e, 1.0);
    prev = e;
  }
}

TEST(SamplingMathTest, TokenMassIsTheScaledExpOfTheShiftedLogit) {
  const int shift = SampleMassShift(1000);
  const double one = std::ldexp(1.0, shift);
  EXPECT_EQ(SampleTokenMass(2.0f, 2.0f, 1.0, shift), uint64_t{1} << shift);
  EXPECT_EQ(SampleTokenMass(-0.0f, 0.0f, 1.0, shift), uint64_t{1} << shift);
  EXPECT_EQ(SampleTokenMass(kNaN, 2.0f, 1.0, shift), 0u);
  EXPECT_EQ(SampleTokenMass(-kInf, 2.0f, 1.0, shift), 0u);
  // Infinite temperature: every finite token weighs the same; the smallest
  // one (1/T = 7e44, finite in double): only the maximum weighs anything.
  EXPECT_EQ(SampleInvTemperature(kInf), 0.0);
  EXPECT_EQ(SampleTokenMass(-50.0f, 2.0f, SampleInvTemperature(kInf), shift), uint64_t{1} << shift);
  const double inv_tiny = SampleInvTemperature(std::numeric_limits<float>::denorm_min());
  EXPECT_GT(inv_tiny, 1e44);
  EXPECT_EQ(SampleTokenMass(1.999f, 2.0f, inv_tiny, shift), 0u);
  EXPECT_EQ(SampleTokenMass(2.0f, 2.0f, inv_tiny, shift), uint64_t{1} << shift);

  std::mt19937 rng(44);
  std::uniform_real_distribution<float> logit(-40.0f, 10.0f);
  std::uniform_real_distribution<float> temp(0.05f, 3.0f);
  for (int i = 0; i < 100000; ++i) {
    const float m = 10.0f, l = logit(rng), t = temp(rng);
    const double inv_t = SampleInvTemperature(t);
    EXPECT_EQ(inv_t, 1.0 / static_cast<double>(t));
    const uint64_t q = SampleTokenMass(l, m, inv_t, shift);
    const double want = one * std::exp((static_cast<double>(l) - m) / t);
    ASSERT_LE(q, uint64_t{1} << shift);
    ASSERT_NEAR(static_cast<double>(q), want, 1.0 + want * 1e-15) << l << " " << t;
    // Monotone in the logit.
    const float l2 = std::nextafter(l, 11.0f);
    ASSERT_LE(q, SampleTokenMass(l2, m, inv_t, shift));
  }
}

TEST(SamplingMathTest, TopPTargetIsTheCeilingOfTheShareClamped) {
  EXPECT_EQ(SampleTopPTarget(1000, 0.0f), 1u);
  EXPECT_EQ(SampleTopPTarget(1000, -1.0f), 1u);
  EXPECT_EQ(SampleTopPTarget(1000, 0.5f), 500u);
  EXPECT_EQ(SampleTopPTarget(1000, 0.5001f), 501u);
  EXPECT_EQ(SampleTopPTarget(1000, 1.0f), 1000u);
  EXPECT_EQ(SampleTopPTarget(1000, 2.0f), 1000u);
  EXPECT_EQ(SampleTopPTarget(1, 0.3f), 1u);
  std::mt19937_64 rng(45);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t mass = 1 + (rng() >> (2 + rng() % 62));
    const float p = static_cast<float>((rng() >> 40) * (1.0 / (1ull << 24)));
    const uint64_t t = SampleTopPTarget(mass, p);
    ASSERT_GE(t, 1u);
    ASSERT_LE(t, mass);
    // Within rounding of the exact ceil(p * mass) (mass and the product are
    // each rounded to double once).
    const long double exact = static_cast<long double>(p) * static_cast<long double>(mass);
    const long double slack = 1.0L + exact * 3e-16L;
    ASSERT_GE(static_cast<long double>(t) + slack, exact) << mass << " " << p;
    ASSERT_LE(static_cast<long double>(t), std::max<long double>(1.0L, exact + slack));
  }
}

TEST(SamplingMathTest, DrawTargetCoversOneToMassEvenly) {
  for (uint64_t mass : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{1000}, uint64_t{1} << 45,
                        (uint64_t{1} << 62) - 1}) {
    EXPECT_EQ(SampleDrawTarget(0.0f, mass), 1u);
    const float u_max = 1.0f - 1.0f / 16777216.0f;
    const uint64_t top = SampleDrawTarget(u_max, mass);
    EXPECT_LE(top, mass);
    EXPECT_GE(top, 1u);
  }
  // Mass 3 over the whole 24-bit u grid (sampled): each target 1/3 of the time.
  int count[4] = {0, 0, 0, 0};
  for (uint32_t i = 0; i < (1u << 24); i += 7) {
    const uint64_t t = SampleDrawTarget(static_cast<float>(i) / 16777216.0f, 3);
    ASSERT_GE(t, 1u);
    ASSERT_LE(t, 3u);
    ++count[t];
  }
  const int total = count[1] + count[2] + count[3];
  for (int t = 1; t <= 3; ++t) EXPECT_NEAR(count[t] / static_cast<double>(total), 1.0 / 3, 1e-5);
  EXPECT_EQ(SampleGroupSteps(1, 5), 1u);
  EXPECT_EQ(SampleGroupSteps(5, 5), 1u);
  EXPECT_EQ(SampleGroupSteps(6, 5), 2u);
  EXPECT_EQ(SampleGroupSteps(15, 5), 3u);
  EXPECT_EQ(SampleGroupSteps(7, 1), 7u);
}

TEST(SamplingMathTest, DigitsSplitTheKeyTwelveTwelveEight) {
  const uint32_t key = 0xabcdef12u;
  EXPECT_EQ(SampleDigit(key, 0), 0xabcu);
  EXPECT_EQ(SampleDigit(key, 1), 0xdefu);
  EXPECT_EQ(SampleDigit(key, 2), 0x12u);
  uint32_t prefix = 0;
  for (int pass = 0; pass < kSampleDigitPasses; ++pass) {
    EXPECT_TRUE(SamplePrefixMatches(key, pass, prefix)) << pass;
    EXPECT_FALSE(pass > 0 && SamplePrefixMatches(key ^ 0x80000000u, pass, prefix)) << pass;
    prefix = SampleAppendDigit(prefix, pass, SampleDigit(key, pass));
  }
  EXPECT_EQ(prefix, key);
}

// ---- The CUDA sampler's search, emulated ----------------------------------------
//
// Mirrors FindCrossing / NthInGroup / SampleKernel in kernels/cuda/sampling.cu:
// histograms of digits over the kept tokens matching the prefix, the highest
// digit whose bins from the top reach the target, then the n-th token of the
// final equal-key group in id order.

struct EmuRow {
  const float* logits;
  int vocab;
  float max_logit;
  double inv_temperature;
  int shift;
};

enum class Need { kCount, kTopP, kDraw };

uint64_t EmuFindCrossing(const EmuRow& row, bool mass, uint64_t cut, Need kind, uint64_t count,
                         float param) {
  constexpr int kBins = 4096;
  uint32_t prefix = 0;
  uint64_t above = 0, need = 0, group_value = 0, group_count = 0;
  uint32_t group_min = 0, group_max = 0;
  std::vector<uint64_t> hist(kBins);
  std::vector<uint32_t> gcount(256), gmin(256), gmax(256);
  for (int pass = 0; pass < kSampleDigitPasses; ++pass) {
    const bool last = pass == kSampleDigitPasses - 1;
    std::fill(hist.begin(), hist.end(), 0);
    std::fill(gcount.begin(), gcount.end(), 0);
    std::fill(gmin.begin(), gmin.end(), 0xffffffffu);
    std::fill(gmax.begin(), gmax.end(), 0);
    for (int v = 0; v < row.vocab; ++v) {
      const float l = row.logits[v];
      const uint32_t key = SampleOrderKey(l);
      if (!SamplePrefixMatches(key, pass, prefix)) continue;
      if (SampleRankKey(key, v) < cut) continue;
      const uint64_t value =
          mass ? SampleTokenMass(l, row.max_logit, row.inv_temperature, row.shift) : 1;
      if (value == 0) continue;
      const uint32_t d = SampleDigit(key, pass);
      hist[d] += value;
      if (last) {
        ++gcount[d];
        gmin[d] = std::min<uint32_t>(gmin[d], v);
        gmax[d] = std::max<uint32_t>(gmax[d], v);
      }
    }
    uint64_t total = 0;
    for (uint64_t h : hist) total += h;
    if (pass == 0) {
      need = kind == Need::kCount  ? count
             : kind == Need::kTopP ? SampleTopPTarget(total, param)
                                   : SampleDrawTarget(param, total);
    }
    const uint64_t rel = need - above;
    EXPECT_GE(rel, 1u);
    EXPECT_LE(rel, total);
    uint64_t acc = 0;
    int digit = kBins - 1;
    for (; digit > 0; --digit) {
      if (acc + hist[digit] >= rel) break;
      acc += hist[digit];
    }
    above += acc;
    prefix = SampleAppendDigit(prefix, pass, static_cast<uint32_t>(digit));
    if (last) {
      group_value = hist[digit];
      group_count = gcount[digit];
      group_min = gmin[digit];
      group_max = gmax[digit];
    }
  }
  const uint64_t step = SampleGroupSteps(need - above, group_value / group_count);
  EXPECT_GE(step, 1u);
  EXPECT_LE(step, group_count);
  uint32_t id = group_min;
  if (step == group_count) {
    id = group_max;
  } else if (step > 1) {
    uint64_t seen = 0;
    for (int v = 0; v < row.vocab; ++v) {
      const uint32_t key = SampleOrderKey(row.logits[v]);
      if (key == prefix && SampleRankKey(key, v) >= cut && ++seen == step) {
        id = static_cast<uint32_t>(v);
        break;
      }
    }
  }
  return SampleRankKey(prefix, id);
}

int32_t EmuSample(const float* logits, int vocab, float temperature, int32_t top_k, float top_p,
                  uint64_t seed, uint64_t step) {
  uint64_t best = 0;
  for (int v = 0; v < vocab; ++v) {
    best = std::max(best, SampleRankKey(SampleOrderKey(logits[v]), v));
  }
  EmuRow row{logits, vocab, SampleLogitFromKey(SampleOrderKeyFromRankKey(best)), 0.0, 0};
  if (!(temperature > 0.0f) || !std::isfinite(row.max_logit)) {
    return static_cast<int32_t>(SampleIdFromRankKey(best));
  }
  row.inv_temperature = SampleInvTemperature(temperature);
  row.shift = SampleMassShift(vocab);
  uint64_t cut = 0;
  if (top_k > 0 && top_k < vocab) cut = EmuFindCrossing(row, false, cut, Need::kCount, top_k, 0);
  if (top_p < 1.0f) cut = EmuFindCrossing(row, true, cut, Need::kTopP, 0, top_p);
  const float u = UniformFromCounter(seed, step);
  return static_cast<int32_t>(
      SampleIdFromRankKey(EmuFindCrossing(row, true, cut, Need::kDraw, 0, u)));
}

// Rows of one vocabulary size with varied logit shapes and parameters.
struct Batch {
  int64_t rows, vocab;
  std::vector<float> logits, temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<int64_t> seeds, steps;
};

Batch MakeBatch(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b{rows, vocab, std::vector<float>(rows * vocab), {}, {}, {}, {}, {}};
  for (int64_t r = 0; r < rows; ++r) {
    float* l = b.logits.data() + r * vocab;
    const int shape = static_cast<int>(r % 6);
    std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(r % 5));
    for (int64_t v = 0; v < vocab; ++v) {
      float x = normal(rng);
      if (shape == 1) x = std::round(x * 2.0f) / 2.0f;    // heavy ties
      if (shape == 2) x = static_cast<float>(rng() % 3);  // three levels
      if (shape == 3 && rng() % 4 == 0) x = -kInf;        // masked vocabulary
      if (shape == 4 && rng() % 50 == 0) x = kNaN;        // stray NaNs
      if (shape == 5 && rng() % 3 == 0) x = (rng() % 2) ? 0.0f : -0.0f;
      l[v] = x;
    }
    const int temp_kind = static_cast<int>(rng() % 8);
    b.temperature.push_back(temp_kind == 0   ? 0.0f
                            : temp_kind == 1 ? 1e-4f
                            : temp_kind == 2 ? 50.0f
                                             : 0.3f + static_cast<float>(rng() % 100) / 50.0f);
    const int k_kind = static_cast<int>(rng() % 5);
    b.top_k.push_back(k_kind == 0   ? 0
                      : k_kind == 1 ? 1
                      : k_kind == 2 ? static_cast<int32_t>(vocab)
                                    : 1 + static_cast<int32_t>(rng() % (vocab + 3)));
    const int p_kind = static_cast<int>(rng() % 4);
    b.top_p.push_back(p_kind == 0   ? 1.0f
                      : p_kind == 1 ? 0.0f
                                    : static_cast<float>(rng() % 1000) / 1000.0f);
    b.seeds.push_back(static_cast<int64_t>(rng()));
    b.steps.push_back(static_cast<int64_t>(rng() % 100000));
  }
  return b;
}

std::vector<int32_t> HostSample(const Batch& b) {
  using testing::Make;
  testing::Owned logits = Make(DType::kF32, {b.rows, b.vocab});
  testing::Owned temp = Make(DType::kF32, {b.rows});
  testing::Owned top_k = Make(DType::kI32, {b.rows});
  testing::Owned top_p = Make(DType::kF32, {b.rows});
  testing::Owned seeds = Make(DType::kI64, {b.rows});
  testing::Owned steps = Make(DType::kI64, {b.rows});
  testing::Owned out = Make(DType::kI32, {b.rows});
  std::memcpy(logits.data<float>(), b.logits.data(), b.logits.size() * sizeof(float));
  std::memcpy(temp.data<float>(), b.temperature.data(), b.rows * sizeof(float));
  std::memcpy(top_k.data<int32_t>(), b.top_k.data(), b.rows * sizeof(int32_t));
  std::memcpy(top_p.data<float>(), b.top_p.data(), b.rows * sizeof(float));
  std::memcpy(seeds.data<int64_t>(), b.seeds.data(), b.rows * sizeof(int64_t));
  std::memcpy(steps.data<int64_t>(), b.steps.data(), b.rows * sizeof(int64_t));
  for (int64_t r = 0; r < b.rows; ++r) out.data<int32_t>()[r] = -1;
  const absl::Status st =
      Sample(testing::HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t, out.t);
  EXPECT_OK(st);
  return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + b.rows);
}

TEST(SamplingMathTest, RadixDescentPicksTheHostKernelsToken) {
  int64_t rows_checked = 0, sampled = 0;
  for (int64_t vocab : {1, 2, 7, 37, 300, 4099, 40000}) {
    const int64_t rows = vocab >= 40000 ? 60 : 400;
    const Batch b = MakeBatch(rows, vocab, static_cast<uint32_t>(1000 + vocab));
    const std::vector<int32_t> host = HostSample(b);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t emu = EmuSample(
          b.logits.data() + r * vocab, static_cast<int>(vocab), b.temperature[r], b.top_k[r],
          b.top_p[r], static_cast<uint64_t>(b.seeds[r]), static_cast<uint64_t>(b.steps[r]));
      ASSERT_EQ(emu, host[r]) << "vocab " << vocab << " row " << r << " T " << b.temperature[r]
                              << " top_k " << b.top_k[r] << " top_p " << b.top_p[r];
      ASSERT_GE(host[r], 0);
      ASSERT_LT(host[r], vocab);
      ++rows_checked;
      sampled += b.temperature[r] > 0.0f ? 1 : 0;
    }
  }
  EXPECT_GT(sampled, rows_checked / 2);
}

TEST(SamplingMathTest, DrawsFollowTheIntegerMasses) {
  // Three tokens with masses in ratio 1 : e^-1 : e^-2 (T = 1): the draw over
  // 60,000 steps matches q_v / sum q to sampling noise.
  const float logits[3] = {0.0f, -1.0f, -2.0f};
  int count[3] = {0, 0, 0};
  constexpr int kN = 60000;
  for (int i = 0; i < kN; ++i) ++count[EmuSample(logits, 3, 1.0f, 0, 1.0f, 5, i)];
  const double z = 1.0 + std::exp(-1.0) + std::exp(-2.0);
  for (int v = 0; v < 3; ++v) {
    const double p = std::exp(-static_cast<double>(v)) / z;
    EXPECT_NEAR(count[v] / static_cast<double>(kN), p, 5 * std::sqrt(p * (1 - p) / kN)) << v;
  }
}

}  // namespace
}  // namespace mlag
