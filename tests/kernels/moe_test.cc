// MoE routing and routed experts against hand-worked cases and plain
// double-precision references.
#include "kernels/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::CountNaN;
using testing::FillRandom;
using testing::HostStream;
using testing::Make;
using testing::MaxRelError;
using testing::Owned;
using testing::PoisonNaN;

// ---------------------------------------------------------------------------
// Routing

struct RouteResult {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Owned F32(const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  Owned o = Make(DType::kF32, shape);
  std::memcpy(o.t.data(), v.data(), v.size() * sizeof(float));
  return o;
}

// Runs MoeRoute on `logits` [T, E] (and `bias` [E] when not empty).
RouteResult Route(const RoutingParams& p, const std::vector<float>& logits,
                  const std::vector<float>& bias = {}) {
  const int64_t E = p.num_experts, K = p.top_k;
  const int64_t T = static_cast<int64_t>(logits.size()) / E;
  Owned l = F32(logits, {T, E});
  Owned b = bias.empty() ? Owned{} : F32(bias, {E});
  Owned ids = Make(DType::kI32, {T, K});
  Owned w = Make(DType::kF32, {T, K});
  for (int64_t i = 0; i < T * K; ++i) ids.data<int32_t>()[i] = -7;
  PoisonNaN(w);
  absl::Status st = MoeRoute(HostStream(), p, l.t, b.t, ids.t, w.t);
  EXPECT_OK(st);
  EXPECT_EQ(CountNaN(w), 0);
  RouteResult r;
  r.ids.assign(ids.data<int32_t>(), ids.data<int32_t>() + T * K);
  r.weights.assign(w.data<float>(), w.data<float>() + T * K);
  return r;
}

std::vector<float> Logs(const std::vector<double>& e) {
  std::vector<float> l;
  for (double v : e) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

// Logit whose sigmoid is s.
float Logit(double s) { return static_cast<float>(std::log(s / (1.0 - s))); }

void ExpectWeights(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 2e-6 * std::abs(want[i]) + 1e-7) << i;
  }
}

TEST(MoeRoute, SoftmaxGreedyByHand) {
  // exp(l) = [1, 2, 1, 4, 1, 1, 2, 1], sum 13, so s = exp(l) / 13.
  // Best is expert 3 (4/13); experts 1 and 6 tie at 2/13 and the lower index,
  // 1, wins. No normalisation, scaling 1: w = [4/13, 2/13].
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.scoring = ScoringFunc::kSoftmax;
  p.method = TopkMethod::kGreedy;
  RouteResult r = Route(p, Logs({1, 2, 1, 4, 1, 1, 2, 1}));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  ExpectWeights(r.weights, {4.0 / 13, 2.0 / 13});

  // norm_topk_prob: w = [4, 2] / 6 and the scaling factor (16) is skipped for
  // softmax.
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 16.0f;
  r = Route(p, Logs({1, 2, 1, 4, 1, 1, 2, 1}));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  ExpectWeights(r.weights, {4.0 / 6, 2.0 / 6});
}

TEST(MoeRoute, SoftmaxGroupLimitedGreedyByHand) {
  // Groups of 2: {0,1} {2,3} {4,5} {6,7}. exp(l) = [1, 3, 2, 2, 5, 1, 1, 4],
  // sum 19. Group scores (max s) = [3, 2, 5, 4]/19: keep groups 2 and 3.
  // Candidates 4 (5), 5 (1), 6 (1), 7 (4): top-3 = 4, 7, then 5 and 6 tie and 5
  // wins. (Ungrouped top-3 would be 4, 7, 1.) No norm, scaling 2:
  // w = 2 * [5, 4, 1] / 19.
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 3;
  p.n_group = 4;
  p.topk_group = 2;
  p.scoring = ScoringFunc::kSoftmax;
  p.method = TopkMethod::kGroupLimitedGreedy;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 2.0f;
  RouteResult r = Route(p, Logs({1, 3, 2, 2, 5, 1, 1, 4}));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 7, 5}));
  ExpectWeights(r.weights, {10.0 / 19, 8.0 / 19, 2.0 / 19});
}

TEST(MoeRoute, SoftmaxGroupTieKeepsLowerGroup) {
  // exp(l) = [2, 1, 2, 1.9, 1, 1, 1, 1]: groups 0 and 1 both score 2 (exactly:
  // the same logit), one group is kept, and it must be group 0, giving
  // ids [0, 1]. (Group 1 would give [2, 3]; ungrouped top-2 is [0, 2].)
  // sum = 10.9; scaling 1: w = [2, 1] / 10.9.
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 1;
  p.scoring = ScoringFunc::kSoftmax;
  p.method = TopkMethod::kGroupLimitedGreedy;
  RouteResult r = Route(p, Logs({2, 1, 2, 1.9, 1, 1, 1, 1}));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  ExpectWeights(r.weights, {2 / 10.9, 1 / 10.9});
}

TEST(MoeRoute, SigmoidNoauxTcByHand) {
  // s = sigmoid(l) = [0.5, 0.25, 0.75, 0.2, 0.8, 0.5, 0.25, 0.9]
  // bias           = [0,   0.5,  0,    0,  -0.25, 0, 0.25, -0.5]
  // b = s + bias   = [0.5, 0.75, 0.75, 0.2, 0.55, 0.5, 0.5, 0.4]
  // group scores (sum of top-2 b): g0 1.25, g1 0.95, g2 1.05, g3 0.9 -> keep
  // g0 and g2. Candidates 0 (0.5), 1 (0.75), 4 (0.55), 5 (0.5): ids [1, 4].
  // (Top-2 of s alone would be [7, 4]; ungrouped top-2 of b would be [1, 2].)
  // w = s[ids] = [0.25, 0.8]; norm: / 1.05; times 2.5 = [0.625, 2] / 1.05.
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5f;
  std::vector<float> l;
  for (double s : {0.5, 0.25, 0.75, 0.2, 0.8, 0.5, 0.25, 0.9}) l.push_back(Logit(s));
  RouteResult r = Route(p, l, {0, 0.5f, 0, 0, -0.25f, 0, 0.25f, -0.5f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 4}));
  ExpectWeights(r.weights, {0.625 / 1.05, 2.0 / 1.05});
}

TEST(MoeRoute, NegativeBiasMasksWithMinusInfinity) {
  // bias = -1 everywhere, so every b = s - 1 is negative.
  // s = [0.5, 0.75, 0.25, 0.2, 0.8, 0.9, 0.25, 0.5]
  // b = [-0.5, -0.25, -0.75, -0.8, -0.2, -0.1, -0.75, -0.5]
  // group scores: g0 -0.75, g1 -1.55, g2 -0.3, g3 -1.25 -> keep g2, g0.
  // Candidates 0 (-0.5), 1 (-0.25), 4 (-0.2), 5 (-0.1): ids [5, 4].
  // Masking the other groups to 0 instead of -inf would rank experts 2, 3,
  // 6, 7 (b = 0) first and give [2, 3].
  // No norm, scaling 2.5: w = 2.5 * [0.9, 0.8].
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 2.5f;
  std::vector<float> l;
  for (double s : {0.5, 0.75, 0.25, 0.2, 0.8, 0.9, 0.25, 0.5}) l.push_back(Logit(s));
  RouteResult r = Route(p, l, std::vector<float>(8, -1.0f));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 4}));
  ExpectWeights(r.weights, {2.25, 2.0});
}

TEST(MoeRoute, EqualScoresGoToLowerIndex) {
  // All logits equal: softmax greedy picks experts 0, 1, 2, each 1/8.
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 3;
  RouteResult r = Route(p, std::vector<float>(8, 0.3f));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  ExpectWeights(r.weights, {0.125, 0.125, 0.125});

  // Same for sigmoid noaux_tc with zero bias: all groups tie, groups 0 and 1
  // are kept, and ids are 0, 1, 2; w = 0.5 each, normalised to 1/3.
  p.n_group = 4;
  p.topk_group = 2;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = true;
  r = Route(p, std::vector<float>(8, 0.0f), std::vector<float>(8, 0.0f));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  ExpectWeights(r.weights, {1.0 / 3, 1.0 / 3, 1.0 / 3});
}

TEST(MoeRoute, NoauxTcGroupTieKeepsLowerGroup) {
  // s = 0.5 everywhere (l = 0); bias = [0, 0, .25, -.25, 0, 0, -.125, -.125]
  // b = [0.5, 0.5, 0.75, 0.25, 0.5, 0.5, 0.375, 0.375]: groups 0, 1, 2 all
  // score exactly 1.0 (g3 0.75). One group kept: group 0, so ids [0, 1].
  // (Group 1 would give [2, 3]; ungrouped top-2 of b is [2, 0].)
  // w = [0.5, 0.5] / (1 + 1e-20) * 1.
  RoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 1;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = true;
  RouteResult r = Route(p, std::vector<float>(8, 0.0f),
                        {0, 0, 0.25f, -0.25f, 0, 0, -0.125f, -0.125f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  ExpectWeights(r.weights, {0.5, 0.5});
}

// Independent router in double precision: full sorts with an explicit
// comparator, masking by skipping experts of dropped groups.
struct RefRoute {
  std::vector<double> s;    // [E] scores
  std::vector<double> sel;  // [E] selection scores, -inf for dropped groups
  std::vector<int> ids;     // [K]
};

RefRoute RefRouteToken(const RoutingParams& p, const float* l, const float* bias) {
  const int E = p.num_experts, G = p.n_group, per = E / G;
  RefRoute r;
  r.s.resize(E);
  if (p.scoring == ScoringFunc::kSoftmax) {
    double m = -INFINITY, sum = 0;
    for (int e = 0; e < E; ++e) m = std::max(m, static_cast<double>(l[e]));
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - m);
    for (int e = 0; e < E; ++e) r.s[e] = std::exp(l[e] - m) / sum;
  } else {
    for (int e = 0; e < E; ++e) r.s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
  }
  r.sel = r.s;
  if (p.method == TopkMethod::kNoauxTc) {
    for (int e = 0; e < E; ++e) r.sel[e] += bias[e];
  }
  auto rank = [](const std::vector<double>& v) {
    std::vector<int> order(v.size());
    for (size_t i = 0; i < v.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
    return order;
  };
  if (p.method != TopkMethod::kGreedy) {
    std::vector<double> gs(G);
    for (int g = 0; g < G; ++g) {
      std::vector<double> v(r.sel.begin() + g * per, r.sel.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[g] = p.method == TopkMethod::kNoauxTc ? v[0] + (per > 1 ? v[1] : 0.0) : v[0];
    }
    std::vector<int> gorder = rank(gs);
    for (int j = p.topk_group; j < G; ++j) {
      for (int i = 0; i < per; ++i) r.sel[gorder[j] * per + i] = -INFINITY;
    }
  }
  std::vector<int> order = rank(r.sel);
  r.ids.assign(order.begin(), order.begin() + p.top_k);
  return r;
}

void CompareWithReference(const RoutingParams& p, int T, uint32_t seed) {
  const int E = p.num_experts, K = p.top_k;
  std::vector<float> l = testing::RandomFloats(static_cast<size_t>(T) * E, seed, -4.0f, 4.0f);
  std::vector<float> bias;
  if (p.method == TopkMethod::kNoauxTc) bias = testing::RandomFloats(E, seed + 1, -0.5f, 0.5f);
  RouteResult got = Route(p, l, bias);
  double max_rel = 0;
  int exact_rows = 0;
  for (int t = 0; t < T; ++t) {
    RefRoute ref = RefRouteToken(p, l.data() + t * E, bias.data());
    const int32_t* ids = got.ids.data() + t * K;
    const float* w = got.weights.data() + t * K;
    exact_rows += std::equal(ids, ids + K, ref.ids.begin()) ? 1 : 0;
    // Each pick must be in range, distinct, from a kept group, and rank where
    // the reference ranks it (equal up to float rounding when it is not the
    // same expert: a near tie).
    double sum = 0;
    for (int k = 0; k < K; ++k) {
      ASSERT_GE(ids[k], 0);
      ASSERT_LT(ids[k], E);
      for (int j = 0; j < k; ++j) ASSERT_NE(ids[j], ids[k]) << "t=" << t;
      ASSERT_TRUE(std::isfinite(ref.sel[ids[k]])) << "t=" << t << " picked a dropped group";
      ASSERT_NEAR(ref.sel[ids[k]], ref.sel[ref.ids[k]], 1e-5) << "t=" << t << " k=" << k;
      sum += ref.s[ids[k]];
    }
    for (int k = 0; k < K; ++k) {
      double want = ref.s[ids[k]];
      if (p.norm_topk_prob) want /= sum + (p.scoring == ScoringFunc::kSigmoid ? 1e-20 : 0.0);
      if (!p.norm_topk_prob || p.scoring == ScoringFunc::kSigmoid) {
        want *= p.routed_scaling_factor;
      }
      max_rel = std::max(max_rel, std::abs(w[k] - want) / std::abs(want));
    }
  }
  // Random logits have no ties: every row matches exactly.
  EXPECT_EQ(exact_rows, T);
  EXPECT_LT(max_rel, 1e-5);
  std::printf("max_rel_err moe_route(T=%d E=%d K=%d G=%d) %.3g\n", T, E, K, p.n_group, max_rel);
}

TEST(MoeRoute, RandomAgainstDoubleReference) {
  for (int T : {1, 5, 33}) {
    RoutingParams p;
    p.num_experts = 16;
    p.top_k = 4;
    p.n_group = 4;
    p.topk_group = 2;

    p.scoring = ScoringFunc::kSoftmax;
    p.method = TopkMethod::kGreedy;
    p.n_group = 1;
    p.topk_group = 1;
    p.routed_scaling_factor = 1.5f;
    CompareWithReference(p, T, 100 + T);
    p.norm_topk_prob = true;
    CompareWithReference(p, T, 200 + T);

    p.n_group = 4;
    p.topk_group = 2;
    p.method = TopkMethod::kGroupLimitedGreedy;
    p.norm_topk_prob = false;
    p.routed_scaling_factor = 16.0f;
    CompareWithReference(p, T, 300 + T);
    p.norm_topk_prob = true;
    CompareWithReference(p, T, 400 + T);

    p.scoring = ScoringFunc::kSigmoid;
    p.method = TopkMethod::kNoauxTc;
    p.routed_scaling_factor = 2.5f;
    CompareWithReference(p, T, 500 + T);
    p.norm_topk_prob = false;
    CompareWithReference(p, T, 600 + T);
  }
  RoutingParams p;
  p.num_experts = 64;
  p.top_k = 6;
  p.scoring = ScoringFunc::kSoftmax;
  p.method = TopkMethod::kGreedy;
  for (int T : {1, 5, 33}) CompareWithReference(p, T, 700 + T);
}

TEST(MoeRoute, RejectsBadParams) {
  Owned l = Make(DType::kF32, {2, 16});
  Owned b = Make(DType::kF32, {16});
  Owned ids = Make(DType::kI32, {2, 4});
  Owned w = Make(DType::kF32, {2, 4});
  auto run = [&](RoutingParams p) { return MoeRoute(HostStream(), p, l.t, b.t, ids.t, w.t); };
  RoutingParams good;
  good.num_experts = 16;
  good.top_k = 4;
  good.n_group = 4;
  good.topk_group = 2;
  good.scoring = ScoringFunc::kSigmoid;
  good.method = TopkMethod::kNoauxTc;
  ASSERT_OK(run(good));

  struct Case {
    const char* field;
    RoutingParams p;
  };
  std::vector<Case> cases;
  RoutingParams p = good;
  p.n_group = 3;  // 16 % 3 != 0
  cases.push_back({"n_group", p});
  p = good;
  p.topk_group = 5;
  cases.push_back({"topk_group", p});
  p = good;
  p.topk_group = 1;  // only 4 experts selectable, K = 4 is fine ...
  p.top_k = 4;
  ASSERT_OK(run(p));
  p.topk_group = 1;  // ... but not 5 (shapes aside, params are checked first)
  p.top_k = 5;
  cases.push_back({"top_k", p});
  p = good;
  p.top_k = 17;
  cases.push_back({"top_k", p});
  p = good;
  p.num_experts = 0;
  cases.push_back({"num_experts", p});
  for (const Case& c : cases) {
    absl::Status st = run(c.p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find(c.field), absl::string_view::npos) << st;
  }

  // Shape / dtype errors name the tensor; noaux_tc needs the bias.
  Owned wrong_ids = Make(DType::kI32, {2, 3});
  absl::Status st = MoeRoute(HostStream(), good, l.t, b.t, wrong_ids.t, w.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("topk_ids"), absl::string_view::npos) << st;
  st = MoeRoute(HostStream(), good, l.t, Tensor(), ids.t, w.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("correction_bias"), absl::string_view::npos) << st;
  // Greedy ignores the bias.
  RoutingParams greedy = good;
  greedy.scoring = ScoringFunc::kSoftmax;
  greedy.method = TopkMethod::kGreedy;
  EXPECT_OK(MoeRoute(HostStream(), greedy, l.t, Tensor(), ids.t, w.t));
}

// ---------------------------------------------------------------------------
// Routed experts

struct ExpertsCase {
  int T, D, I, E, K;
};

struct ExpertsData {
  ExpertsCase c;
  int L;
  Owned x, ids, w, map, w_gu, w_down;
  std::vector<double> x_d, w_gu_d, w_down_d;
};

// Random x, distinct random ids per token, weights, and `L` experts' weights.
ExpertsData MakeExperts(const ExpertsCase& c, int L, uint32_t seed) {
  ExpertsData d;
  d.c = c;
  d.L = L;
  d.x = Make(DType::kF32, {c.T, c.D});
  d.ids = Make(DType::kI32, {c.T, c.K});
  d.w = Make(DType::kF32, {c.T, c.K});
  d.map = Make(DType::kI32, {c.E});
  d.w_gu = Make(DType::kF32, {L, 2 * c.I, c.D});
  d.w_down = Make(DType::kF32, {L, c.D, c.I});
  d.x_d = FillRandom(d.x, seed);
  FillRandom(d.w, seed + 1, 0.1f, 1.0f);
  const float scale_gu = 2.0f / std::sqrt(static_cast<float>(c.D));
  const float scale_dn = 2.0f / std::sqrt(static_cast<float>(c.I));
  d.w_gu_d = FillRandom(d.w_gu, seed + 2, -scale_gu, scale_gu);
  d.w_down_d = FillRandom(d.w_down, seed + 3, -scale_dn, scale_dn);
  std::mt19937 rng(seed + 4);
  std::vector<int32_t> perm(c.E);
  for (int t = 0; t < c.T; ++t) {
    for (int e = 0; e < c.E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < c.K; ++k) d.ids.data<int32_t>()[t * c.K + k] = perm[k];
  }
  return d;
}

void SetMap(const ExpertsData& d, const std::vector<int32_t>& map) {
  std::memcpy(d.map.t.data(), map.data(), map.size() * sizeof(int32_t));
}

// Plain double reference: per token, per k, f_e in double.
std::vector<double> RefExperts(const ExpertsData& d) {
  const ExpertsCase& c = d.c;
  std::vector<double> out(static_cast<size_t>(c.T) * c.D, 0.0);
  std::vector<double> a(c.I);
  for (int t = 0; t < c.T; ++t) {
    for (int k = 0; k < c.K; ++k) {
      const int e = d.ids.data<int32_t>()[t * c.K + k];
      if (e < 0 || e >= c.E) continue;
      const int slot = d.map.data<int32_t>()[e];
      if (slot < 0 || slot >= d.L) continue;
      const double* gu = d.w_gu_d.data() + static_cast<size_t>(slot) * 2 * c.I * c.D;
      const double* dn = d.w_down_d.data() + static_cast<size_t>(slot) * c.D * c.I;
      const double* xt = d.x_d.data() + static_cast<size_t>(t) * c.D;
      for (int i = 0; i < c.I; ++i) {
        double g = 0, u = 0;
        for (int j = 0; j < c.D; ++j) {
          g += gu[static_cast<size_t>(i) * c.D + j] * xt[j];
          u += gu[static_cast<size_t>(c.I + i) * c.D + j] * xt[j];
        }
        a[i] = g / (1.0 + std::exp(-g)) * u;
      }
      const double wk = d.w.data<float>()[t * c.K + k];
      for (int j = 0; j < c.D; ++j) {
        double f = 0;
        for (int i = 0; i < c.I; ++i) f += dn[static_cast<size_t>(j) * c.I + i] * a[i];
        out[static_cast<size_t>(t) * c.D + j] += wk * f;
      }
    }
  }
  return out;
}

Owned RunExperts(const ExpertsData& d) {
  Owned out = Make(DType::kF32, {d.c.T, d.c.D});
  PoisonNaN(out);
  absl::Status st =
      MoeExperts(HostStream(), d.x.t, d.ids.t, d.w.t, d.map.t, d.w_gu.t, d.w_down.t, out.t);
  EXPECT_OK(st);
  EXPECT_EQ(CountNaN(out), 0);
  return out;
}

TEST(MoeExperts, AgainstDoubleReference) {
  const ExpertsCase cases[] = {
      {1, 24, 12, 16, 4}, {7, 256, 112, 16, 4}, {33, 24, 112, 16, 4}, {33, 256, 12, 16, 4}};
  uint32_t seed = 10;
  for (const ExpertsCase& c : cases) {
    // All experts held, in a permuted slot order.
    {
      ExpertsData d = MakeExperts(c, c.E, seed++);
      std::vector<int32_t> map(c.E);
      for (int e = 0; e < c.E; ++e) map[e] = (e * 5 + 3) % c.E;  // 5 is coprime to 16
      SetMap(d, map);
      Owned out = RunExperts(d);
      const double err = MaxRelError(out, RefExperts(d));
      EXPECT_LT(err, 1e-5);
      std::printf("max_rel_err moe_experts(T=%d D=%d I=%d full) %.3g\n", c.T, c.D, c.I, err);
    }
    // A subset: the odd experts, in slots 0..E/2-1; the rest are -1 and their
    // contributions must be left out. Token 0 also gets invalid ids.
    {
      ExpertsData d = MakeExperts(c, c.E / 2, seed++);
      std::vector<int32_t> map(c.E, -1);
      for (int e = 1; e < c.E; e += 2) map[e] = e / 2;
      SetMap(d, map);
      d.ids.data<int32_t>()[0] = -1;
      if (c.K > 1) d.ids.data<int32_t>()[1] = c.E;
      Owned out = RunExperts(d);
      std::vector<double> want = RefExperts(d);
      const double err = MaxRelError(out, want);
      EXPECT_LT(err, 1e-5);
      std::printf("max_rel_err moe_experts(T=%d D=%d I=%d subset) %.3g\n", c.T, c.D, c.I, err);
    }
  }
}

TEST(MoeExperts, TokenWithNoLocalExpertIsZero) {
  ExpertsData d = MakeExperts({3, 24, 12, 16, 4}, 4, 77);
  std::vector<int32_t> map(16, -1);
  for (int e = 0; e < 4; ++e) map[e] = e;
  SetMap(d, map);
  // Token 1 only routes to experts 8..11 (not held); token 0 to 0..3.
  for (int k = 0; k < 4; ++k) {
    d.ids.data<int32_t>()[0 * 4 + k] = k;
    d.ids.data<int32_t>()[1 * 4 + k] = 8 + k;
  }
  Owned out = RunExperts(d);
  for (int j = 0; j < 24; ++j) EXPECT_EQ(out.data<float>()[24 + j], 0.0f) << j;
  double norm0 = 0;
  for (int j = 0; j < 24; ++j) norm0 += std::abs(out.data<float>()[j]);
  EXPECT_GT(norm0, 0.0);
  EXPECT_LT(MaxRelError(out, RefExperts(d)), 1e-5);
}

TEST(MoeExperts, TwoRanksSumToFullMap) {
  // Rank 0 holds experts 0..7, rank 1 holds 8..15, each in slots 0..7 with
  // the matching slices of the full weights. out_0 + out_1 == out_full.
  const ExpertsCase c{33, 256, 112, 16, 4};
  ExpertsData full = MakeExperts(c, 16, 91);
  std::vector<int32_t> map(16);
  for (int e = 0; e < 16; ++e) map[e] = e;
  SetMap(full, map);
  Owned out_full = RunExperts(full);

  std::vector<double> sum(static_cast<size_t>(c.T) * c.D, 0.0);
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t gu_per = 2LL * c.I * c.D, dn_per = 1LL * c.D * c.I;
    Tensor w_gu(full.w_gu.data<float>() + rank * 8 * gu_per, DType::kF32, {8, 2 * c.I, c.D});
    Tensor w_dn(full.w_down.data<float>() + rank * 8 * dn_per, DType::kF32, {8, c.D, c.I});
    Owned rmap = Make(DType::kI32, {16});
    for (int e = 0; e < 16; ++e) {
      rmap.data<int32_t>()[e] = (e / 8 == rank) ? e % 8 : -1;
    }
    Owned out = Make(DType::kF32, {c.T, c.D});
    PoisonNaN(out);
    ASSERT_OK(
        MoeExperts(HostStream(), full.x.t, full.ids.t, full.w.t, rmap.t, w_gu, w_dn, out.t));
    ASSERT_EQ(CountNaN(out), 0);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out.data<float>()[i];
  }
  const double err = MaxRelError(out_full, sum);
  EXPECT_LT(err, 1e-6);
  std::printf("max_rel_err moe_experts(two ranks vs full) %.3g\n", err);
}

TEST(MoeExperts, BitReproducibleAcrossThreadCounts) {
  const ExpertsCase c{33, 256, 112, 16, 4};
  ExpertsData d = MakeExperts(c, 16, 55);
  std::vector<int32_t> map(16);
  for (int e = 0; e < 16; ++e) map[e] = e;
  SetMap(d, map);
  Owned a = RunExperts(d);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Owned b = RunExperts(d);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(a.t.data(), b.t.data(), a.t.nbytes()), 0);
}

TEST(MoeExperts, RejectsBadShapes) {
  ExpertsData d = MakeExperts({3, 24, 12, 16, 4}, 4, 5);
  Owned out = Make(DType::kF32, {3, 24});
  Owned bad_down = Make(DType::kF32, {4, 24, 11});
  absl::Status st =
      MoeExperts(HostStream(), d.x.t, d.ids.t, d.w.t, d.map.t, d.w_gu.t, bad_down.t, out.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("w_down"), absl::string_view::npos) << st;
  Owned bad_w = Make(DType::kF32, {3, 3});
  st = MoeExperts(HostStream(), d.x.t, d.ids.t, bad_w.t, d.map.t, d.w_gu.t, d.w_down.t, out.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("topk_weights"), absl::string_view::npos) << st;
  Owned bad_map = Make(DType::kI64, {16});
  st = MoeExperts(HostStream(), d.x.t, d.ids.t, d.w.t, bad_map.t, d.w_gu.t, d.w_down.t, out.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("expert_map"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace mlag
