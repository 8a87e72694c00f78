// The CUDA sources of every op but attention (kernels/cuda/{moe, sampling,
// rms_norm, activation, embedding, rope, elementwise, linear}.cu), launchers
// and kernels, run on the CPU through kernels/cuda/emulation/cuda_emulation.h and
// compared with the host kernels on the same random inputs. Tolerances are
// the GPU tests' (tests/gpu/basic_ops_gpu_test.cc, moe_linear_gpu_test.cc):
//   routing: identical ids, weights within 1e-6 (relative above 1);
//   experts: 1e-5 normwise, and the same bits with either scratch size;
//   sampling: the identical token in every row;
//   rms_norm, silu_and_mul: 1e-5 normwise (f32 out), one ulp (bf16 out), the
//     updated residual bit for bit;
//   gather_rows, rope, fill / scale / add, zero: bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/moe.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

#define MLAG_CUDA_EMULATION 1
#include "kernels/cuda/emulation/cuda_emulation.h"
// The emulation must come first.
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;
using testing::RandomFloats;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();


Owned FromFloats(DType dtype, const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  Owned o = Make(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) o.set(static_cast<int64_t>(i), v[i]);
  return o;
}

Owned Copy(const Owned& src) {
  Owned o;
  o.buffer = testing::HostDevice().Allocate(src.buffer.bytes()).value();
  std::memcpy(o.buffer.data(), src.buffer.data(), src.buffer.bytes());
  o.t = Tensor::Strided(static_cast<char*>(o.buffer.data()) +
                            (static_cast<const char*>(src.t.data()) -
                             static_cast<const char*>(src.buffer.data())),
                        src.t.dtype(), src.t.shape(), src.t.strides(), DeviceKind::kHost);
  return o;
}

// max |a - b| / max |b| over all elements.
double NormwiseError(const Owned& got, const Owned& want) {
  double err = 0.0, ref = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got.get(i)) - want.get(i)));
    ref = std::max(ref, std::abs(static_cast<double>(want.get(i))));
  }
  return ref > 0.0 ? err / ref : err;
}

bool SameBytes(const Owned& a, const Owned& b) {
  return a.t.nbytes() == b.t.nbytes() && std::memcmp(a.t.data(), b.t.data(), a.t.nbytes()) == 0;
}

// ---- MoE routing ---------------------------------------------------------------------

cuda::MoeRouteParams CudaRouteParams(const RoutingParams& p) {
  cuda::MoeRouteParams c;
  c.num_experts = p.num_experts;
  c.top_k = p.top_k;
  c.n_group = p.n_group;
  c.topk_group = p.topk_group;
  c.sigmoid = p.scoring == ScoringFunc::kSigmoid;
  c.method = p.method == TopkMethod::kGreedy              ? cuda::kMoeGreedy
             : p.method == TopkMethod::kGroupLimitedGreedy ? cuda::kMoeGroupLimitedGreedy
                                                            : cuda::kMoeNoauxTc;
  c.norm_topk_prob = p.norm_topk_prob;
  c.routed_scaling_factor = p.routed_scaling_factor;
  return c;
}

RoutingParams Route(int E, int K, int G, int topk_group, ScoringFunc scoring, TopkMethod method,
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

std::vector<RoutingParams> RouteCases() {
  using S = ScoringFunc;
  using M = TopkMethod;
  return {Route(64, 6, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
          Route(160, 6, 1, 1, S::kSoftmax, M::kGreedy, true, 1.0f),
          Route(8, 8, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
          Route(160, 6, 8, 3, S::kSoftmax, M::kGroupLimitedGreedy, false, 16.0f),
          Route(72, 5, 6, 2, S::kSoftmax, M::kGroupLimitedGreedy, true, 16.0f),
          Route(256, 8, 8, 4, S::kSigmoid, M::kNoauxTc, true, 2.5f),
          Route(72, 5, 6, 2, S::kSigmoid, M::kNoauxTc, false, 2.5f),
          Route(16, 3, 16, 5, S::kSigmoid, M::kNoauxTc, true, 1.0f),
          Route(64, 4, 1, 1, S::kSigmoid, M::kGreedy, true, 1.5f),
          Route(64, 4, 4, 2, S::kSigmoid, M::kGroupLimitedGreedy, false, 1.0f)};
}

// Routes T tokens of `logits` (rows of E + 3) through the emulated launcher
// and the host kernel; ids must be identical, weights within 1e-6.
void CompareRoute(const RoutingParams& p, int64_t T, const std::vector<float>& logits,
                  const std::vector<float>& bias) {
  const int64_t E = p.num_experts, K = p.top_k, ld = E + 3;
  Owned l = FromFloats(DType::kF32, logits, {T, ld});
  Owned b = FromFloats(DType::kF32, bias, {E});
  Owned ids = Make(DType::kI32, {T, K});
  Owned w = Make(DType::kF32, {T, K});
  Owned got_ids = Make(DType::kI32, {T, K});
  Owned got_w = Make(DType::kF32, {T, K});
  testing::PoisonNaN(got_w);
  const bool noaux = p.method == TopkMethod::kNoauxTc;
  const Tensor lv = l.t.Slice(1, 0, E);
  ASSERT_OK(MoeRoute(HostStream(), p, lv, noaux ? b.t : Tensor(), ids.t, w.t));
  ASSERT_EQ(cuda::LaunchMoeRoute(CudaRouteParams(p), l.data<float>(), ld,
                                 noaux ? b.data<float>() : nullptr, T, got_ids.data<int32_t>(),
                                 got_w.data<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  int failures = 0;
  for (int64_t i = 0; i < T * K && failures < 10; ++i) {
    const int32_t want_id = ids.data<int32_t>()[i], got_id = got_ids.data<int32_t>()[i];
    const double want = w.data<float>()[i], got = got_w.data<float>()[i];
    if (got_id != want_id || !(std::abs(got - want) <= 1e-6 * std::max(1.0, std::abs(want)))) {
      ++failures;
      ADD_FAILURE() << "token " << i / K << " k " << i % K << ": id " << got_id << " (host "
                    << want_id << "), weight " << got << " (host " << want << ")";
    }
  }
}

TEST(MoeRouteEmuTest, EveryMethodMatchesHost) {
  uint32_t seed = 1000;
  for (const RoutingParams& p : RouteCases()) {
    SCOPED_TRACE(::testing::Message() << "E=" << p.num_experts << " K=" << p.top_k
                                      << " G=" << p.n_group << " method "
                                      << static_cast<int>(p.method));
    const int64_t T = 37, E = p.num_experts;
    CompareRoute(p, T, RandomFloats(T * (E + 3), seed, -4.0f, 4.0f),
                 RandomFloats(E, seed + 1, -0.5f, 0.5f));
    seed += 2;
  }
}

// Four logit levels: exact ties among experts and among groups, broken
// towards the lower index on both sides.
TEST(MoeRouteEmuTest, TiesGoToLowerIndexAsOnHost) {
  std::mt19937 rng(77);
  for (const RoutingParams& p : RouteCases()) {
    const int64_t T = 16, E = p.num_experts;
    std::vector<float> logits(T * (E + 3));
    std::uniform_int_distribution<int> level(0, 3);
    for (float& v : logits) v = 0.5f * static_cast<float>(level(rng)) - 0.5f;
    CompareRoute(p, T, logits, std::vector<float>(E, 0.25f));
  }
}

// ---- MoE experts ---------------------------------------------------------------------

struct ExpertsCase {
  int64_t T, K, E, L, D, I;
  bool partial_map;  // some experts not held here (slot -1)
  bool invalid_ids;  // ids outside [0, E)
  int64_t x_pad;     // extra elements per row of x
};

TEST(MoeExpertsEmuTest, MatchesHost) {
  const std::vector<ExpertsCase> cases = {
      {1, 2, 8, 8, 16, 8, false, false, 0},
      {17, 4, 16, 16, 33, 24, false, false, 0},
      {64, 6, 32, 10, 65, 40, true, false, 7},    // partial map, strided x
      {200, 8, 16, 16, 48, 72, false, false, 0},  // tall tiles, > 1024 pairs
      {300, 8, 8, 4, 130, 70, true, true, 3},     // tall tiles, skipped ids
      {9, 3, 12, 1, 20, 17, true, true, 0},       // one local expert
      {5, 2, 4, 4, 8, 0, false, false, 0},        // I == 0: every output 0
  };
  uint32_t seed = 5000;
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " K=" << c.K << " E=" << c.E << " L="
                                      << c.L << " D=" << c.D << " I=" << c.I);
    std::mt19937 rng(seed);
    const int64_t ldx = c.D + c.x_pad;
    Owned x = FromFloats(DType::kF32, RandomFloats(c.T * ldx, seed + 1), {c.T, ldx});
    Owned weights = FromFloats(DType::kF32, RandomFloats(c.T * c.K, seed + 2, 0.05f, 1.0f),
                               {c.T, c.K});
    Owned w_gate_up = FromFloats(
        DType::kF32, RandomFloats(c.L * 2 * c.I * c.D, seed + 3, -0.3f, 0.3f), {c.L, 2 * c.I, c.D});
    Owned w_down = FromFloats(DType::kF32, RandomFloats(c.L * c.D * c.I, seed + 4, -0.3f, 0.3f),
                              {c.L, c.D, c.I});
    Owned ids = Make(DType::kI32, {c.T, c.K});
    std::vector<int32_t> experts(static_cast<size_t>(c.E));
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < c.T; ++t) {  // K distinct experts per token, as routed
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int64_t k = 0; k < c.K; ++k) ids.data<int32_t>()[t * c.K + k] = experts[k % c.E];
    }
    if (c.invalid_ids) {
      for (int64_t i = 0; i < c.T * c.K; i += 7) {
        ids.data<int32_t>()[i] = i % 2 == 0 ? -1 : static_cast<int32_t>(c.E + i % 5);
      }
    }
    Owned map = Make(DType::kI32, {c.E});
    for (int64_t e = 0; e < c.E; ++e) map.data<int32_t>()[e] = -1;
    std::shuffle(experts.begin(), experts.end(), rng);
    const int64_t held = c.partial_map ? std::min(c.L, std::max<int64_t>(1, c.E / 2)) : c.L;
    for (int64_t s = 0; s < held && s < c.E; ++s) map.data<int32_t>()[experts[s]] = static_cast<int32_t>(s);
    seed += 10;

    Owned want = Make(DType::kF32, {c.T, c.D});
    const Tensor xv = x.t.Slice(1, 0, c.D);
    ASSERT_OK(MoeExperts(HostStream(), xv, ids.t, weights.t, map.t, w_gate_up.t, w_down.t,
                           want.t)
                    );
    cuda::MoeExpertsArgs a;
    a.x = x.data<float>();
    a.x_ld = ldx;
    a.topk_ids = ids.data<int32_t>();
    a.topk_weights = weights.data<float>();
    a.expert_map = map.data<int32_t>();
    a.w_gate_up = w_gate_up.data<float>();
    a.w_down = w_down.data<float>();
    a.T = static_cast<int>(c.T);
    a.K = static_cast<int>(c.K);
    a.E = static_cast<int>(c.E);
    a.L = static_cast<int>(c.L);
    a.D = static_cast<int>(c.D);
    a.I = static_cast<int>(c.I);
    const size_t bytes = cuda::MoeExpertsWorkspaceBytes(c.T, c.K, c.D, c.I, c.L);
    ASSERT_GT(bytes, 0u);
    std::vector<Owned> outs;
    for (size_t extra : {size_t{0}, size_t{4096}}) {  // exact and larger scratch
      std::vector<float> scratch((bytes + extra) / 4 + 1, kNaN);
      Owned got = Make(DType::kF32, {c.T, c.D});
      testing::PoisonNaN(got);
      a.out = got.data<float>();
      a.workspace = scratch.data();
      a.workspace_bytes = bytes + extra;
      ASSERT_EQ(cuda::LaunchMoeExperts(a, nullptr), cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      EXPECT_EQ(testing::CountNaN(got), 0);
      EXPECT_LE(NormwiseError(got, want), 1e-5);
      outs.push_back(std::move(got));
    }
    EXPECT_TRUE(SameBytes(outs[0], outs[1]));
    a.workspace_bytes = bytes - 4;  // too small: refused before any launch
    EXPECT_EQ(cuda::LaunchMoeExperts(a, nullptr), cudaErrorInvalidValue);
  }
}

// ---- Sampling -------------------------------------------------------------------------

TEST(SampleEmuTest, MatchesHostTokenForToken) {
  struct Case {
    int64_t rows, vocab;
  };
  uint32_t seed = 600;
  for (const Case& c : std::vector<Case>{{16, 1}, {48, 7}, {48, 300}, {12, 2000}}) {
    const int64_t B = c.rows, V = c.vocab, ld = V + 3;
    Owned logits = Make(DType::kF32, {B, ld});
    Owned temp = Make(DType::kF32, {B});
    Owned top_k = Make(DType::kI32, {B});
    Owned top_p = Make(DType::kF32, {B});
    Owned seeds = Make(DType::kI64, {B});
    Owned steps = Make(DType::kI64, {B});
    std::mt19937 rng(seed++);
    for (int64_t r = 0; r < B; ++r) {
      float* l = logits.data<float>() + r * ld;
      const int shape = static_cast<int>(r % 6);
      std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(r % 4));
      for (int64_t v = 0; v < V; ++v) {
        float x = normal(rng);
        if (shape == 1) x = std::round(x * 2.0f) / 2.0f;                   // heavy ties
        if (shape == 2) x = static_cast<float>(rng() % 3);                // three levels
        if (shape == 3 && rng() % 4 == 0) x = -kInf;                      // masked
        if (shape == 4 && rng() % 97 == 0) x = kNaN;                      // stray NaNs
        if (shape == 5 && rng() % 3 == 0) x = (rng() % 2) ? 0.0f : -0.0f;  // signed zeros
        l[v] = x;
      }
      const int tk = static_cast<int>(rng() % 8);
      temp.data<float>()[r] =
          tk == 0 ? 0.0f : tk == 1 ? 1e-4f : tk == 2 ? 20.0f : 0.3f + (rng() % 100) / 50.0f;
      const int kk = static_cast<int>(rng() % 5);
      top_k.data<int32_t>()[r] =
          kk == 0 ? 0 : kk == 1 ? 1 : kk == 2 ? 50 : 1 + static_cast<int32_t>(rng() % (V + 3));
      const int pk = static_cast<int>(rng() % 4);
      top_p.data<float>()[r] =
          pk == 0 ? 1.0f : pk == 1 ? 0.0f : static_cast<float>(rng() % 1000) / 1000.0f;
      seeds.data<int64_t>()[r] = static_cast<int64_t>(rng());
      steps.data<int64_t>()[r] = static_cast<int64_t>(rng() % 100000);
    }
    Owned want = Make(DType::kI32, {B});
    Owned got = Make(DType::kI32, {B});
    for (int64_t r = 0; r < B; ++r) got.data<int32_t>()[r] = -7;
    const Tensor lv = logits.t.Slice(1, 0, V);
    ASSERT_OK(Sample(HostStream(), lv, temp.t, top_k.t, top_p.t, seeds.t, steps.t, want.t));
    ASSERT_EQ(cuda::LaunchSample(logits.data<float>(), B, V, ld, temp.data<float>(),
                                 top_k.data<int32_t>(), top_p.data<float>(),
                                 seeds.data<int64_t>(), steps.data<int64_t>(),
                                 got.data<int32_t>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    int mismatches = 0;
    for (int64_t r = 0; r < B; ++r) {
      if (got.data<int32_t>()[r] != want.data<int32_t>()[r] && ++mismatches <= 5) {
        ADD_FAILURE() << "V " << V << " row " << r << ": emulated " << got.data<int32_t>()[r]
                      << ", host " << want.data<int32_t>()[r];
      }
    }
    EXPECT_EQ(mismatches, 0) << "V " << V;
  }
}

// ---- Norms, activation, embedding, rope, elementwise ----------------------------

// One ulp of bf16 at the magnitude of `want`, or 1e-5 normwise for f32.
void ExpectOutputClose(const Owned& got, const Owned& want, const std::string& what) {
  EXPECT_EQ(testing::CountNaN(got), testing::CountNaN(want)) << what;
  if (want.t.dtype() == DType::kF32) {
    EXPECT_LE(NormwiseError(got, want), 1e-5) << what;
    return;
  }
  int64_t off = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float w = want.get(i), g = got.get(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(w), 1e-30f)) - 7);
    off += std::abs(static_cast<double>(g) - w) > ulp ? 1 : 0;
  }
  EXPECT_EQ(off, 0) << what << ": elements more than one bf16 ulp apart";
}

TEST(RmsNormEmuTest, MatchesHost) {
  for (DType out_dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t D : {7, 64, 1000, 2049}) {
      const int64_t T = 5;
      const std::string what = std::string(DTypeName(out_dtype)) + " D=" + std::to_string(D);
      Owned x = FromFloats(DType::kF32, RandomFloats(T * D, 10 + D), {T, D});
      Owned weight = FromFloats(DType::kBF16, RandomFloats(D, 11 + D, 0.5f, 1.5f), {D});
      Owned want = Make(out_dtype, {T, D});
      Owned got = Make(out_dtype, {T, D});
      testing::PoisonNaN(got);
      ASSERT_OK(RmsNorm(HostStream(), x.t, weight.t, 1e-6f, want.t));
      ASSERT_EQ(cuda::LaunchRmsNorm(x.t.data(), DType::kF32, D, weight.t.data(),
                                    DType::kBF16, got.t.data(), out_dtype, D, T, D,
                                    1e-6f, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ExpectOutputClose(got, want, "rms_norm " + what);

      // residual += x, then y = norm(residual): the residual bit for bit.
      Owned residual = FromFloats(DType::kF32, RandomFloats(T * D, 12 + D), {T, D});
      Owned residual_got = Copy(residual);
      Owned y_want = Make(out_dtype, {T, D});
      Owned y_got = Make(out_dtype, {T, D});
      testing::PoisonNaN(y_got);
      ASSERT_OK(AddRmsNorm(HostStream(), x.t, residual.t, weight.t, 1e-6f, y_want.t));
      ASSERT_EQ(cuda::LaunchAddRmsNorm(x.t.data(), DType::kF32, D, residual_got.t.data(),
                                       DType::kF32, D, weight.t.data(), DType::kBF16,
                                       y_got.t.data(), out_dtype, D, T, D, 1e-6f, nullptr),
                cudaSuccess);
      EXPECT_TRUE(SameBytes(residual_got, residual)) << "residual " << what;
      ExpectOutputClose(y_got, y_want, "add_rms_norm " + what);
    }
  }
}

TEST(SiluAndMulEmuTest, MatchesHost) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t I : {5, 64, 777}) {
      const int64_t T = 6;
      Owned gate_up = FromFloats(dtype, RandomFloats(T * 2 * I, 20 + I, -6.0f, 6.0f), {T, 2 * I});
      Owned want = Make(dtype, {T, I});
      Owned got = Make(dtype, {T, I});
      testing::PoisonNaN(got);
      ASSERT_OK(SiluAndMul(HostStream(), gate_up.t, want.t));
      ASSERT_EQ(cuda::LaunchSiluAndMul(gate_up.t.data(), dtype, 2 * I, got.t.data(),
                                       dtype, I, T, I, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ExpectOutputClose(got, want, std::string("silu_and_mul ") + std::string(DTypeName(dtype)));
    }
  }
}

TEST(GatherRowsEmuTest, MatchesHostBitForBit) {
  const int64_t rows = 50, dim = 37, n = 9;
  Owned table = FromFloats(DType::kBF16, RandomFloats(rows * dim, 30), {rows, dim});
  Owned idx = Make(DType::kI32, {n});
  const int32_t ids[n] = {0, 49, 3, 3, 17, 48, 1, 2, 25};
  for (int64_t i = 0; i < n; ++i) idx.data<int32_t>()[i] = ids[i];
  for (DType out_dtype : {DType::kF32, DType::kBF16}) {
    Owned want = Make(out_dtype, {n, dim});
    Owned got = Make(out_dtype, {n, dim});
    ASSERT_OK(GatherRows(HostStream(), idx.t, table.t, want.t));
    ASSERT_EQ(cuda::LaunchGatherRows(idx.t.data(), false, 1, table.t.data(), DType::kBF16,
                                     rows, dim, got.t.data(), out_dtype, dim, n, dim,
                                     nullptr),
              cudaSuccess);
    EXPECT_TRUE(SameBytes(got, want)) << DTypeName(out_dtype);
  }
}

TEST(ApplyRopeEmuTest, MatchesHostBitForBit) {
  RopeParams params;
  params.rotary_dim = 16;
  params.yarn = true;
  params.factor = 40.0;
  const int64_t P = 64, T = 7, H = 3, dr = params.rotary_dim;
  Owned table = Make(DType::kF32, {P, dr});
  ASSERT_OK(FillRopeTable(params, table.t));
  Owned positions = Make(DType::kI32, {T});
  const int32_t pos[T] = {0, 5, 63, 64, -1, 17, 30};  // two rows out of range: unchanged
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = pos[t];
  Owned q = FromFloats(DType::kF32, RandomFloats(T * H * dr, 40), {T, H, dr});
  Owned k = FromFloats(DType::kF32, RandomFloats(T * dr, 41), {T, dr});
  Owned q_got = Copy(q), k_got = Copy(k);
  ASSERT_OK(ApplyRope(HostStream(), positions.t, table.t, q.t, k.t));
  ASSERT_EQ(cuda::LaunchApplyRope(positions.data<int32_t>(), 1, table.data<float>(), P, dr,
                                  q_got.data<float>(), H * dr, dr, H, k_got.data<float>(), dr, T,
                                  dr / 2, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(SameBytes(q_got, q));
  EXPECT_TRUE(SameBytes(k_got, k));
}

TEST(ElementwiseEmuTest, FillScaleAddAndZeroMatchHost) {
  const int64_t n = 1000;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Owned a = FromFloats(dtype, RandomFloats(n, 50), {n});
    Owned b = FromFloats(dtype, RandomFloats(n, 51), {n});
    Owned want = Make(dtype, {n}), got = Make(dtype, {n});
    ASSERT_OK(Add(HostStream(), a.t, b.t, want.t));
    ASSERT_EQ(cuda::LaunchAdd(a.t.data(), dtype, b.t.data(), dtype, got.t.data(),
                              dtype, n, nullptr),
              cudaSuccess);
    EXPECT_TRUE(SameBytes(got, want)) << "add " << DTypeName(dtype);
    ASSERT_OK(Scale(HostStream(), a.t, -0.37f, want.t));
    ASSERT_EQ(cuda::LaunchScale(a.t.data(), dtype, -0.37f, got.t.data(), dtype, n,
                                nullptr),
              cudaSuccess);
    EXPECT_TRUE(SameBytes(got, want)) << "scale " << DTypeName(dtype);
    ASSERT_OK(Fill(HostStream(), want.t, 2.75));
    ASSERT_EQ(cuda::LaunchFill(got.t.data(), dtype, n, 2.75, nullptr), cudaSuccess);
    EXPECT_TRUE(SameBytes(got, want)) << "fill " << DTypeName(dtype);
  }
  // LaunchZeroF32 over a strided [3, 4, 5] view of a [3, 6, 7] buffer: the
  // view becomes zeros, everything else keeps its values.
  Owned buf = FromFloats(DType::kF32, RandomFloats(3 * 6 * 7, 52, 0.5f, 1.0f), {3, 6, 7});
  ASSERT_EQ(cuda::LaunchZeroF32(buf.data<float>(), 3, 4, 5, 42, 7, nullptr), cudaSuccess);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      for (int64_t l = 0; l < 7; ++l) {
        const float v = buf.data<float>()[i * 42 + j * 7 + l];
        if (j < 4 && l < 5) {
          EXPECT_EQ(v, 0.0f) << i << " " << j << " " << l;
        } else {
          EXPECT_GE(v, 0.5f) << i << " " << j << " " << l;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mlag
