// The CUDA MLA attention sources run on the CPU through the emulation in
// kernels/cuda/emulation/cuda_emulation.h, against the host kernels:
//   * the tensor-core decode kernel alone (kernels/cuda/mla_decode_mma.cuh),
//     with split items merged here as the combine kernel merges them
//     (kernels/common/softmax_math.h): fragment layouts, the cp.async ring,
//     the cross-warp score reduction, the online softmax, head groups;
//   * the launchers of kernels/cuda/mla_attention.cu (tests/cuda_emu/
//     emu_mla_attention.cc): decode with every kernel choice, with and
//     without a workspace (device planner and combine kernel), and prefill;
//   * the KV update launcher (emu_mla_kv_update.cc), byte for byte.
// Tolerances are the GPU test's (tests/mla_attention_cases.h): 1e-5 (3e-5
// for long rows) for f32 arithmetic; for the tensor-core kernels 4x the
// double-precision model's distance from the host, plus 1e-5.
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "kernels/common/softmax_math.h"
#include "kernels/mla_kv_update.h"
#include "tests/mla_attention_cases.h"

#define MLAG_CUDA_EMULATION 1
#include "kernels/cuda/emulation/cuda_emulation.h"
// The emulation must come first.
#include "kernels/cuda/mla_decode_mma.cuh"
#include "kernels/cuda/mla_kv_update.cuh"

namespace mlag {
namespace {

using namespace mla_cases;  // NOLINT: the shared attention cases

constexpr double kBaseTol = 1e-5;

// Runs the kernel over `batch` decode rows. chunk == 0: one item per
// sequence, written directly; chunk > 0: sequences longer than `chunk` are
// split into items of `chunk` tokens (the plan the device planner makes for
// that split length), whose partial outputs and LSEs are merged here.
// `spare_blocks` extra thread blocks find no item and must exit.
Outputs RunEmulated(const Dims& d, const Paged& p, const Queries& q, int batch, bool split_q,
                    int chunk, int spare_blocks) {
  using namespace cuda::mla_block;
  Outputs o = PoisonedOutputs(d, batch);
  KernelParams kp{};
  cuda::MlaAttentionArgs& a = kp.a;
  a.q_latent = q.q_latent.data_as<const float>();
  a.q_latent_stride0 = q.q_latent.stride(0);
  a.q_latent_stride1 = q.q_latent.stride(1);
  a.q_pe = q.q_pe.data_as<const float>();
  a.q_pe_stride0 = q.q_pe.stride(0);
  a.q_pe_stride1 = q.q_pe.stride(1);
  a.cache = p.cache.t.data();
  a.cache_dtype = DType::kBF16;
  a.num_blocks = p.cache.t.size(0);
  a.block_size = p.block_size;
  a.block_table = p.block_table.data<int32_t>();
  a.block_table_stride = p.max_blocks;
  a.max_blocks = p.max_blocks;
  a.seq_lens = p.seq_lens.data<int32_t>();
  a.num_seqs = batch;
  a.num_rows = batch;
  a.heads = d.heads;
  a.rkv = d.rkv;
  a.dr = d.dr;
  a.scale = q.scale;
  a.out_latent = o.out.data<float>();
  a.lse = o.lse.data<float>();
  kp.capacity = p.max_blocks * p.block_size;
  kp.head_groups = (d.heads + kVecs - 1) / kVecs;
  kp.prefill = 0;

  std::vector<int> plan;
  std::vector<float> part_out, part_lse;
  int items = batch;
  if (chunk > 0) {
    plan.resize(static_cast<size_t>(batch) + 2);
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      const int len = a.seq_lens[b];
      plan[static_cast<size_t>(b)] = next;
      next += len <= chunk ? 1 : (len - 1) / chunk + 1;
    }
    plan[static_cast<size_t>(batch)] = next;
    plan[static_cast<size_t>(batch) + 1] = chunk;
    items = next;
    part_out.assign(static_cast<size_t>(items) * d.heads * d.rkv, std::nanf(""));
    part_lse.assign(static_cast<size_t>(items) * d.heads, std::nanf(""));
    kp.plan = plan.data();
    kp.part_out = part_out.data();
    kp.part_lse = part_lse.data();
  }
  const unsigned grid = static_cast<unsigned>((items + spare_blocks) * kp.head_groups);
  const size_t smem = MmaSmemBytes(d.rkv + d.dr);
  if (split_q) {
    emu::Launch(grid, kThreads, smem, [&kp] { MlaDecodeMmaKernel<true>(kp); });
  } else {
    emu::Launch(grid, kThreads, smem, [&kp] { MlaDecodeMmaKernel<false>(kp); });
  }

  // Merge the items of split sequences as MlaDecodeCombineKernel does.
  for (int b = 0; chunk > 0 && b < batch; ++b) {
    const int first = plan[static_cast<size_t>(b)];
    const int n = plan[static_cast<size_t>(b) + 1] - first;
    if (n <= 1) continue;
    for (int k = 0; k < n * d.heads; ++k) {
      EXPECT_FALSE(std::isnan(part_lse[static_cast<size_t>(first) * d.heads + k]))
          << "sequence " << b << ": a split item left its partial LSE unwritten";
    }
    for (int h = 0; h < d.heads; ++h) {
      float total = -INFINITY;
      for (int k = 0; k < n; ++k) {
        total = LseAdd(total, part_lse[static_cast<size_t>(first + k) * d.heads + h]);
      }
      std::vector<float> acc(static_cast<size_t>(d.rkv), 0.0f);
      for (int k = 0; k < n; ++k) {
        const float w = LseMergeWeight(part_lse[static_cast<size_t>(first + k) * d.heads + h], total);
        if (w == 0.0f) continue;
        const float* src = &part_out[(static_cast<size_t>(first + k) * d.heads + h) * d.rkv];
        for (int i = 0; i < d.rkv; ++i) acc[static_cast<size_t>(i)] = std::fma(w, src[i], acc[static_cast<size_t>(i)]);
      }
      const int64_t row = static_cast<int64_t>(b) * d.heads + h;
      for (int i = 0; i < d.rkv; ++i) o.out.set(row * d.rkv + i, acc[static_cast<size_t>(i)]);
      o.lse.set(row, total);
    }
  }
  return o;
}

struct EmuCase {
  int block_size;
  bool split_q;
};

class MlaDecodeMmaEmuTest : public ::testing::TestWithParam<EmuCase> {
 protected:
  void Check(const Dims& d, const std::vector<int>& lens, uint32_t seed) {
    const EmuCase c = GetParam();
    const int batch = static_cast<int>(lens.size());
    const Paged p = MakePaged(d, DType::kBF16, c.block_size, lens, lens, seed);
    const Queries q = MakeQueries(d, batch, seed + 1);
    const Outputs want = HostDecode(d, p, q, batch);
    const Outputs model = ModelTensorCoreDecode(d, p, q, batch, c.split_q);
    const AttnDiff m = Compare(model.out, model.lse, want.out, want.lse);
    const double model_err = std::max(m.out, m.lse);
    EXPECT_LT(model_err, c.split_q ? 4e-3 : 2e-2);
    const double tol = 4.0 * model_err + kBaseTol;
    for (int chunk : {0, 64}) {
      const Outputs got = RunEmulated(d, p, q, batch, c.split_q, chunk, /*spare_blocks=*/2);
      ExpectClose(Compare(got.out, got.lse, want.out, want.lse), tol,
                  std::string(chunk > 0 ? "split items" : "unsplit") + " H" +
                      std::to_string(d.heads) + " rkv" + std::to_string(d.rkv) + " dr" +
                      std::to_string(d.dr));
    }
  }
};

// Width 48: three k-steps, so five warps have none; five n-tiles, so three
// warps own none.
TEST_P(MlaDecodeMmaEmuTest, NarrowRows) {
  Check(Dims{3, 40, 8}, {1, 2, 15, 0, 16, 17, 33, 64, 65, 100}, 71);
}

// tiny-v3's attention widths with 20 heads: two head groups, the second
// with 4 live vectors.
TEST_P(MlaDecodeMmaEmuTest, TinyWidthsTwoHeadGroups) {
  Check(Dims{20, 64, 16}, {0, 3, 70, 150, 33}, 72);
}

// DeepSeek's 512 + 64: 36 k-steps (five for warps 0-3, four for 4-7).
TEST_P(MlaDecodeMmaEmuTest, DeepSeekWidths) {
  Check(Dims{16, 512, 64}, {1, 37, 130, 0}, 73);
}

INSTANTIATE_TEST_SUITE_P(BlocksAndQ, MlaDecodeMmaEmuTest,
                         ::testing::Values(EmuCase{16, true}, EmuCase{64, true},
                                           EmuCase{16, false}, EmuCase{64, false}),
                         [](const ::testing::TestParamInfo<EmuCase>& info) {
                           return "block" + std::to_string(info.param.block_size) +
                                  (info.param.split_q ? "_split_q" : "_bf16_q");
                         });

// The emulation itself: a deliberately wrong fragment use must be caught.
// B operand rows swapped (b0 and b1 exchanged) gives a different product.
TEST(CudaEmulationTest, MmaFollowsThePtxLayout) {
  // A = identity (16 x 16), B[k][n] = k * 8 + n: D = A B + 0 must equal B's
  // first 16 rows x 8 columns in the C layout, for every lane.
  std::vector<float> got(32 * 4);
  emu::Launch(1, 32, 0, [&got] {
    const int lane = static_cast<int>(threadIdx.x);
    const int g = lane >> 2, t = lane & 3;
    auto bf = [](float x) { return static_cast<uint32_t>(F32ToBf16(x)); };
    auto a_at = [](int r, int c) { return r == c ? 1.0f : 0.0f; };
    auto b_at = [](int k, int n) { return static_cast<float>(k * 8 + n); };
    const uint32_t a[4] = {bf(a_at(g, 2 * t)) | bf(a_at(g, 2 * t + 1)) << 16,
                           bf(a_at(g + 8, 2 * t)) | bf(a_at(g + 8, 2 * t + 1)) << 16,
                           bf(a_at(g, 2 * t + 8)) | bf(a_at(g, 2 * t + 9)) << 16,
                           bf(a_at(g + 8, 2 * t + 8)) | bf(a_at(g + 8, 2 * t + 9)) << 16};
    const uint32_t b0 = bf(b_at(2 * t, g)) | bf(b_at(2 * t + 1, g)) << 16;
    const uint32_t b1 = bf(b_at(2 * t + 8, g)) | bf(b_at(2 * t + 9, g)) << 16;
    float d[4] = {0, 0, 0, 0};
    cuda::mla_block::MmaBf16(d, a, b0, b1);
    for (int r = 0; r < 4; ++r) got[static_cast<size_t>(lane * 4 + r)] = d[r];
  });
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    EXPECT_EQ(got[lane * 4 + 0], g * 8 + 2 * t) << lane;
    EXPECT_EQ(got[lane * 4 + 1], g * 8 + 2 * t + 1) << lane;
    EXPECT_EQ(got[lane * 4 + 2], (g + 8) * 8 + 2 * t) << lane;
    EXPECT_EQ(got[lane * 4 + 3], (g + 8) * 8 + 2 * t + 1) << lane;
  }
}

// ---- The launchers of kernels/cuda/mla_attention.cu ------------------------------

cuda::MlaAttentionArgs LauncherArgs(const Dims& d, const Paged& p, const Queries& q, int rows,
                                    const Outputs& o) {
  cuda::MlaAttentionArgs a;
  a.q_latent = q.q_latent.data_as<const float>();
  a.q_latent_stride0 = q.q_latent.stride(0);
  a.q_latent_stride1 = q.q_latent.stride(1);
  a.q_pe = q.q_pe.data_as<const float>();
  a.q_pe_stride0 = q.q_pe.stride(0);
  a.q_pe_stride1 = q.q_pe.stride(1);
  a.cache = p.cache.t.data();
  a.cache_dtype = p.cache.t.dtype();
  a.num_blocks = p.cache.t.size(0);
  a.block_size = p.block_size;
  a.block_table = p.block_table.data<int32_t>();
  a.block_table_stride = p.max_blocks;
  a.max_blocks = p.max_blocks;
  a.seq_lens = p.seq_lens.data<int32_t>();
  a.num_seqs = p.seq_lens.t.size(0);
  a.num_rows = rows;
  a.heads = d.heads;
  a.rkv = d.rkv;
  a.dr = d.dr;
  a.scale = q.scale;
  a.out_latent = o.out.data<float>();
  a.lse = o.lse.data<float>();
  return a;
}

struct LaunchCase {
  DType cache;
  int block_size;
  MlaDecodeKernel kernel;
};


class MlaDecodeLaunchEmuTest : public ::testing::TestWithParam<LaunchCase> {
 protected:
  void Check(const Dims& d, const std::vector<int>& lens, double base_tol, uint32_t seed) {
    const LaunchCase c = GetParam();
    const int batch = static_cast<int>(lens.size());
    const Paged p = MakePaged(d, c.cache, c.block_size, lens, lens, seed);
    const Queries q = MakeQueries(d, batch, seed + 1);
    const Outputs want = HostDecode(d, p, q, batch);
    const bool mma_shapes = c.cache == DType::kBF16 && (d.rkv + d.dr) % 16 == 0 && d.rkv % 8 == 0;
    const bool tensor_core = c.kernel == MlaDecodeKernel::kTensorCore ||
                             c.kernel == MlaDecodeKernel::kTensorCoreBf16Q ||
                             (c.kernel == MlaDecodeKernel::kAuto && mma_shapes);
    double tol = base_tol;
    if (tensor_core && mma_shapes) {
      const Outputs model = ModelTensorCoreDecode(d, p, q, batch,
                                                  c.kernel != MlaDecodeKernel::kTensorCoreBf16Q);
      const AttnDiff m = Compare(model.out, model.lse, want.out, want.lse);
      tol = 4.0 * std::max(m.out, m.lse) + base_tol;
    }
    const size_t ws_bytes = cuda::MlaDecodeWorkspaceBytes(
        batch, d.heads, d.rkv, cuda::MlaDecodeDefaultMaxSplits(batch));
    std::vector<float> workspace(ws_bytes / sizeof(float) + 1, std::nanf(""));
    for (bool with_workspace : {true, false}) {
      const Outputs got = PoisonedOutputs(d, batch);
      cuda::MlaAttentionArgs a = LauncherArgs(d, p, q, batch, got);
      a.decode_kernel = c.kernel;
      const cudaError_t err = cuda::LaunchMlaDecode(
          a, with_workspace ? workspace.data() : nullptr, with_workspace ? ws_bytes : 0, nullptr);
      if (tensor_core && !mma_shapes) {
        EXPECT_EQ(err, cudaErrorNotSupported);
        continue;
      }
      ASSERT_EQ(err, cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      if (with_workspace) {
        // The device planner's item count (plan[num_seqs]): sequences longer
        // than the minimum split of 128 tokens must have been split.
        const int items = reinterpret_cast<const int32_t*>(workspace.data())[batch];
        int expected_min = batch;
        for (int len : lens) expected_min += len > 128 ? 1 : 0;
        EXPECT_GE(items, expected_min);
      }
      ExpectClose(Compare(got.out, got.lse, want.out, want.lse), tol,
                  std::string(with_workspace ? "planned" : "unsplit") + " H" +
                      std::to_string(d.heads) + " rkv" + std::to_string(d.rkv) + " dr" +
                      std::to_string(d.dr));
    }
  }
};

TEST_P(MlaDecodeLaunchEmuTest, NarrowRows) {
  Check(Dims{3, 40, 8}, {1, 2, 15, 0, 16, 17, 63, 64, 65, 129, 200}, 1e-5, 81);
}

// Rows that are not a multiple of 16 bytes (the f32 kernel's element-wise
// tile loads; the tensor-core kernels refuse them) and two head groups.
TEST_P(MlaDecodeLaunchEmuTest, OddWidthsTwoHeadGroups) {
  Check(Dims{20, 37, 6}, {0, 3, 150, 70}, 1e-5, 82);
}

// The planner splits the sequences longer than 128 tokens (the minimum
// split) and the combine kernel merges them.
TEST_P(MlaDecodeLaunchEmuTest, DeepSeekWidthsSplit) {
  Check(Dims{16, 512, 64}, {300, 1, 0, 129}, 3e-5, 83);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, MlaDecodeLaunchEmuTest,
    ::testing::Values(LaunchCase{DType::kF32, 16, MlaDecodeKernel::kAuto},
                      LaunchCase{DType::kBF16, 64, MlaDecodeKernel::kF32},
                      LaunchCase{DType::kBF16, 16, MlaDecodeKernel::kAuto},
                      LaunchCase{DType::kBF16, 64, MlaDecodeKernel::kTensorCoreBf16Q},
                      LaunchCase{DType::kF32, 64, MlaDecodeKernel::kTensorCore}),
    [](const ::testing::TestParamInfo<LaunchCase>& info) {
      return std::string(DTypeName(info.param.cache)) + "_block" +
             std::to_string(info.param.block_size) + "_" + MlaDecodeKernelName(info.param.kernel);
    });

// Prefill through LaunchMlaPrefill: sequence b has cached[b] tokens before
// fresh[b] new query rows; one row before the first sequence and one after
// the last belong to none (zeros, lse -inf).
void CheckPrefill(DType cache, const Dims& d, const std::vector<int>& cached,
                  const std::vector<int>& fresh, uint32_t seed) {
  const int batch = static_cast<int>(cached.size());
  std::vector<int> lens(cached.size());
  for (size_t b = 0; b < lens.size(); ++b) lens[b] = cached[b] + fresh[b];
  const Paged p = MakePaged(d, cache, 16, lens, lens, seed);
  int rows = 2;
  for (int f : fresh) rows += f;
  const Queries q = MakeQueries(d, rows, seed + 1);
  Owned qsl = Make(DType::kI32, {batch + 1});
  qsl.data<int32_t>()[0] = 1;
  for (int b = 0; b < batch; ++b) qsl.data<int32_t>()[b + 1] = qsl.data<int32_t>()[b] + fresh[b];
  Outputs want = PoisonedOutputs(d, rows);
  ASSERT_OK(MlaPrefill(HostStream(), q.q_latent, q.q_pe, p.cache.t, p.block_table.t,
                         p.seq_lens.t, qsl.t, q.scale, want.out.t, want.lse.t)
                  );
  const Outputs got = PoisonedOutputs(d, rows);
  cuda::MlaAttentionArgs a = LauncherArgs(d, p, q, rows, got);
  a.query_start_loc = qsl.data<int32_t>();
  ASSERT_EQ(cuda::LaunchMlaPrefill(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ExpectClose(Compare(got.out, got.lse, want.out, want.lse), 1e-5,
              std::string("prefill ") + std::string(DTypeName(cache)) + " H" +
                  std::to_string(d.heads) + " rkv" + std::to_string(d.rkv));
}

TEST(MlaPrefillLaunchEmuTest, MatchesHost) {
  CheckPrefill(DType::kBF16, Dims{3, 40, 8}, {0, 20, 5}, {7, 3, 18}, 91);
  CheckPrefill(DType::kF32, Dims{20, 37, 6}, {4, 0}, {5, 2}, 92);
  CheckPrefill(DType::kBF16, Dims{16, 512, 64}, {40, 0}, {9, 4}, 93);
}

// The KV update launcher writes exactly the host kernel's bytes and leaves
// every other slot (negative and out-of-range slots included) untouched.
TEST(MlaKvUpdateLaunchEmuTest, MatchesHostByteForByte) {
  for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
    const int rkv = 64, dr = 16, tokens = 9, blocks = 4, block_size = 8;
    Owned kv_c = Make(DType::kF32, {tokens, rkv});
    Owned k_pe = Make(DType::kF32, {tokens, dr});
    testing::FillRandom(kv_c, 101);
    testing::FillRandom(k_pe, 102);
    Owned slots = Make(DType::kI64, {tokens});
    const int64_t slot_values[tokens] = {3, -1, 17, 31, 0, 32, 8, -5, 12};
    for (int t = 0; t < tokens; ++t) slots.data<int64_t>()[t] = slot_values[t];
    Owned want = Make(cache_dtype, {blocks, block_size, rkv + dr});
    testing::FillRandom(want, 103);
    Owned got = Make(cache_dtype, {blocks, block_size, rkv + dr});
    std::memcpy(got.buffer.data(), want.buffer.data(), want.buffer.bytes());
    ASSERT_OK(MlaKvUpdate(HostStream(), kv_c.t, k_pe.t, slots.t, want.t));
    ASSERT_EQ(cuda::LaunchMlaKvUpdate(kv_c.t.data(), DType::kF32, rkv,
                                      k_pe.t.data(), DType::kF32, dr,
                                      slots.data<int64_t>(), 1, tokens, got.t.data(),
                                      cache_dtype, blocks * block_size, rkv,
                                      dr, nullptr),
              cudaSuccess);
    EXPECT_EQ(std::memcmp(got.t.data(), want.t.data(), want.t.nbytes()), 0)
        << DTypeName(cache_dtype);
  }
}

// Threads waiting at barriers no other live thread will reach (here half a
// warp in a shuffle, the other half at __syncthreads) are reported as a
// deadlock, not left hanging.
TEST(CudaEmulationDeathTest, MismatchedBarriersAreReported) {
  EXPECT_DEATH(emu::Launch(1, 32, 0,
                           [] {
                             if (threadIdx.x < 16) {
                               __shfl_xor_sync(0xffffffffu, 1.0f, 1);
                             } else {
                               __syncthreads();
                             }
                           }),
               "deadlock");
}

}  // namespace
}  // namespace mlag
