// GPU tests of the MLA kernels (kv_update, decode, prefill): every CUDA
// result against the host kernel run on the same random inputs. Compiled
// always; every test skips itself without a CUDA device.
//
// Tolerances. kv_update is compared byte for byte (the cast is the same
// round-to-nearest-even on both sides). Attention on the host and on the GPU
// reads the same cache values (bf16 widened exactly) and accumulates in f32
// in a different order; out_latent is compared normwise (max |got - want| /
// max |want|) and lse as max |got - want| / max(1, |want|):
//   1e-5 for sequences up to 300 tokens (about 100x f32 epsilon), 3e-5 when
//   a 4096-token sequence is in the batch (the f32 sums of the softmax
//   denominator and of the value rows run 4096 terms deep on both sides).
// A row with seq_len 0 must be exactly zero with lse -inf, and no output
// element may keep the NaN poison written before each run.
//
// The tensor-core decode kernels round on purpose (q to bf16, or to a bf16
// hi + lo pair; the probabilities to bf16). Their tolerance is computed per
// case from a double-precision model of that arithmetic
// (ModelTensorCoreDecode): the GPU must lie within 4x the model's own
// distance from the host kernel plus the f32 tolerance above, and the model
// itself must stay within the documented precision (2e-2 for a bf16 q,
// 4e-3 for the split q).
#include "runtime/core/scalar_types.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "mlag_config.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"
#include "tests/mla_attention_cases.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;
using namespace mla_cases;  // NOLINT: the shared attention cases

constexpr double kTol = 1e-5;
constexpr double kTolLong = 3e-5;

// ---- Device plumbing ----------------------------------------------------------

class MlaGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (Device::CudaDeviceCount() == 0) return;
    auto device = Device::Create("cuda");
    ASSERT_OK(device);
    device_ = std::move(device).value();
    ASSERT_OK(device_->MakeCurrent());
    auto stream = Stream::Create(device_.get());
    ASSERT_OK(stream);
    stream_ = std::move(stream).value();
  }
  static void TearDownTestSuite() {
    stream_.reset();
    device_.reset();
  }
  void SetUp() override {
    if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_NE(device_, nullptr);
  }

  static Device& device() { return *device_; }
  static Stream& stream() { return *stream_; }

  static std::unique_ptr<Device> device_;
  static std::unique_ptr<Stream> stream_;
};

std::unique_ptr<Device> MlaGpuTest::device_;
std::unique_ptr<Stream> MlaGpuTest::stream_;

// Waits for everything on the device: kernels on the test stream and the
// copies Device::CopyFromHost makes on the legacy stream (a pageable
// host-to-device cudaMemcpy may return before its DMA has landed, and the
// test stream does not wait for the legacy stream).
void SyncDevice() {
#if MLAG_HAVE_CUDA
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#endif
}

// A device copy of a host test buffer, with views at the same offsets.
struct DeviceCopy {
  Buffer buffer;
  const Owned* host = nullptr;

  // The device view matching `host_view`, a view into host->buffer.
  Tensor View(const Tensor& host_view) const {
    const ptrdiff_t offset =
        static_cast<const char*>(host_view.data()) - static_cast<const char*>(host->buffer.data());
    return Tensor::Strided(static_cast<char*>(buffer.data()) + offset, host_view.dtype(),
                           host_view.shape(), host_view.strides(), DeviceKind::kCuda);
  }
  Tensor View() const { return View(host->t); }
};

DeviceCopy Upload(Device& device, const Owned& host) {
  DeviceCopy d;
  d.host = &host;
  d.buffer = device.Allocate(host.buffer.bytes()).value();
  EXPECT_OK(device.CopyFromHost(d.buffer.data(), host.buffer.data(), host.buffer.bytes()));
  SyncDevice();
  return d;
}

// Copies the device buffer back over its host buffer.
void Download(Device& device, Stream& stream, const DeviceCopy& d) {
  ASSERT_OK(stream.Synchronize());
  ASSERT_OK(device.CopyToHost(d.host->buffer.data(), d.buffer.data(), d.host->buffer.bytes()));
}

// A host tensor of the same shape owning a copy of `src`'s buffer.
Owned Clone(const Owned& src) {
  Owned o = Make(src.t.dtype(), {src.numel()});
  o.t = Tensor(o.buffer.data(), src.t.dtype(), src.t.shape());
  std::memcpy(o.buffer.data(), src.buffer.data(), std::min(o.buffer.bytes(), src.buffer.bytes()));
  return o;
}

uint64_t Fnv1a(const unsigned char* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// ============================================================================
// KV update

struct KvCase {
  DType input;
  DType cache;
  int rkv, dr;
};

class MlaKvUpdateGpuTest : public MlaGpuTest, public ::testing::WithParamInterface<KvCase> {};

TEST_P(MlaKvUpdateGpuTest, MatchesHostBytes) {
  const KvCase c = GetParam();
  const int pad = 5, num_blocks = 9, block_size = 16;
  const int num_slots = num_blocks * block_size;
  const int rows = 40, tokens = 33;  // inputs longer than slot_mapping (graph padding)
  const int width = c.rkv + c.dr;

  // kv_c and k_pe are column slices of one [rows, rkv + dr + pad] buffer, as
  // the projection produces them.
  Owned kv = Make(c.input, {rows, width + pad});
  testing::FillRandom(kv, 1000 + c.rkv, -4.0f, 4.0f);
  const Tensor kv_c = kv.t.Slice(1, 0, c.rkv);
  const Tensor k_pe = kv.t.Slice(1, c.rkv, width);

  Owned cache = Make(c.cache, {num_blocks, block_size, width});
  testing::FillRandom(cache, 2000 + c.dr, -8.0f, 8.0f);

  // Distinct random slots with dummy rows (-1), a negative slot, one past the
  // cache and slot 0.
  std::mt19937 rng(3000);
  std::vector<int64_t> perm(num_slots - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  Owned slots = Make(DType::kI64, {tokens});
  int64_t* slot = slots.data<int64_t>();
  for (int t = 0; t < tokens; ++t) slot[t] = perm[t];
  slot[0] = -1;
  slot[4] = -1;
  slot[5] = -7;
  slot[9] = num_slots;
  slot[tokens - 1] = 0;
  slot[tokens - 2] = -1;
  std::vector<bool> written(num_slots, false);
  for (int t = 0; t < tokens; ++t) {
    if (slot[t] >= 0 && slot[t] < num_slots) written[slot[t]] = true;
  }
  const size_t row_bytes = static_cast<size_t>(width) * DTypeSize(c.cache);
  auto unwritten_checksum = [&](const Owned& o) {
    uint64_t h = 1469598103934665603ull;
    const auto* base = static_cast<const unsigned char*>(o.t.data());
    for (int s = 0; s < num_slots; ++s) {
      if (!written[s]) h = Fnv1a(base + s * row_bytes, row_bytes, h);
    }
    return h;
  };
  const uint64_t before = unwritten_checksum(cache);

  // Host reference on a copy of the cache.
  Owned want = Clone(cache);
  ASSERT_OK(MlaKvUpdate(HostStream(), kv_c, k_pe, slots.t, want.t));

  DeviceCopy d_kv = Upload(device(), kv);
  DeviceCopy d_cache = Upload(device(), cache);
  DeviceCopy d_slots = Upload(device(), slots);
  ASSERT_OK(MlaKvUpdate(stream(), d_kv.View(kv_c), d_kv.View(k_pe), d_slots.View(),
                          d_cache.View())
                  );
  Download(device(), stream(), d_cache);

  EXPECT_EQ(unwritten_checksum(cache), before);
  EXPECT_EQ(std::memcmp(cache.t.data(), want.t.data(), cache.t.nbytes()), 0);
  int mismatched_rows = 0;
  for (int s = 0; s < num_slots; ++s) {
    mismatched_rows += std::memcmp(static_cast<const char*>(cache.t.data()) + s * row_bytes,
                                   static_cast<const char*>(want.t.data()) + s * row_bytes,
                                   row_bytes) != 0;
  }
  EXPECT_EQ(mismatched_rows, 0);
  int rows_written = 0;
  for (bool w : written) rows_written += w;
  EXPECT_EQ(rows_written, tokens - 5);  // 4 negative slots, 1 out of range

  // A dummy run (every slot -1) changes nothing.
  for (int t = 0; t < tokens; ++t) slot[t] = -1;
  DeviceCopy d_dummy = Upload(device(), slots);
  ASSERT_OK(MlaKvUpdate(stream(), d_kv.View(kv_c), d_kv.View(k_pe), d_dummy.View(),
                          d_cache.View())
                  );
  Owned after = Clone(cache);
  Download(device(), stream(), d_cache);
  EXPECT_EQ(std::memcmp(cache.t.data(), after.t.data(), cache.t.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MlaKvUpdateGpuTest,
    ::testing::Values(KvCase{DType::kF32, DType::kF32, 512, 64},
                      KvCase{DType::kF32, DType::kBF16, 512, 64},
                      KvCase{DType::kBF16, DType::kBF16, 512, 64},
                      KvCase{DType::kBF16, DType::kF32, 512, 64},
                      KvCase{DType::kF32, DType::kF32, 37, 6},
                      KvCase{DType::kF32, DType::kBF16, 37, 6},
                      KvCase{DType::kBF16, DType::kBF16, 37, 6},
                      KvCase{DType::kBF16, DType::kF32, 40, 8}),
    [](const ::testing::TestParamInfo<KvCase>& info) {
      return std::string(DTypeName(info.param.input)) + "_to_" +
             std::string(DTypeName(info.param.cache)) + "_" + std::to_string(info.param.rkv) +
             "_" + std::to_string(info.param.dr);
    });

// ============================================================================
// Attention


bool IsTensorCore(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTensorCore || k == MlaDecodeKernel::kTensorCoreBf16Q;
}

// Whether `kernel` runs on the tensor cores for these inputs (kAuto picks
// them for a bf16 cache of supported widths on compute capability >= 8.0).
bool RunsOnTensorCores(MlaDecodeKernel kernel, DType cache, const Dims& d) {
  if (IsTensorCore(kernel)) return true;
  if (kernel != MlaDecodeKernel::kAuto || cache != DType::kBF16) return false;
  if ((d.rkv + d.dr) % 16 != 0 || d.rkv % 8 != 0) return false;
#if MLAG_HAVE_CUDA
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major >= 8;
#else
  return false;
#endif
}

// The tolerance of `kernel` on these inputs: `base` for the f32 kernel; for
// the tensor-core kernels 4x the model's distance from the host plus `base`,
// after checking the model's own precision.
double DecodeTolerance(MlaDecodeKernel kernel, DType cache, const Dims& d, const Paged& p,
                       const Queries& q, int batch, const Outputs& host, double base) {
  if (!RunsOnTensorCores(kernel, cache, d)) return base;
  const bool split_q = kernel != MlaDecodeKernel::kTensorCoreBf16Q;
  const Outputs model = ModelTensorCoreDecode(d, p, q, batch, split_q);
  const AttnDiff m = Compare(model.out, model.lse, host.out, host.lse);
  const double model_err = std::max(m.out, m.lse);
  EXPECT_LT(model_err, split_q ? 4e-3 : 2e-2) << "precision of the tensor-core arithmetic itself";
  std::printf("  model of %s: out %.3g lse %.3g\n", split_q ? "split q" : "bf16 q", m.out, m.lse);
  return 4.0 * model_err + base;
}

struct DecodeCase {
  DType cache;
  int block_size;
  MlaDecodeKernel kernel;
};

class MlaDecodeGpuTest : public MlaGpuTest, public ::testing::WithParamInterface<DecodeCase> {
 protected:
  // Runs decode on the GPU (with and without a workspace) and compares with
  // the host kernel. An explicit tensor-core kernel on dims or a cache it
  // does not support must be refused with InvalidArgument.
  void Check(const Dims& d, const std::vector<int>& lens, double tol, uint32_t seed) {
    const DecodeCase c = GetParam();
    const int batch = static_cast<int>(lens.size());
    const Paged p = MakePaged(d, c.cache, c.block_size, lens, lens, seed);
    const Queries q = MakeQueries(d, batch, seed + 1);
    const Outputs want = HostDecode(d, p, q, batch);
    const bool refused = IsTensorCore(c.kernel) &&
                         (c.cache != DType::kBF16 || (d.rkv + d.dr) % 16 != 0 || d.rkv % 8 != 0);
    if (!refused) tol = DecodeTolerance(c.kernel, c.cache, d, p, q, batch, want, tol);

    DeviceCopy d_cache = Upload(device(), p.cache);
    DeviceCopy d_table = Upload(device(), p.block_table);
    DeviceCopy d_lens = Upload(device(), p.seq_lens);
    DeviceCopy d_q = Upload(device(), q.buffer);
    auto ws = MlaDecodeWorkspace::Create(device(), batch, d.heads, d.rkv);
    ASSERT_OK(ws);
    EXPECT_GT(ws->bytes(), 0u);
    for (bool with_workspace : {true, false}) {
      Outputs got = PoisonedOutputs(d, batch);
      DeviceCopy d_out = Upload(device(), got.out);
      DeviceCopy d_lse = Upload(device(), got.lse);
      const absl::Status st = MlaDecode(stream(), d_q.View(q.q_latent), d_q.View(q.q_pe),
                                        d_cache.View(), d_table.View(), d_lens.View(), q.scale,
                                        d_out.View(), d_lse.View(),
                                        with_workspace ? &ws.value() : nullptr, c.kernel);
      if (refused) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        continue;
      }
      ASSERT_OK(st);
      Download(device(), stream(), d_out);
      Download(device(), stream(), d_lse);
      ExpectClose(Compare(got.out, got.lse, want.out, want.lse), tol,
                  std::string(with_workspace ? "split" : "unsplit") + " H" +
                      std::to_string(d.heads) + " rkv" + std::to_string(d.rkv) + " dr" +
                      std::to_string(d.dr));
    }
  }
};

TEST_P(MlaDecodeGpuTest, SmallDims) {
  const std::vector<int> lens = {1, 2, 15, 0, 16, 17, 63, 64, 65, 129, 255, 256, 300};
  Check(Dims{3, 40, 8}, lens, kTol, 11);
}

// Widths that are not a multiple of 16 bytes (element-wise tile loads; the
// tensor-core kernels refuse them and kAuto falls back to f32), and more
// heads than one thread block holds (two head groups, the second partial).
TEST_P(MlaDecodeGpuTest, OddDimsAndHeadGroups) {
  Check(Dims{20, 37, 6}, {0, 3, 200, 70, 300}, kTol, 21);
}

// Two head groups at widths every kernel takes (tiny-v3's attention shape
// with 20 heads).
TEST_P(MlaDecodeGpuTest, HeadGroupsAtTinyWidths) {
  Check(Dims{20, 64, 16}, {0, 3, 200, 70, 300, 33}, kTol, 25);
}

TEST_P(MlaDecodeGpuTest, DeepSeekWidths) {
  Check(Dims{16, 512, 64}, {1, 37, 300, 0, 129}, kTol, 31);
}

// A 4096-token sequence next to short ones: the planner splits it over many
// thread blocks and the combine kernel merges them.
TEST_P(MlaDecodeGpuTest, LongSequence) {
  Check(Dims{16, 512, 64}, {4096, 0, 5, 300}, kTolLong, 41);
}

INSTANTIATE_TEST_SUITE_P(
    CacheBlocksKernel, MlaDecodeGpuTest,
    ::testing::Values(DecodeCase{DType::kF32, 16, MlaDecodeKernel::kF32},
                      DecodeCase{DType::kF32, 64, MlaDecodeKernel::kF32},
                      DecodeCase{DType::kBF16, 16, MlaDecodeKernel::kF32},
                      DecodeCase{DType::kBF16, 64, MlaDecodeKernel::kF32},
                      DecodeCase{DType::kF32, 16, MlaDecodeKernel::kAuto},
                      DecodeCase{DType::kBF16, 64, MlaDecodeKernel::kAuto},
                      DecodeCase{DType::kBF16, 16, MlaDecodeKernel::kTensorCore},
                      DecodeCase{DType::kBF16, 64, MlaDecodeKernel::kTensorCore},
                      DecodeCase{DType::kBF16, 16, MlaDecodeKernel::kTensorCoreBf16Q},
                      DecodeCase{DType::kBF16, 64, MlaDecodeKernel::kTensorCoreBf16Q},
                      DecodeCase{DType::kF32, 64, MlaDecodeKernel::kTensorCore}),
    [](const ::testing::TestParamInfo<DecodeCase>& info) {
      return std::string(DTypeName(info.param.cache)) + "_block" +
             std::to_string(info.param.block_size) + "_" +
             MlaDecodeKernelName(info.param.kernel);
    });

TEST_F(MlaGpuTest, DecodeRejectsMismatchedWorkspace) {
  const Dims d{4, 64, 16};
  const Paged p = MakePaged(d, DType::kF32, 16, {5, 9, 1}, {5, 9, 1}, 51);
  const Queries q = MakeQueries(d, 3, 52);
  DeviceCopy d_cache = Upload(device(), p.cache);
  DeviceCopy d_table = Upload(device(), p.block_table);
  DeviceCopy d_lens = Upload(device(), p.seq_lens);
  DeviceCopy d_q = Upload(device(), q.buffer);
  Outputs got = PoisonedOutputs(d, 3);
  DeviceCopy d_out = Upload(device(), got.out);
  DeviceCopy d_lse = Upload(device(), got.lse);
  auto small = MlaDecodeWorkspace::Create(device(), 2, d.heads, d.rkv);  // 2 < 3 sequences
  ASSERT_OK(small);
  absl::Status st = MlaDecode(stream(), d_q.View(q.q_latent), d_q.View(q.q_pe), d_cache.View(),
                              d_table.View(), d_lens.View(), q.scale, d_out.View(), d_lse.View(),
                              &small.value());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  auto other_heads = MlaDecodeWorkspace::Create(device(), 8, d.heads + 1, d.rkv);
  ASSERT_OK(other_heads);
  st = MlaDecode(stream(), d_q.View(q.q_latent), d_q.View(q.q_pe), d_cache.View(), d_table.View(),
                 d_lens.View(), q.scale, d_out.View(), d_lse.View(), &other_heads.value());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

// One graph captured once, replayed for two different seq_lens sets written
// into the same device buffer: the split plan is made on the device, so both
// replays must match the host.
TEST_F(MlaGpuTest, CapturedDecodeReplaysForNewSeqLens) {
  const Dims d{16, 512, 64};
  const std::vector<int> first = {5, 0, 300, 64, 1, 129, 4096, 17};
  const std::vector<int> second = {4096, 33, 0, 2000, 0, 1, 65, 700};
  std::vector<int> capacity(first.size());
  for (size_t b = 0; b < first.size(); ++b) capacity[b] = std::max(first[b], second[b]);
  const int batch = static_cast<int>(first.size());
  Paged p = MakePaged(d, DType::kBF16, 64, first, capacity, 61);
  const Queries q = MakeQueries(d, batch, 62);

  DeviceCopy d_cache = Upload(device(), p.cache);
  DeviceCopy d_table = Upload(device(), p.block_table);
  DeviceCopy d_lens = Upload(device(), p.seq_lens);
  DeviceCopy d_q = Upload(device(), q.buffer);
  Outputs got = PoisonedOutputs(d, batch);
  DeviceCopy d_out = Upload(device(), got.out);
  DeviceCopy d_lse = Upload(device(), got.lse);
  auto ws = MlaDecodeWorkspace::Create(device(), batch, d.heads, d.rkv);
  ASSERT_OK(ws);

  ASSERT_OK(stream().BeginCapture());
  absl::Status st;
  {
    NodeScope scope(stream(), "layers.0.attn.mla", OpKind::kKernel);
    st = MlaDecode(stream(), d_q.View(q.q_latent), d_q.View(q.q_pe), d_cache.View(),
                   d_table.View(), d_lens.View(), q.scale, d_out.View(), d_lse.View(),
                   &ws.value());
  }
  auto graph = stream().EndCapture();
  ASSERT_OK(st);
  ASSERT_OK(graph);
  ASSERT_EQ((*graph)->nodes().size(), 1u);
  EXPECT_EQ((*graph)->nodes()[0].name, "layers.0.attn.mla");

  for (const std::vector<int>* lens : {&first, &second, &first}) {
    for (int b = 0; b < batch; ++b) p.seq_lens.data<int32_t>()[b] = (*lens)[b];
    ASSERT_OK(stream().Synchronize());
    ASSERT_OK(device()
                    .CopyFromHost(d_lens.buffer.data(), p.seq_lens.buffer.data(),
                                  p.seq_lens.buffer.bytes())
                    );
    testing::PoisonNaN(got.out);
    testing::PoisonNaN(got.lse);
    ASSERT_OK(
        device().CopyFromHost(d_out.buffer.data(), got.out.buffer.data(), got.out.buffer.bytes()));
    ASSERT_OK(
        device().CopyFromHost(d_lse.buffer.data(), got.lse.buffer.data(), got.lse.buffer.bytes()));
    SyncDevice();
    ASSERT_OK((*graph)->Replay(stream()));
    Download(device(), stream(), d_out);
    Download(device(), stream(), d_lse);
    const Outputs want = HostDecode(d, p, q, batch);
    const double tol = DecodeTolerance(MlaDecodeKernel::kAuto, DType::kBF16, d, p, q, batch,
                                       want, kTolLong);
    ExpectClose(Compare(got.out, got.lse, want.out, want.lse), tol,
                lens == &second ? "graph replay, second seq_lens" : "graph replay, first seq_lens");
  }
}

// ============================================================================
// Prefill

struct PrefillCase {
  DType cache;
  int block_size;
};

class MlaPrefillGpuTest : public MlaGpuTest, public ::testing::WithParamInterface<PrefillCase> {
 protected:
  // Sequence b has cached[b] tokens before fresh[b] new ones (its query
  // rows); `lead` rows before the first sequence and `tail` rows after the
  // last belong to none (zeros and -inf).
  void Check(const Dims& d, const std::vector<int>& cached, const std::vector<int>& fresh,
             int lead, int tail, uint32_t seed) {
    const PrefillCase c = GetParam();
    const int batch = static_cast<int>(cached.size());
    std::vector<int> lens(batch);
    for (int b = 0; b < batch; ++b) lens[b] = cached[b] + fresh[b];
    const Paged p = MakePaged(d, c.cache, c.block_size, lens, lens, seed);
    Owned qsl = Make(DType::kI32, {batch + 1});
    int rows = lead;
    for (int b = 0; b < batch; ++b) {
      qsl.data<int32_t>()[b] = rows;
      rows += fresh[b];
    }
    qsl.data<int32_t>()[batch] = rows;
    rows += tail;
    const Queries q = MakeQueries(d, rows, seed + 1);

    Outputs want = PoisonedOutputs(d, rows);
    absl::Status st = MlaPrefill(HostStream(), q.q_latent, q.q_pe, p.cache.t, p.block_table.t,
                                 p.seq_lens.t, qsl.t, q.scale, want.out.t, want.lse.t);
    ASSERT_OK(st);

    DeviceCopy d_cache = Upload(device(), p.cache);
    DeviceCopy d_table = Upload(device(), p.block_table);
    DeviceCopy d_lens = Upload(device(), p.seq_lens);
    DeviceCopy d_qsl = Upload(device(), qsl);
    DeviceCopy d_q = Upload(device(), q.buffer);
    Outputs got = PoisonedOutputs(d, rows);
    DeviceCopy d_out = Upload(device(), got.out);
    DeviceCopy d_lse = Upload(device(), got.lse);
    st = MlaPrefill(stream(), d_q.View(q.q_latent), d_q.View(q.q_pe), d_cache.View(),
                    d_table.View(), d_lens.View(), d_qsl.View(), q.scale, d_out.View(),
                    d_lse.View());
    ASSERT_OK(st);
    Download(device(), stream(), d_out);
    Download(device(), stream(), d_lse);
    ExpectClose(Compare(got.out, got.lse, want.out, want.lse), kTol,
                "prefill H" + std::to_string(d.heads) + " rkv" + std::to_string(d.rkv));
  }
};

TEST_P(MlaPrefillGpuTest, SmallDims) {
  Check(Dims{3, 40, 8}, {0, 5, 70}, {1, 7, 20}, 0, 3, 71);
}

TEST_P(MlaPrefillGpuTest, OddDimsHeadGroupsAndLeadingPadding) {
  Check(Dims{20, 37, 6}, {9, 0, 30, 4}, {5, 0, 4, 1}, 2, 1, 81);
}

TEST_P(MlaPrefillGpuTest, DeepSeekWidths) {
  Check(Dims{16, 512, 64}, {300, 0, 64}, {33, 20, 1}, 0, 2, 91);
}

INSTANTIATE_TEST_SUITE_P(CacheAndBlocks, MlaPrefillGpuTest,
                         ::testing::Values(PrefillCase{DType::kF32, 16},
                                           PrefillCase{DType::kBF16, 64}),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) {
                           return std::string(DTypeName(info.param.cache)) + "_block" +
                                  std::to_string(info.param.block_size);
                         });

}  // namespace
}  // namespace mlag
