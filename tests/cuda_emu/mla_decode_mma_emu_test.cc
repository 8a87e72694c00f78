// The tensor-core MLA decode kernel's own source
// (kernels/cuda/mla_decode_mma.cuh), run on the CPU through the emulation in
// tests/cuda_emu/cuda_emulation.h, against the host kernel: fragment
// layouts, the cp.async ring, the cross-warp score reduction, the online
// softmax, head groups, split items and the epilogue, on odd and DeepSeek
// widths. The split-item partials are merged here as the combine kernel
// merges them (kernels/common/softmax_math.h). The tolerance is the one the
// GPU test uses for these kernels (tests/mla_attention_cases.h): 4x the
// double-precision model's distance from the host, plus 1e-5.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/softmax_math.h"
#include "tests/mla_attention_cases.h"

#define MLAG_CUDA_EMULATION 1
#include "tests/cuda_emu/cuda_emulation.h"
// The emulation must come first.
#include "kernels/cuda/mla_decode_mma.cuh"

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
  a.cache_dtype = 1;
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
