#include "examples/mlag/gemm_cost.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/status/status.h"
#include "kernels/host/blas.h"
#include "kernels/host/gemm.h"
#include "kernels/host/linear.h"
#include "kernels/host/parallel.h"

namespace mlag {
namespace {

// Best wall time of `reps` runs of fn, in seconds.
template <typename Fn>
double BestSeconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

const char* OpenblasCore() { return openblas_get_corename(); }

double MeasurePeakGflops(int reps) {
  // Items of 2^20 steps (about 2-20 ms each), claimed one at a time, 16
  // per thread: a thread that starts late takes fewer, and the total over
  // the wall time is every thread's rate together.
  constexpr int64_t kItemSteps = int64_t{1} << 20;
  const int64_t items = 16 * int64_t{host::NumThreads()};
  std::vector<int64_t> done(static_cast<size_t>(items));
  const double seconds = BestSeconds(reps, [&] {
    host::ParallelForDynamic(items, [&](int64_t i) { done[i] = host::GemmPeakProbe(kItemSteps); });
  });
  double madds = 0.0;  // the same every repetition
  for (int64_t d : done) madds += static_cast<double>(d);
  return 2.0 * madds / seconds / 1e9;
}

absl::StatusOr<std::vector<GemmCost>> MeasureGemmCost(int64_t out, int64_t in,
                                                      std::vector<int64_t> rows, int reps) {
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  if (out <= 0 || in <= 0 || rows.empty()) {
    return absl::InvalidArgumentError("gemm cost: empty shape");
  }
  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  std::vector<float> w(static_cast<size_t>(out * in)), x(static_cast<size_t>(max_rows * in)),
      y(static_cast<size_t>(max_rows * out));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  // The host GEMM reads the weights packed, as the model's are; OpenBLAS
  // reads them row-major.
  std::vector<float> w_packed(w);
  LinearWeight wt(Tensor(w_packed.data(), DType::kF32, {out, in}));
  host::PackGemmRowGroups(w_packed.data(), DType::kF32, out, in);
  wt.host_row_groups = true;
  host::UseSerialBlas();
  std::vector<GemmCost> results;
  for (int64_t m : rows) {
    const Tensor xt(x.data(), DType::kF32, {m, in});
    const Tensor yt(y.data(), DType::kF32, {m, out});
    host::Linear(xt, wt, yt);  // warm caches and pages
    const double gemm_s = BestSeconds(reps, [&] { host::Linear(xt, wt, yt); });
    // OpenBLAS, one contiguous block of output columns per thread.
    const int64_t parts = host::NumThreads();
    const double blas_s = BestSeconds(reps, [&] {
      host::ParallelFor(parts, [&](int64_t p) {
        const int64_t c0 = out * p / parts, c1 = out * (p + 1) / parts;
        if (c1 <= c0) return;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                    static_cast<int>(c1 - c0), static_cast<int>(in), 1.0f, x.data(),
                    static_cast<int>(in), w.data() + c0 * in, static_cast<int>(in), 0.0f,
                    y.data() + c0, static_cast<int>(out));
      });
    });
    const double flops = 2.0 * static_cast<double>(m) * out * in;
    results.push_back({m, out, in, flops / gemm_s / 1e9, flops / blas_s / 1e9});
  }
  return results;
}

}  // namespace mlag
