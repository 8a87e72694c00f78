// MLA decode kernel benchmark on one CUDA device: b = 128 sequences of 4096
// cached tokens, H = 16 heads, Rkv = 512, dr = 64 (DeepSeek-V2-Lite's
// attention), bf16 cache in blocks of 64 tokens with the pages in random
// order. For each decode kernel (f32, tensor_core, tensor_core_bf16q) times
// 20 MlaDecode calls (through the public kernels API on a CUDA stream, with a
// decode workspace) with CUDA events; measures device-to-device cudaMemcpy
// bandwidth of a 2 GiB buffer in the same run (read + write bytes); prints
//   mla_decode[KERNEL] b=128 s=4096 H=16: X us, Y GB/s, Z% of copy bandwidth (W GB/s), vs f32: E
// where the bytes are the cache rows read (b * s * 576 * 2) plus the queries
// read and the outputs written, and E is the normwise difference of the
// kernel's output from the f32 kernel's (max |a - b| / max |b|). Exits 77
// when there is no CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "examples/mlag/memory_bandwidth.h"
#include "kernels/mla_attention.h"
#include "mlag_config.h"
#include "runtime/core/device.h"
#include "runtime/core/scalar_types.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr int64_t kBatch = 128;
constexpr int64_t kSeqLen = 4096;
constexpr int64_t kHeads = 16;
constexpr int64_t kRkv = 512;
constexpr int64_t kDr = 64;
constexpr int64_t kBlockSize = 64;
constexpr int kWarmup = 3;
constexpr int kIters = 20;
constexpr size_t kCopyBytes = size_t{2} << 30;

#define BENCH_CHECK(expr)                                                                          \
  do {                                                                                             \
    const absl::Status bench_status_ = (expr);                                                     \
    if (!bench_status_.ok()) {                                                                     \
      std::fprintf(stderr, "mla_decode_bench: %s: %s\n", #expr, bench_status_.ToString().c_str()); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

#if MLAG_HAVE_CUDA
#define BENCH_CUDA(expr)                                                                         \
  do {                                                                                           \
    const cudaError_t bench_err_ = (expr);                                                       \
    if (bench_err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "mla_decode_bench: %s: %s\n", #expr, cudaGetErrorString(bench_err_)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

int Run() {
  using namespace mlag;
  auto device_or = Device::Create("cuda");
  BENCH_CHECK(device_or.status());
  Device& device = **device_or;
  BENCH_CHECK(device.MakeCurrent());
  auto stream_or = Stream::Create(&device);
  BENCH_CHECK(stream_or.status());
  Stream& stream = **stream_or;

  const int64_t blocks_per_seq = kSeqLen / kBlockSize;
  const int64_t num_blocks = kBatch * blocks_per_seq + 1;  // block 0: the null block
  const int64_t row = kRkv + kDr;

  // Cache: random bf16 values, generated on the host one block at a time.
  auto cache_buf = device.Allocate(static_cast<size_t>(num_blocks * kBlockSize * row) * 2);
  BENCH_CHECK(cache_buf.status());
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> block(static_cast<size_t>(kBlockSize * row));
    std::vector<uint16_t> pool(4096);
    for (uint16_t& v : pool) v = F32ToBf16(u(rng));
    for (int64_t b = 0; b < num_blocks; ++b) {
      const size_t shift = static_cast<size_t>(rng() % pool.size());
      for (size_t i = 0; i < block.size(); ++i) block[i] = pool[(i * 7 + shift) % pool.size()];
      BENCH_CHECK(device.CopyFromHost(static_cast<uint16_t*>(cache_buf->data()) + b * block.size(),
                                      block.data(), block.size() * 2));
    }
  }
  const Tensor cache = cache_buf->AsTensor(DType::kBF16, {num_blocks, kBlockSize, row});

  // Block table: the pages in random order; every sequence full.
  std::vector<int32_t> table(static_cast<size_t>(kBatch * blocks_per_seq));
  std::iota(table.begin(), table.end(), 1);
  std::shuffle(table.begin(), table.end(), std::mt19937(2));
  std::vector<int32_t> lens(kBatch, static_cast<int32_t>(kSeqLen));
  std::vector<float> q(static_cast<size_t>(kBatch * kHeads * row));
  {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (float& v : q) v = u(rng);
  }
  auto table_buf = device.Allocate(table.size() * 4);
  auto lens_buf = device.Allocate(lens.size() * 4);
  auto q_buf = device.Allocate(q.size() * 4);
  auto out_buf = device.Allocate(static_cast<size_t>(kBatch * kHeads * kRkv) * 4);
  auto lse_buf = device.Allocate(static_cast<size_t>(kBatch * kHeads) * 4);
  BENCH_CHECK(table_buf.status());
  BENCH_CHECK(lens_buf.status());
  BENCH_CHECK(q_buf.status());
  BENCH_CHECK(out_buf.status());
  BENCH_CHECK(lse_buf.status());
  BENCH_CHECK(device.CopyFromHost(table_buf->data(), table.data(), table.size() * 4));
  BENCH_CHECK(device.CopyFromHost(lens_buf->data(), lens.data(), lens.size() * 4));
  BENCH_CHECK(device.CopyFromHost(q_buf->data(), q.data(), q.size() * 4));
  BENCH_CUDA(cudaDeviceSynchronize());
  const Tensor block_table = table_buf->AsTensor(DType::kI32, {kBatch, blocks_per_seq});
  const Tensor seq_lens = lens_buf->AsTensor(DType::kI32, {kBatch});
  // q_latent and q_pe are column slices of one [b, H, Rkv + dr] buffer.
  const Tensor q_all = q_buf->AsTensor(DType::kF32, {kBatch, kHeads, row});
  const Tensor q_latent = q_all.Slice(2, 0, kRkv);
  const Tensor q_pe = q_all.Slice(2, kRkv, row);
  const Tensor out = out_buf->AsTensor(DType::kF32, {kBatch, kHeads, kRkv});
  const Tensor lse = lse_buf->AsTensor(DType::kF32, {kBatch, kHeads});
  auto ws = MlaDecodeWorkspace::Create(device, kBatch, kHeads, kRkv);
  BENCH_CHECK(ws.status());
  const float scale = 0.1147f;

  // The ceiling, measured now on the same device.
  auto bw = MeasureMemoryBandwidth(device, kCopyBytes);
  BENCH_CHECK(bw.status());
  const double copy_gbps = bw->bytes_per_second / 1e9;
  std::printf("device: %s, copy bandwidth %.1f GB/s\n", device.name().c_str(), copy_gbps);

  const double bytes = static_cast<double>(kBatch * kSeqLen * row * 2)           // cache rows
                       + static_cast<double>(kBatch * kHeads * row * 4)          // queries
                       + static_cast<double>(kBatch * kHeads * (kRkv + 1) * 4);  // out + lse
  std::vector<float> reference;  // the f32 kernel's output
  for (MlaDecodeKernel kernel :
       {MlaDecodeKernel::kF32, MlaDecodeKernel::kTensorCore, MlaDecodeKernel::kTensorCoreBf16Q}) {
    for (int i = 0; i < kWarmup; ++i) {
      BENCH_CHECK(MlaDecode(stream, q_latent, q_pe, cache, block_table, seq_lens, scale, out, lse,
                            &ws.value(), kernel));
    }
    BENCH_CHECK(stream.Synchronize());
    cudaEvent_t start, stop;
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    const cudaStream_t cs = static_cast<cudaStream_t>(stream.native());
    BENCH_CUDA(cudaEventRecord(start, cs));
    for (int i = 0; i < kIters; ++i) {
      BENCH_CHECK(MlaDecode(stream, q_latent, q_pe, cache, block_table, seq_lens, scale, out, lse,
                            &ws.value(), kernel));
    }
    BENCH_CUDA(cudaEventRecord(stop, cs));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    BENCH_CUDA(cudaEventDestroy(start));
    BENCH_CUDA(cudaEventDestroy(stop));
    const double us = 1000.0 * ms / kIters;

    // Sanity: finite outputs, and their distance from the f32 kernel's.
    std::vector<float> lse_host(static_cast<size_t>(kBatch * kHeads));
    std::vector<float> out_host(static_cast<size_t>(kBatch * kHeads * kRkv));
    BENCH_CHECK(device.CopyToHost(lse_host.data(), lse_buf->data(), lse_host.size() * 4));
    BENCH_CHECK(device.CopyToHost(out_host.data(), out_buf->data(), out_host.size() * 4));
    for (float v : lse_host) {
      if (!(v == v) || v > 1e30f || v < -1e30f) {
        std::fprintf(stderr, "mla_decode_bench: non-finite lse %g\n", v);
        return 1;
      }
    }
    if (reference.empty()) reference = out_host;
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < out_host.size(); ++i) {
      err = std::max(err, std::abs(static_cast<double>(out_host[i]) - reference[i]));
      ref = std::max(ref, std::abs(static_cast<double>(reference[i])));
    }
    const double gbps = bytes / (us * 1e-6) / 1e9;
    std::printf(
        "mla_decode[%s] b=%lld s=%lld H=%lld: %.1f us, %.1f GB/s, %.1f%% of copy "
        "bandwidth (%.1f GB/s), vs f32: %.2g\n",
        MlaDecodeKernelName(kernel), static_cast<long long>(kBatch),
        static_cast<long long>(kSeqLen), static_cast<long long>(kHeads), us, gbps,
        100.0 * gbps / copy_gbps, copy_gbps, ref > 0.0 ? err / ref : err);
  }
  return 0;
}
#endif  // MLAG_HAVE_CUDA

}  // namespace

int main() {
  if (mlag::Device::CudaDeviceCount() == 0) {
    std::printf("mla_decode_bench: no CUDA device, skipped\n");
    return 77;
  }
#if MLAG_HAVE_CUDA
  return Run();
#else
  return 77;
#endif
}
