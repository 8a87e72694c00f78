#include "examples/mlag/memory_bandwidth.h"

#include <chrono>
#include <cstring>
#include <memory>
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

// The matrix-vector product's row length.
constexpr int64_t kGemvCols = 2048;

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
  // First touch from the threads that will read, as the weights are filled.
  host::ParallelFor(threads, [&](int64_t t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    for (int64_t i = b; i < e; ++i) data[i] = 1.0f;
  });
  p->partial_.resize(threads);
  // The matrix-vector product streams the buffer as the model's weights are
  // streamed: packed by PackForLinear.
  const int64_t rows = n / kGemvCols;
  p->x_.assign(kGemvCols, 1.0f);
  p->y_.assign(static_cast<size_t>(rows), 0.0f);
  MLAG_ASSIGN_OR_RETURN(p->stream_, Stream::Create(&device));
  p->weight_ = LinearWeight(Tensor(data, DType::kF32, {rows, kGemvCols}));
  MLAG_RETURN_IF_ERROR(PackForLinear(device, p->weight_));
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
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    host::ParallelFor(threads, [&](int64_t t) {
      const int64_t b = n * t / threads, e = n * (t + 1) / threads;
      partial_[t] = SumFloats(data + b, e - b);
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float p : partial_) sink = sink + p;
    sum_bps = std::max(sum_bps, static_cast<double>(bytes_) / s);
  }
  (void)sink;
  // The one-row Linear, whose prefetched single stream can reach more of the
  // memory system than the plain loop above. The ceiling is the better of
  // the two.
  const int64_t rows = static_cast<int64_t>(y_.size());
  const Tensor xt(x_.data(), DType::kF32, {1, kGemvCols});
  const Tensor yt(y_.data(), DType::kF32, {1, rows});
  double gemv_bps = 0.0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    MLAG_RETURN_IF_ERROR(Linear(*stream_, xt, weight_, yt));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gemv_bps = std::max(gemv_bps, static_cast<double>(rows * kGemvCols * sizeof(float)) / s);
  }
  m.read_sum_bytes_per_second = sum_bps;
  m.gemv_bytes_per_second = gemv_bps;
  m.bytes_per_second = std::max(sum_bps, gemv_bps);
  m.method = "best of a parallel read-sum and a matrix-vector product over the buffer";
  return m;
}

absl::StatusOr<BandwidthMeasurement> MeasureMemoryBandwidth(Device& device, size_t bytes,
                                                            int reps) {
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBandwidthProbe> probe,
                        MemoryBandwidthProbe::Create(device, bytes));
  return probe->Measure(reps);
}

}  // namespace mlag
