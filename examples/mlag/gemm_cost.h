// What batch invariance costs the host, measured in the same run as the
// figures it qualifies: the host GEMM (kernels/host/gemm.h, one summation
// order per output element at every row count, on weights packed as the
// model's are) against OpenBLAS's sgemm (whose order depends on the row
// count) on one of the model's projection shapes, both split over the
// threads by output columns. And the host's peak multiply-add rate, the
// arithmetic ceiling of those kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace mlag {

struct GemmCost {
  int64_t rows = 0, out = 0, in = 0;
  double host_gemm_gflops = 0;  // 2 * rows * out * in / best time
  double openblas_gflops = 0;
};

// OpenBLAS's kernel family ("Haswell", "SkylakeX", ...): the CPU's, or
// OPENBLAS_CORETYPE's when set before the process started.
const char* OpenblasCore();

// The host's peak multiply-add rate, as GFLOP/s (two per multiply-add):
// host::GemmPeakProbe on every host thread at once, best of `reps`. The
// arithmetic ceiling that decode steps are measured against. Host only.
double MeasurePeakGflops(int reps = 5);

// Best of `reps` for each distinct row count (ascending), f32 weights
// [out, in]. Host only.
absl::StatusOr<std::vector<GemmCost>> MeasureGemmCost(int64_t out, int64_t in,
                                                      std::vector<int64_t> rows, int reps = 3);

}  // namespace mlag
