// Token sampling: greedy, top-k / top-p support and frequencies, and
// determinism keyed by (seed, step) only.
#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;

struct Row {
  std::vector<float> logits;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int64_t seed = 0;
  int64_t step = 0;
};

// Runs Sample over `rows` (all of the same vocabulary size) in one batch.
std::vector<int32_t> SampleRows(const std::vector<Row>& rows) {
  const int64_t B = static_cast<int64_t>(rows.size());
  const int64_t V = static_cast<int64_t>(rows[0].logits.size());
  Owned logits = Make(DType::kF32, {B, V});
  Owned temp = Make(DType::kF32, {B});
  Owned top_k = Make(DType::kI32, {B});
  Owned top_p = Make(DType::kF32, {B});
  Owned seeds = Make(DType::kI64, {B});
  Owned steps = Make(DType::kI64, {B});
  Owned out = Make(DType::kI32, {B});
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(logits.data<float>() + b * V, rows[b].logits.data(), V * sizeof(float));
    temp.data<float>()[b] = rows[b].temperature;
    top_k.data<int32_t>()[b] = rows[b].top_k;
    top_p.data<float>()[b] = rows[b].top_p;
    seeds.data<int64_t>()[b] = rows[b].seed;
    steps.data<int64_t>()[b] = rows[b].step;
    out.data<int32_t>()[b] = -1;
  }
  absl::Status st = Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t,
                           out.t);
  EXPECT_OK(st);
  return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + B);
}

// Independent reference: the allowed tokens and their renormalised
// probabilities (top-k first, then top-p over the top-k renormalised mass).
std::map<int, double> AllowedSet(const std::vector<float>& logits, double temperature, int top_k,
                                 double top_p) {
  const int V = static_cast<int>(logits.size());
  double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += p[v] = std::exp((logits[v] - m) / temperature);
  for (double& q : p) q /= sum;
  std::vector<int> order(V);
  for (int v = 0; v < V; ++v) order[v] = v;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  int kept = (top_k <= 0 || top_k >= V) ? V : top_k;
  double mass = 0;
  for (int i = 0; i < kept; ++i) mass += p[order[i]];
  if (top_p < 1.0) {
    double cum = 0;
    int n = 0;
    while (n < kept) {
      cum += p[order[n++]] / mass;
      if (cum >= top_p) break;
    }
    kept = n;
  }
  std::map<int, double> allowed;
  double total = 0;
  for (int i = 0; i < kept; ++i) total += p[order[i]];
  for (int i = 0; i < kept; ++i) allowed[order[i]] = p[order[i]] / total;
  return allowed;
}

TEST(Sample, GreedyIsArgmaxLowestIdOnTies) {
  std::vector<Row> rows(4);
  rows[0].logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f, 0.0f};  // ties 1, 3, 5
  rows[1].logits = {-3.0f, -2.0f, -2.5f, -2.0f, -9.0f, -4.0f, -2.0001f};
  rows[2].logits = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  rows[3].logits = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 7.0f};
  rows[1].temperature = -1.0f;  // any temperature <= 0 is greedy
  rows[2].top_k = 3;            // top-k / top-p do not matter for greedy
  rows[3].top_p = 0.1f;
  for (int i = 0; i < 4; ++i) rows[i].seed = 1234 + i;
  EXPECT_EQ(SampleRows(rows), (std::vector<int32_t>{1, 1, 0, 6}));
}

// Draws 10,000 times (steps 0..9999) from one distribution; every draw must
// be allowed and the frequencies must match the renormalised probabilities.
void CheckDistribution(float temperature, int top_k, float top_p, uint64_t seed) {
  const int V = 37;
  const int N = 10000;
  std::vector<float> logits = testing::RandomFloats(V, 4242, -2.0f, 2.0f);
  std::map<int, double> allowed = AllowedSet(logits, temperature, top_k, top_p);
  std::vector<Row> rows(N);
  for (int i = 0; i < N; ++i) {
    rows[i].logits = logits;
    rows[i].temperature = temperature;
    rows[i].top_k = top_k;
    rows[i].top_p = top_p;
    rows[i].seed = static_cast<int64_t>(seed);
    rows[i].step = i;
  }
  std::vector<int32_t> got = SampleRows(rows);
  std::map<int, int> count;
  for (int32_t tok : got) {
    ASSERT_TRUE(allowed.count(tok)) << "token " << tok << " outside the allowed set (top_k "
                                    << top_k << ", top_p " << top_p << ")";
    ++count[tok];
  }
  // Pearson chi-square over the allowed tokens; the bound is generous (the
  // mean is df, the sd sqrt(2 df)) but far below what a wrong distribution
  // gives at N = 10,000.
  double chi2 = 0, max_rel = 0;
  for (const auto& [tok, prob] : allowed) {
    const double expected = prob * N;
    const double d = count[tok] - expected;
    chi2 += d * d / expected;
    max_rel = std::max(max_rel, std::abs(count[tok] / double(N) - prob) / prob);
  }
  const double df = std::max<double>(1, allowed.size() - 1);
  EXPECT_LT(chi2, df + 8 * std::sqrt(2 * df) + 10)
      << "top_k " << top_k << " top_p " << top_p << " allowed " << allowed.size();
  // The "error" here is sampling noise of the empirical frequencies.
  std::printf("max_rel_err sample(T=%.2f top_k=%d top_p=%.2f freq vs prob) %.3g "
              "[%zu allowed, chi2 %.1f, df %.0f]\n",
              temperature, top_k, top_p, max_rel, allowed.size(), chi2, df);
}

TEST(Sample, TemperatureOnlyMatchesSoftmax) { CheckDistribution(0.8f, 0, 1.0f, 11); }
TEST(Sample, TopKStaysInsideAndMatches) { CheckDistribution(1.0f, 5, 1.0f, 12); }
TEST(Sample, TopPStaysInsideAndMatches) { CheckDistribution(0.7f, 0, 0.6f, 13); }
TEST(Sample, TopKThenTopPStaysInsideAndMatches) { CheckDistribution(1.3f, 12, 0.75f, 14); }

TEST(Sample, TopKOneAndTinyTopPAreArgmax) {
  std::vector<float> logits = testing::RandomFloats(50, 9, -3.0f, 3.0f);
  const int argmax = static_cast<int>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
  std::vector<Row> rows(200);
  for (int i = 0; i < 200; ++i) {
    rows[i].logits = logits;
    rows[i].temperature = 1.5f;
    rows[i].seed = 99;
    rows[i].step = i;
    if (i % 2 == 0) {
      rows[i].top_k = 1;
    } else {
      rows[i].top_p = 0.0f;  // the most likely token is always kept
    }
  }
  for (int32_t tok : SampleRows(rows)) EXPECT_EQ(tok, argmax);
}

TEST(Sample, IndependentOfBatchPosition) {
  // Each (seed, step) row alone, then in a batch of 7 at position 3 with
  // unrelated neighbours: the same token.
  std::vector<float> logits = testing::RandomFloats(64, 21, -1.0f, 1.0f);
  int differing_neighbours = 0;
  for (int i = 0; i < 100; ++i) {
    Row r;
    r.logits = logits;
    r.temperature = 0.9f;
    r.top_k = (i % 3 == 0) ? 20 : 0;
    r.top_p = (i % 2 == 0) ? 0.9f : 1.0f;
    r.seed = 1000 + i % 7;
    r.step = i * 13;
    const int32_t alone = SampleRows({r})[0];
    std::vector<Row> batch(7);
    for (int j = 0; j < 7; ++j) {
      batch[j].logits = testing::RandomFloats(64, 500 + i * 7 + j, -1.0f, 1.0f);
      batch[j].temperature = j % 2 == 0 ? 1.0f : 0.0f;
      batch[j].seed = r.seed;  // even the same seed at other steps
      batch[j].step = r.step + j + 1;
    }
    batch[3] = r;
    std::vector<int32_t> got = SampleRows(batch);
    EXPECT_EQ(got[3], alone) << "i=" << i;
    differing_neighbours += got[2] != alone ? 1 : 0;
  }
  EXPECT_GT(differing_neighbours, 0);
}

TEST(Sample, SameSeedRepeatsAndSeedsDiffer) {
  std::vector<float> logits(32, 0.0f);  // uniform: every draw is informative
  auto sequence = [&](int64_t seed) {
    std::vector<Row> rows(64);
    for (int i = 0; i < 64; ++i) {
      rows[i].logits = logits;
      rows[i].temperature = 1.0f;
      rows[i].seed = seed;
      rows[i].step = i;
    }
    return SampleRows(rows);
  };
  std::vector<int32_t> a = sequence(7), a2 = sequence(7), b = sequence(8);
  EXPECT_EQ(a, a2);
  int same = 0;
  for (int i = 0; i < 64; ++i) same += a[i] == b[i] ? 1 : 0;
  EXPECT_LT(same, 16);  // about 2 expected for independent uniform draws
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 16u);
}

TEST(Sample, RejectsBadArguments) {
  Owned logits = Make(DType::kF32, {2, 8});
  Owned temp = Make(DType::kF32, {2});
  Owned top_k = Make(DType::kI32, {2});
  Owned top_p = Make(DType::kF32, {2});
  Owned seeds = Make(DType::kI64, {2});
  Owned steps = Make(DType::kI64, {2});
  Owned out = Make(DType::kI32, {2});
  EXPECT_OK(
      Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t, out.t));
  Owned seeds32 = Make(DType::kI32, {2});
  absl::Status st =
      Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds32.t, steps.t, out.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("seeds"), absl::string_view::npos) << st;
  Owned out3 = Make(DType::kI32, {3});
  st = Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t, out3.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("out_tokens"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace mlag
