#include "examples/mlag/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/host/parallel.h"
#include "kernels/linear.h"
#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mlag {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// Sum of `lines` cache lines of floats at p (64-byte aligned) read with
// non-temporal loads (MOVNTDQA), which may bypass the cache hierarchy's
// allocation; on ordinary write-back memory most CPUs treat them as plain
// loads, so this is one more method to take the best of.
__attribute__((target("sse4.1"))) float SumNonTemporal(const float* p, int64_t lines) {
  __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  for (int64_t l = 0; l < lines; ++l) {
    __m128i* line = reinterpret_cast<__m128i*>(const_cast<float*>(p) + l * 16);
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm_add_ps(acc[j], _mm_castsi128_ps(_mm_stream_load_si128(line + j)));
    }
  }
  float out[4];
  float total = 0;
  for (const __m128& a : acc) {
    _mm_storeu_ps(out, a);
    total += out[0] + out[1] + out[2] + out[3];
  }
  return total;
}
#endif

// How a read method walks a thread's share of the buffer.
enum class ReadMethod {
  kPlain,        // kStreams interleaved streams, plain loads
  kPrefetch,     // the same, each stream prefetched kPrefetchAhead bytes ahead
  kNonTemporal,  // one stream of non-temporal (streaming) loads
};

// A cache line of floats as one GNU vector: one add per line, so the loop
// is bound by loads, not by add latency.
typedef float Line __attribute__((vector_size(64)));

// Sum of n floats read as kStreams interleaved streams (or one, for
// non-temporal loads) with independent accumulators, keeping several memory
// streams in flight.
float SumFloats(const float* p, int64_t n, ReadMethod method) {
  constexpr int kStreams = 4;
  constexpr int64_t kPrefetchAhead = 2048;  // bytes, per stream
  constexpr int64_t kLineFloats = 16;
  float total = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (method == ReadMethod::kNonTemporal) {
    const int64_t lines = n / kLineFloats;
    total = SumNonTemporal(p, lines);
    for (int64_t i = lines * kLineFloats; i < n; ++i) total += p[i];
    return total;
  }
#endif
  const int64_t len = n / kStreams / kLineFloats * kLineFloats;
  Line acc[kStreams] = {};
  for (int64_t i = 0; i < len; i += kLineFloats) {
    for (int s = 0; s < kStreams; ++s) {
      const float* at = p + s * len + i;
      if (method == ReadMethod::kPrefetch) {
        __builtin_prefetch(reinterpret_cast<const char*>(at) + kPrefetchAhead);
      }
      Line v;
      __builtin_memcpy(&v, at, sizeof(v));
      acc[s] += v;
    }
  }
  for (int64_t i = kStreams * len; i < n; ++i) total += p[i];
  for (const Line& a : acc) {
    for (int j = 0; j < kLineFloats; ++j) total += a[j];
  }
  return total;
}

// The matrix-vector product's row length.
constexpr int64_t kGemvCols = 2048;
// The host GEMM's packed group (kernels/host/gemm.h's kGemmGroupRows).
constexpr int64_t kGemmGroupRowsForProbe = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBandwidthProbe>> MemoryBandwidthProbe::Create(Device& device,
                                                                                   size_t bytes) {
  std::unique_ptr<MemoryBandwidthProbe> p(new MemoryBandwidthProbe());
  p->device_ = &device;
  p->bytes_ = bytes;
  MLAG_ASSIGN_OR_RETURN(p->buffer_, device.Allocate(bytes));
  if (device.is_cuda()) {
#if MLAG_HAVE_CUDA
    MLAG_ASSIGN_OR_RETURN(p->copy_, device.Allocate(bytes));
    MLAG_CUDA_RETURN_IF_ERROR(cudaMemset(p->buffer_.data(), 1, bytes));
    MLAG_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(p->copy_.data(), p->buffer_.data(), bytes, cudaMemcpyDeviceToDevice));
    MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return p;
#else
    return absl::FailedPreconditionError("CUDA bandwidth in a build without CUDA");
#endif
  }
  float* data = static_cast<float*>(p->buffer_.data());
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  const int threads = host::NumThreads();
  // Device::Allocate advises a buffer this large onto huge pages, as it
  // does the model's weights; Device::HostHugePageShare reports what it got.
  // First touch from the threads that will read, as the weights are filled.
  host::ParallelFor(threads, [&](int64_t t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    for (int64_t i = b; i < e; ++i) data[i] = 1.0f;
  });
  p->huge_page_share_ = Device::HostHugePageShare(data, bytes);
  p->partial_.resize(threads);
  // The matrix-vector product streams the buffer as the model's weights are
  // streamed: packed by PackForLinear.
  const int64_t rows = n / kGemvCols;
  p->x_.assign(kGemvCols, 1.0f);
  p->y_.assign(static_cast<size_t>(rows), 0.0f);
  MLAG_ASSIGN_OR_RETURN(p->stream_, Stream::Create(&device));
  p->weight_ = LinearWeight(Tensor(data, DType::kF32, {rows, kGemvCols}));
  MLAG_RETURN_IF_ERROR(PackForLinear(device, p->weight_));
  // The same bytes read as packed bf16 weights: the bf16 kernel streams
  // them differently (two weights a lane, converted in registers). What the
  // bytes hold does not matter to the time (f32 1.0s are finite bf16s).
  const int64_t bf16_rows = n * 2 / kGemvCols / kGemmGroupRowsForProbe * kGemmGroupRowsForProbe;
  p->bf16_weight_ = LinearWeight(Tensor(data, DType::kBF16, {bf16_rows, kGemvCols}));
  p->bf16_weight_.host_row_groups = true;
  p->y_.resize(static_cast<size_t>(std::max(rows, bf16_rows)));
  return p;
}

absl::StatusOr<BandwidthMeasurement> MemoryBandwidthProbe::Measure(int reps) {
  BandwidthMeasurement m;
  m.bytes = bytes_;
  if (device_->is_cuda()) {
#if MLAG_HAVE_CUDA
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      MLAG_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(copy_.data(), buffer_.data(), bytes_, cudaMemcpyDeviceToDevice));
      MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.bytes_per_second = std::max(m.bytes_per_second, 2.0 * bytes_ / s);
    }
    m.method = "device-to-device cudaMemcpy (read + write bytes)";
    return m;
#else
    return absl::FailedPreconditionError("CUDA bandwidth in a build without CUDA");
#endif
  }
  const float* data = static_cast<const float*>(buffer_.data());
  const int64_t n = static_cast<int64_t>(bytes_ / sizeof(float));
  const int threads = static_cast<int>(partial_.size());
  volatile float sink = 0;
  double sum_bps = 0.0;
  const char* best_read = "";
  struct Method {
    ReadMethod method;
    const char* name;
  };
  std::vector<Method> methods = {{ReadMethod::kPlain, "streaming read"},
                                 {ReadMethod::kPrefetch, "prefetched read"}};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.1")) {
    methods.push_back({ReadMethod::kNonTemporal, "non-temporal read"});
  }
#endif
  for (int r = 0; r < reps; ++r) {
    for (const Method& method : methods) {
      auto t0 = std::chrono::steady_clock::now();
      host::ParallelFor(threads, [&](int64_t t) {
        // Line-aligned shares, so non-temporal loads see aligned lines.
        const int64_t b = n * t / threads / 16 * 16;
        const int64_t e = t + 1 == threads ? n : n * (t + 1) / threads / 16 * 16;
        partial_[t] = SumFloats(data + b, e - b, method.method);
      });
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (float p : partial_) sink = sink + p;
      if (static_cast<double>(bytes_) / s > sum_bps) {
        sum_bps = static_cast<double>(bytes_) / s;
        best_read = method.name;
      }
    }
  }
  (void)sink;
  // The one-row Linear, whose prefetched single stream can reach more of the
  // memory system than the plain loop above. The ceiling is the better of
  // the two.
  const Tensor xt(x_.data(), DType::kF32, {1, kGemvCols});
  double gemv_bps = 0.0;
  const char* best_gemv = "";
  for (int r = 0; r < reps; ++r) {
    for (const LinearWeight* w : {&weight_, &bf16_weight_}) {
      const int64_t rows = w->values.size(0);
      const Tensor yt(y_.data(), DType::kF32, {1, rows});
      auto t0 = std::chrono::steady_clock::now();
      MLAG_RETURN_IF_ERROR(Linear(*stream_, xt, *w, yt));
      MLAG_RETURN_IF_ERROR(stream_->Synchronize());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double bps = static_cast<double>(w->values.nbytes()) / s;
      if (bps > gemv_bps) {
        gemv_bps = bps;
        best_gemv = w == &weight_ ? "matrix-vector product (f32)" : "matrix-vector product (bf16)";
      }
    }
  }
  m.read_sum_bytes_per_second = sum_bps;
  m.gemv_bytes_per_second = gemv_bps;
  m.bytes_per_second = std::max(sum_bps, gemv_bps);
  m.huge_page_share = huge_page_share_;
  m.method = sum_bps >= gemv_bps ? best_read : best_gemv;
  return m;
}

absl::StatusOr<BandwidthMeasurement> MeasureMemoryBandwidth(Device& device, size_t bytes,
                                                            int reps) {
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBandwidthProbe> probe,
                        MemoryBandwidthProbe::Create(device, bytes));
  return probe->Measure(reps);
}

}  // namespace mlag
