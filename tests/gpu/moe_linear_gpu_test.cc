// GPU-specific behaviour of Linear and MoeExperts on CUDA: cuBLASLt
// algorithm caching, capture of a shape never warmed up eagerly, and the
// MoE scratch rules (a caller workspace too small, a capture needing more
// per-stream scratch than eager launches grew). Compiled always; every test
// skips itself without a CUDA device. The numerical cases of these ops (and
// of MoeRoute), on every backend, are in tests/ops/cases_{linear,moe}.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
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
// Linear

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
// MoeExperts

struct ExpertsCase {
  int64_t T, K, E, L, D, I;
};

class MoeExpertsGpu : public MoeLinearGpu {
 protected:
  struct Inputs {
    Twin<float> x, weights, w_gate_up, w_down, out;
    Twin<int32_t> ids, map;
  };

  // Random inputs: K distinct experts per token, every expert held (L = E).
  Inputs MakeInputs(const ExpertsCase& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(c.T * c.K);
    std::vector<int32_t> experts(c.E);
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < c.T; ++t) {  // K distinct experts per token, as routed
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int64_t k = 0; k < c.K; ++k) ids[t * c.K + k] = experts[k % c.E];
    }
    std::vector<int32_t> map(c.E);
    std::iota(map.begin(), map.end(), 0);
    Inputs in{
        MakeTwin<float>(DType::kF32, RandomFloats(c.T * c.D, seed + 1), {c.T, c.D}),
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
};

TEST_F(MoeExpertsGpu, RejectsSmallWorkspace) {
  const ExpertsCase c{8, 2, 8, 8, 16, 8};
  Inputs in = MakeInputs(c, 42);
  const size_t bytes = MoeExpertsWorkspaceBytes(c.T, c.K, c.D, c.I, c.L);
  Buffer ws = device_->Allocate(bytes).value();
  absl::Status st = RunDevice(in, ws.AsTensor(DType::kU8, {static_cast<int64_t>(bytes) - 4}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("MoeExpertsWorkspaceBytes"));
}

TEST_F(MoeExpertsGpu, CaptureNeedingMoreScratchThanWarmedUpFails) {
  const ExpertsCase small{4, 2, 8, 8, 16, 8};
  const ExpertsCase large{64, 2, 8, 8, 16, 8};
  Inputs a = MakeInputs(small, 1), b = MakeInputs(large, 2);
  ASSERT_OK(RunDevice(a, Tensor()));  // eager: scratch for T = 4
  ASSERT_OK(stream_->Synchronize());
  ASSERT_OK(stream_->BeginCapture());
  const absl::Status st = RunDevice(b, Tensor());
  auto graph = stream_->EndCapture();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("per-stream scratch"));
}

}  // namespace
}  // namespace mlag
