// The memory-bandwidth ceiling benchmarks are measured against, taken in the
// same run as the figures it bounds.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/linear.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace mlag {

struct BandwidthMeasurement {
  double bytes_per_second = 0.0;           // the ceiling: best of the methods and repetitions
  double read_sum_bytes_per_second = 0.0;  // host: best parallel read-sum
  double gemv_bytes_per_second = 0.0;      // host: Linear at one row over the buffer
  size_t bytes = 0;                        // buffer size
  double huge_page_share = 0.0;            // host: the share of the buffer on huge pages
  const char* method = "";                 // the method that gave the ceiling
};

// A bandwidth measurement that can be repeated without allocating again:
// the buffer is allocated, first touched (and on the host packed as a weight)
// once, so a benchmark can take the ceiling right beside each timing. On a
// shared machine whose memory bandwidth moves between phases, a ceiling taken
// minutes away can land in another phase than the figure it bounds.
class MemoryBandwidthProbe {
 public:
  // `bytes` should be far larger than the last-level cache.
  static absl::StatusOr<std::unique_ptr<MemoryBandwidthProbe>> Create(Device& device, size_t bytes);
  // The measurement MeasureMemoryBandwidth describes, best of `reps`.
  absl::StatusOr<BandwidthMeasurement> Measure(int reps);

  // The buffer the probe reads, for comparing another reader with the probe
  // over the same memory. On 4 KiB pages two buffers of one size can stream
  // at speeds up to 20% apart (measured on a virtual machine: the physical
  // pages each one gets), so a comparison across buffers measures their
  // pages, not the readers. What the buffer holds does not matter to the
  // probe's time; a caller may overwrite it.
  void* data() const { return buffer_.data(); }
  size_t bytes() const { return bytes_; }

 private:
  MemoryBandwidthProbe() = default;

  Device* device_ = nullptr;
  size_t bytes_ = 0;
  Buffer buffer_;
  Buffer copy_;                     // CUDA: the copy's destination
  std::unique_ptr<Stream> stream_;  // host: the Linear's stream
  LinearWeight weight_;             // host: the buffer as a packed [rows, 2048] weight
  LinearWeight bf16_weight_;        // host: the same bytes as packed bf16 weights
  std::vector<float> x_, y_, partial_;
  double huge_page_share_ = 0.0;
};

// Host: the best of several ways to read a `bytes` buffer (on huge pages
// where the system gives them) on every host thread: plain streaming reads,
// reads with software prefetch, non-temporal loads, and a one-row Linear
// streaming the same buffer as an f32 and as a bf16 weight matrix (the
// access pattern of decode), best of `reps` each. A ceiling any real kernel can beat is a
// defect of the probe: mlag bench names one when a step does. CUDA: a device-to-device
// cudaMemcpy, counting bytes read plus bytes written. `bytes` should be far
// larger than the last-level cache.
absl::StatusOr<BandwidthMeasurement> MeasureMemoryBandwidth(Device& device, size_t bytes,
                                                            int reps = 5);

}  // namespace mlag
