#include "examples/mlag/memory_bandwidth.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/host/parallel.h"
#include "kernels/linear.h"
#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {
namespace {

// Sum of n floats read as four interleaved streams with independent
// accumulators, so the loop is bound by loads, not by add latency, and keeps
// several memory streams in flight.
float SumFloats(const float* p, int64_t n) {
  constexpr int kStreams = 4;
  const int64_t len = n / kStreams / 16 * 16;
  float acc[kStreams][16] = {};
  for (int64_t i = 0; i < len; i += 16) {
    for (int s = 0; s < kStreams; ++s) {
      for (int j = 0; j < 16; ++j) acc[s][j] += p[s * len + i + j];
    }
  }
  float total = 0;
  for (int64_t i = kStreams * len; i < n; ++i) total += p[i];
  for (auto& a : acc) {
    for (float v : a) total += v;
  }
  return total;
}

}  // namespace

absl::StatusOr<BandwidthMeasurement> MeasureMemoryBandwidth(Device& device, size_t bytes,
                                                            int reps) {
  BandwidthMeasurement m;
  m.bytes = bytes;
  if (device.is_cuda()) {
#if MLAG_HAVE_CUDA
    MLAG_ASSIGN_OR_RETURN(Buffer src, device.Allocate(bytes));
    MLAG_ASSIGN_OR_RETURN(Buffer dst, device.Allocate(bytes));
    MLAG_CUDA_RETURN_IF_ERROR(cudaMemset(src.data(), 1, bytes));
    MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
    MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      MLAG_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
      MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.bytes_per_second = std::max(m.bytes_per_second, 2.0 * bytes / s);
    }
    m.method = "device-to-device cudaMemcpy (read + write bytes)";
    return m;
#else
    return absl::FailedPreconditionError("CUDA bandwidth in a build without CUDA");
#endif
  }
  MLAG_ASSIGN_OR_RETURN(Buffer buf, device.Allocate(bytes));
  float* data = static_cast<float*>(buf.data());
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  const int threads = host::NumThreads();
  // First touch from the threads that will read, as the weights are filled.
  host::ParallelFor(threads, [&](int64_t t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    for (int64_t i = b; i < e; ++i) data[i] = 1.0f;
  });
  std::vector<float> partial(threads);
  volatile float sink = 0;
  double sum_bps = 0.0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    host::ParallelFor(threads, [&](int64_t t) {
      const int64_t b = n * t / threads, e = n * (t + 1) / threads;
      partial[t] = SumFloats(data + b, e - b);
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float p : partial) sink = sink + p;
    sum_bps = std::max(sum_bps, static_cast<double>(bytes) / s);
  }
  (void)sink;
  // The same buffer streamed by a matrix-vector product: the host Linear
  // kernel at one row, on weights packed as the model's are (PackForLinear),
  // whose prefetched single stream can reach more of the memory system than
  // the plain loop above. The ceiling is the better of the two.
  constexpr int64_t kCols = 2048;
  const int64_t rows = n / kCols;
  std::vector<float> x(kCols, 1.0f), y(static_cast<size_t>(rows));
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, Stream::Create(&device));
  LinearWeight w(Tensor(data, DType::kF32, {rows, kCols}));
  MLAG_RETURN_IF_ERROR(PackForLinear(device, w));
  const Tensor xt(x.data(), DType::kF32, {1, kCols});
  const Tensor yt(y.data(), DType::kF32, {1, rows});
  double gemv_bps = 0.0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    MLAG_RETURN_IF_ERROR(Linear(*stream, xt, w, yt));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gemv_bps = std::max(gemv_bps, static_cast<double>(rows * kCols * sizeof(float)) / s);
  }
  m.read_sum_bytes_per_second = sum_bps;
  m.gemv_bytes_per_second = gemv_bps;
  m.bytes_per_second = std::max(sum_bps, gemv_bps);
  m.method = "best of a parallel read-sum and a matrix-vector product over the buffer";
  return m;
}

}  // namespace mlag
