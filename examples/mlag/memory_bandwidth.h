// The memory-bandwidth ceiling benchmarks are measured against, taken in the
// same run as the figures it bounds.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "runtime/core/device.h"

namespace mlag {

struct BandwidthMeasurement {
  double bytes_per_second = 0.0;           // the ceiling: best of the methods and repetitions
  double read_sum_bytes_per_second = 0.0;  // host: parallel read-sum
  double gemv_bytes_per_second = 0.0;      // host: Linear at one row over the buffer
  size_t bytes = 0;                        // buffer size
  const char* method = "";                 // what was timed
};

// Host: the better of a read-only sum over a `bytes` buffer on every host
// thread and a one-row Linear streaming the same buffer as a weight matrix
// (the access pattern of decode), best of `reps`. CUDA: a device-to-device
// cudaMemcpy, counting bytes read plus bytes written. `bytes` should be far
// larger than the last-level cache.
absl::StatusOr<BandwidthMeasurement> MeasureMemoryBandwidth(Device& device, size_t bytes,
                                                            int reps = 5);

}  // namespace mlag
