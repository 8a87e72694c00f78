// Graph capture and replay. Compiled twice: with MLAG_TEST_DEVICE "host" into
// the unit tests and "cuda" into the gpu suite, where the fixture skips when
// no CUDA device is present.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "tests/status_matchers.h"

#ifndef MLAG_TEST_DEVICE
#define MLAG_TEST_DEVICE "host"
#endif

namespace mlag {
namespace {

class GraphTest : public ::testing::Test {
 protected:
  static constexpr int64_t kN = 257;  // odd on purpose

  void SetUp() override {
    if (std::string(MLAG_TEST_DEVICE) == "cuda" && Device::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    device_ = Device::Create(MLAG_TEST_DEVICE).value();
    stream_ = Stream::Create(device_.get()).value();
    x_ = Alloc();
    tmp_ = Alloc();
    acc_ = Alloc();
    out_ = Alloc();
  }

  Tensor Alloc() {
    buffers_.push_back(device_->Allocate(kN * sizeof(float)).value());
    return buffers_.back().AsTensor(DType::kF32, {kN});
  }

  void Upload(const Tensor& t, const std::vector<float>& v) {
    ASSERT_OK(device_->CopyFromHost(t.data(), v.data(), v.size() * sizeof(float)));
  }
  std::vector<float> Download(const Tensor& t) {
    std::vector<float> v(kN);
    EXPECT_OK(stream_->Synchronize());
    EXPECT_OK(device_->CopyToHost(v.data(), t.data(), kN * sizeof(float)));
    return v;
  }
  std::vector<float> Random(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> v(kN);
    for (float& f : v) f = u(rng);
    return v;
  }

  // Three named ops: tmp = 0.5 x; acc = acc + tmp; out = acc.
  absl::Status LaunchOps() {
    {
      NodeScope s(*stream_, "step.halve", OpKind::kKernel);
      if (auto st = Scale(*stream_, x_, 0.5f, tmp_); !st.ok()) return st;
    }
    {
      NodeScope s(*stream_, "step.accumulate", OpKind::kKernel);
      if (auto st = Add(*stream_, acc_, tmp_, acc_); !st.ok()) return st;
    }
    NodeScope s(*stream_, "step.publish", OpKind::kCopy);
    return Copy(*stream_, acc_, out_);
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::vector<Buffer> buffers_;
  Tensor x_, tmp_, acc_, out_;
};

TEST_F(GraphTest, NodesKeepNamesAndKindsInLaunchOrder) {
  ASSERT_OK(stream_->BeginCapture());
  ASSERT_OK(LaunchOps());
  auto graph = stream_->EndCapture();
  ASSERT_OK(graph);
  const auto& nodes = (*graph)->nodes();
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].name, "step.halve");
  EXPECT_EQ(nodes[0].kind, OpKind::kKernel);
  EXPECT_EQ(nodes[1].name, "step.accumulate");
  EXPECT_EQ(nodes[1].kind, OpKind::kKernel);
  EXPECT_EQ(nodes[2].name, "step.publish");
  EXPECT_EQ(nodes[2].kind, OpKind::kCopy);
}

TEST_F(GraphTest, UnscopedLaunchesUseKernelNames) {
  ASSERT_OK(stream_->BeginCapture());
  ASSERT_OK(Scale(*stream_, x_, 2.0f, tmp_));
  ASSERT_OK(Copy(*stream_, tmp_, out_));
  auto graph = stream_->EndCapture().value();
  ASSERT_EQ(graph->nodes().size(), 2u);
  EXPECT_EQ(graph->nodes()[0].name, "scale");
  EXPECT_EQ(graph->nodes()[1].name, "copy");
  EXPECT_EQ(graph->nodes()[1].kind, OpKind::kCopy);
}

TEST_F(GraphTest, CaptureDoesNotRunAndReplayReadsThroughCapturedAddresses) {
  std::vector<float> zeros(kN, 0.0f);
  Upload(acc_, zeros);
  Upload(out_, zeros);
  Upload(x_, Random(1));
  ASSERT_OK(stream_->BeginCapture());
  ASSERT_OK(LaunchOps());
  auto graph = stream_->EndCapture().value();
  // Capturing ran nothing.
  EXPECT_EQ(Download(out_), zeros);

  // New contents in the captured input buffer: replay sees them.
  std::vector<float> x2 = Random(2);
  Upload(x_, x2);
  ASSERT_OK(graph->Replay(*stream_));
  std::vector<float> out = Download(out_);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(out[i], 0.5f * x2[i]) << i;

  std::vector<float> x3 = Random(3);
  Upload(x_, x3);
  ASSERT_OK(graph->Replay(*stream_));
  out = Download(out_);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(out[i], 0.5f * x2[i] + 0.5f * x3[i]) << i;
}

TEST_F(GraphTest, ThousandReplaysEqualEagerExecution) {
  const std::vector<float> x = Random(7);
  std::vector<float> zeros(kN, 0.0f);
  Upload(x_, x);
  Upload(acc_, zeros);
  for (int i = 0; i < 1000; ++i) ASSERT_OK(LaunchOps());
  std::vector<float> eager = Download(out_);

  Upload(acc_, zeros);
  Upload(out_, zeros);
  ASSERT_OK(stream_->BeginCapture());
  ASSERT_OK(LaunchOps());
  auto graph = stream_->EndCapture().value();
  for (int i = 0; i < 1000; ++i) ASSERT_OK(graph->Replay(*stream_));
  std::vector<float> replayed = Download(out_);
  ASSERT_EQ(std::memcmp(eager.data(), replayed.data(), kN * sizeof(float)), 0);
  // And the sum really accumulated (not a constant result).
  EXPECT_NE(replayed[0], 0.0f);
  EXPECT_NEAR(replayed[0], 500.0f * x[0], 1e-3f * std::abs(500.0f * x[0]) + 1e-3f);
}

TEST_F(GraphTest, AllocationDuringCaptureFails) {
  ASSERT_OK(stream_->BeginCapture());
  auto buf = device_->Allocate(1024);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(buf.status().message().find("during graph capture"), std::string::npos) << buf.status();
  ASSERT_OK(stream_->EndCapture());
  // After the capture allocation works again.
  EXPECT_OK(device_->Allocate(1024));
}

TEST_F(GraphTest, CaptureStateErrors) {
  EXPECT_EQ(stream_->EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(stream_->BeginCapture());
  EXPECT_EQ(stream_->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(stream_->EndCapture());
}

TEST_F(GraphTest, BadArgumentsRejectedAtLaunch) {
  buffers_.push_back(device_->Allocate(16 * sizeof(float)).value());
  Tensor small = buffers_.back().AsTensor(DType::kF32, {16});
  absl::Status s = Add(*stream_, x_, small, out_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b"), std::string::npos) << s;
}

}  // namespace
}  // namespace mlag
