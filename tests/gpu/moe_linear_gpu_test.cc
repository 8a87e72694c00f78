// GPU tests: Linear, HeadMatmul, MoeRoute and MoeExperts on CUDA against the
// host kernels on the same random inputs (which tests/kernels/ hold to
// double-precision references), and the MoE path under graph capture.
// Compiled always; every test skips itself without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "kernels/moe.h"
#include "mlag_config.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_blas.h"
#endif

namespace mlag {
namespace {

using ::testing::HasSubstr;
using testing::HostStream;
using testing::RandomFloats;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

// Flat offsets of every element of a strided view, in row-major index order.
std::vector<int64_t> ViewOffsets(const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& strides) {
  std::vector<int64_t> offsets = {0};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t base : offsets) {
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * strides[d]);
    }
    offsets = std::move(next);
  }
  return offsets;
}

// An array in host memory and a device buffer of the same bytes, viewed with
// one shape and strides on both sides.
template <typename T>
struct Twin {
  std::vector<T> host;
  Buffer dev;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape, strides;

  Tensor Host() { return Tensor::Strided(host.data(), dtype, shape, strides, DeviceKind::kHost); }
  Tensor Dev() const {
    return Tensor::Strided(dev.data(), dtype, shape, strides, DeviceKind::kCuda);
  }
  std::vector<int64_t> Offsets() const { return ViewOffsets(shape, strides); }
};

// Normwise relative error of `got` against `want` over `offsets`:
// max |got - want| / max |want|; +inf when `got` has a NaN there.
double RelError(const std::vector<float>& got, const std::vector<float>& want,
                const std::vector<int64_t>& offsets) {
  double err = 0.0, ref = 0.0;
  for (int64_t o : offsets) {
    if (std::isnan(got[o])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(static_cast<double>(got[o]) - want[o]));
    ref = std::max(ref, std::abs(static_cast<double>(want[o])));
  }
  return err / std::max(ref, 1e-30);
}

// Elements outside the view that are no longer NaN (the poison was overwritten).
int64_t PaddingWritten(const std::vector<float>& got, const std::vector<int64_t>& offsets) {
  std::vector<bool> in_view(got.size(), false);
  for (int64_t o : offsets) in_view[o] = true;
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += !in_view[i] && !std::isnan(got[i]) ? 1 : 0;
  return n;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MoeLinearGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto device = Device::Create("cuda");
    ASSERT_OK(device);
    device_ = std::move(device).value();
    auto stream = Stream::Create(device_.get());
    ASSERT_OK(stream);
    stream_ = std::move(stream).value();
  }

  void TearDown() override {
    if (stream_ == nullptr) return;
    EXPECT_OK(stream_->Synchronize());
#if MLAG_HAVE_CUDA
    cuda_blas::ReleaseStreamContext(*stream_);
#endif
  }

  // Waits for every copy and kernel on the device: cudaMemcpy from pageable
  // memory may return before the data lands, and the stream is non-blocking.
  void SyncDevice() {
#if MLAG_HAVE_CUDA
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#endif
  }

  template <typename T>
  Twin<T> MakeTwin(DType dtype, std::vector<T> values, std::vector<int64_t> shape,
                   std::vector<int64_t> strides = {}) {
    Twin<T> t;
    t.dtype = dtype;
    t.strides = strides.empty() ? ContiguousStrides(shape) : strides;
    t.shape = std::move(shape);
    t.host = std::move(values);
    t.dev = device_->Allocate(t.host.size() * sizeof(T)).value();
    Upload(t);
    return t;
  }

  template <typename T>
  void Upload(const Twin<T>& t) {
    ASSERT_OK(device_->CopyFromHost(t.dev.data(), t.host.data(), t.host.size() * sizeof(T)));
    SyncDevice();
  }

  // The device copy of `t` (after the stream's work).
  template <typename T>
  std::vector<T> Download(const Twin<T>& t) {
    EXPECT_OK(stream_->Synchronize());
    std::vector<T> v(t.host.size());
    EXPECT_OK(device_->CopyToHost(v.data(), t.dev.data(), v.size() * sizeof(T)));
    return v;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

// ---------------------------------------------------------------------------
// Linear and HeadMatmul

TEST_F(MoeLinearGpu, LinearMatchesHost) {
  const int64_t in = 37, out = 53;
  uint32_t seed = 1;
  for (int64_t T : {1, 3, 17, 64}) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " strided=" << strided);
      const int64_t ldx = strided ? in + 5 : in;
      const int64_t ldy = strided ? out + 3 : out;
      auto x = MakeTwin<float>(DType::kF32, RandomFloats(T * ldx, seed++), {T, in}, {ldx, 1});
      auto w = MakeTwin<float>(DType::kF32, RandomFloats(out * in, seed++), {out, in});
      auto y = MakeTwin<float>(DType::kF32, std::vector<float>(T * ldy, kNaN), {T, out}, {ldy, 1});
      absl::Status st = Linear(*stream_, x.Dev(), w.Dev(), y.Dev());
      ASSERT_OK(st);
      const std::vector<float> got = Download(y);
      st = Linear(HostStream(), x.Host(), w.Host(), y.Host());
      ASSERT_OK(st);
      EXPECT_LE(RelError(got, y.host, y.Offsets()), 1e-5);
      EXPECT_EQ(PaddingWritten(got, y.Offsets()), 0);
    }
  }
}

TEST_F(MoeLinearGpu, LinearReusesCachedAlgorithm) {
#if MLAG_HAVE_CUDA
  const int64_t T = 9, in = 24, out = 40;
  auto x = MakeTwin<float>(DType::kF32, RandomFloats(T * in, 11), {T, in});
  auto w = MakeTwin<float>(DType::kF32, RandomFloats(out * in, 12), {out, in});
  auto y = MakeTwin<float>(DType::kF32, std::vector<float>(T * out, kNaN), {T, out});
  ASSERT_OK(Linear(*stream_, x.Dev(), w.Dev(), y.Dev()));
  const size_t cached = cuda_blas::CachedAlgorithmCount(*stream_);
  EXPECT_GE(cached, 1u);
  ASSERT_OK(Linear(*stream_, x.Dev(), w.Dev(), y.Dev()));
  EXPECT_EQ(cuda_blas::CachedAlgorithmCount(*stream_), cached);
#endif
}

TEST_F(MoeLinearGpu, HeadMatmulMatchesHost) {
  const int64_t H = 3, K = 19, N = 24;
  uint32_t seed = 100;
  for (bool transpose_w : {false, true}) {
    for (int64_t T : {1, 5, 33}) {
      for (bool strided : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "transpose_w=" << transpose_w << " T=" << T << " strided=" << strided);
        // Strided: x is [T, H, K] inside [T, H+1, K+2], out [T, H, N] inside
        // [T, H, N+3].
        const std::vector<int64_t> x_strides =
            strided ? std::vector<int64_t>{(H + 1) * (K + 2), K + 2, 1}
                    : std::vector<int64_t>{H * K, K, 1};
        const std::vector<int64_t> o_strides =
            strided ? std::vector<int64_t>{H * (N + 3), N + 3, 1} : std::vector<int64_t>{H * N, N, 1};
        auto x = MakeTwin<float>(DType::kF32, RandomFloats(T * x_strides[0], seed++), {T, H, K},
                                 x_strides);
        const std::vector<int64_t> w_shape =
            transpose_w ? std::vector<int64_t>{H, N, K} : std::vector<int64_t>{H, K, N};
        auto w = MakeTwin<float>(DType::kF32, RandomFloats(H * K * N, seed++), w_shape);
        auto o = MakeTwin<float>(DType::kF32, std::vector<float>(T * o_strides[0], kNaN),
                                 {T, H, N}, o_strides);
        absl::Status st = HeadMatmul(*stream_, x.Dev(), w.Dev(), transpose_w, o.Dev());
        ASSERT_OK(st);
        const std::vector<float> got = Download(o);
        st = HeadMatmul(HostStream(), x.Host(), w.Host(), transpose_w, o.Host());
        ASSERT_OK(st);
        EXPECT_LE(RelError(got, o.host, o.Offsets()), 1e-5);
        EXPECT_EQ(PaddingWritten(got, o.Offsets()), 0);
      }
    }
  }
}

TEST_F(MoeLinearGpu, CapturingUnwarmedLinearShapeFails) {
  const int64_t in = 37, out = 21;
  auto w = MakeTwin<float>(DType::kF32, RandomFloats(out * in, 7), {out, in});
  auto x = MakeTwin<float>(DType::kF32, RandomFloats(5 * in, 8), {5, in});
  auto y = MakeTwin<float>(DType::kF32, std::vector<float>(5 * out, kNaN), {5, out});
  const Tensor x4 = x.Dev().Slice(0, 0, 4), y4 = y.Dev().Slice(0, 0, 4);
  ASSERT_OK(Linear(*stream_, x4, w.Dev(), y4));  // warm-up of T = 4 only
  ASSERT_OK(stream_->Synchronize());

  ASSERT_OK(stream_->BeginCapture());
  const absl::Status unwarmed = Linear(*stream_, x.Dev(), w.Dev(), y.Dev());  // T = 5
  const absl::Status warmed = Linear(*stream_, x4, w.Dev(), y4);
  auto graph = stream_->EndCapture();
  EXPECT_EQ(unwarmed.code(), absl::StatusCode::kFailedPrecondition) << unwarmed;
  EXPECT_THAT(std::string(unwarmed.message()), HasSubstr("no cuBLASLt algorithm cached"));
  EXPECT_THAT(std::string(unwarmed.message()), HasSubstr("[5, 37]"));
  EXPECT_THAT(std::string(unwarmed.message()), HasSubstr("eagerly"));
  // The failed launch enqueued nothing: the warmed shape still captures and replays.
  ASSERT_OK(warmed);
  ASSERT_OK(graph);
  Upload(y);  // poison again: the replay must write rows 0..3
  ASSERT_OK((*graph)->Replay(*stream_));
  const std::vector<float> got = Download(y);
  ASSERT_OK(Linear(HostStream(), x.Host(), w.Host(), y.Host()));
  const std::vector<int64_t> rows4 = ViewOffsets({4, out}, {out, 1});
  EXPECT_LE(RelError(got, y.host, rows4), 1e-5);
  EXPECT_EQ(PaddingWritten(got, rows4), 0);  // row 4 never written
}

// ---------------------------------------------------------------------------
// MoeRoute

struct RouteCase {
  const char* name;
  RoutingParams p;
};

std::vector<RouteCase> RouteCases() {
  auto make = [](const char* name, int E, int K, int G, int topk_group, ScoringFunc scoring,
                 TopkMethod method, bool norm, float scale) {
    RoutingParams p;
    p.num_experts = E;
    p.top_k = K;
    p.n_group = G;
    p.topk_group = topk_group;
    p.scoring = scoring;
    p.method = method;
    p.norm_topk_prob = norm;
    p.routed_scaling_factor = scale;
    return RouteCase{name, p};
  };
  using S = ScoringFunc;
  using M = TopkMethod;
  return {
      make("softmax_greedy", 64, 6, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
      make("softmax_greedy_norm", 160, 6, 1, 1, S::kSoftmax, M::kGreedy, true, 1.0f),
      make("softmax_greedy_k_eq_e", 8, 8, 1, 1, S::kSoftmax, M::kGreedy, false, 1.0f),
      make("softmax_group_limited", 160, 6, 8, 3, S::kSoftmax, M::kGroupLimitedGreedy, false,
           16.0f),
      make("softmax_group_limited_norm", 72, 5, 6, 2, S::kSoftmax, M::kGroupLimitedGreedy, true,
           16.0f),
      make("sigmoid_noaux_tc", 256, 8, 8, 4, S::kSigmoid, M::kNoauxTc, true, 2.5f),
      make("sigmoid_noaux_tc_no_norm", 72, 5, 6, 2, S::kSigmoid, M::kNoauxTc, false, 2.5f),
      make("sigmoid_noaux_tc_one_per_group", 16, 3, 16, 5, S::kSigmoid, M::kNoauxTc, true, 1.0f),
      make("sigmoid_greedy", 64, 4, 1, 1, S::kSigmoid, M::kGreedy, true, 1.5f),
      make("sigmoid_group_limited", 64, 4, 4, 2, S::kSigmoid, M::kGroupLimitedGreedy, false, 1.0f),
      make("softmax_noaux_tc", 32, 3, 4, 2, S::kSoftmax, M::kNoauxTc, false, 1.0f),
  };
}

class MoeRouteGpu : public MoeLinearGpu {
 protected:
  // Routes `logits` ([T, E] inside rows of E+3) on both sides; ids must be
  // identical and weights agree to 1e-6 (relative above 1).
  void Compare(const RoutingParams& p, int64_t T, std::vector<float> logits,
               std::vector<float> bias) {
    const int64_t E = p.num_experts, K = p.top_k, ld = E + 3;
    auto l = MakeTwin<float>(DType::kF32, std::move(logits), {T, E}, {ld, 1});
    auto b = MakeTwin<float>(DType::kF32, std::move(bias), {E});
    auto ids = MakeTwin<int32_t>(DType::kI32, std::vector<int32_t>(T * K, -7), {T, K});
    auto w = MakeTwin<float>(DType::kF32, std::vector<float>(T * K, kNaN), {T, K});
    const bool noaux = p.method == TopkMethod::kNoauxTc;
    absl::Status st = MoeRoute(*stream_, p, l.Dev(), noaux ? b.Dev() : Tensor(), ids.Dev(), w.Dev());
    ASSERT_OK(st);
    const std::vector<int32_t> got_ids = Download(ids);
    const std::vector<float> got_w = Download(w);
    st = MoeRoute(HostStream(), p, l.Host(), noaux ? b.Host() : Tensor(), ids.Host(), w.Host());
    ASSERT_OK(st);
    int id_mismatches = 0, weight_mismatches = 0;
    for (int64_t i = 0; i < T * K; ++i) {
      id_mismatches += got_ids[i] != ids.host[i] ? 1 : 0;
      const double tol = 1e-6 * std::max(1.0, std::abs(static_cast<double>(w.host[i])));
      const bool ok = std::abs(static_cast<double>(got_w[i]) - w.host[i]) <= tol;
      weight_mismatches += ok ? 0 : 1;
      if (got_ids[i] != ids.host[i] || !ok) {
        ADD_FAILURE() << "token " << i / K << " k " << i % K << ": id " << got_ids[i]
                      << " (host " << ids.host[i] << "), weight " << got_w[i] << " (host "
                      << w.host[i] << ")";
        if (id_mismatches + weight_mismatches > 10) return;
      }
    }
  }
};

TEST_F(MoeRouteGpu, EveryMethodMatchesHost) {
  uint32_t seed = 1000;
  for (const RouteCase& c : RouteCases()) {
    SCOPED_TRACE(c.name);
    const int64_t T = 37, E = c.p.num_experts;
    std::vector<float> logits = RandomFloats(T * (E + 3), seed++, -4.0f, 4.0f);
    std::vector<float> bias = RandomFloats(E, seed++, -0.5f, 0.5f);
    Compare(c.p, T, std::move(logits), std::move(bias));
  }
}

TEST_F(MoeRouteGpu, TiesGoToLowerIndexAsOnHost) {
  // Logits from four levels: many exact ties among experts and among groups,
  // which both sides must break towards the lower index. The bias is one
  // constant: per-expert bias levels would make sums such as (a + b) + c and
  // a + (b + c) compete, equal in exact arithmetic but not in floats, where
  // the last bit of expf decides.
  std::mt19937 rng(77);
  for (const RouteCase& c : RouteCases()) {
    SCOPED_TRACE(c.name);
    const int64_t T = 64, E = c.p.num_experts;
    std::vector<float> logits(T * (E + 3));
    std::uniform_int_distribution<int> level(0, 3);
    for (float& v : logits) v = 0.5f * static_cast<float>(level(rng)) - 0.5f;
    Compare(c.p, T, logits, std::vector<float>(E, 0.25f));
  }
}

// ---------------------------------------------------------------------------
// MoeExperts

struct ExpertsCase {
  int64_t T, K, E, L, D, I;
  bool partial_map;    // some experts not held here (slot -1)
  bool invalid_ids;    // ids outside [0, E)
  int64_t x_pad;       // extra elements per row of x
};

class MoeExpertsGpu : public MoeLinearGpu {
 protected:
  struct Inputs {
    Twin<float> x, weights, w_gate_up, w_down, out;
    Twin<int32_t> ids, map;
  };

  Inputs MakeInputs(const ExpertsCase& c, uint32_t seed) {
    std::mt19937 rng(seed);
    const int64_t ldx = c.D + c.x_pad;
    std::vector<int32_t> ids(c.T * c.K);
    std::vector<int32_t> experts(c.E);
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < c.T; ++t) {  // K distinct experts per token, as routed
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int64_t k = 0; k < c.K; ++k) ids[t * c.K + k] = experts[k % c.E];
    }
    if (c.invalid_ids) {
      for (int64_t i = 0; i < c.T * c.K; i += 7) {
        ids[i] = i % 2 == 0 ? -1 : static_cast<int32_t>(c.E + i % 5);
      }
    }
    // Slots: a shuffled assignment of L experts; the rest are not held here.
    std::vector<int32_t> map(c.E, -1);
    std::shuffle(experts.begin(), experts.end(), rng);
    const int64_t held = c.partial_map ? std::min(c.L, std::max<int64_t>(1, c.E / 2)) : c.L;
    for (int64_t s = 0; s < held && s < c.E; ++s) map[experts[s]] = static_cast<int32_t>(s);
    Inputs in{
        MakeTwin<float>(DType::kF32, RandomFloats(c.T * ldx, seed + 1), {c.T, c.D}, {ldx, 1}),
        MakeTwin<float>(DType::kF32, RandomFloats(c.T * c.K, seed + 2, 0.05f, 1.0f), {c.T, c.K}),
        MakeTwin<float>(DType::kF32, RandomFloats(c.L * 2 * c.I * c.D, seed + 3, -0.3f, 0.3f),
                        {c.L, 2 * c.I, c.D}),
        MakeTwin<float>(DType::kF32, RandomFloats(c.L * c.D * c.I, seed + 4, -0.3f, 0.3f),
                        {c.L, c.D, c.I}),
        MakeTwin<float>(DType::kF32, std::vector<float>(c.T * c.D, kNaN), {c.T, c.D}),
        MakeTwin<int32_t>(DType::kI32, std::move(ids), {c.T, c.K}),
        MakeTwin<int32_t>(DType::kI32, std::move(map), {c.E}),
    };
    return in;
  }

  absl::Status RunDevice(Inputs& in, const Tensor& workspace) {
    return MoeExperts(*stream_, in.x.Dev(), in.ids.Dev(), in.weights.Dev(), in.map.Dev(),
                      in.w_gate_up.Dev(), in.w_down.Dev(), in.out.Dev(), workspace);
  }
  absl::Status RunHost(Inputs& in) {
    return MoeExperts(HostStream(), in.x.Host(), in.ids.Host(), in.weights.Host(),
                      in.map.Host(), in.w_gate_up.Host(), in.w_down.Host(), in.out.Host());
  }
};

TEST_F(MoeExpertsGpu, MatchesHost) {
  const std::vector<ExpertsCase> cases = {
      {1, 2, 8, 8, 16, 8, false, false, 0},
      {17, 4, 16, 16, 33, 24, false, false, 0},
      {64, 6, 32, 10, 65, 40, true, false, 7},    // partial map, strided x
      {200, 8, 16, 16, 48, 72, false, false, 0},  // tall tiles, > 1024 pairs
      {300, 8, 8, 4, 130, 70, true, true, 3},     // tall tiles, skipped ids
      {9, 3, 12, 1, 20, 17, true, true, 0},       // one local expert
      {40, 4, 16, 12, 24, 20, true, false, 0},    // slots 8..11 hold no expert
      {5, 2, 4, 4, 8, 0, false, false, 0},        // I == 0: every output 0
  };
  uint32_t seed = 5000;
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " K=" << c.K << " E=" << c.E << " L="
                                      << c.L << " D=" << c.D << " I=" << c.I);
    Inputs in = MakeInputs(c, seed);
    seed += 10;
    // Per-stream scratch first, then a caller-provided workspace of exactly
    // MoeExpertsWorkspaceBytes: the same bits either way.
    absl::Status st = RunDevice(in, Tensor());
    ASSERT_OK(st);
    const std::vector<float> got = Download(in.out);
    const size_t bytes = MoeExpertsWorkspaceBytes(c.T, c.K, c.D, c.I, c.L);
    ASSERT_GT(bytes, 0u);
    Buffer ws = device_->Allocate(bytes).value();
    Upload(in.out);  // poison again
    st = RunDevice(in, ws.AsTensor(DType::kU8, {static_cast<int64_t>(bytes)}));
    ASSERT_OK(st);
    const std::vector<float> got_ws = Download(in.out);
    EXPECT_TRUE(BitwiseEqual(got, got_ws));

    st = RunHost(in);
    ASSERT_OK(st);
    const std::vector<int64_t> all = in.out.Offsets();
    EXPECT_LE(RelError(got, in.out.host, all), 1e-5);
    if (c.I == 0) {
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
    }
  }
}

TEST_F(MoeExpertsGpu, RejectsSmallWorkspace) {
  const ExpertsCase c{8, 2, 8, 8, 16, 8, false, false, 0};
  Inputs in = MakeInputs(c, 42);
  const size_t bytes = MoeExpertsWorkspaceBytes(c.T, c.K, c.D, c.I, c.L);
  Buffer ws = device_->Allocate(bytes).value();
  absl::Status st =
      RunDevice(in, ws.AsTensor(DType::kU8, {static_cast<int64_t>(bytes) - 4}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("MoeExpertsWorkspaceBytes"));
}

TEST_F(MoeExpertsGpu, CaptureNeedingMoreScratchThanWarmedUpFails) {
  const ExpertsCase small{4, 2, 8, 8, 16, 8, false, false, 0};
  const ExpertsCase large{64, 2, 8, 8, 16, 8, false, false, 0};
  Inputs a = MakeInputs(small, 1), b = MakeInputs(large, 2);
  ASSERT_OK(RunDevice(a, Tensor()));  // eager: scratch for T = 4
  ASSERT_OK(stream_->Synchronize());
  ASSERT_OK(stream_->BeginCapture());
  const absl::Status st = RunDevice(b, Tensor());
  auto graph = stream_->EndCapture();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("per-stream scratch"));
}

// ---------------------------------------------------------------------------
// Graph capture of gate + route + experts

TEST_F(MoeExpertsGpu, CapturedRouteAndExpertsReplayLikeEager) {
  const int64_t T = 24, D = 40, I = 24, E = 32, K = 4;
  RoutingParams p;
  p.num_experts = E;
  p.top_k = K;
  p.n_group = 4;
  p.topk_group = 2;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5f;
  for (bool own_workspace : {false, true}) {
    SCOPED_TRACE(own_workspace ? "caller workspace" : "per-stream scratch");
    // Fresh stream per variant: the per-stream scratch path starts empty.
    auto fresh = Stream::Create(device_.get());
    ASSERT_OK(fresh);
    Stream& s = **fresh;
    auto x = MakeTwin<float>(DType::kF32, RandomFloats(T * D, 1), {T, D});
    auto w_gate = MakeTwin<float>(DType::kF32, RandomFloats(E * D, 2), {E, D});
    auto bias = MakeTwin<float>(DType::kF32, RandomFloats(E, 3, -0.2f, 0.2f), {E});
    auto logits = MakeTwin<float>(DType::kF32, std::vector<float>(T * E, kNaN), {T, E});
    auto ids = MakeTwin<int32_t>(DType::kI32, std::vector<int32_t>(T * K, -7), {T, K});
    auto weights = MakeTwin<float>(DType::kF32, std::vector<float>(T * K, kNaN), {T, K});
    std::vector<int32_t> map(E);
    std::iota(map.begin(), map.end(), 0);
    auto emap = MakeTwin<int32_t>(DType::kI32, map, {E});
    auto wgu = MakeTwin<float>(DType::kF32, RandomFloats(E * 2 * I * D, 4, -0.3f, 0.3f),
                               {E, 2 * I, D});
    auto wdn = MakeTwin<float>(DType::kF32, RandomFloats(E * D * I, 5, -0.3f, 0.3f), {E, D, I});
    auto out = MakeTwin<float>(DType::kF32, std::vector<float>(T * D, kNaN), {T, D});
    Buffer ws_buf;
    Tensor ws;
    if (own_workspace) {
      const size_t bytes = MoeExpertsWorkspaceBytes(T, K, D, I, E);
      ws_buf = device_->Allocate(bytes).value();
      ws = ws_buf.AsTensor(DType::kU8, {static_cast<int64_t>(bytes)});
    }
    auto forward = [&](Stream& st) -> absl::Status {
      {
        NodeScope n(st, "layers.0.moe.gate", OpKind::kGemm);
        absl::Status r = Linear(st, x.Dev(), w_gate.Dev(), logits.Dev());
        if (!r.ok()) return r;
      }
      {
        NodeScope n(st, "layers.0.moe.route", OpKind::kKernel);
        absl::Status r = MoeRoute(st, p, logits.Dev(), bias.Dev(), ids.Dev(), weights.Dev());
        if (!r.ok()) return r;
      }
      NodeScope n(st, "layers.0.moe.experts", OpKind::kGemm);
      return MoeExperts(st, x.Dev(), ids.Dev(), weights.Dev(), emap.Dev(), wgu.Dev(), wdn.Dev(),
                        out.Dev(), ws);
    };

    // Eager warm-up on inputs A, then capture.
    ASSERT_OK(forward(s));
    ASSERT_OK(s.Synchronize());
    std::vector<float> out_a(T * D);
    ASSERT_OK(device_->CopyToHost(out_a.data(), out.dev.data(), out_a.size() * 4));
    ASSERT_OK(s.BeginCapture());
    const absl::Status captured = forward(s);
    auto graph = s.EndCapture();
    ASSERT_OK(captured);
    ASSERT_OK(graph);
    std::vector<std::string> names;
    for (const GraphNode& node : (*graph)->nodes()) names.push_back(node.name);
    EXPECT_THAT(names, ::testing::ElementsAre("layers.0.moe.gate", "layers.0.moe.route",
                                              "layers.0.moe.experts"));

    // New inputs B into the captured buffers; outputs poisoned; replay.
    x.host = RandomFloats(T * D, 21);
    bias.host = RandomFloats(E, 23, -0.2f, 0.2f);
    Upload(x);
    Upload(bias);
    Upload(out);
    Upload(ids);
    Upload(weights);
    ASSERT_OK((*graph)->Replay(s));
    ASSERT_OK(s.Synchronize());
    std::vector<float> out_graph(T * D), w_graph(T * K);
    std::vector<int32_t> ids_graph(T * K);
    ASSERT_OK(device_->CopyToHost(out_graph.data(), out.dev.data(), T * D * 4));
    ASSERT_OK(device_->CopyToHost(w_graph.data(), weights.dev.data(), T * K * 4));
    ASSERT_OK(device_->CopyToHost(ids_graph.data(), ids.dev.data(), T * K * 4));

    // Eager on inputs B: the same bits.
    Upload(out);
    ASSERT_OK(forward(s));
    ASSERT_OK(s.Synchronize());
    std::vector<float> out_eager(T * D), w_eager(T * K);
    std::vector<int32_t> ids_eager(T * K);
    ASSERT_OK(device_->CopyToHost(out_eager.data(), out.dev.data(), T * D * 4));
    ASSERT_OK(device_->CopyToHost(w_eager.data(), weights.dev.data(), T * K * 4));
    ASSERT_OK(device_->CopyToHost(ids_eager.data(), ids.dev.data(), T * K * 4));
    EXPECT_EQ(ids_graph, ids_eager);
    EXPECT_TRUE(BitwiseEqual(w_graph, w_eager));
    EXPECT_TRUE(BitwiseEqual(out_graph, out_eager));
    EXPECT_FALSE(BitwiseEqual(out_graph, out_a));  // the replay did read inputs B

    // And both agree with the host pipeline on inputs B.
    Tensor h_logits = logits.Host(), h_ids = ids.Host(), h_w = weights.Host(), h_out = out.Host();
    ASSERT_OK(Linear(HostStream(), x.Host(), w_gate.Host(), h_logits));
    ASSERT_OK(MoeRoute(HostStream(), p, h_logits, bias.Host(), h_ids, h_w));
    ASSERT_OK(MoeExperts(HostStream(), x.Host(), h_ids, h_w, emap.Host(), wgu.Host(),
                           wdn.Host(), h_out)
                    );
    EXPECT_EQ(ids_graph, ids.host);
    EXPECT_LE(RelError(out_graph, out.host, out.Offsets()), 1e-5);
    graph->reset();
    ASSERT_OK(s.Synchronize());
#if MLAG_HAVE_CUDA
    cuda_blas::ReleaseStreamContext(s);
#endif
  }
}

}  // namespace
}  // namespace mlag
