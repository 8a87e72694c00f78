// Host-only properties of MoE routing and the routed experts: argument
// rejection and bit reproducibility across thread counts. The numerical
// cases (hand-worked routes, routing and experts against double references,
// on every backend) are in tests/ops/cases_moe.cc.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/host/thread_pool.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::CountNaN;
using testing::FillRandom;
using testing::HostStream;
using testing::Make;
using testing::Owned;
using testing::PoisonNaN;

// ---------------------------------------------------------------------------
// Routing

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
  FillRandom(d.x, seed);
  FillRandom(d.w, seed + 1, 0.1f, 1.0f);
  const float scale_gu = 2.0f / std::sqrt(static_cast<float>(c.D));
  const float scale_dn = 2.0f / std::sqrt(static_cast<float>(c.I));
  FillRandom(d.w_gu, seed + 2, -scale_gu, scale_gu);
  FillRandom(d.w_down, seed + 3, -scale_dn, scale_dn);
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

Owned RunExperts(const ExpertsData& d) {
  SCOPED_TRACE(absl::StrCat("RunExperts T=", d.c.T, " D=", d.c.D, " I=", d.c.I, " E=", d.c.E,
                            " K=", d.c.K, " L=", d.L));
  Owned out = Make(DType::kF32, {d.c.T, d.c.D});
  PoisonNaN(out);
  absl::Status st =
      MoeExperts(HostStream(), d.x.t, d.ids.t, d.w.t, d.map.t, d.w_gu.t, d.w_down.t, out.t);
  EXPECT_OK(st);
  EXPECT_EQ(CountNaN(out), 0);
  return out;
}

TEST(MoeExperts, BitReproducibleAcrossThreadCounts) {
  const ExpertsCase c{33, 256, 112, 16, 4};
  ExpertsData d = MakeExperts(c, 16, 55);
  std::vector<int32_t> map(16);
  for (int e = 0; e < 16; ++e) map[e] = e;
  SetMap(d, map);
  Owned a = RunExperts(d);
  host::SetNumThreads(1);
  Owned b = RunExperts(d);
  host::SetNumThreads(0);
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