// Attention test cases shared by the GPU tests of the MLA kernels
// (tests/gpu/mla_gpu_test.cc) and the CPU emulation of the tensor-core decode
// kernel (tests/cuda_emu/): paged caches and queries on random data, the host
// kernel as the reference, the comparison, and a double-precision model of
// the tensor-core kernels' rounding that sizes their tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/scalar_types.h"
#include "kernels/mla_attention.h"
#include "runtime/core/dtype.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag::mla_cases {

using testing::HostStream;
using testing::Make;
using testing::Owned;

struct Dims {
  int heads, rkv, dr;
};

// Sequences in a paged cache: pages in random order from a pool whose block 0
// (the null block) is never used; every cache row holding no token is NaN, so
// reading past a seq_len poisons the output. Room for `capacity_lens[b]`
// tokens per sequence; seq_lens starts at `lens`.
struct Paged {
  int block_size = 0;
  int max_blocks = 0;
  Owned cache, block_table, seq_lens;
};

inline Paged MakePaged(const Dims& d, DType dtype, int block_size, const std::vector<int>& lens,
                const std::vector<int>& capacity_lens, uint32_t seed) {
  Paged p;
  p.block_size = block_size;
  const int batch = static_cast<int>(lens.size());
  int used = 0;
  for (int len : capacity_lens) {
    const int n = (len + block_size - 1) / block_size;
    used += n;
    p.max_blocks = std::max(p.max_blocks, n);
  }
  p.max_blocks += 1;  // a spare column left at the null block
  const int num_blocks = used + 1 + 3;
  const int width = d.rkv + d.dr;
  p.cache = Make(dtype, {num_blocks, block_size, width});
  testing::PoisonNaN(p.cache);
  p.block_table = Make(DType::kI32, {batch, p.max_blocks});
  p.seq_lens = Make(DType::kI32, {batch});
  std::mt19937 rng(seed);
  std::vector<int> pool(num_blocks - 1);
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  size_t next = 0;
  for (int b = 0; b < batch; ++b) {
    p.seq_lens.data<int32_t>()[b] = lens[b];
    int32_t* row = p.block_table.data<int32_t>() + b * p.max_blocks;
    for (int j = 0; j * block_size < capacity_lens[b]; ++j) row[j] = pool[next++];
    for (int s = 0; s < capacity_lens[b]; ++s) {
      const int64_t slot = static_cast<int64_t>(row[s / block_size]) * block_size + s % block_size;
      for (int i = 0; i < width; ++i) p.cache.set(slot * width + i, u(rng));
    }
  }
  return p;
}

// Queries [n, H, rkv + dr + 1] (q_latent and q_pe are column slices) and the
// softmax scale: scores scale * (q . k) with q, k uniform in (-1, 1) have a
// standard deviation of about 2 (neither flat nor one-hot).
struct Queries {
  Owned buffer;
  Tensor q_latent, q_pe;
  float scale = 0.0f;
};

inline Queries MakeQueries(const Dims& d, int n, uint32_t seed) {
  Queries q;
  q.buffer = Make(DType::kF32, {std::max(n, 1), d.heads, d.rkv + d.dr + 1});
  testing::FillRandom(q.buffer, seed);
  q.q_latent = q.buffer.t.Slice(0, 0, n).Slice(2, 0, d.rkv);
  q.q_pe = q.buffer.t.Slice(0, 0, n).Slice(2, d.rkv, d.rkv + d.dr);
  q.scale = static_cast<float>(2.0 / std::sqrt((d.rkv + d.dr) / 9.0));
  return q;
}

struct AttnDiff {
  double out = 0.0, lse = 0.0;
  int64_t nan = 0;
  int64_t empty_rows_wrong = 0;
};

// got vs want ([n, H, rkv] and [n, H]); rows whose want lse is -inf for
// every head (seq_len 0 / padding) must be exactly zero with lse -inf.
inline AttnDiff Compare(const Owned& got_out, const Owned& got_lse, const Owned& want_out,
                 const Owned& want_lse) {
  AttnDiff d;
  d.nan = testing::CountNaN(got_out) + testing::CountNaN(got_lse);
  const int64_t n = got_out.t.size(0), heads = got_out.t.size(1), rkv = got_out.t.size(2);
  double err = 0.0, ref = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float wl = want_lse.get(r * heads + h), gl = got_lse.get(r * heads + h);
      if (std::isinf(wl) && wl < 0) {
        if (!(std::isinf(gl) && gl < 0)) ++d.empty_rows_wrong;
        for (int64_t i = 0; i < rkv; ++i) {
          if (got_out.get((r * heads + h) * rkv + i) != 0.0f) ++d.empty_rows_wrong;
        }
        continue;
      }
      d.lse = std::max(d.lse, std::isfinite(gl) ? std::abs(static_cast<double>(gl) - wl) /
                                                      std::max(1.0, std::abs(static_cast<double>(wl)))
                                                : std::numeric_limits<double>::infinity());
      for (int64_t i = 0; i < rkv; ++i) {
        const double g = got_out.get((r * heads + h) * rkv + i);
        const double w = want_out.get((r * heads + h) * rkv + i);
        if (std::isnan(g)) continue;  // counted in d.nan
        err = std::max(err, std::abs(g - w));
        ref = std::max(ref, std::abs(w));
      }
    }
  }
  d.out = err / std::max(ref, 1e-30);
  return d;
}

inline void ExpectClose(const AttnDiff& d, double tol, const std::string& what) {
  EXPECT_EQ(d.nan, 0) << what << ": outputs left unwritten (NaN poison)";
  EXPECT_EQ(d.empty_rows_wrong, 0) << what << ": empty rows must be zeros with lse -inf";
  EXPECT_LT(d.out, tol) << what;
  EXPECT_LT(d.lse, tol) << what;
  std::printf("  %s: out %.3g lse %.3g\n", what.c_str(), d.out, d.lse);
}

struct Outputs {
  Owned out, lse;
};

inline Outputs PoisonedOutputs(const Dims& d, int rows) {
  Outputs o;
  o.out = Make(DType::kF32, {rows, d.heads, d.rkv});
  o.lse = Make(DType::kF32, {rows, d.heads});
  testing::PoisonNaN(o.out);
  testing::PoisonNaN(o.lse);
  return o;
}

// Decode of `paged` on the host stream: the reference.
inline Outputs HostDecode(const Dims& d, const Paged& p, const Queries& q, int batch) {
  Outputs o = PoisonedOutputs(d, batch);
  const absl::Status st = MlaDecode(HostStream(), q.q_latent, q.q_pe, p.cache.t, p.block_table.t,
                                    p.seq_lens.t, q.scale, o.out.t, o.lse.t);
  EXPECT_OK(st);
  return o;
}

// The arithmetic of the tensor-core decode kernels in double: the cache as
// stored, q as bf16 (hi, plus lo = bf16(q - hi) with split_q), exact score
// sums, probabilities exp(score - max) rounded to bf16 and normalised by the
// sum of the rounded values. The GPU differs from it only in the f32
// accumulation order and in the running maximum each probability is rounded
// at, so its error has the same size.
inline Outputs ModelTensorCoreDecode(const Dims& d, const Paged& p, const Queries& q, int batch,
                              bool split_q) {
  Outputs o = PoisonedOutputs(d, batch);
  const int width = d.rkv + d.dr;
  const int64_t q_row = d.rkv + d.dr + 1;  // MakeQueries' buffer layout
  std::vector<double> qv(static_cast<size_t>(width)), scores, acc(static_cast<size_t>(d.rkv));
  std::vector<int64_t> slots;
  for (int b = 0; b < batch; ++b) {
    const int len = p.seq_lens.data<int32_t>()[b];
    slots.clear();
    for (int s = 0; s < len; ++s) {
      const int32_t block = p.block_table.data<int32_t>()[b * p.max_blocks + s / p.block_size];
      slots.push_back(static_cast<int64_t>(block) * p.block_size + s % p.block_size);
    }
    for (int h = 0; h < d.heads; ++h) {
      for (int i = 0; i < width; ++i) {
        const float x = q.buffer.get((static_cast<int64_t>(b) * d.heads + h) * q_row + i);
        const float hi = Bf16ToF32(F32ToBf16(x));
        qv[static_cast<size_t>(i)] = split_q ? static_cast<double>(hi) + Bf16ToF32(F32ToBf16(x - hi))
                                             : static_cast<double>(hi);
      }
      scores.assign(slots.size(), 0.0);
      double max = -std::numeric_limits<double>::infinity();
      for (size_t s = 0; s < slots.size(); ++s) {
        double dot = 0.0;
        for (int i = 0; i < width; ++i) dot += qv[static_cast<size_t>(i)] * p.cache.get(slots[s] * width + i);
        scores[s] = q.scale * dot;
        max = std::max(max, scores[s]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (size_t s = 0; s < slots.size(); ++s) {
        const double w = Bf16ToF32(F32ToBf16(static_cast<float>(std::exp(scores[s] - max))));
        sum += w;
        for (int i = 0; i < d.rkv; ++i) acc[static_cast<size_t>(i)] += w * p.cache.get(slots[s] * width + i);
      }
      const int64_t row = static_cast<int64_t>(b) * d.heads + h;
      for (int i = 0; i < d.rkv; ++i) {
        o.out.set(row * d.rkv + i, sum > 0.0 ? static_cast<float>(acc[static_cast<size_t>(i)] / sum) : 0.0f);
      }
      o.lse.set(row, sum > 0.0 ? static_cast<float>(max + std::log(sum))
                               : -std::numeric_limits<float>::infinity());
    }
  }
  return o;
}

}  // namespace mlag::mla_cases
