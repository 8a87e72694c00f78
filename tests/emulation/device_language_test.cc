// The emulated device language (kernels/cuda/emulation/cuda_emulation.h)
// checked against what a GPU does: the tensor-core mma, as the MLA decode
// kernel reaches it through MmaBf16, and ldmatrix (plain and .trans) follow
// the PTX ISA's fragment layouts;
// threads waiting at barriers no other live thread reaches are reported as a
// deadlock instead of hanging; a grid's last CTA, found with __threadfence
// and an atomic counter, sees every other CTA's writes; a grid launched with
// programmatic dependent launch must wait on the grid before it in every
// thread, and its captured edge is programmatic.
//
// Built only with -Demulate_cuda=true; the kernels below compile against the
// emulation's device language like kernels/cuda/*.cu and run asynchronously
// on the emulated legacy stream, so they write to device memory from
// cudaMalloc (a host pointer argument faults).
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_api.cuh"
#include "kernels/cuda/mla_decode_mma.cuh"
#include "kernels/cuda/warp_ops.cuh"

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// One warp: D = A B + 0 with A = identity (16 x 16) and B[k][n] = k * 8 + n
// (exact in bf16), each lane's four D registers to out[lane * 4 + r].
__global__ void MmaIdentityKernel(float* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const int g = lane >> 2, t = lane & 3;
  auto bf = [](float x) { return static_cast<uint32_t>(mlag::F32ToBf16(x)); };
  auto a_at = [](int r, int c) { return r == c ? 1.0f : 0.0f; };
  auto b_at = [](int k, int n) { return static_cast<float>(k * 8 + n); };
  // The A and B fragments of the PTX ISA's m16n8k16 layout, low half first.
  const uint32_t a[4] = {bf(a_at(g, 2 * t)) | bf(a_at(g, 2 * t + 1)) << 16,
                         bf(a_at(g + 8, 2 * t)) | bf(a_at(g + 8, 2 * t + 1)) << 16,
                         bf(a_at(g, 2 * t + 8)) | bf(a_at(g, 2 * t + 9)) << 16,
                         bf(a_at(g + 8, 2 * t + 8)) | bf(a_at(g + 8, 2 * t + 9)) << 16};
  const uint32_t b0 = bf(b_at(2 * t, g)) | bf(b_at(2 * t + 1, g)) << 16;
  const uint32_t b1 = bf(b_at(2 * t + 8, g)) | bf(b_at(2 * t + 9, g)) << 16;
  float d[4] = {0, 0, 0, 0};
  mlag::cuda::mla_block::MmaBf16(d, a, b0, b1);
  for (int r = 0; r < 4; ++r) out[lane * 4 + r] = d[r];
}

// D = B's 16 x 8 in the C layout, for every lane: a wrong fragment mapping
// (say b0 and b1 exchanged) gives a different product.
TEST(CudaEmulationTest, MmaFollowsThePtxLayout) {
  CUDA_OK(cudaSetDevice(0));
  void* d_out = nullptr;
  CUDA_OK(cudaMalloc(&d_out, 32 * 4 * sizeof(float)));
  MLAG_LAUNCH(MmaIdentityKernel, 1, 32, 0, nullptr)(static_cast<float*>(d_out));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(32 * 4);
  CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d_out));
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    EXPECT_EQ(got[lane * 4 + 0], g * 8 + 2 * t) << lane;
    EXPECT_EQ(got[lane * 4 + 1], g * 8 + 2 * t + 1) << lane;
    EXPECT_EQ(got[lane * 4 + 2], (g + 8) * 8 + 2 * t) << lane;
    EXPECT_EQ(got[lane * 4 + 3], (g + 8) * 8 + 2 * t + 1) << lane;
  }
}

// One warp: four 8x8 b16 matrices in shared memory, element (m, r, c) =
// 64 m + 8 r + c; lane l gives row l % 8 of matrix l / 8. Each lane's four
// registers go to out[lane * 4 + m].
__global__ void LdMatrixKernel(uint32_t* out, int transposed) {
  alignas(16) __shared__ uint16_t tile[4 * 64];
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 4 * 64; i += 32) tile[i] = static_cast<uint16_t>(i);
  __syncwarp();
  const uint16_t* row = tile + (lane / 8) * 64 + (lane % 8) * 8;
  uint32_t r[4];
  if (transposed) {
    mlag::cuda::LdMatrixX4Trans(r, row);
  } else {
    mlag::cuda::LdMatrixX4(r, row);
  }
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

std::vector<uint32_t> RunLdMatrix(int transposed) {
  std::vector<uint32_t> got(32 * 4);
  void* d_out = nullptr;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_out, got.size() * sizeof(uint32_t)), cudaSuccess);
  MLAG_LAUNCH(LdMatrixKernel, 1, 32, 0, nullptr)(static_cast<uint32_t*>(d_out), transposed);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(got.data(), d_out, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaFree(d_out), cudaSuccess);
  return got;
}

// PTX ISA, ldmatrix: "each thread receives ... row groupID, elements 2 *
// threadID_in_group and + 1" of each matrix; with .trans, row and column
// exchange.
TEST(CudaEmulationTest, LdMatrixFollowsThePtxLayout) {
  const std::vector<uint32_t> plain = RunLdMatrix(0), trans = RunLdMatrix(1);
  auto at = [](int m, int r, int c) { return static_cast<uint32_t>(64 * m + 8 * r + c); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(plain[lane * 4 + m], at(m, g, 2 * t) | at(m, g, 2 * t + 1) << 16)
          << "lane " << lane << " matrix " << m;
      EXPECT_EQ(trans[lane * 4 + m], at(m, 2 * t, g) | at(m, 2 * t + 1, g) << 16)
          << "lane " << lane << " matrix " << m << " (.trans)";
    }
  }
}

// Each CTA writes its slot, fences, and counts itself in; the CTA that
// counts last sums every slot (read volatile, as on a GPU) and resets the
// counter, as MoeGateRouteKernel does.
__global__ void LastCtaKernel(int* slots, int* counter, int* sum) {
  __shared__ int last;
  if (threadIdx.x == 0) slots[blockIdx.x] = static_cast<int>(blockIdx.x) + 1;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  const volatile int* v = slots;
  int total = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) total += v[b];
  *sum = total;
  *counter = 0;
}

TEST(CudaEmulationTest, LastCtaSeesEveryCtasWrites) {
  constexpr int kCtas = 37;
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, (kCtas + 2) * sizeof(int)));
  int* d = static_cast<int*>(p);
  CUDA_OK(cudaMemset(d, 0, (kCtas + 2) * sizeof(int)));
  for (int launch = 0; launch < 2; ++launch) {  // the counter was reset
    MLAG_LAUNCH(LastCtaKernel, kCtas, 64, 0, nullptr)(d, d + kCtas, d + kCtas + 1);
    std::vector<int> got(2);
    CUDA_OK(cudaMemcpy(got.data(), d + kCtas, 2 * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got[0], 0) << "counter left set, launch " << launch;
    EXPECT_EQ(got[1], kCtas * (kCtas + 1) / 2) << "launch " << launch;
  }
  CUDA_OK(cudaFree(d));
}

// Half a warp in a shuffle, the other half at __syncthreads: neither barrier
// can complete.
__global__ void MismatchedBarriersKernel(float* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  } else {
    __syncthreads();
  }
}

TEST(CudaEmulationDeathTest, MismatchedBarriersAreReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    void* d_out = nullptr;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&d_out, 32 * sizeof(float)) != cudaSuccess) {
      return;  // no deadlock report: the death test fails
    }
    MLAG_LAUNCH(MismatchedBarriersKernel, 1, 32, 0, nullptr)(static_cast<float*>(d_out));
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(run(), "deadlock");
}

// Programmatic dependent launch (kernels/cuda/cuda_api.cuh). Each kernel
// adds one to every element of `x`, reading it first: a chain of them gives
// the count only if each grid saw the one before it.
__global__ void PdlIncrementKernel(int* x, int n) {
  MLAG_GRID_DEPENDENCY_SYNC();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += 1;
}

// The same, without the wait its launch demands.
__global__ void PdlWithoutWaitKernel(int* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += 1;
}

TEST(CudaEmulationPdlTest, ChainedGridsAndTheirCapturedEdges) {
  CUDA_OK(cudaSetDevice(0));
  ASSERT_TRUE(mlag::cuda::PdlEnabled()) << "the emulated device is sm_90";
  const int n = 1000;
  int* x = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(int)));
  CUDA_OK(cudaMemset(x, 0, n * sizeof(int)));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  for (int k = 0; k < 5; ++k)
    MLAG_LAUNCH_PDL(PdlIncrementKernel, (n + 127) / 128, 128, 0, stream)(x, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<int> host(n);
  CUDA_OK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 5) << i;

  // Captured: a plain kernel, a PDL kernel (a programmatic edge from it),
  // a copy, a PDL kernel after the copy (a plain edge: only a kernel has a
  // programmatic port).
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  MLAG_LAUNCH(PdlIncrementKernel, (n + 127) / 128, 128, 0, stream)(x, n);
  MLAG_LAUNCH_PDL(PdlIncrementKernel, (n + 127) / 128, 128, 0, stream)(x, n);
  CUDA_OK(cudaMemsetAsync(x, 0, sizeof(int), stream));
  MLAG_LAUNCH_PDL(PdlIncrementKernel, (n + 127) / 128, 128, 0, stream)(x, n);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  size_t edges = 0;
  CUDA_OK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  ASSERT_EQ(edges, 3u);
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  // As CUDA: programmatic edges are not listed without their data.
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), nullptr, &edges), cudaErrorLossyQuery);
  (void)cudaGetLastError();
  CUDA_OK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges));
  EXPECT_EQ(data[0].type, cudaGraphDependencyTypeProgrammatic);
  EXPECT_EQ(data[0].from_port, cudaGraphKernelNodePortProgrammatic);
  EXPECT_EQ(data[1].type, cudaGraphDependencyTypeDefault);
  EXPECT_EQ(data[2].type, cudaGraphDependencyTypeDefault);
  EXPECT_EQ(data[2].from_port, cudaGraphKernelNodePortDefault);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host[0], 1);
  EXPECT_EQ(host[1], 8);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(x));
}

TEST(CudaEmulationDeathTest, APdlGridThatSkipsTheWaitIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    int* x = nullptr;
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&x), 64 * sizeof(int)) != cudaSuccess) {
      return;  // no report: the death test fails
    }
    MLAG_LAUNCH_PDL(PdlWithoutWaitKernel, 2, 32, 0, nullptr)(x, 64);
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(run(), "without griddepcontrol.wait");
  // Launched plainly, the same kernel owes no wait.
  int* x = nullptr;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&x), 64 * sizeof(int)));
  MLAG_LAUNCH(PdlWithoutWaitKernel, 2, 32, 0, nullptr)(x, 64);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(x));
}

}  // namespace
