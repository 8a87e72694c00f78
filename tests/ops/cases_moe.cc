// Cases of MoeRoute and MoeExperts (kernels/moe.h).
//
// moe_route: router ids exact on every backend (ExpectInts), weights within
// 2e-6 normwise of a double-precision reference (f32 expf and sums: up to
// ~5e-7 seen, for softmax over 160 experts). The expected ids come from
//   - hand-worked rows (each also checked against the reference router, so
//     the reference itself is held to worked answers), and
//   - RefRouteToken, an independent router in double written here: full
//     sorts with an explicit comparator, dropped groups skipped.
// An f32 router and a double one agree exactly only where no decision hangs
// on rounding, so the inputs are drawn to make every decision either an
// exact tie (equal logits give equal scores in any precision; the rule sends
// them to the lower index) or clear of rounding by 1e-5: rows with a near tie
// are drawn again. The tie cases draw logits from four levels whose sums and
// differences have no coincidences, and use one bias for every expert (per-
// expert bias levels make group sums like (a + b) + c and a + (b + c) equal
// in exact arithmetic, which f32 and double round differently).
//
// moe_experts: 1e-5 normwise against per-(token, k) products in double (f32
// sgemm error is ~1e-6 at these sizes); bf16 and fp8 weights on tensor cores
// against the staged reference and its per-element bound (RefExpertsTensorCores). On CUDA each case
// also runs with a caller workspace of exactly MoeExpertsWorkspaceBytes and a larger one: the same
// bytes as with the per-stream scratch.
//
// moe_gate_route_experts: gate Linear, MoeRoute and MoeExperts captured as one
// graph; besides RunOp's replay-equals-eager check, the graph is replayed on
// new inputs written into the captured buffers and must give their reference
// results (the expert GEMMs are planned on the device from the new routing).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "kernels/moe.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"
#include "tests/ops/harness.h"
#include "tests/status_matchers.h"

namespace mlag::ops_test {
namespace {

constexpr DType kF32 = DType::kF32, kI32 = DType::kI32;
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t Index(int64_t i) { return static_cast<size_t>(i); }

// ---- Routing: the reference -------------------------------------------------------------

RoutingParams Params(int E, int K, int G, int topk_group, ScoringFunc scoring, TopkMethod method,
                     bool norm, float scale) {
  RoutingParams p;
  p.num_experts = E;
  p.top_k = K;
  p.n_group = G;
  p.topk_group = topk_group;
  p.scoring = scoring;
  p.method = method;
  p.norm_topk_prob = norm;
  p.routed_scaling_factor = scale;
  return p;
}

std::string MethodName(const RoutingParams& p) {
  const char* scoring = p.scoring == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
  const char* method = p.method == TopkMethod::kGreedy               ? "greedy"
                       : p.method == TopkMethod::kGroupLimitedGreedy ? "group_limited"
                                                                     : "noaux_tc";
  return absl::StrCat(scoring, " ", method, " E ", p.num_experts, " K ", p.top_k, " G ", p.n_group,
                      " keep ", p.topk_group, p.norm_topk_prob ? " norm" : "", " scale ",
                      p.routed_scaling_factor);
}

struct RefRoute {
  std::vector<int32_t> ids;     // [K], best first
  std::vector<double> weights;  // [K]
  // Every decision (the order of the K picks, the K-th against the next, the
  // kept groups against the next) is an exact tie or clear of rounding.
  bool well_posed = true;
  // An exact tie decided a pick, its place, or a kept group.
  bool tie_decided = false;
};

// Two values an f32 router might order differently from a double one: not
// equal, yet within 1e-5 (relative above 1).
bool NearTie(double a, double b) {
  if (a == b || std::isinf(a) || std::isinf(b)) return false;
  return std::abs(a - b) <= 1e-5 * std::max({1.0, std::abs(a), std::abs(b)});
}

// Indices of `v` best first: higher value first, the lower index among equals.
std::vector<int> Ranked(const std::vector<double>& v) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return v[Index(a)] > v[Index(b)] || (v[Index(a)] == v[Index(b)] && a < b);
  });
  return order;
}

// Checks the boundaries a selection of the first `n` of `order` depends on:
// the pairs (0, 1) .. (n - 1, n) when `ordered`, else only (n - 1, n).
void CheckDecisions(const std::vector<double>& v, const std::vector<int>& order, size_t n,
                    bool ordered, RefRoute* r) {
  for (size_t i = ordered ? 1 : n; i <= n && i < order.size(); ++i) {
    const double a = v[Index(order[i - 1])], b = v[Index(order[i])];
    if (NearTie(a, b)) r->well_posed = false;
    if (a == b && !std::isinf(a)) r->tie_decided = true;
  }
}

// One token of MoEGate in double: scores, selection scores, group masking
// and top-k, then the weights.
RefRoute RefRouteToken(const RoutingParams& p, const double* logits, const double* bias) {
  const int E = p.num_experts, G = p.n_group, per = E / G;
  std::vector<double> s(Index(E));
  if (p.scoring == ScoringFunc::kSoftmax) {
    const double m = *std::max_element(logits, logits + E);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(logits[e] - m);
    for (int e = 0; e < E; ++e) s[Index(e)] = std::exp(logits[e] - m) / sum;
  } else {
    for (int e = 0; e < E; ++e) s[Index(e)] = 1.0 / (1.0 + std::exp(-logits[e]));
  }
  std::vector<double> sel = s;
  if (p.method == TopkMethod::kNoauxTc) {
    for (int e = 0; e < E; ++e) sel[Index(e)] += bias[e];
  }
  RefRoute r;
  if (p.method != TopkMethod::kGreedy) {
    // Group score: the best selection score (group_limited_greedy), or the
    // sum of the best two, the larger first (noaux_tc).
    std::vector<double> group_score(Index(G));
    for (int g = 0; g < G; ++g) {
      std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<double>());
      group_score[Index(g)] = p.method == TopkMethod::kNoauxTc && per > 1 ? v[0] + v[1] : v[0];
    }
    const std::vector<int> groups = Ranked(group_score);
    CheckDecisions(group_score, groups, Index(p.topk_group), false, &r);
    for (size_t j = Index(p.topk_group); j < groups.size(); ++j) {
      for (int i = 0; i < per; ++i) sel[Index(groups[j] * per + i)] = -kInf;
    }
  }
  const std::vector<int> order = Ranked(sel);
  CheckDecisions(sel, order, Index(p.top_k), true, &r);
  double sum = 0.0;
  for (int k = 0; k < p.top_k; ++k) {
    r.ids.push_back(order[Index(k)]);
    r.weights.push_back(s[Index(order[Index(k)])]);
    sum += r.weights.back();
  }
  const bool sigmoid = p.scoring == ScoringFunc::kSigmoid;
  for (double& w : r.weights) {
    if (p.norm_topk_prob) w /= sum + (sigmoid ? 1e-20 : 0.0);
    if (!p.norm_topk_prob || sigmoid) w *= p.routed_scaling_factor;
  }
  return r;
}

// The routing outputs of T tokens, laid out as MoeRoute writes them.
struct RouteWant {
  std::vector<int64_t> ids;
  std::vector<double> weights;
};

RouteWant RefRouteAll(const RoutingParams& p, const std::vector<double>& logits, int64_t T,
                      const std::vector<double>& bias) {
  RouteWant want;
  for (int64_t t = 0; t < T; ++t) {
    const RefRoute r = RefRouteToken(p, logits.data() + t * p.num_experts, bias.data());
    want.ids.insert(want.ids.end(), r.ids.begin(), r.ids.end());
    want.weights.insert(want.weights.end(), r.weights.begin(), r.weights.end());
  }
  return want;
}

// Runs MoeRoute on `logits` (`bias` for noaux_tc, or for any method when
// `pass_bias`: the others must ignore it) and checks ids and weights.
void RunRoute(Context& ctx, const RoutingParams& p, Buf& logits, Buf& bias, bool pass_bias,
              const RouteWant& want) {
  const int64_t T = logits.shape[0], K = p.top_k;
  Buf& ids = ctx.Output("topk_ids", kI32, {T, K}, 0, 1, 2);
  Buf& weights = ctx.Output("topk_weights", kF32, {T, K}, 0, 2, 1);
  const bool use_bias = pass_bias || p.method == TopkMethod::kNoauxTc;
  ctx.RunOp({&ids, &weights}, [&](Stream& s) {
    return MoeRoute(s, p, logits.t, use_bias ? bias.t : Tensor(), ids.t, weights.t);
  });
  ctx.ExpectInts(ids, want.ids);
  ctx.ExpectClose(weights, want.weights, Tolerance::F32(2e-6));
}

// ---- Routing: hand-worked rows ---------------------------------------------------------

struct HandRow {
  RoutingParams p;
  std::vector<double> logits;  // [E], stored as f32
  std::vector<double> bias;    // [E] (noaux_tc), else empty
  std::vector<int64_t> ids;
  std::vector<double> weights;
};

std::vector<double> Logs(const std::vector<double>& e) {
  std::vector<double> l;
  for (double v : e) l.push_back(std::log(v));
  return l;
}

// Logits whose sigmoids are `s`.
std::vector<double> Logits(const std::vector<double>& s) {
  std::vector<double> l;
  for (double v : s) l.push_back(std::log(v / (1.0 - v)));
  return l;
}

void HandRouteCase(Context& ctx, const HandRow& c) {
  const int64_t E = c.p.num_experts;
  Buf& logits = ctx.Make("logits", kF32, {1, E}, 0, 1, 1);
  for (int64_t e = 0; e < E; ++e)
    logits.HostData<float>()[e] = static_cast<float>(c.logits[Index(e)]);
  ctx.Upload(logits);
  Buf& bias = ctx.Make("correction_bias", kF32, {E});  // zeros where the method has none
  for (int64_t e = 0; e < E; ++e) {
    bias.HostData<float>()[e] = c.bias.empty() ? 0.0f : static_cast<float>(c.bias[Index(e)]);
  }
  ctx.Upload(bias);
  // The reference router must find the worked answer too.
  const RefRoute ref = RefRouteToken(c.p, logits.Values().data(), bias.Values().data());
  EXPECT_EQ(std::vector<int64_t>(ref.ids.begin(), ref.ids.end()), c.ids) << "reference router";
  RunRoute(ctx, c.p, logits, bias, false, {c.ids, c.weights});
}

std::vector<std::pair<std::string, HandRow>> HandRows() {
  using S = ScoringFunc;
  using M = TopkMethod;
  std::vector<std::pair<std::string, HandRow>> rows;
  // exp(l) = [1, 2, 1, 4, 1, 1, 2, 1], sum 13: expert 3 (4/13) first; 1 and
  // 6 tie at 2/13 and the lower index, 1, wins. w = [4, 2] / 13.
  rows.push_back({"softmax greedy",
                  {Params(8, 2, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
                   Logs({1, 2, 1, 4, 1, 1, 2, 1}),
                   {},
                   {3, 1},
                   {4.0 / 13, 2.0 / 13}}});
  // norm_topk_prob: w = [4, 2] / 6, and softmax skips the scaling factor.
  rows.push_back({"softmax greedy norm skips scaling",
                  {Params(8, 2, 1, 1, S::kSoftmax, M::kGreedy, true, 16.0f),
                   Logs({1, 2, 1, 4, 1, 1, 2, 1}),
                   {},
                   {3, 1},
                   {4.0 / 6, 2.0 / 6}}});
  // Groups {0,1} {2,3} {4,5} {6,7}; exp(l) = [1, 3, 2, 2, 5, 1, 1, 4], sum
  // 19. Group scores (max) [3, 2, 5, 4] / 19 keep groups 2 and 3; top-3 of
  // 4 (5), 5 (1), 6 (1), 7 (4) is 4, 7, then 5 (tie with 6, lower index).
  // Ungrouped it would be 4, 7, 1. w = 2 * [5, 4, 1] / 19.
  rows.push_back({"softmax group_limited_greedy",
                  {Params(8, 3, 4, 2, S::kSoftmax, M::kGroupLimitedGreedy, false, 2.0f),
                   Logs({1, 3, 2, 2, 5, 1, 1, 4}),
                   {},
                   {4, 7, 5},
                   {10.0 / 19, 8.0 / 19, 2.0 / 19}}});
  // exp(l) = [2, 1, 2, 1.9, 1, 1, 1, 1]: groups 0 and 1 both score 2 (the
  // same logit); the one kept group is group 0: ids [0, 1] (group 1 would
  // give [2, 3], no grouping [0, 2]). w = [2, 1] / 10.9.
  rows.push_back({"softmax group tie keeps the lower group",
                  {Params(8, 2, 4, 1, S::kSoftmax, M::kGroupLimitedGreedy, false, 1.0f),
                   Logs({2, 1, 2, 1.9, 1, 1, 1, 1}),
                   {},
                   {0, 1},
                   {2 / 10.9, 1 / 10.9}}});
  // s = [0.5, 0.25, 0.75, 0.2, 0.8, 0.5, 0.25, 0.9], bias [0, .5, 0, 0,
  // -.25, 0, .25, -.5]: b = [0.5, 0.75, 0.75, 0.2, 0.55, 0.5, 0.5, 0.4];
  // group scores (top-2 sums) 1.25, 0.95, 1.05, 0.9 keep g0 and g2; of 0, 1,
  // 4, 5 the top-2 by b is [1, 4] (s alone: [7, 4]; b ungrouped: [1, 2]).
  // w = s[ids] = [0.25, 0.8] / 1.05 * 2.5.
  rows.push_back({"sigmoid noaux_tc",
                  {Params(8, 2, 4, 2, S::kSigmoid, M::kNoauxTc, true, 2.5f),
                   Logits({0.5, 0.25, 0.75, 0.2, 0.8, 0.5, 0.25, 0.9}),
                   {0, 0.5, 0, 0, -0.25, 0, 0.25, -0.5},
                   {1, 4},
                   {0.625 / 1.05, 2.0 / 1.05}}});
  // bias -1 everywhere: every b = s - 1 < 0. s = [.5, .75, .25, .2, .8, .9,
  // .25, .5]; group scores -0.75, -1.55, -0.3, -1.25 keep g2, g0; of 0, 1,
  // 4, 5 (b -0.5, -0.25, -0.2, -0.1) the picks are [5, 4]. Masking dropped
  // groups with 0 instead of -inf would rank experts 2, 3 first.
  // w = 2.5 * [0.9, 0.8].
  rows.push_back({"negative bias masks with -inf",
                  {Params(8, 2, 4, 2, S::kSigmoid, M::kNoauxTc, false, 2.5f),
                   Logits({0.5, 0.75, 0.25, 0.2, 0.8, 0.9, 0.25, 0.5}),
                   std::vector<double>(8, -1.0),
                   {5, 4},
                   {2.25, 2.0}}});
  // All logits equal: experts 0, 1, 2, each 1/8.
  rows.push_back({"equal scores go to the lower index",
                  {Params(8, 3, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
                   std::vector<double>(8, 0.3),
                   {},
                   {0, 1, 2},
                   {0.125, 0.125, 0.125}}});
  // Sigmoid noaux_tc, zero logits and bias: every group ties, groups 0 and 1
  // are kept, ids 0, 1, 2; w = 0.5 each, normalised to 1/3.
  rows.push_back({"equal scores and groups go to the lower index",
                  {Params(8, 3, 4, 2, S::kSigmoid, M::kNoauxTc, true, 1.0f),
                   std::vector<double>(8, 0.0),
                   std::vector<double>(8, 0.0),
                   {0, 1, 2},
                   {1.0 / 3, 1.0 / 3, 1.0 / 3}}});
  // s = 0.5 everywhere; bias [0, 0, .25, -.25, 0, 0, -.125, -.125]: b =
  // [.5, .5, .75, .25, .5, .5, .375, .375]; groups 0, 1, 2 all score exactly
  // 1.0 (g3 0.75); the one kept group is 0: ids [0, 1] (group 1 would give
  // [2, 3], no grouping [2, 0]). w = [0.5, 0.5] / (1 + 1e-20).
  rows.push_back({"noaux_tc group tie keeps the lower group",
                  {Params(8, 2, 4, 1, S::kSigmoid, M::kNoauxTc, true, 1.0f),
                   std::vector<double>(8, 0.0),
                   {0, 0, 0.25, -0.25, 0, 0, -0.125, -0.125},
                   {0, 1},
                   {0.5, 0.5}}});
  return rows;
}

// ---- Routing: random rows and exact ties --------------------------------------------------

std::vector<RoutingParams> RouteConfigs() {
  using S = ScoringFunc;
  using M = TopkMethod;
  return {
      Params(64, 6, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
      Params(160, 6, 1, 1, S::kSoftmax, M::kGreedy, true, 1.0f),
      Params(16, 4, 1, 1, S::kSoftmax, M::kGreedy, false, 1.5f),
      Params(8, 8, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),  // K = E
      Params(160, 6, 8, 3, S::kSoftmax, M::kGroupLimitedGreedy, false, 16.0f),
      Params(72, 5, 6, 2, S::kSoftmax, M::kGroupLimitedGreedy, true, 16.0f),
      Params(16, 4, 4, 2, S::kSoftmax, M::kGroupLimitedGreedy, false, 16.0f),
      Params(256, 8, 8, 4, S::kSigmoid, M::kNoauxTc, true, 2.5f),  // DeepSeek-V3
      Params(72, 5, 6, 2, S::kSigmoid, M::kNoauxTc, false, 2.5f),
      Params(16, 3, 16, 5, S::kSigmoid, M::kNoauxTc, true, 1.0f),  // one expert per group
      Params(16, 4, 4, 2, S::kSigmoid, M::kNoauxTc, true, 2.5f),
      Params(64, 4, 1, 1, S::kSigmoid, M::kGreedy, true, 1.5f),
      Params(64, 4, 4, 2, S::kSigmoid, M::kGroupLimitedGreedy, false, 1.0f),
      Params(32, 3, 4, 2, S::kSoftmax, M::kNoauxTc, false, 1.0f),
  };
}

// T tokens of logits in rows of E + 3, uniform in [-4, 4) or (`ties`) from
// four levels, each row drawn again until the reference's decisions are well
// posed. With `ties`, some row must have an exact tie decide a pick, its
// place or a kept group, or the case would test no tie.
void RandomRouteCase(Context& ctx, const RoutingParams& p, int64_t T, bool ties) {
  const int64_t E = p.num_experts;
  Buf& bias = ctx.Make("correction_bias", kF32, {E}, 0, 1, 1);
  ctx.Randomize(bias, -0.5, 0.5);
  if (ties) {
    // One bias for all experts: selection ties stay exact ties.
    for (int64_t e = 0; e < E; ++e) bias.HostData<float>()[e] = 0.25f;
    ctx.Upload(bias);
  }
  const std::vector<double> b = bias.Values();
  Buf& logits = ctx.Make("logits", kF32, {T, E}, 3, 2, 1);
  ctx.Randomize(logits, -4.0, 4.0);  // padding included
  std::mt19937 rng(ctx.NextSeed());
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::uniform_int_distribution<int> level(0, 3);
  const float kLevels[4] = {-0.9f, -0.2f, 0.3f, 1.1f};
  int tie_rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    float* row = logits.HostData<float>() + t * logits.strides[0];
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 100) << "no well-posed row drawn for token " << t;
      std::vector<double> l(Index(E));
      for (int64_t e = 0; e < E; ++e) {
        row[e] = ties ? kLevels[level(rng)] : uniform(rng);
        l[Index(e)] = row[e];
      }
      const RefRoute r = RefRouteToken(p, l.data(), b.data());
      if (!r.well_posed) continue;
      tie_rows += r.tie_decided ? 1 : 0;
      break;
    }
  }
  ctx.Upload(logits);
  if (ties) {
    EXPECT_GT(tie_rows, 0) << "no exact tie decided anything: the case tests no tie";
  }
  const bool pass_bias = !ties;  // random cases also show the other methods ignore it
  RunRoute(ctx, p, logits, bias, pass_bias, RefRouteAll(p, logits.Values(), T, b));
}

// ---- Router whole: gate and routing (MoeGateRoute) -----------------------------------------

// x [T, D] (rows of D + 2) and w_gate [E, D] drawn from levels whose
// products are multiples of 2^-6 and whose sums stay below 2^17: every
// logit is exact in f32 in any summation order, so the CUDA kernel's order
// cannot move a decision and the reference's well-posedness (and its exact
// ties, from the few levels) carries over. Token rows are drawn again until
// the reference's decisions are well posed. Checks the logits exactly, the
// ids exactly and the weights as moe_route does; on CUDA the fused launch's
// counter must be back at 0 after the eager run and two graph replays
// (RunOp), and T = 40 takes the two-launch path.
void GateRouteCase(Context& ctx, const RoutingParams& p, int64_t T, int64_t D) {
  const int64_t E = p.num_experts, K = p.top_k;
  Buf& bias = ctx.Make("correction_bias", kF32, {E});
  ctx.Randomize(bias, -0.5, 0.5);
  const std::vector<double> b = bias.Values();
  Buf& w = ctx.Make("w_gate", kF32, {E, D});
  Buf& x = ctx.Make("x", kF32, {T, D}, 2, 0, 1);
  std::mt19937 rng(ctx.NextSeed());
  std::uniform_int_distribution<int> wl(-4, 4), xl(-8, 8);
  for (int64_t i = 0; i < E * D; ++i) w.HostData<float>()[i] = static_cast<float>(wl(rng)) / 8.0f;
  ctx.Upload(w);
  const std::vector<double> wv = w.Values();
  std::vector<double> logits(Index(T * E));
  for (int64_t t = 0; t < T; ++t) {
    float* row = x.HostData<float>() + t * x.strides[0];
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 200) << "no well-posed row drawn for token " << t;
      for (int64_t d = 0; d < D; ++d) row[d] = static_cast<float>(xl(rng)) / 8.0f;
      for (int64_t e = 0; e < E; ++e) {
        double acc = 0.0;
        for (int64_t d = 0; d < D; ++d) acc += double{row[d]} * wv[Index(e * D + d)];
        logits[Index(t * E + e)] = acc;
      }
      if (RefRouteToken(p, logits.data() + t * E, b.data()).well_posed) break;
    }
  }
  ctx.Upload(x);
  Buf& out_logits = ctx.Output("router_logits", kF32, {T, E}, 0, 1);
  Buf& ids = ctx.Output("topk_ids", kI32, {T, K});
  Buf& weights = ctx.Output("topk_weights", kF32, {T, K});
  Buf& counter = ctx.Make("counter", kI32, {1});
  counter.HostData<int32_t>()[0] = 0;
  ctx.Upload(counter);
  const bool noaux = p.method == TopkMethod::kNoauxTc;
  ctx.RunOp({&out_logits, &ids, &weights}, [&](Stream& s) {
    return MoeGateRoute(s, p, x.t, w.t, noaux ? bias.t : Tensor(), out_logits.t,
                        ctx.is_cuda() ? counter.t : Tensor(), ids.t, weights.t);
  });
  ctx.ExpectClose(out_logits, logits, Tolerance::F32(0.0));
  const RouteWant want = RefRouteAll(p, logits, T, b);
  ctx.ExpectInts(ids, want.ids);
  ctx.ExpectClose(weights, want.weights, Tolerance::F32(2e-6));
  if (ctx.is_cuda()) {
    EXPECT_EQ(ctx.DeviceValues(counter), std::vector<double>{0.0}) << "counter left set";
  }
}

// ---- Experts -----------------------------------------------------------------------------

enum class MapKind {
  kAll,      // every expert held, in shuffled slots
  kPartial,  // min(L, max(1, E / 2)) experts held, the rest -1; slots above unused
};

struct ExpertsCase {
  int64_t T, K, E, L, D, I;
  MapKind map;
  bool invalid_ids;  // every 7th (token, k) pair gets an id outside [0, E)
  int64_t x_pad;     // extra elements per row of x
};

std::string Name(const ExpertsCase& c) {
  return absl::StrCat("T ", c.T, " K ", c.K, " E ", c.E, " L ", c.L, " D ", c.D, " I ", c.I,
                      c.map == MapKind::kPartial ? " partial map" : "",
                      c.invalid_ids ? " invalid ids" : "", c.x_pad ? " x pad " : "",
                      c.x_pad ? absl::StrCat(c.x_pad) : "");
}

// The experts' inputs as the reference reads them.
struct ExpertsRef {
  int64_t T, K, E, L, D, I;
  std::vector<double> x;          // [T, D]
  std::vector<int64_t> ids;       // [T, K]
  std::vector<double> weights;    // [T, K]
  std::vector<int64_t> map;       // [E]
  std::vector<double> w_gate_up;  // [L, 2I, D]
  std::vector<double> w_down;     // [L, D, I]
};

// The local slot of (token, k) pair p, or -1 when its id or slot is out of range.
int64_t SlotOfPair(const ExpertsRef& r, int64_t p) {
  const int64_t e = r.ids[Index(p)];
  if (e < 0 || e >= r.E) return -1;
  const int64_t slot = r.map[Index(e)];
  return slot >= 0 && slot < r.L ? slot : -1;
}

// out[t] = sum over valid k of weights[t,k] * W_down (silu(W_gate x) * (W_up x)), in double.
std::vector<double> RefExperts(const ExpertsRef& r) {
  std::vector<double> out(Index(r.T * r.D), 0.0), act(Index(r.I));
  for (int64_t t = 0; t < r.T; ++t) {
    const double* xt = r.x.data() + t * r.D;
    for (int64_t k = 0; k < r.K; ++k) {
      const int64_t slot = SlotOfPair(r, t * r.K + k);
      if (slot < 0) continue;
      const double* gu = r.w_gate_up.data() + slot * 2 * r.I * r.D;
      const double* dn = r.w_down.data() + slot * r.D * r.I;
      for (int64_t i = 0; i < r.I; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t j = 0; j < r.D; ++j) {
          g += gu[i * r.D + j] * xt[j];
          u += gu[(r.I + i) * r.D + j] * xt[j];
        }
        act[Index(i)] = g / (1.0 + std::exp(-g)) * u;
      }
      const double w = r.weights[Index(t * r.K + k)];
      for (int64_t j = 0; j < r.D; ++j) {
        double f = 0.0;
        for (int64_t i = 0; i < r.I; ++i) f += dn[j * r.I + i] * act[Index(i)];
        out[Index(t * r.D + j)] += w * f;
      }
    }
  }
  return out;
}

// The inputs of one MoeExperts call: buffers, and the expert weights as
// tensors (views into larger buffers for a rank's slice) with their values.
struct ExpertsBufs {
  Buf *x, *ids, *weights, *map;
  Tensor w_gate_up, w_down;
  std::vector<double> w_gate_up_values, w_down_values;
};

// K distinct experts per token (as routed), weights in [0.05, 1), expert
// weights scaled so that outputs are O(1).
ExpertsBufs MakeExpertsInputs(Context& ctx, const ExpertsCase& c, std::mt19937& rng) {
  ExpertsBufs b;
  b.x = &ctx.Make("x", kF32, {c.T, c.D}, c.x_pad, 1);
  ctx.Randomize(*b.x);
  b.weights = &ctx.Make("topk_weights", kF32, {c.T, c.K});
  ctx.Randomize(*b.weights, 0.05, 1.0);
  const double gu_scale = 2.0 / std::sqrt(static_cast<double>(c.D));
  const double dn_scale = c.I > 0 ? 2.0 / std::sqrt(static_cast<double>(c.I)) : 1.0;
  Buf& w_gate_up = ctx.Make("w_gate_up", kF32, {c.L, 2 * c.I, c.D});
  ctx.Randomize(w_gate_up, -gu_scale, gu_scale);
  Buf& w_down = ctx.Make("w_down", kF32, {c.L, c.D, c.I});
  ctx.Randomize(w_down, -dn_scale, dn_scale);
  b.w_gate_up = w_gate_up.t;
  b.w_down = w_down.t;
  b.w_gate_up_values = w_gate_up.Values();
  b.w_down_values = w_down.Values();

  b.ids = &ctx.Make("topk_ids", kI32, {c.T, c.K});
  std::vector<int32_t> experts(Index(c.E));
  std::iota(experts.begin(), experts.end(), 0);
  int32_t* ids = b.ids->HostData<int32_t>();
  for (int64_t t = 0; t < c.T; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t k = 0; k < c.K; ++k) ids[t * c.K + k] = experts[Index(k % c.E)];
  }
  if (c.invalid_ids) {
    for (int64_t i = 0; i < c.T * c.K; i += 7) {
      ids[i] = i % 2 == 0 ? -1 : static_cast<int32_t>(c.E + i % 5);
    }
  }
  ctx.Upload(*b.ids);

  b.map = &ctx.Make("expert_map", kI32, {c.E});
  int32_t* map = b.map->HostData<int32_t>();
  std::fill(map, map + c.E, -1);
  std::shuffle(experts.begin(), experts.end(), rng);
  const int64_t held =
      c.map == MapKind::kPartial ? std::min(c.L, std::max<int64_t>(1, c.E / 2)) : c.L;
  for (int64_t s = 0; s < held && s < c.E; ++s) map[experts[Index(s)]] = static_cast<int32_t>(s);
  ctx.Upload(*b.map);
  return b;
}

std::vector<int64_t> Ints(const Buf& b) {
  std::vector<int64_t> v;
  for (double d : b.Values()) v.push_back(static_cast<int64_t>(d));
  return v;
}

ExpertsRef RefInputs(const ExpertsBufs& b) {
  ExpertsRef r;
  r.T = b.x->shape[0];
  r.D = b.x->shape[1];
  r.K = b.ids->shape[1];
  r.E = b.map->shape[0];
  r.L = b.w_gate_up.size(0);
  r.I = b.w_gate_up.size(1) / 2;
  r.x = b.x->Values();
  r.ids = Ints(*b.ids);
  r.weights = b.weights->Values();
  r.map = Ints(*b.map);
  r.w_gate_up = b.w_gate_up_values;
  r.w_down = b.w_down_values;
  return r;
}

absl::Status RunExperts(Stream& s, const ExpertsBufs& b, Buf& out, const Tensor& workspace) {
  return MoeExperts(s, b.x->t, b.ids->t, b.weights->t, b.map->t, b.w_gate_up, b.w_down, out.t,
                    workspace);
}

// ---- Experts on tensor cores: the reference and its error bound ----------------------------
//
// On tensor cores (MoeExpertsOnTensorCores) MoeExperts multiplies x as staged
// (bf16, or e4m3 per row and 128-column block) and stages the activations
// the same way for down (kernels/moe.h). The reference follows those steps in
// double and carries, per element, a bound on how far the device may be from
// it; every output must lie within its bound. The bound is what the
// instructions document (TensorCoreDotBound), not what the emulation shows:
//   - every f32 operation outside the mma rounds to nearest (unit 2^-24), and
//     expf is within 2 ulp;
//   - x's staging is bitwise reproducible (F32ToBf16, QuantizeFp8Blocks);
//     the activations' staging rounds the device's f32 value, which lies
//     within the gate_up bound of the reference's: where that interval
//     rounds (or, for fp8, with the block scale anywhere in its interval) to
//     one staged value the reference has it exactly, else the bound spans
//     every value it can round to.

double Bf16Round(double v) { return Bf16ToF32(F32ToBf16(static_cast<float>(v))); }

// x's row as the tensor-core GEMM multiplies it.
std::vector<double> StagedRow(DType dtype, const double* x, int64_t n) {
  std::vector<double> out(Index(n));
  if (dtype == DType::kBF16) {
    for (int64_t j = 0; j < n; ++j) out[Index(j)] = Bf16Round(x[j]);
    return out;
  }
  std::vector<float> row(Index(n));
  for (int64_t j = 0; j < n; ++j) row[Index(j)] = static_cast<float>(x[j]);
  std::vector<uint8_t> q(Index(n));
  std::vector<float> s(Index(Fp8Blocks(n)));
  QuantizeFp8Blocks(row.data(), 1, n, q.data(), s.data());
  for (int64_t j = 0; j < n; ++j) {
    out[Index(j)] = static_cast<double>(F8E4M3ToF32(q[Index(j)])) *
                    static_cast<double>(s[Index(j / kFp8BlockSize)]);
  }
  return out;
}

// The staged activations: for each a[i] (exact) with device error up to
// da[i], the value `want` the reference multiplies and `err`, how far the
// device's staged value may be from it.
void StageActivations(DType dtype, const std::vector<double>& a, const std::vector<double>& da,
                      std::vector<double>* want, std::vector<double>* err) {
  const size_t n = a.size();
  want->assign(n, 0.0);
  err->assign(n, 0.0);
  if (dtype == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      const double lo = Bf16Round(a[i] - da[i]), hi = Bf16Round(a[i] + da[i]);
      (*want)[i] = (lo + hi) / 2;
      (*err)[i] = (hi - lo) / 2;
    }
    return;
  }
  for (size_t b0 = 0; b0 < n; b0 += kFp8BlockSize) {
    const size_t b1 = std::min(n, b0 + static_cast<size_t>(kFp8BlockSize));
    double amax_lo = 0.0, amax_hi = 0.0;
    for (size_t i = b0; i < b1; ++i) {
      amax_lo = std::max(amax_lo, std::abs(a[i]) - da[i]);
      amax_hi = std::max(amax_hi, std::abs(a[i]) + da[i]);
    }
    // The device's scale: f32(amax / 448), or 1 for an all-zero block.
    std::vector<float> scales = {static_cast<float>(static_cast<float>(amax_hi) / 448.0f)};
    if (amax_lo > 0) scales.push_back(static_cast<float>(amax_lo) / 448.0f);
    if (amax_lo <= 0) scales.push_back(1.0f);
    const auto [s_min, s_max] = std::minmax_element(scales.begin(), scales.end());
    for (size_t i = b0; i < b1; ++i) {
      // e4m3(v / s) is monotonic in v and, for either sign of v, in s: its
      // extremes lie at the corners, and the staged value q s within
      // [q_min, q_max] x [s_min, s_max].
      double q_min = kInf, q_max = -kInf;
      for (float s : scales) {
        for (double v : {a[i] - da[i], a[i] + da[i]}) {
          const double q = F8E4M3ToF32(F32ToF8E4M3(static_cast<float>(v) / s));
          q_min = std::min(q_min, q);
          q_max = std::max(q_max, q);
        }
      }
      double lo = kInf, hi = -kInf;
      for (double q : {q_min, q_max}) {
        for (double s : {double{*s_min}, double{*s_max}}) {
          lo = std::min(lo, q * s);
          hi = std::max(hi, q * s);
        }
      }
      (*want)[i] = (lo + hi) / 2;
      (*err)[i] = (hi - lo) / 2;
    }
  }
}

// MoeExperts on tensor cores with `dtype` weights (their values in r), in
// double, with each output's error bound.
BoundedRef RefExpertsTensorCores(const ExpertsRef& r, DType dtype) {
  const double f32 = std::ldexp(1.0, -24);
  BoundedRef out{std::vector<double>(Index(r.T * r.D), 0.0),
                 std::vector<double>(Index(r.T * r.D), 0.0)};
  std::vector<double> sum_abs(Index(r.T * r.D), 0.0);  // sum_k |w| (|y| + dy)
  std::vector<double> a(Index(r.I)), da(Index(r.I)), act, act_err;
  for (int64_t t = 0; t < r.T; ++t) {
    const std::vector<double> xs = StagedRow(dtype, r.x.data() + t * r.D, r.D);
    for (int64_t k = 0; k < r.K; ++k) {
      const int64_t slot = SlotOfPair(r, t * r.K + k);
      if (slot < 0) continue;
      const double* gu = r.w_gate_up.data() + slot * 2 * r.I * r.D;
      const double* dn = r.w_down.data() + slot * r.D * r.I;
      for (int64_t i = 0; i < r.I; ++i) {
        double g = 0.0, u = 0.0, sg = 0.0, su = 0.0;
        for (int64_t j = 0; j < r.D; ++j) {
          g += gu[i * r.D + j] * xs[Index(j)];
          u += gu[(r.I + i) * r.D + j] * xs[Index(j)];
          sg += std::abs(gu[i * r.D + j] * xs[Index(j)]);
          su += std::abs(gu[(r.I + i) * r.D + j] * xs[Index(j)]);
        }
        const double dg = TensorCoreDotBound(dtype, r.D, sg),
                     du = TensorCoreDotBound(dtype, r.D, su);
        const double silu = g / (1.0 + std::exp(-g));
        a[Index(i)] = silu * u;
        // |silu'| <= 1.1; the f32 epilogue (expf, +, /, *) within 8 units.
        da[Index(i)] = 1.1 * (std::abs(u) + du) * dg + (std::abs(silu) + 1.1 * dg) * du +
                       8 * f32 * (std::abs(silu) + 1.1 * dg) * (std::abs(u) + du) + 1e-30;
      }
      StageActivations(dtype, a, da, &act, &act_err);
      const double w = r.weights[Index(t * r.K + k)];
      for (int64_t j = 0; j < r.D; ++j) {
        double y = 0.0, sy = 0.0, dy = 0.0;
        for (int64_t i = 0; i < r.I; ++i) {
          y += dn[j * r.I + i] * act[Index(i)];
          sy += std::abs(dn[j * r.I + i]) * (std::abs(act[Index(i)]) + act_err[Index(i)]);
          dy += std::abs(dn[j * r.I + i]) * act_err[Index(i)];
        }
        dy += TensorCoreDotBound(dtype, r.I, sy);
        out.want[Index(t * r.D + j)] += w * y;
        out.bound[Index(t * r.D + j)] += std::abs(w) * dy;
        sum_abs[Index(t * r.D + j)] += std::abs(w) * (std::abs(y) + dy);
      }
    }
  }
  // The combine: f32 products and a sum over at most K terms, in k order.
  for (size_t i = 0; i < out.bound.size(); ++i) {
    out.bound[i] += GammaBound(r.K + 1, f32) * sum_abs[i];
  }
  return out;
}

// Whether this backend runs `dtype` experts on tensor cores.
bool OnTensorCores(Context& ctx, DType dtype) {
  const absl::StatusOr<bool> yes = MoeExpertsOnTensorCores(ctx.stream().device(), dtype);
  EXPECT_TRUE(yes.ok()) << yes.status();
  return yes.ok() && *yes;
}

// Checks MoeExperts' output against the reference: on tensor cores within
// the bound above, and with `check_sensitivity` a reference with two rows of
// a used expert's w_down exchanged (fp8: only their first block scales) must
// fall outside it, so that the check can fail; elsewhere 1e-5 normwise
// against f32-exact products. fp8's bound assumes 14-bit accumulation and
// so spans about |y| where random signs cancel: its sensitivity is shown on
// inputs without cancellation (ExpertsCountsCase's `positive`).
void CheckExpertsOutput(Context& ctx, Buf& out, const ExpertsRef& r, DType dtype,
                        const std::vector<double>& down_scales, bool check_sensitivity) {
  if (!OnTensorCores(ctx, dtype)) {
    ctx.ExpectClose(out, RefExperts(r), Tolerance::F32(1e-5));
    return;
  }
  const std::vector<double> got = ctx.DeviceValues(out);
  const BoundedRef ref = RefExpertsTensorCores(r, dtype);
  std::string what;
  EXPECT_EQ(OutsideBound(got, ref, &what), 0) << "outputs outside the tensor-core bound:" << what;
  double bound_max = 0.0, want_max = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    bound_max = std::max(bound_max, ref.bound[i]);
    want_max = std::max(want_max, std::abs(ref.want[i]));
  }
  ::testing::Test::RecordProperty("max_bound_over_max_want",
                                  absl::StrCat(bound_max / std::max(want_max, 1e-300)));
  if (!check_sensitivity || r.D < 2 || r.I == 0) return;
  // The first slot with a row routed to it: row 0 of its w_down and another
  // exchange their block-0 scales (fp8: the row whose scale differs most) or
  // their values (bf16: row 1).
  int64_t used = -1;
  for (int64_t p = 0; p < static_cast<int64_t>(r.ids.size()) && used < 0; ++p) {
    used = SlotOfPair(r, p);
  }
  if (used < 0) return;
  ExpertsRef swapped = r;
  double* row0 = swapped.w_down.data() + used * r.D * r.I;
  double* row1 = row0 + r.I;
  if (dtype == DType::kF8E4M3) {
    const int64_t blocks = Fp8Blocks(r.I);
    const double s0 = down_scales[Index(used * r.D * blocks)];
    int64_t other = 1;
    for (int64_t j = 1; j < r.D; ++j) {
      const double sj = down_scales[Index((used * r.D + j) * blocks)];
      const double so = down_scales[Index((used * r.D + other) * blocks)];
      if (std::abs(std::log(sj / s0)) > std::abs(std::log(so / s0))) other = j;
    }
    row1 = row0 + other * r.I;
    const double s1 = down_scales[Index((used * r.D + other) * blocks)];
    for (int64_t i = 0; i < std::min<int64_t>(r.I, kFp8BlockSize); ++i) {
      row0[i] *= s1 / s0;
      row1[i] *= s0 / s1;
    }
  } else {
    std::swap_ranges(row0, row0 + r.I, row1);
  }
  EXPECT_GT(OutsideBound(got, RefExpertsTensorCores(swapped, dtype), nullptr), 0)
      << "a reference with two rows of w_down (fp8: their block-0 scales) exchanged still "
         "holds the output: the bound is too loose to catch a misplaced weight";
}

// Expert weights of `dtype` for the inputs `b` (their f32 values are replaced
// by what the dtype holds; fp8: e4m3 with per-row 128-column block scales in
// [0.002, 0.004]). The down scales' values go to `down_scales`.
void MakeExpertWeights(Context& ctx, ExpertsBufs& b, int64_t L, int64_t D, int64_t I, DType dtype,
                       LinearWeight* gate_up, LinearWeight* down,
                       std::vector<double>* down_scales) {
  for (auto [name, w, values, out_dim, in_dim] :
       {std::tuple{"w_gate_up", gate_up, &b.w_gate_up_values, 2 * I, D},
        std::tuple{"w_down", down, &b.w_down_values, D, I}}) {
    Buf& v = ctx.Make(absl::StrCat(name, "_", DTypeName(dtype)), dtype, {L, out_dim, in_dim});
    std::vector<double> scales;
    if (dtype == DType::kF8E4M3) {
      Buf& s = ctx.Make(absl::StrCat(name, "_scales"), kF32, {L, out_dim, Fp8Blocks(in_dim)});
      ctx.Randomize(s, 0.002, 0.004);
      scales = s.Values();
      w->scales = s.t;
      if (w == down) *down_scales = scales;
    }
    for (size_t i = 0; i < values->size(); ++i) {
      const int64_t row = static_cast<int64_t>(i) / in_dim, col = static_cast<int64_t>(i) % in_dim;
      double& value = (*values)[i];
      if (dtype == DType::kF8E4M3) {
        const float scale = static_cast<float>(scales[Index(row * Fp8Blocks(in_dim) + col / 128)]);
        const uint8_t q = F32ToF8E4M3(static_cast<float>(value) / scale);
        v.host[i] = q;
        value = Fp8Dequantize(q, scale);
      } else {
        StoreElement(dtype, v.host.data(), static_cast<int64_t>(i), value);
        value = LoadElement(dtype, v.host.data(), static_cast<int64_t>(i));
      }
    }
    ctx.Upload(v);
    w->values = v.t;
  }
}

// Expert weights in bf16, or fp8 with per-row 128-column block scales. The
// host (and CUDA without tensor cores for the dtype) widens them to their
// exact values; tensor cores take the staged activations (above).
void ExpertsWeightDtypeCase(Context& ctx, const ExpertsCase& c, DType dtype) {
  std::mt19937 rng(ctx.NextSeed());
  ExpertsBufs b = MakeExpertsInputs(ctx, c, rng);
  LinearWeight gate_up, down;
  std::vector<double> down_scales;
  MakeExpertWeights(ctx, b, c.L, c.D, c.I, dtype, &gate_up, &down, &down_scales);
  Buf& out = ctx.Output("out", kF32, {c.T, c.D}, 0, 3, 2);
  ctx.RunOp({&out}, [&](Stream& s) {
    return MoeExperts(s, b.x->t, b.ids->t, b.weights->t, b.map->t, gate_up, down, out.t);
  });
  CheckExpertsOutput(ctx, out, RefInputs(b), dtype, down_scales, dtype == DType::kBF16);
}

// K = 1 and experts given exactly `counts[s]` tokens each (0 included: an
// empty expert), in shuffled token order and shuffled slots: every row-tile
// height the tensor-core GEMM picks, partial and several tiles per expert.
void ExpertsCountsCase(Context& ctx, DType dtype, const std::vector<int64_t>& counts, int64_t D,
                       int64_t I, bool positive = false) {
  std::mt19937 rng(ctx.NextSeed());
  const int64_t L = static_cast<int64_t>(counts.size());
  const int64_t T = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const ExpertsCase c{T, 1, L, L, D, I, MapKind::kAll, false, 1};
  ExpertsBufs b = MakeExpertsInputs(ctx, c, rng);
  std::vector<int32_t> slot_expert(Index(L));  // slot s holds expert slot_expert[s]
  std::iota(slot_expert.begin(), slot_expert.end(), 0);
  std::shuffle(slot_expert.begin(), slot_expert.end(), rng);
  int32_t* map = b.map->HostData<int32_t>();
  for (int64_t s = 0; s < L; ++s) map[slot_expert[Index(s)]] = static_cast<int32_t>(s);
  std::vector<int32_t> ids;
  for (int64_t s = 0; s < L; ++s)
    ids.insert(ids.end(), Index(counts[Index(s)]), slot_expert[Index(s)]);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::copy(ids.begin(), ids.end(), b.ids->HostData<int32_t>());
  ctx.Upload(*b.map);
  ctx.Upload(*b.ids);
  if (positive) {  // no cancellation anywhere
    ctx.Randomize(*b.x, 0.1, 1.0);
    for (std::vector<double>* v : {&b.w_gate_up_values, &b.w_down_values}) {
      for (double& w : *v) w = std::abs(w);
    }
  }
  LinearWeight gate_up, down;
  std::vector<double> down_scales;
  MakeExpertWeights(ctx, b, L, D, I, dtype, &gate_up, &down, &down_scales);
  Buf& out = ctx.Output("out", kF32, {T, D}, 0, 1, 1);
  ctx.RunOp({&out}, [&](Stream& s) {
    return MoeExperts(s, b.x->t, b.ids->t, b.weights->t, b.map->t, gate_up, down, out.t);
  });
  CheckExpertsOutput(ctx, out, RefInputs(b), dtype, down_scales, dtype == DType::kBF16 || positive);
}

void ExpertsCaseRun(Context& ctx, const ExpertsCase& c) {
  std::mt19937 rng(ctx.NextSeed());
  const ExpertsBufs b = MakeExpertsInputs(ctx, c, rng);
  Buf& out = ctx.Output("out", kF32, {c.T, c.D}, 0, 3, 2);
  ctx.RunOp({&out}, [&](Stream& s) { return RunExperts(s, b, out, Tensor()); });
  const std::vector<double> want = RefExperts(RefInputs(b));
  ctx.ExpectClose(out, want, Tolerance::F32(1e-5));
  if (!ctx.is_cuda()) return;  // the host takes no workspace
  // A caller workspace of exactly the bytes needed, then a larger one (both
  // starting as 0xff garbage): the same bytes as the per-stream scratch.
  const std::vector<uint8_t> scratch_bytes = ctx.Download(out);
  const int64_t needed = static_cast<int64_t>(MoeExpertsWorkspaceBytes(c.T, c.K, c.D, c.I, c.L));
  ASSERT_GT(needed, 0);
  for (int64_t extra : {int64_t{0}, int64_t{4096}}) {
    SCOPED_TRACE(absl::StrCat("caller workspace of ", needed + extra, " bytes"));
    Buf& ws = ctx.Make("workspace", DType::kU8, {needed + extra}, 0, 4, 4);
    ctx.Poison(out);
    ctx.RunOp(
        {&out}, [&](Stream& s) { return RunExperts(s, b, out, ws.t); }, extra == 0);
    EXPECT_TRUE(ctx.Download(out) == scratch_bytes) << "differs from the per-stream scratch run";
  }
}

// Token 0 routes to held experts 0..3 only, token 1 to 8..11 (none held),
// token 2 anywhere: row 1 is exactly zero, row 0 is not.
void TokenWithNoLocalExpertCase(Context& ctx) {
  const ExpertsCase c{3, 4, 16, 4, 24, 12, MapKind::kAll, false, 0};
  std::mt19937 rng(ctx.NextSeed());
  const ExpertsBufs b = MakeExpertsInputs(ctx, c, rng);
  int32_t* map = b.map->HostData<int32_t>();
  int32_t* ids = b.ids->HostData<int32_t>();
  for (int32_t e = 0; e < 16; ++e) map[e] = e < 4 ? e : -1;
  for (int32_t k = 0; k < 4; ++k) {
    ids[k] = k;
    ids[4 + k] = 8 + k;
  }
  ctx.Upload(*b.map);
  ctx.Upload(*b.ids);
  Buf& out = ctx.Output("out", kF32, {c.T, c.D}, 0, 1, 1);
  ctx.RunOp({&out}, [&](Stream& s) { return RunExperts(s, b, out, Tensor()); });
  const std::vector<double> want = RefExperts(RefInputs(b));
  ctx.ExpectClose(out, want, Tolerance::F32(1e-5));
  const std::vector<double> got = ctx.DeviceValues(out);
  double row0 = 0.0;
  for (int64_t j = 0; j < c.D; ++j) {
    EXPECT_EQ(got[Index(c.D + j)], 0.0) << "token 1, column " << j;
    row0 += std::abs(got[Index(j)]);
  }
  EXPECT_GT(row0, 0.0);
}

// Expert parallelism: rank 0 holds experts 0..7, rank 1 holds 8..15, each in
// slots 0..7 with its slice of the full weights (views into them). Each
// rank's output matches its reference, and the two sum to the full map's.
void TwoRanksCase(Context& ctx) {
  const ExpertsCase c{33, 4, 16, 16, 256, 112, MapKind::kAll, false, 0};
  std::mt19937 rng(ctx.NextSeed());
  const ExpertsBufs full = MakeExpertsInputs(ctx, c, rng);
  int32_t* map = full.map->HostData<int32_t>();
  for (int32_t e = 0; e < 16; ++e) map[e] = e;
  ctx.Upload(*full.map);
  Buf& out_full = ctx.Output("out full", kF32, {c.T, c.D});
  ctx.RunOp({&out_full}, [&](Stream& s) { return RunExperts(s, full, out_full, Tensor()); });
  const std::vector<double> want_full = RefExperts(RefInputs(full));
  ctx.ExpectClose(out_full, want_full, Tolerance::F32(1e-5));

  std::vector<double> sum(Index(c.T * c.D), 0.0);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    Buf& rmap = ctx.Make(absl::StrCat("expert_map rank ", rank), kI32, {16});
    for (int32_t e = 0; e < 16; ++e) rmap.HostData<int32_t>()[e] = e / 8 == rank ? e % 8 : -1;
    ctx.Upload(rmap);
    // The rank's weights: slots 8 rank .. 8 rank + 7 of the full buffers.
    ExpertsBufs part = full;
    part.map = &rmap;
    part.w_gate_up = full.w_gate_up.Slice(0, rank * 8, rank * 8 + 8);
    part.w_down = full.w_down.Slice(0, rank * 8, rank * 8 + 8);
    const size_t gu = full.w_gate_up_values.size() / 2, dn = full.w_down_values.size() / 2;
    part.w_gate_up_values.assign(full.w_gate_up_values.begin() + rank * gu,
                                 full.w_gate_up_values.begin() + (rank + 1) * gu);
    part.w_down_values.assign(full.w_down_values.begin() + rank * dn,
                              full.w_down_values.begin() + (rank + 1) * dn);
    Buf& out = ctx.Output(absl::StrCat("out rank ", rank), kF32, {c.T, c.D});
    ctx.RunOp({&out}, [&](Stream& s) { return RunExperts(s, part, out, Tensor()); });
    ctx.ExpectClose(out, RefExperts(RefInputs(part)), Tolerance::F32(1e-5));
    const std::vector<double> got = ctx.DeviceValues(out);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
  }
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < sum.size(); ++i) {
    err = std::max(err, std::abs(sum[i] - want_full[i]));
    ref = std::max(ref, std::abs(want_full[i]));
  }
  EXPECT_LE(err, 1e-5 * ref) << "rank 0 + rank 1 against the full map";
}

// ---- Gate, route and experts in one graph ------------------------------------------------

void GateRouteExpertsCase(Context& ctx, bool caller_workspace) {
  const int64_t T = 24, D = 40, I = 24, E = 32, K = 4;
  const RoutingParams p =
      Params(E, K, 4, 2, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, true, 2.5f);
  Buf& x = ctx.Make("x", kF32, {T, D});
  Buf& w_gate = ctx.Make("w_gate", kF32, {E, D});
  ctx.Randomize(w_gate);
  Buf& bias = ctx.Make("correction_bias", kF32, {E});
  ctx.Randomize(bias, -0.2, 0.2);
  Buf& map = ctx.Make("expert_map", kI32, {E});
  for (int32_t e = 0; e < E; ++e) map.HostData<int32_t>()[e] = (e * 5 + 3) % E;  // a permutation
  ctx.Upload(map);
  Buf& w_gate_up = ctx.Make("w_gate_up", kF32, {E, 2 * I, D});
  ctx.Randomize(w_gate_up, -0.3, 0.3);
  Buf& w_down = ctx.Make("w_down", kF32, {E, D, I});
  ctx.Randomize(w_down, -0.3, 0.3);
  Buf& logits = ctx.Output("logits", kF32, {T, E});
  Buf& ids = ctx.Output("topk_ids", kI32, {T, K});
  Buf& weights = ctx.Output("topk_weights", kF32, {T, K});
  Buf& out = ctx.Output("out", kF32, {T, D});
  Tensor workspace;
  if (caller_workspace) {
    const int64_t bytes = static_cast<int64_t>(MoeExpertsWorkspaceBytes(T, K, D, I, E));
    workspace = ctx.Make("workspace", DType::kU8, {std::max<int64_t>(bytes, 4)}).t;
  }
  const std::vector<double> wg = w_gate.Values(), b = bias.Values();

  // New x (random, drawn again until every token's routing is well posed on
  // the double logits, which the f32 gate matches to ~1e-6) and what the
  // pipeline must give for it.
  struct Want {
    std::vector<double> logits, weights, out;
    std::vector<int64_t> ids;
  };
  auto draw_x = [&]() -> Want {
    for (int attempt = 0; attempt < 100; ++attempt) {
      ctx.Randomize(x);
      Want w;
      const std::vector<double> xv = x.Values();
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) {
          double acc = 0.0;
          for (int64_t j = 0; j < D; ++j) acc += xv[Index(t * D + j)] * wg[Index(e * D + j)];
          w.logits.push_back(acc);
        }
      }
      bool well_posed = true;
      for (int64_t t = 0; t < T; ++t) {
        well_posed &= RefRouteToken(p, w.logits.data() + t * E, b.data()).well_posed;
      }
      if (!well_posed) continue;
      const RouteWant route = RefRouteAll(p, w.logits, T, b);
      w.ids = route.ids;
      w.weights = route.weights;
      ExpertsRef r{
          T, K, E, E, D, I, xv, w.ids, w.weights, Ints(map), w_gate_up.Values(), w_down.Values()};
      w.out = RefExperts(r);
      return w;
    }
    ADD_FAILURE() << "no well-posed x drawn";
    return {};
  };
  auto check = [&](const Want& want) {
    ctx.ExpectClose(logits, want.logits, Tolerance::F32(1e-5));
    ctx.ExpectInts(ids, want.ids);
    ctx.ExpectClose(weights, want.weights, Tolerance::F32(2e-6));
    ctx.ExpectClose(out, want.out, Tolerance::F32(1e-5));
  };
  auto forward = [&](Stream& s) -> absl::Status {
    {
      NodeScope n(s, "moe.gate", OpKind::kGemm);
      MLAG_RETURN_IF_ERROR(Linear(s, x.t, w_gate.t, logits.t));
    }
    {
      NodeScope n(s, "moe.route", OpKind::kKernel);
      MLAG_RETURN_IF_ERROR(MoeRoute(s, p, logits.t, bias.t, ids.t, weights.t));
    }
    NodeScope n(s, "moe.experts", OpKind::kGemm);
    return MoeExperts(s, x.t, ids.t, weights.t, map.t, w_gate_up.t, w_down.t, out.t, workspace);
  };

  const Want first = draw_x();
  ctx.RunOp({&logits, &ids, &weights, &out}, forward);
  check(first);

  // A graph captured on the first x, replayed on a second one.
  ASSERT_OK(ctx.stream().BeginCapture());
  const absl::Status recorded = forward(ctx.stream());
  absl::StatusOr<std::unique_ptr<Graph>> graph = ctx.stream().EndCapture();
  ASSERT_OK(recorded);
  ASSERT_OK(graph);
  std::vector<std::string> names;
  for (const GraphNode& node : (*graph)->nodes()) names.push_back(node.name);
  EXPECT_EQ(names, (std::vector<std::string>{"moe.gate", "moe.route", "moe.experts"}));
  const Want second = draw_x();
  for (Buf* o : {&logits, &ids, &weights, &out}) ctx.Poison(*o);
  ASSERT_OK((*graph)->Replay(ctx.stream()));
  ASSERT_OK(ctx.stream().Synchronize());
  SCOPED_TRACE("replay on a new x");
  check(second);
}

}  // namespace

void AddMoeCases(CaseList& cases) {
  for (const auto& [name, row] : HandRows()) {
    cases.Add("moe_route", absl::StrCat("by hand ", name),
              [row = row](Context& ctx) { HandRouteCase(ctx, row); });
  }
  int i = 0;
  for (const RoutingParams& p : RouteConfigs()) {
    const int64_t T = std::vector<int64_t>{1, 5, 37}[Index(i++ % 3)];
    cases.Add("moe_route", absl::StrCat(MethodName(p), " random T ", T),
              [p, T](Context& ctx) { RandomRouteCase(ctx, p, T, false); });
    cases.Add("moe_route", absl::StrCat(MethodName(p), " ties T 33"),
              [p](Context& ctx) { RandomRouteCase(ctx, p, 33, true); });
  }
  i = 0;
  for (const RoutingParams& p : RouteConfigs()) {
    // Decode batches (one launch on CUDA) and one beyond them; odd D.
    const int64_t T = std::vector<int64_t>{1, 3, 17, 32, 40}[Index(i % 5)];
    const int64_t D = std::vector<int64_t>{37, 64, 129}[Index(i++ % 3)];
    cases.Add("moe_gate_route", absl::StrCat(MethodName(p), " T ", T, " D ", D),
              [p, T, D](Context& ctx) { GateRouteCase(ctx, p, T, D); });
  }

  using M = MapKind;
  const ExpertsCase experts[] = {
      {1, 2, 8, 8, 16, 8, M::kAll, false, 0},
      {1, 4, 16, 16, 24, 12, M::kAll, false, 0},
      {7, 4, 16, 8, 256, 112, M::kPartial, true, 0},
      {17, 4, 16, 16, 33, 24, M::kAll, false, 0},
      {33, 4, 16, 16, 24, 112, M::kAll, false, 2},
      {33, 4, 16, 8, 256, 12, M::kPartial, true, 0},
      {64, 6, 32, 10, 65, 40, M::kPartial, false, 7},
      {200, 8, 16, 16, 48, 72, M::kAll, false, 0},     // tall tiles, > 1024 pairs
      {300, 8, 8, 4, 130, 70, M::kPartial, true, 3},   // 2400 pairs, skipped ids
      {9, 3, 12, 1, 20, 17, M::kPartial, true, 0},     // one local expert
      {40, 4, 16, 12, 24, 20, M::kPartial, false, 0},  // slots 8..11 hold no expert
      {5, 2, 4, 4, 8, 0, M::kAll, false, 0},           // I = 0: every output 0
  };
  for (const ExpertsCase& c : experts) {
    cases.Add("moe_experts", Name(c), [c](Context& ctx) { ExpertsCaseRun(ctx, c); });
  }
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    for (const ExpertsCase& c : {ExpertsCase{3, 4, 16, 8, 130, 70, M::kPartial, true, 1},
                                 ExpertsCase{40, 6, 16, 16, 300, 40, M::kAll, false, 0}}) {
      cases.Add("moe_experts", absl::StrCat(DTypeName(dtype), " weights ", Name(c)),
                [c, dtype](Context& ctx) { ExpertsWeightDtypeCase(ctx, c, dtype); });
    }
  }
  // Tokens per expert 0, 1, 3, 17, 64 and 300, row tiles of 8, 16, 32 and 64
  // on tensor cores; aligned rows (cp.async weights) and odd K and N.
  const std::vector<std::vector<int64_t>> counts = {
      {0, 1, 3, 17}, {1, 17, 30, 0}, {3, 17, 17, 0, 64}, {0, 1, 3, 17, 64, 300}};
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    for (const std::vector<int64_t>& n : counts) {
      for (auto [D, I] : {std::pair<int64_t, int64_t>{160, 96}, {33, 17}}) {
        cases.Add(
            "moe_experts",
            absl::StrCat(DTypeName(dtype), " weights, tokens per expert ", absl::StrJoin(n, " "),
                         ", D ", D, " I ", I),
            [dtype, n = n, D = D, I = I](Context& ctx) { ExpertsCountsCase(ctx, dtype, n, D, I); });
      }
    }
  }
  cases.Add("moe_experts", "fp8 weights, one exchanged scale is outside the bound",
            [](Context& ctx) {
              ExpertsCountsCase(ctx, DType::kF8E4M3, {5, 0, 12}, 160, 96, true);
            });
  cases.Add("moe_experts", "token with no local expert is zero", TokenWithNoLocalExpertCase);
  cases.Add("moe_experts", "two ranks sum to the full map", TwoRanksCase);
  cases.Add("moe_gate_route_experts", "per-stream scratch",
            [](Context& ctx) { GateRouteExpertsCase(ctx, false); });
  cases.Add("moe_gate_route_experts", "caller workspace",
            [](Context& ctx) { GateRouteExpertsCase(ctx, true); });
}

}  // namespace mlag::ops_test
