// The bandwidth ceiling mlag bench measures against is one no kernel of ours
// beats: on the same machine, in the same process, the probe
// (examples/mlag/memory_bandwidth.h) reads at least as fast as the host's own
// batch-1 decode GEMM streaming the same bytes as f32 or bf16 weights,
// packed as the model's are. A ceiling below a real kernel would make every
// "of bw" figure read high.
//
// The GEMM streams the probe's own buffer: on 4 KiB pages two allocations of
// one size can read at speeds up to 20% apart, and a comparison across
// buffers would measure their pages, not the readers. The comparison runs
// once on the pages the system gives (huge pages where it has them) and once
// on 4 KiB pages, which a machine whose huge pages are used up or disabled
// falls back to.
//
// Timings, so the comparison is made within short interleaved rounds (see
// the test) and allows 5% for noise; under a sanitizer (whose instrumentation slows the
// probe's loops and the GEMM unequally) the test skips.
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "examples/mlag/memory_bandwidth.h"
#include "gtest/gtest.h"
#include "kernels/host/gemm.h"
#include "kernels/linear.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "tests/status_matchers.h"

#if defined(__SANITIZE_ADDRESS__)
#define MLAG_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLAG_SANITIZED 1
#endif
#endif

namespace mlag {
namespace {

constexpr size_t kBytes = size_t{512} << 20;  // far beyond any last-level cache
constexpr int64_t kCols = 4096;

// Best bytes/s of a one-row Linear over the probe's buffer read as a
// [rows, kCols] weight of `dtype`, packed as the model's weights are.
class DecodeGemm {
 public:
  static std::unique_ptr<DecodeGemm> Create(Device& device, DType dtype,
                                            const MemoryBandwidthProbe& probe) {
    auto g = std::make_unique<DecodeGemm>();
    g->rows_ = static_cast<int64_t>(probe.bytes() / DTypeSize(dtype)) / kCols;
    g->bytes_ = static_cast<size_t>(g->rows_ * kCols) * DTypeSize(dtype);
    // Bytes that are a finite weight in either dtype, the same after packing.
    std::fill_n(static_cast<uint8_t*>(probe.data()), g->bytes_, uint8_t{0x3c});
    g->weight_ = LinearWeight(Tensor(probe.data(), dtype, {g->rows_, kCols}));
    EXPECT_OK(PackForLinear(device, g->weight_));
    g->x_.assign(kCols, 0.5f);
    g->y_.assign(static_cast<size_t>(g->rows_), 0.0f);
    g->stream_ = Stream::Create(&device).value();
    return g;
  }
  double Best(int reps) {
    const Tensor x(x_.data(), DType::kF32, {1, kCols});
    const Tensor y(y_.data(), DType::kF32, {1, rows_});
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_OK(Linear(*stream_, x, weight_, y));
      EXPECT_OK(stream_->Synchronize());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(bytes_) / s);
    }
    return best;
  }

 private:
  int64_t rows_ = 0;
  size_t bytes_ = 0;
  LinearWeight weight_;
  std::vector<float> x_, y_;
  std::unique_ptr<Stream> stream_;
};

// Runs the comparison on the pages new allocations get now; returns the
// share of the probe's buffer on huge pages.
double ExpectNoDecodeGemmReadsFasterThanTheProbe() {
  auto device = Device::Create("host").value();
  auto probe = MemoryBandwidthProbe::Create(*device, kBytes).value();
  auto f32 = DecodeGemm::Create(*device, DType::kF32, *probe);
  auto bf16 = DecodeGemm::Create(*device, DType::kBF16, *probe);
  // Short rounds, each comparing within itself: this machine's bandwidth
  // may move between phases from one second to the next, and a probe timed
  // in one phase against a GEMM timed in another compares nothing. A probe
  // slower than the GEMM loses in every round; one that is not wins in the
  // rounds that stayed in one phase. The round kept is the one most
  // favourable to the probe.
  double best_ratio = 0, probe_best = 0, f32_best = 0, bf16_best = 0, huge_page_share = 0;
  const char* method = "";
  for (int round = 0; round < 6; ++round) {
    const BandwidthMeasurement m = probe->Measure(/*reps=*/1).value();
    huge_page_share = m.huge_page_share;
    const double f32_r = f32->Best(2), bf16_r = bf16->Best(2);
    best_ratio = std::max(best_ratio, m.bytes_per_second / std::max(f32_r, bf16_r));
    if (m.bytes_per_second > probe_best) {
      probe_best = m.bytes_per_second;
      method = m.method;
    }
    f32_best = std::max(f32_best, f32_r);
    bf16_best = std::max(bf16_best, bf16_r);
  }
  std::printf(
      "bandwidth probe %.2f GB/s at best (%s); batch-1 decode GEMM over the same %zu MiB at best: "
      "f32 %.2f GB/s, bf16 %.2f GB/s; the probe over the faster GEMM in its best round: %.2f; "
      "%.0f%% of it on huge pages; host kernels %s\n",
      probe_best / 1e9, method, kBytes >> 20, f32_best / 1e9, bf16_best / 1e9, best_ratio,
      100 * huge_page_share, host::GemmIsa());
  EXPECT_GE(best_ratio, 0.95) << "the probe is slower than the host's decode GEMM";
  return huge_page_share;
}

TEST(BandwidthProbeTest, NoDecodeGemmReadsFasterThanTheProbe) {
#ifdef MLAG_SANITIZED
  GTEST_SKIP() << "timings under a sanitizer compare nothing";
#endif
  ExpectNoDecodeGemmReadsFasterThanTheProbe();
}

TEST(BandwidthProbeTest, NoDecodeGemmReadsFasterThanTheProbeOnSmallPages) {
#ifdef MLAG_SANITIZED
  GTEST_SKIP() << "timings under a sanitizer compare nothing";
#endif
  // Transparent huge pages off for this process while the buffers are
  // allocated and first touched: every page is 4 KiB.
  const int was_disabled = prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0);
  if (was_disabled < 0 || prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
    GTEST_SKIP() << "this kernel cannot turn transparent huge pages off for a process";
  }
  const double huge_page_share = ExpectNoDecodeGemmReadsFasterThanTheProbe();
  prctl(PR_SET_THP_DISABLE, was_disabled, 0, 0, 0);
  EXPECT_EQ(huge_page_share, 0.0)
      << "the buffer got huge pages: the comparison was not on 4 KiB pages";
}

}  // namespace
}  // namespace mlag
