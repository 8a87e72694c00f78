// The emulated CUDA runtime keeps the driver's rules: devices and their
// memory, the current device per thread, asynchronous launches, the ordering
// of blocking, non-blocking and legacy streams, events, launch limits,
// stream capture in its three modes and the calls a capture forbids, and
// graphs (nodes, edges, instantiate, launch, update, destroy). Each rule is
// broken on purpose and the named error is expected.
//
// Built only with -Demulate_cuda=true; the kernels below compile against the
// emulation's device language like kernels/cuda/*.cu. A fault is sticky for
// its device, so tests that cause one run in a child process (EXPECT_EXIT).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_api.cuh"

namespace {

using ::testing::ExitedWithCode;

__global__ void AddKernel(float* p, float v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += v;
}

// Reads its dynamic shared memory back out (needs `bytes` of it).
__global__ void SmemKernel(float* out, int n) {
  MLAG_DYNAMIC_SMEM(float, smem);
  for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = static_cast<float>(i);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = smem[n - 1 - i];
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A host function that holds its stream until Open().
class Gate {
 public:
  Gate() : opened_(open_.get_future().share()) {}
  void Block(cudaStream_t s) { ASSERT_EQ(cudaLaunchHostFunc(s, &Gate::Wait, this), cudaSuccess); }
  void Open() { open_.set_value(); }

 private:
  static void Wait(void* self) { static_cast<Gate*>(self)->opened_.wait(); }
  std::promise<void> open_;
  std::shared_future<void> opened_;
};

class EmulatedRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }

  float* DeviceFloats(int n, float value) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
    std::vector<float> v(static_cast<size_t>(n), value);
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return static_cast<float*>(p);
  }

  void TearDown() override {
    // cudaFreeHost waits for every stream: only once the test's are done.
    if (peek_buffer_ != nullptr) {
      EXPECT_EQ(cudaFreeHost(peek_buffer_), cudaSuccess);
    }
  }

  // The first element, read on its own non-blocking stream (so ordered with
  // nothing else) into pinned memory allocated once per test.
  float Peek(const float* p) {
    if (peek_buffer_ == nullptr) {
      EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&peek_buffer_), sizeof(float)),
                cudaSuccess);
    }
    cudaStream_t s;
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(peek_buffer_, p, sizeof(float), cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
    return *peek_buffer_;
  }

 private:
  float* peek_buffer_ = nullptr;
};

// ---- Devices and memory -------------------------------------------------------------

// Not a fixture test: the runtime reads its environment at its first call,
// which must be the child's.
TEST(EmulatedRuntimeEnvironmentTest, DeviceCountAndMemoryComeFromTheEnvironment) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto configured = [] {
    setenv("MLAG_EMULATED_GPUS", "3", 1);
    setenv("MLAG_EMULATED_GPU_MEMORY", "1M", 1);
    int n = 0;
    size_t free_bytes = 0;
    size_t total = 0;
    void* a = nullptr;
    void* b = nullptr;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n == 3 &&
                    cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && total == (1u << 20) &&
                    free_bytes == total &&  // the host has more than 1 MiB available
                    cudaMalloc(&a, 600 << 10) == cudaSuccess &&
                    cudaMalloc(&b, 600 << 10) == cudaErrorMemoryAllocation &&
                    cudaSetDevice(1) == cudaSuccess &&  // another device, its own memory
                    cudaMalloc(&b, 600 << 10) == cudaSuccess &&
                    cudaSetDevice(3) == cudaErrorInvalidDevice;
    std::exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(configured(), ExitedWithCode(0), "");
  auto malformed = [] {
    setenv("MLAG_EMULATED_GPUS", "many", 1);
    int n = 7;
    std::exit(cudaGetDeviceCount(&n) == cudaErrorInitializationError && n == 0 ? 0 : 1);
  };
  EXPECT_EXIT(malformed(), ExitedWithCode(0), "MLAG_EMULATED_GPUS='many' is not a count");
}

TEST_F(EmulatedRuntimeTest, TheCurrentDeviceBelongsToTheThread) {
  CUDA_OK(cudaSetDevice(1));
  int other = -1;
  std::thread([&] { cudaGetDevice(&other); }).join();
  EXPECT_EQ(other, 0);
  int mine = -1;
  CUDA_OK(cudaGetDevice(&mine));
  EXPECT_EQ(mine, 1);
  CUDA_OK(cudaSetDevice(0));
}

TEST_F(EmulatedRuntimeTest, CopiesCheckTheirDirectionAndBounds) {
  float* d = DeviceFloats(4, 1.0f);
  std::vector<float> host(8, 0.0f);
  EXPECT_EQ(cudaMemcpy(host.data(), d, 4 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // the direction is backwards
  EXPECT_EQ(cudaMemcpy(host.data(), d, 8 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);  // past the allocation
  cudaGetLastError();
  CUDA_OK(cudaMemcpy(host.data(), d, 4 * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host[3], 1.0f);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  cudaGetLastError();
  CUDA_OK(cudaFree(d));
}

TEST_F(EmulatedRuntimeTest, FreshDeviceMemoryIsPoisoned) {
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 16));
  uint32_t word = 0;
  CUDA_OK(cudaMemcpy(&word, p, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(word, 0xffffffffu);  // NaN as f32: an unwritten read shows up
  CUDA_OK(cudaFree(p));
}

TEST_F(EmulatedRuntimeTest, KernelsFaultOnMemoryOfAnotherDeviceWithoutPeerAccess) {
  auto remote_write = [] {
    cudaSetDevice(1);
    void* remote = nullptr;
    cudaMalloc(&remote, 64 * sizeof(float));
    cudaSetDevice(0);
    MLAG_LAUNCH(AddKernel, 1, 32, 0, nullptr)(static_cast<float*>(remote), 1.0f, 64);
    std::exit(cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1);
  };
  EXPECT_EXIT(remote_write(), ExitedWithCode(0),
              "is memory of cuda:1, used on cuda:0 without peer access");
  auto host_write = [] {
    std::vector<float> pageable(64, 0.0f);
    MLAG_LAUNCH(AddKernel, 1, 32, 0, nullptr)(pageable.data(), 1.0f, 64);
    const bool faulted = cudaDeviceSynchronize() == cudaErrorIllegalAddress;
    // Sticky: the device runs nothing more.
    void* p = nullptr;
    std::exit(faulted && cudaMalloc(&p, 4) == cudaErrorIllegalAddress ? 0 : 1);
  };
  EXPECT_EXIT(host_write(), ExitedWithCode(0), "is not device memory");
  // With peer access the same launch works.
  auto peer_write = [] {
    cudaSetDevice(1);
    void* remote = nullptr;
    cudaMalloc(&remote, 64 * sizeof(float));
    cudaMemset(remote, 0, 64 * sizeof(float));
    cudaDeviceSynchronize();
    cudaSetDevice(0);
    const bool enabled = cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess &&
                         cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled;
    MLAG_LAUNCH(AddKernel, 1, 32, 0, nullptr)(static_cast<float*>(remote), 2.0f, 64);
    float first = 0;
    const bool ran = cudaDeviceSynchronize() == cudaSuccess &&
                     cudaMemcpy(&first, remote, 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    std::exit(enabled && ran && first == 2.0f ? 0 : 1);
  };
  EXPECT_EXIT(peer_write(), ExitedWithCode(0), "");
}

TEST_F(EmulatedRuntimeTest, KernelsLaunchOnStreamsOfTheCurrentDeviceOnly) {
  CUDA_OK(cudaSetDevice(1));
  cudaStream_t s1;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaSetDevice(0));
  float* d = DeviceFloats(32, 0.0f);
  MLAG_LAUNCH(AddKernel, 1, 32, 0, s1)(d, 1.0f, 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaFree(d));
}

// ---- Launches and streams -------------------------------------------------------------

TEST_F(EmulatedRuntimeTest, LaunchesAreAsynchronousAndRunInStreamOrder) {
  float* d = DeviceFloats(64, 1.0f);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate gate;
  gate.Block(s);
  MLAG_LAUNCH(AddKernel, 2, 32, 0, s)(d, 1.0f, 64);
  MLAG_LAUNCH(AddKernel, 2, 32, 0, s)(d, 10.0f, 64);
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(Peek(d), 1.0f);  // queued, not run
  gate.Open();
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(Peek(d), 12.0f);
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
}

TEST_F(EmulatedRuntimeTest, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  float* d = DeviceFloats(32, 1.0f);
  for (const bool blocking : {true, false}) {
    SCOPED_TRACE(blocking ? "blocking stream" : "non-blocking stream");
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    Gate gate;
    gate.Block(s);
    MLAG_LAUNCH(AddKernel, 1, 32, 0, s)(d, 1.0f, 32);
    // cudaMemcpy runs on the legacy stream: after the blocking stream's
    // kernel (so it waits for the gate, opened from another thread), before
    // a non-blocking one's. Behind a non-blocking stream the gate opens only
    // once the copy has returned (or after 10 s, should the copy wrongly
    // wait), so however late this thread runs the copy sees 1.
    std::atomic<bool> copied{false};
    std::thread opener([&] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      while (!blocking && !copied && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      gate.Open();
    });
    float first = 0;
    CUDA_OK(cudaMemcpy(&first, d, sizeof(float), cudaMemcpyDeviceToHost));
    copied = true;
    const float before = first;
    opener.join();
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(before, blocking ? 2.0f : 1.0f);
    CUDA_OK(cudaMemcpy(d, std::vector<float>(32, 1.0f).data(), 32 * sizeof(float),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaStreamDestroy(s));
  }
  CUDA_OK(cudaFree(d));
}

TEST_F(EmulatedRuntimeTest, CudaMemcpyFromPageableMemoryReturnsBeforeTheDeviceHasIt) {
  float* d = DeviceFloats(4, 1.0f);
  Gate gate;
  gate.Block(nullptr);  // hold the legacy stream
  std::vector<float> fresh(4, 5.0f);
  CUDA_OK(cudaMemcpy(d, fresh.data(), 4 * sizeof(float), cudaMemcpyHostToDevice));
  fresh.assign(4, 9.0f);     // the source was taken at the call
  EXPECT_EQ(Peek(d), 1.0f);  // a non-blocking stream does not see it yet
  gate.Open();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(Peek(d), 5.0f);
  CUDA_OK(cudaFree(d));
}

TEST_F(EmulatedRuntimeTest, EventsOrderStreamsAndTime) {
  float* d = DeviceFloats(32, 0.0f);
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t start, done;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&done));
  Gate gate;
  CUDA_OK(cudaEventRecord(start, a));
  gate.Block(a);
  MLAG_LAUNCH(AddKernel, 1, 32, 0, a)(d, 1.0f, 32);
  CUDA_OK(cudaEventRecord(done, a));
  CUDA_OK(cudaStreamWaitEvent(b, done));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, b)(d, 10.0f, 32);  // after a's kernel
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(b), cudaErrorNotReady);
  gate.Open();
  CUDA_OK(cudaStreamSynchronize(b));
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(Peek(d), 11.0f);
  float ms = -1;
  CUDA_OK(cudaEventElapsedTime(&ms, start, done));
  EXPECT_GE(ms, 0.0f);
  for (cudaEvent_t e : {start, done}) CUDA_OK(cudaEventDestroy(e));
  for (cudaStream_t s : {a, b}) CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
}

TEST_F(EmulatedRuntimeTest, LaunchLimitsAreThoseOfSm90) {
  float* d = DeviceFloats(256, 0.0f);
  MLAG_LAUNCH(AddKernel, 1, 2048, 0, nullptr)(d, 1.0f, 256);  // > 1024 threads
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  MLAG_LAUNCH(AddKernel, dim3(1, 70000), 32, 0, nullptr)(d, 1.0f, 256);  // grid y > 65535
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  const int n = 16 * 1024;  // 64 KB of dynamic shared memory
  float* out = DeviceFloats(n, 0.0f);
  MLAG_LAUNCH(SmemKernel, 1, 256, n * sizeof(float), nullptr)(out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);  // over 48 KB without opting in
  EXPECT_EQ(
      cudaFuncSetAttribute(SmemKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
      cudaErrorInvalidValue);                            // over the 227 KB the device has
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);  // every failed call sets it
  CUDA_OK(cudaFuncSetAttribute(SmemKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               n * sizeof(float)));
  MLAG_LAUNCH(SmemKernel, 1, 256, n * sizeof(float), nullptr)(out, n);
  CUDA_OK(cudaGetLastError());
  std::vector<float> got(n);
  CUDA_OK(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got[0], n - 1.0f);
  EXPECT_EQ(got[n - 1], 0.0f);
  int optin = 0;
  CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  EXPECT_EQ(optin, 227 * 1024);
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFree(out));
}

// ---- Stream capture -------------------------------------------------------------------

class CaptureTest : public EmulatedRuntimeTest {
 protected:
  void SetUp() override {
    EmulatedRuntimeTest::SetUp();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    data_ = DeviceFloats(32, 0.0f);
  }
  void TearDown() override {
    cudaStreamDestroy(stream_);
    cudaFree(data_);
  }
  // Ends the capture; the error it reports.
  cudaError_t End() {
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &g);
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
    return e;
  }
  cudaStream_t stream_ = nullptr;
  float* data_ = nullptr;
};

TEST_F(CaptureTest, MallocInAGlobalCaptureInvalidatesIt) {
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 1.0f, 32);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status;
  CUDA_OK(cudaStreamIsCapturing(stream_, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
}

TEST_F(CaptureTest, AGlobalCaptureForbidsOtherThreadsUnlessTheyAreRelaxed) {
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  cudaError_t plain = cudaSuccess, relaxed = cudaSuccess;
  std::thread([&] {
    void* p = nullptr;
    plain = cudaMalloc(&p, 64);
  }).join();
  EXPECT_EQ(plain, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  std::thread([&] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    relaxed = cudaMalloc(&p, 64);
    cudaFree(p);
  }).join();
  EXPECT_EQ(relaxed, cudaSuccess);
  EXPECT_EQ(End(), cudaSuccess);
}

TEST_F(CaptureTest, AThreadLocalCaptureForbidsItsOwnThreadOnly) {
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaError_t other = cudaErrorUnknown;
  std::thread([&] {
    void* p = nullptr;
    other = cudaMalloc(&p, 64);
    cudaFree(p);
  }).join();
  EXPECT_EQ(other, cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
}

TEST_F(CaptureTest, ARelaxedCaptureAllowsMalloc) {
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(End(), cudaSuccess);
  CUDA_OK(cudaFree(p));
}

TEST_F(CaptureTest, SynchronousCallsInvalidateTheCapture) {
  float host = 0;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaMemcpy(&host, data_, 4, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
  // A copy from pageable memory cannot become a graph node.
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaMemcpyAsync(data_, &host, 4, cudaMemcpyHostToDevice, stream_),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(End(), cudaErrorStreamCaptureInvalidated);
}

TEST_F(CaptureTest, UsingTheLegacyStreamWhileABlockingStreamCapturesInvalidatesIt) {
  cudaStream_t blocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, nullptr)(data_, 1.0f, 32);  // the legacy stream
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  // A non-blocking stream's capture does not care.
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, nullptr)(data_, 1.0f, 32);
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(End(), cudaSuccess);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaStreamDestroy(blocking));
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeRelaxed),
            cudaErrorStreamCaptureUnsupported);  // the legacy stream itself cannot capture
  cudaGetLastError();
}

TEST_F(CaptureTest, EventsRecordedInACaptureCannotBeQueried) {
  cudaEvent_t e;
  CUDA_OK(cudaEventCreate(&e));
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  CUDA_OK(cudaEventRecord(e, stream_));
  EXPECT_EQ(cudaEventQuery(e), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaEventSynchronize(e), cudaErrorCapturedEvent);
  EXPECT_EQ(End(), cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaEventDestroy(e));
}

TEST_F(CaptureTest, OnlyTheCapturingThreadEndsAThreadLocalCapture) {
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaError_t other = cudaSuccess;
  std::thread([&] {
    cudaGraph_t g = nullptr;
    other = cudaStreamEndCapture(stream_, &g);
  }).join();
  EXPECT_EQ(other, cudaErrorStreamCaptureWrongThread);
  EXPECT_EQ(End(), cudaSuccess);
}

// ---- Graphs ------------------------------------------------------------------------------

TEST_F(CaptureTest, GraphsListTheirNodesAndReplayInstantiateUpdateAndDestroy) {
  cudaStreamCaptureStatus status;
  CUDA_OK(cudaStreamGetCaptureInfo(stream_, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 1.0f, 32);
  CUDA_OK(cudaMemsetAsync(data_ + 31, 0, sizeof(float), stream_));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 2.0f, 32);
  cudaGraph_t live = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t num_deps = 0;
  CUDA_OK(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &live, &deps, nullptr, &num_deps));
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_EQ(num_deps, 1u);
  // Captured, not run. (Read from another thread: this one's thread-local
  // capture forbids it the synchronising calls a read needs.)
  float during = -1;
  std::thread([&] { during = Peek(data_); }).join();
  EXPECT_EQ(during, 0.0f);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  EXPECT_EQ(graph, live);

  size_t n = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &n));
  ASSERT_EQ(n, 3u);
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<cudaGraphNodeType> types;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CUDA_OK(cudaGraphNodeGetType(node, &t));
    types.push_back(t);
  }
  EXPECT_EQ(types, (std::vector<cudaGraphNodeType>{cudaGraphNodeTypeKernel, cudaGraphNodeTypeMemset,
                                                   cudaGraphNodeTypeKernel}));
  size_t edges = 0;
  CUDA_OK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  ASSERT_EQ(edges, 2u);
  std::vector<cudaGraphNode_t> from(2), to(2);
  CUDA_OK(cudaGraphGetEdges(graph, from.data(), to.data(), nullptr, &edges));
  EXPECT_EQ(from[0], nodes[0]);
  EXPECT_EQ(to[0], nodes[1]);
  EXPECT_EQ(to[1], nodes[2]);

  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) CUDA_OK(cudaGraphLaunch(exec, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(Peek(data_), 6.0f);

  // The same topology with other arguments updates in place.
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 100.0f, 32);
  CUDA_OK(cudaMemsetAsync(data_ + 31, 0, sizeof(float), stream_));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 200.0f, 32);
  cudaGraph_t same_shape = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &same_shape));
  cudaGraphExecUpdateResultInfo info;
  CUDA_OK(cudaGraphExecUpdate(exec, same_shape, &info));
  EXPECT_EQ(info.result, cudaGraphExecUpdateSuccess);
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(Peek(data_), 306.0f);

  // Another topology cannot.
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  MLAG_LAUNCH(AddKernel, 1, 32, 0, stream_)(data_, 1.0f, 32);
  cudaGraph_t other_shape = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &other_shape));
  EXPECT_EQ(cudaGraphExecUpdate(exec, other_shape, &info), cudaErrorGraphExecUpdateFailure);
  EXPECT_EQ(info.result, cudaGraphExecUpdateErrorTopologyChanged);
  cudaGetLastError();

  CUDA_OK(cudaGraphExecDestroy(exec));
  for (cudaGraph_t g : {graph, same_shape, other_shape}) CUDA_OK(cudaGraphDestroy(g));
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidValue);  // already gone
  cudaGetLastError();
}

}  // namespace
