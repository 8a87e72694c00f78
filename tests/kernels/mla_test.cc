// MLA kernels on the host against double-precision references written here:
// YaRN constants (the formulas of the Hugging Face modeling_deepseek.py),
// the rope table and rotation on interleaved pairs, the host decode's forced
// split lengths, the host attention's vectorised softmax tile and exp, and
// the argument checks of kv_update, decode and prefill.
// The numerical cases of kv_update, decode and prefill, written once for
// every backend, are in tests/ops/cases_mla.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/host/attention_softmax.h"
#include "kernels/host/gemm.h"
#include "kernels/host/mla_attention.h"
#include "kernels/host/parallel.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "kernels/rope.h"
#include "tests/error_report.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;
using testing::SkipUnlessRequestedIsa;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

using ::mlag::testing::RecordError;  // max_rel_err lines at exit

// ============================================================================
// Rope

// The YaRN formulas of modeling_deepseek.py (yarn_find_correction_dim,
// yarn_linear_ramp_mask, yarn_get_mscale), all in double.
struct YarnRef {
  double lo, hi;
  std::vector<double> inv_freq;
};
YarnRef YarnReference(const RopeParams& p) {
  const int dr = p.rotary_dim;
  auto corr = [&](double r) {
    return dr * std::log(p.original_max_position / (2.0 * kPi * r)) / (2.0 * std::log(p.theta));
  };
  YarnRef ref;
  ref.lo = std::max(std::floor(corr(p.beta_fast)), 0.0);
  ref.hi = std::min(std::ceil(corr(p.beta_slow)), static_cast<double>(dr - 1));
  if (ref.lo == ref.hi) ref.hi += 0.001;
  for (int i = 0; i < dr / 2; ++i) {
    const double inv0 = std::pow(p.theta, -2.0 * i / dr);
    if (!p.yarn) {
      ref.inv_freq.push_back(inv0);
      continue;
    }
    const double ramp = std::clamp((i - ref.lo) / (ref.hi - ref.lo), 0.0, 1.0);
    ref.inv_freq.push_back(inv0 * (1.0 - ramp) + inv0 / p.factor * ramp);
  }
  return ref;
}
double GRef(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}
double SoftmaxScaleRef(int qk_head_dim, const RopeParams& p) {
  const double g = p.yarn ? GRef(p.factor, p.mscale_all_dim) : 1.0;
  return g * g / std::sqrt(static_cast<double>(qk_head_dim));
}

RopeParams TinyVariantA() {
  RopeParams p;
  p.rotary_dim = 16;
  p.theta = 100.0;
  p.yarn = true;
  p.factor = 4.0;
  p.original_max_position = 64;
  p.beta_fast = 32.0;
  p.beta_slow = 1.0;
  p.mscale = 0.707;
  p.mscale_all_dim = 0.707;
  return p;
}

RopeParams V3Params(double mscale, double mscale_all_dim) {
  RopeParams p;
  p.rotary_dim = 64;
  p.theta = 10000.0;
  p.yarn = true;
  p.factor = 40.0;
  p.original_max_position = 4096;
  p.mscale = mscale;
  p.mscale_all_dim = mscale_all_dim;
  return p;
}

TEST(RopeTest, TinyConfigYarnConstants) {
  const RopeParams p = TinyVariantA();
  const YarnRange range = ComputeYarnRange(p);
  EXPECT_EQ(range.lo, 0.0f);
  EXPECT_EQ(range.hi, 5.0f);

  // tiny-v3's inverse frequencies, computed once with those formulas in
  // Python and printed with 5 or 6 decimals: each must match to half a unit
  // of its last printed digit (plus f32 rounding).
  const double printed[] = {1, 0.47799, 0.221359, 0.097805, 0.04, 0.014059, 0.007906, 0.004446};
  const int decimals[] = {6, 5, 6, 6, 6, 6, 6, 6};
  const std::vector<float> inv = ComputeInvFreq(p);
  const YarnRef ref = YarnReference(p);
  ASSERT_EQ(inv.size(), 8u);
  double max_err = 0.0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(inv[i], printed[i], 0.5 * std::pow(10.0, -decimals[i]) + 1e-7) << "pair " << i;
    const double rel = std::abs(inv[i] - ref.inv_freq[i]) / ref.inv_freq[i];
    EXPECT_LT(rel, 1e-6) << "pair " << i;
    max_err = std::max(max_err, rel);
  }
  RecordError("inv_freq", max_err);

  const float scale = MlaSoftmaxScale(48, p);
  EXPECT_NEAR(scale, 0.174017, 0.5e-6 + 1e-7);
  const double scale_rel = std::abs(scale - SoftmaxScaleRef(48, p)) / SoftmaxScaleRef(48, p);
  EXPECT_LT(scale_rel, 1e-6);
  RecordError("softmax_scale", scale_rel);
  // mscale == mscale_all_dim: cos and sin are not scaled.
  EXPECT_EQ(RopeCosSinScale(p), 1.0f);
  EXPECT_NEAR(YarnMscale(4.0, 0.707), GRef(4.0, 0.707), 1e-7);
  EXPECT_EQ(YarnMscale(1.0, 0.707), 1.0f);
}

TEST(RopeTest, V2V3Constants) {
  const RopeParams v3 = V3Params(1.0, 1.0);
  const YarnRange range = ComputeYarnRange(v3);
  EXPECT_EQ(range.lo, 10.0f);
  EXPECT_EQ(range.hi, 23.0f);
  const float s3 = MlaSoftmaxScale(192, v3);
  EXPECT_NEAR(s3, 0.135234, 0.5e-6 + 1e-7);
  EXPECT_LT(std::abs(s3 - SoftmaxScaleRef(192, v3)) / SoftmaxScaleRef(192, v3), 1e-6);

  const RopeParams v2 = V3Params(0.707, 0.707);
  const float s2 = MlaSoftmaxScale(192, v2);
  EXPECT_NEAR(s2, 0.114721, 0.5e-6 + 1e-7);
  EXPECT_LT(std::abs(s2 - SoftmaxScaleRef(192, v2)) / SoftmaxScaleRef(192, v2), 1e-6);

  const std::vector<float> inv = ComputeInvFreq(v3);
  const YarnRef ref = YarnReference(v3);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_LT(std::abs(inv[i] - ref.inv_freq[i]) / ref.inv_freq[i], 1e-6) << "pair " << i;
  }
  // Below lo the frequencies are unscaled, above hi divided by the factor.
  EXPECT_FLOAT_EQ(inv[3], static_cast<float>(std::pow(10000.0, -6.0 / 64)));
  EXPECT_FLOAT_EQ(inv[30], static_cast<float>(std::pow(10000.0, -60.0 / 64) / 40.0));

  // Without YaRN: plain frequencies and qk_head_dim^-1/2.
  RopeParams plain = v3;
  plain.yarn = false;
  const std::vector<float> inv_plain = ComputeInvFreq(plain);
  for (int i = 0; i < 32; ++i) {
    EXPECT_LT(std::abs(inv_plain[i] - std::pow(10000.0, -2.0 * i / 64)) /
                  std::pow(10000.0, -2.0 * i / 64),
              1e-6);
  }
  EXPECT_NEAR(MlaSoftmaxScale(192, plain), 1.0 / std::sqrt(192.0), 1e-8);
  EXPECT_EQ(RopeCosSinScale(plain), 1.0f);
}

// lo == hi widens the ramp by 0.001 instead of dividing by zero: with L = 5
// both correction dims are in (-1, 0), so lo = max(floor, 0) = 0 and
// hi = ceil(-0.4) = 0.
TEST(RopeTest, YarnDegenerateRange) {
  RopeParams p = TinyVariantA();
  p.original_max_position = 5;
  const YarnRange r = ComputeYarnRange(p);
  EXPECT_EQ(r.lo, 0.0f);
  EXPECT_FLOAT_EQ(r.hi, 0.001f);
  const std::vector<float> inv = ComputeInvFreq(p);
  const YarnRef ref = YarnReference(p);
  EXPECT_EQ(ref.hi, 0.001);
  for (size_t i = 0; i < inv.size(); ++i) {
    EXPECT_LT(std::abs(inv[i] - ref.inv_freq[i]) / ref.inv_freq[i], 1e-6) << "pair " << i;
  }
}

// Table rows: [cos(f32(p) * inv) * s | sin(...) * s] for a cos/sin scale != 1.
TEST(RopeTest, FillRopeTableMatchesDouble) {
  RopeParams p = TinyVariantA();
  p.mscale = 1.0;  // s = g(4, 1) / g(4, 0.707) != 1
  const double s = GRef(4.0, 1.0) / GRef(4.0, 0.707);
  EXPECT_NEAR(RopeCosSinScale(p), s, 1e-7);
  const int positions = 67;
  Owned table = Make(DType::kF32, {positions, 16});
  testing::PoisonNaN(table);
  ASSERT_OK(FillRopeTable(p, table.t));
  EXPECT_EQ(testing::CountNaN(table), 0);
  const std::vector<float> inv = ComputeInvFreq(p);
  std::vector<double> want(static_cast<size_t>(positions) * 16);
  for (int pos = 0; pos < positions; ++pos) {
    for (int i = 0; i < 8; ++i) {
      const double angle = static_cast<float>(pos) * inv[i];  // rounded to f32, as the kernel
      want[pos * 16 + i] = std::cos(angle) * s;
      want[pos * 16 + 8 + i] = std::sin(angle) * s;
    }
  }
  const double err = testing::MaxRelError(table, want);
  EXPECT_LT(err, 1e-6);
  RecordError("rope_table", err);

  Owned bad = Make(DType::kF32, {positions, 12});
  const absl::Status st = FillRopeTable(p, bad.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("table"), std::string::npos) << st;
}

TEST(RopeTest, ApplyRopeStridedMatchesDouble) {
  RopeParams p = TinyVariantA();
  p.mscale = 1.0;
  const int dr = 16, half = 8, heads = 5, tokens = 13, positions = 70;
  const int q_nope = 7, q_pad = 3, rkv = 11, k_pad = 5;
  Owned table = Make(DType::kF32, {positions, dr});
  ASSERT_OK(FillRopeTable(p, table.t));

  // q rows [q_nope | q_pe | pad] per head; k rows [kv_c | k_pe | pad], as the
  // projections produce them.
  Owned q = Make(DType::kF32, {tokens, heads, q_nope + dr + q_pad});
  Owned k = Make(DType::kF32, {tokens, rkv + dr + k_pad});
  const std::vector<double> q0 = testing::FillRandom(q, 11);
  const std::vector<double> k0 = testing::FillRandom(k, 12);
  Owned pos = Make(DType::kI32, {tokens});
  std::mt19937 rng(13);
  for (int t = 0; t < tokens; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(rng() % positions);
  pos.data<int32_t>()[3] = -1;         // out of range: row unchanged
  pos.data<int32_t>()[7] = positions;  // out of range: row unchanged
  pos.data<int32_t>()[8] = positions - 1;

  const Tensor q_pe = q.t.Slice(2, q_nope, q_nope + dr);
  const Tensor k_pe = k.t.Slice(1, rkv, rkv + dr);
  ASSERT_OK(ApplyRope(HostStream(), pos.t, table.t, q_pe, k_pe));

  const std::vector<float> inv = ComputeInvFreq(p);
  const double s = GRef(4.0, 1.0) / GRef(4.0, 0.707);
  auto rotate = [&](std::vector<double>& x, size_t base, int position) {
    if (position < 0 || position >= positions) return;
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<float>(position) * inv[i];
      const double c = std::cos(angle) * s, sn = std::sin(angle) * s;
      const double x0 = x[base + 2 * i], x1 = x[base + 2 * i + 1];
      x[base + 2 * i] = x0 * c - x1 * sn;
      x[base + 2 * i + 1] = x0 * sn + x1 * c;
    }
  };
  std::vector<double> q_want = q0, k_want = k0;
  const int q_row = q_nope + dr + q_pad;
  const int k_row = rkv + dr + k_pad;
  for (int t = 0; t < tokens; ++t) {
    const int position = pos.data<int32_t>()[t];
    for (int h = 0; h < heads; ++h) rotate(q_want, (t * heads + h) * q_row + q_nope, position);
    rotate(k_want, t * k_row + rkv, position);
  }
  const double q_err = testing::MaxRelError(q, q_want);
  const double k_err = testing::MaxRelError(k, k_want);
  EXPECT_LT(q_err, 1e-6);
  EXPECT_LT(k_err, 1e-6);
  RecordError("rope", std::max(q_err, k_err));
  // Columns outside the rope slices and out-of-range rows are bit-identical.
  for (int t = 0; t < tokens; ++t) {
    const bool rotated = t != 3 && t != 7;
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < q_row; ++c) {
        const bool in_pe = c >= q_nope && c < q_nope + dr;
        const size_t i = static_cast<size_t>((t * heads + h) * q_row + c);
        if (!in_pe || !rotated) {
          EXPECT_EQ(q.get(i), static_cast<float>(q0[i])) << t << "," << c;
        }
      }
    }
    for (int c = 0; c < k_row; ++c) {
      const bool in_pe = c >= rkv && c < rkv + dr;
      const size_t i = static_cast<size_t>(t * k_row + c);
      if (!in_pe || !rotated) {
        EXPECT_EQ(k.get(i), static_cast<float>(k0[i])) << t << "," << c;
      }
    }
  }

  Owned bad_pos = Make(DType::kI64, {tokens});
  const absl::Status st = ApplyRope(HostStream(), bad_pos.t, table.t, q_pe, k_pe);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("positions"), std::string::npos) << st;
}

// ============================================================================
// KV update: argument rejection. Its numerical cases (every dtype pair,
// negative and out-of-range slots, graph padding, on every backend) are in
// tests/ops/cases_mla.cc.

TEST(KvUpdateArgs, RejectsBadArguments) {
  Owned kv_c = Make(DType::kF32, {4, 8});
  Owned k_pe = Make(DType::kF32, {4, 2});
  Owned cache = Make(DType::kF32, {2, 4, 10});
  Owned slots = Make(DType::kI64, {5});  // longer than the inputs
  absl::Status st = MlaKvUpdate(HostStream(), kv_c.t, k_pe.t, slots.t, cache.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kv_c"), std::string::npos) << st;
  Owned slots32 = Make(DType::kI32, {4});
  st = MlaKvUpdate(HostStream(), kv_c.t, k_pe.t, slots32.t, cache.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot_mapping"), std::string::npos) << st;
  Owned wide = Make(DType::kF32, {2, 4, 11});
  Owned slots4 = Make(DType::kI64, {4});
  st = MlaKvUpdate(HostStream(), kv_c.t, k_pe.t, slots4.t, wide.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cache"), std::string::npos) << st;
}

// ============================================================================
// Attention: what only the host kernel has (forced split lengths) and
// argument rejection. The numerical cases of decode and prefill, on every
// backend, are in tests/ops/cases_mla.cc.

// Sequences of `lens` tokens in a paged cache (pages in random order from a
// pool whose block 0 is never used; rows holding no token NaN, so a read
// past a seq_len shows up) and one decode query per sequence, uniform in
// (-1, 1), with a scale that gives scores of standard deviation about 2.
struct PagedDecode {
  int heads = 0, rkv = 0, dr = 0, block_size = 0, max_blocks = 0;
  std::vector<int> lens;
  Owned cache, block_table, seq_lens;
  Owned q;  // [B, H, rkv + dr]: q_latent and q_pe are column slices
  Tensor q_latent, q_pe;
  float scale = 0.0f;

  int batch() const { return static_cast<int>(lens.size()); }
  int width() const { return rkv + dr; }
  int64_t Slot(int b, int s) const {
    return static_cast<int64_t>(block_table.data<int32_t>()[b * max_blocks + s / block_size]) *
               block_size +
           s % block_size;
  }
};

PagedDecode MakePagedDecode(int heads, int rkv, int dr, int block_size,
                            const std::vector<int>& lens, uint32_t seed) {
  PagedDecode p;
  p.heads = heads;
  p.rkv = rkv;
  p.dr = dr;
  p.block_size = block_size;
  p.lens = lens;
  int used = 0;
  for (int len : lens) {
    const int n = (len + block_size - 1) / block_size;
    used += n;
    p.max_blocks = std::max(p.max_blocks, n);
  }
  p.max_blocks += 1;  // a spare column left at block 0
  const int num_blocks = used + 1 + 3;
  p.cache = Make(DType::kF32, {num_blocks, block_size, p.width()});
  testing::PoisonNaN(p.cache);
  p.block_table = Make(DType::kI32, {p.batch(), p.max_blocks});
  p.seq_lens = Make(DType::kI32, {p.batch()});
  std::mt19937 rng(seed);
  std::vector<int> pool(num_blocks - 1);
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  size_t next = 0;
  for (int b = 0; b < p.batch(); ++b) {
    p.seq_lens.data<int32_t>()[b] = lens[b];
    for (int j = 0; j * block_size < lens[b]; ++j) {
      p.block_table.data<int32_t>()[b * p.max_blocks + j] = pool[next++];
    }
    for (int s = 0; s < lens[b]; ++s) {
      for (int i = 0; i < p.width(); ++i) p.cache.set(p.Slot(b, s) * p.width() + i, u(rng));
    }
  }
  p.q = Make(DType::kF32, {p.batch(), heads, p.width()});
  testing::FillRandom(p.q, seed + 1);
  p.q_latent = p.q.t.Slice(2, 0, rkv);
  p.q_pe = p.q.t.Slice(2, rkv, p.width());
  p.scale = static_cast<float>(2.0 / std::sqrt(p.width() / 9.0));
  return p;
}

// Decode in double: out [B, H, rkv] = the softmax-weighted sum of c_kv,
// lse [B, H]; zeros and -inf for an empty sequence.
void ReferenceDecode(const PagedDecode& p, std::vector<double>* out, std::vector<double>* lse) {
  out->assign(static_cast<size_t>(p.batch()) * p.heads * p.rkv, 0.0);
  lse->assign(static_cast<size_t>(p.batch()) * p.heads, -kInf);
  for (int b = 0; b < p.batch(); ++b) {
    const int len = p.lens[b];
    if (len == 0) continue;
    for (int h = 0; h < p.heads; ++h) {
      const int64_t row = static_cast<int64_t>(b) * p.heads + h;
      std::vector<double> scores(len);
      double max = -kInf;
      for (int s = 0; s < len; ++s) {
        double dot = 0.0;
        for (int i = 0; i < p.width(); ++i) {
          dot += static_cast<double>(p.q.get(row * p.width() + i)) *
                 p.cache.get(p.Slot(b, s) * p.width() + i);
        }
        scores[s] = p.scale * dot;
        max = std::max(max, scores[s]);
      }
      double sum = 0.0;
      for (int s = 0; s < len; ++s) {
        const double e = std::exp(scores[s] - max);
        sum += e;
        for (int i = 0; i < p.rkv; ++i) {
          (*out)[row * p.rkv + i] += e * p.cache.get(p.Slot(b, s) * p.width() + i);
        }
      }
      for (int i = 0; i < p.rkv; ++i) (*out)[row * p.rkv + i] /= sum;
      (*lse)[row] = max + std::log(sum);
    }
  }
}

// The host's decode splits (a partial softmax per split, merged through the
// LSE) at forced split lengths: one token per split, an odd length across
// page boundaries, lengths shorter and longer than most sequences, and 0
// (the length the public entry point picks).
TEST(MlaDecodeSplit, ForcedSplitLengthsMatchDouble) {
  const PagedDecode p = MakePagedDecode(3, 40, 8, 16, {1, 15, 0, 17, 65, 129, 300, 1000}, 51);
  std::vector<double> want_out, want_lse;
  ReferenceDecode(p, &want_out, &want_lse);
  for (int64_t split : {0, 1, 7, 97, 1000}) {
    SCOPED_TRACE(::testing::Message() << "split " << split);
    Owned out = Make(DType::kF32, {p.batch(), p.heads, p.rkv});
    Owned lse = Make(DType::kF32, {p.batch(), p.heads});
    testing::PoisonNaN(out);
    testing::PoisonNaN(lse);
    ASSERT_OK(host::MlaDecode(p.q_latent, p.q_pe, p.cache.t, p.block_table.t, p.seq_lens.t, p.scale,
                              out.t, lse.t, split));
    // The empty sequence (and only it): exact zeros and -inf.
    double lse_err = 0.0;
    for (int64_t r = 0; r < lse.numel(); ++r) {
      if (std::isinf(want_lse[r])) {
        EXPECT_EQ(lse.get(r), -std::numeric_limits<float>::infinity()) << "row " << r;
        for (int i = 0; i < p.rkv; ++i) EXPECT_EQ(out.get(r * p.rkv + i), 0.0f) << "row " << r;
        continue;
      }
      lse_err = std::max(lse_err,
                         std::abs(lse.get(r) - want_lse[r]) / std::max(1.0, std::abs(want_lse[r])));
    }
    const double out_err = testing::MaxRelError(out, want_out);
    EXPECT_LT(out_err, 1e-5);
    EXPECT_LT(lse_err, 1e-5);
    RecordError("mla_decode_split", std::max(out_err, lse_err));
  }
}

// Decode spreads a small batch's heads over the threads in groups of at
// least 8 (each group's queries transposed once for all of its splits); a
// batch with as many ranges as threads keeps one group. A sequence's bits
// do not depend on which: decoded alone (in groups, given two or more
// threads; 19 heads make a last group shorter than the first) or in a
// batch of eight (one group), and both match the double reference.
TEST(MlaDecodeHeadGroups, GroupsGiveTheBitsOfOneGroup) {
  for (int heads : {19, 24}) {
    SCOPED_TRACE(::testing::Message() << heads << " heads, " << host::NumThreads() << " threads");
    const PagedDecode p =
        MakePagedDecode(heads, 40, 8, 16, {100, 37, 300, 5, 64, 250, 9, 130}, 61 + heads);
    std::vector<double> want_out, want_lse;
    ReferenceDecode(p, &want_out, &want_lse);
    Owned out = Make(DType::kF32, {p.batch(), heads, p.rkv});
    Owned lse = Make(DType::kF32, {p.batch(), heads});
    ASSERT_OK(host::MlaDecode(p.q_latent, p.q_pe, p.cache.t, p.block_table.t, p.seq_lens.t, p.scale,
                              out.t, lse.t));
    EXPECT_LT(testing::MaxRelError(out, want_out), 1e-5);
    for (int b = 0; b < p.batch(); ++b) {
      Owned alone = Make(DType::kF32, {1, heads, p.rkv});
      Owned alone_lse = Make(DType::kF32, {1, heads});
      ASSERT_OK(host::MlaDecode(p.q_latent.Slice(0, b, b + 1), p.q_pe.Slice(0, b, b + 1), p.cache.t,
                                p.block_table.t.Slice(0, b, b + 1), p.seq_lens.t.Slice(0, b, b + 1),
                                p.scale, alone.t, alone_lse.t));
      EXPECT_EQ(std::memcmp(alone.t.data(), out.data<float>() + b * heads * p.rkv,
                            heads * p.rkv * sizeof(float)),
                0)
          << "sequence " << b;
      EXPECT_EQ(
          std::memcmp(alone_lse.t.data(), lse.data<float>() + b * heads, heads * sizeof(float)), 0)
          << "sequence " << b;
    }
  }
}

TEST(MlaAttentionArgs, RejectsBadArguments) {
  const PagedDecode p = MakePagedDecode(2, 8, 4, 4, {5, 3}, 81);
  Owned out = Make(DType::kF32, {2, p.heads, p.rkv});
  Owned lse = Make(DType::kF32, {2, p.heads});
  Owned lse_bad = Make(DType::kF32, {2, p.heads + 1});
  absl::Status st = MlaDecode(HostStream(), p.q_latent, p.q_pe, p.cache.t, p.block_table.t,
                              p.seq_lens.t, p.scale, out.t, lse_bad.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st;
  Owned cache16 = Make(DType::kF16, {p.cache.t.size(0), 4, p.width()});
  st = MlaDecode(HostStream(), p.q_latent, p.q_pe, cache16.t, p.block_table.t, p.seq_lens.t,
                 p.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cache"), std::string::npos) << st;

  // Data checks: a seq_len past the block table, a block id past the cache.
  p.seq_lens.data<int32_t>()[1] = p.max_blocks * 4 + 1;
  st = MlaDecode(HostStream(), p.q_latent, p.q_pe, p.cache.t, p.block_table.t, p.seq_lens.t,
                 p.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("seq_lens[1]"), std::string::npos) << st;
  p.seq_lens.data<int32_t>()[1] = 3;
  p.block_table.data<int32_t>()[p.max_blocks] = static_cast<int32_t>(p.cache.t.size(0));
  st = MlaDecode(HostStream(), p.q_latent, p.q_pe, p.cache.t, p.block_table.t, p.seq_lens.t,
                 p.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block_table[1][0]"), std::string::npos) << st;

  // Prefill: more query rows than tokens in the sequence.
  p.block_table.data<int32_t>()[p.max_blocks] = 1;
  Owned qsl = Make(DType::kI32, {3});
  qsl.data<int32_t>()[1] = 1;
  qsl.data<int32_t>()[2] = 2;
  p.seq_lens.data<int32_t>()[0] = 0;
  st = MlaPrefill(HostStream(), p.q_latent, p.q_pe, p.cache.t, p.block_table.t, p.seq_lens.t, qsl.t,
                  p.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("query_start_loc"), std::string::npos) << st;
}

// Attention splits are fixed by the position, never by the batch: a query
// at position p gives the same bits decoded alone, decoded in a batch with
// other sequences of other lengths, prefilled with the whole prompt, or
// prefilled in a later chunk; across split boundaries
// (kAttentionSplitTokens) included.
TEST(MlaHostInvarianceTest, DecodeAndPrefillGiveTheSameBitsAtEveryPosition) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  constexpr int64_t H = 3, R = 40, dr = 8, row = R + dr, bs = 16;
  constexpr int64_t L = 2 * host::kAttentionSplitTokens + 190;  // three splits at the end
  const int64_t blocks = (L + bs - 1) / bs;
  const float scale = 0.3f;
  // One sequence in blocks [0, blocks), in reverse order (the table matters).
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t j = 0; j < blocks; ++j) table[j] = static_cast<int32_t>(blocks - 1 - j);
  std::vector<float> cache = testing::RandomFloats(static_cast<size_t>(blocks * bs * row), 11);
  std::vector<float> ql = testing::RandomFloats(static_cast<size_t>(L * H * R), 12);
  std::vector<float> qp = testing::RandomFloats(static_cast<size_t>(L * H * dr), 13);
  const Tensor cache_t(cache.data(), DType::kF32, {blocks, bs, row});

  // The whole prompt prefilled at once.
  std::vector<float> out(static_cast<size_t>(L * H * R)), lse(static_cast<size_t>(L * H));
  {
    std::vector<int32_t> lens = {static_cast<int32_t>(L)}, qsl = {0, static_cast<int32_t>(L)};
    ASSERT_OK(host::MlaPrefill(
        Tensor(ql.data(), DType::kF32, {L, H, R}), Tensor(qp.data(), DType::kF32, {L, H, dr}),
        cache_t, Tensor(table.data(), DType::kI32, {1, blocks}),
        Tensor(lens.data(), DType::kI32, {1}), Tensor(qsl.data(), DType::kI32, {2}), scale,
        Tensor(out.data(), DType::kF32, {L, H, R}), Tensor(lse.data(), DType::kF32, {L, H})));
  }
  // The same prompt as two chunks: [0, c) then [c, L) after c cached tokens.
  const int64_t c = host::kAttentionSplitTokens + 37;
  std::vector<float> out2(out.size()), lse2(lse.size());
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, c}, {c, L}}) {
    std::vector<int32_t> lens = {static_cast<int32_t>(r1)},
                         qsl = {0, static_cast<int32_t>(r1 - r0)};
    ASSERT_OK(host::MlaPrefill(Tensor(ql.data() + r0 * H * R, DType::kF32, {r1 - r0, H, R}),
                               Tensor(qp.data() + r0 * H * dr, DType::kF32, {r1 - r0, H, dr}),
                               cache_t, Tensor(table.data(), DType::kI32, {1, blocks}),
                               Tensor(lens.data(), DType::kI32, {1}),
                               Tensor(qsl.data(), DType::kI32, {2}), scale,
                               Tensor(out2.data() + r0 * H * R, DType::kF32, {r1 - r0, H, R}),
                               Tensor(lse2.data() + r0 * H, DType::kF32, {r1 - r0, H})));
  }
  EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)), 0);

  const int64_t S = host::kAttentionSplitTokens;
  for (int64_t p : {int64_t{0}, int64_t{31}, S - 1, S, S + 1, 2 * S - 1, 2 * S, L - 1}) {
    for (int64_t batch : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "position " << p << ", batch " << batch);
      // The query decoded as sequence batch / 2 of `batch` sequences over the
      // same cache, the others at other lengths.
      const int64_t me = batch / 2;
      std::vector<int32_t> lens(static_cast<size_t>(batch)), tables;
      std::vector<float> dl(static_cast<size_t>(batch * H * R)),
          dp(static_cast<size_t>(batch * H * dr));
      for (int64_t b = 0; b < batch; ++b) {
        lens[b] = static_cast<int32_t>(b == me ? p + 1 : (37 * b + 5 * p) % L + 1);
        const int64_t src = b == me ? p : (lens[b] - 1);
        std::copy_n(ql.data() + src * H * R, H * R, dl.data() + b * H * R);
        std::copy_n(qp.data() + src * H * dr, H * dr, dp.data() + b * H * dr);
        tables.insert(tables.end(), table.begin(), table.end());
      }
      std::vector<float> dout(dl.size()), dlse(static_cast<size_t>(batch * H));
      ASSERT_OK(host::MlaDecode(Tensor(dl.data(), DType::kF32, {batch, H, R}),
                                Tensor(dp.data(), DType::kF32, {batch, H, dr}), cache_t,
                                Tensor(tables.data(), DType::kI32, {batch, blocks}),
                                Tensor(lens.data(), DType::kI32, {batch}), scale,
                                Tensor(dout.data(), DType::kF32, {batch, H, R}),
                                Tensor(dlse.data(), DType::kF32, {batch, H})));
      EXPECT_EQ(
          std::memcmp(dout.data() + me * H * R, out.data() + p * H * R, H * R * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(dlse.data() + me * H, lse.data() + p * H, H * sizeof(float)), 0);
    }
  }
}

// ============================================================================
// The host attention's softmax tile (kernels/host/attention_softmax.h), on
// the vector width this CPU picks (the kernels_attention_* tests run the
// narrower ones).

// Units in the last place of f32 between `got` and the exact `want`.
double UlpError(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(ExpNonPositiveTest, WithinTwoUlpOfDouble) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> wide(-87.3f, 0.0f), narrow(-1.0f, 0.0f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 == 0 ? wide(rng) : narrow(rng);
    worst = std::max(worst, UlpError(host::ExpNonPositive(x), std::exp(static_cast<double>(x))));
  }
  // Every multiple of ln2 / 2 near the range reduction's switch points.
  for (int k = 0; k <= 250; ++k) {
    for (float x : {-0.34657359f * k, std::nextafter(-0.34657359f * k, 0.0f)}) {
      if (x < -87.3f) continue;
      worst = std::max(worst, UlpError(host::ExpNonPositive(x), std::exp(static_cast<double>(x))));
    }
  }
  EXPECT_LE(worst, 2.0);
  RecordError("ExpNonPositive, ulp", worst);
  EXPECT_EQ(host::ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(host::ExpNonPositive(-0.0f), 1.0f);
  EXPECT_EQ(host::ExpNonPositive(-INFINITY), 0.0f);
  EXPECT_EQ(host::ExpNonPositive(-87.4f), 0.0f);
  EXPECT_EQ(host::ExpNonPositive(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(host::ExpNonPositive(NAN)));
}

// The softmax of a tile sequence, tile by tile, for `lanes` lanes of which
// the first nq are queries; rkv accumulator columns.
struct SoftmaxRun {
  std::vector<float> max, sum, acc, probs;  // probs of the last tile
};

SoftmaxRun RunTiles(int64_t lanes, int64_t nq, int64_t rkv, const std::vector<int32_t>& limit,
                    const std::vector<std::vector<float>>& tiles, int64_t key0, float scale,
                    std::vector<std::vector<float>>* probs_per_tile = nullptr) {
  SoftmaxRun r;
  r.max.assign(lanes, -INFINITY);
  r.sum.assign(lanes, 0.0f);
  r.acc.assign(static_cast<size_t>(nq * rkv), 1.0f);
  const host::SoftmaxLanes s{lanes, r.max.data(), r.sum.data(), limit.data()};
  constexpr int64_t kLdp = 32;
  for (const std::vector<float>& tile : tiles) {
    const int64_t n = static_cast<int64_t>(tile.size()) / lanes;
    std::vector<float> scores = tile;
    r.probs.assign(static_cast<size_t>(nq * kLdp), -1.0f);
    host::SoftmaxTile(s, nq, n, key0, scale, scores.data(), r.probs.data(), kLdp, r.acc.data(),
                      rkv);
    if (probs_per_tile != nullptr) probs_per_tile->push_back(r.probs);
    key0 += n;
  }
  return r;
}

TEST(SoftmaxTileTest, MatchesAnOnlineSoftmaxInDouble) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  constexpr int64_t kLanes = 32, kNq = 19, kRkv = 37, kLdp = 32, kKey0 = 100;
  constexpr float kScale = 0.37f;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  // Tiles of 7, 32, 1 and 20 keys; query q sees keys below its limit: some
  // none, some part of a tile, some all.
  std::vector<std::vector<float>> tiles;
  for (int64_t n : {7, 32, 1, 20}) {
    std::vector<float> t(static_cast<size_t>(n * kLanes));
    for (float& v : t) v = nd(rng);
    tiles.push_back(t);
  }
  std::vector<int32_t> limit(kLanes, 0);
  for (int64_t q = 0; q < kNq; ++q) limit[q] = static_cast<int32_t>(kKey0 + (q * 13) % 62);
  std::vector<std::vector<float>> probs;
  const SoftmaxRun got = RunTiles(kLanes, kNq, kRkv, limit, tiles, kKey0, kScale, &probs);

  double worst_p = 0, worst_sum = 0;
  for (int64_t q = 0; q < kNq; ++q) {
    // The same recurrence, the scaled scores and their maxima in f32 as the
    // kernel forms them (exact), exp and sums in double.
    float m = -INFINITY;
    double sum = 0;
    int64_t key = kKey0;
    for (size_t t = 0; t < tiles.size(); ++t) {
      const int64_t n = static_cast<int64_t>(tiles[t].size()) / kLanes;
      std::vector<float> s(static_cast<size_t>(n));
      float tile_max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        s[j] = key + j < limit[q] ? kScale * tiles[t][j * kLanes + q] : -INFINITY;
        tile_max = std::max(tile_max, s[j]);
      }
      const float m_new = std::max(m, tile_max);
      const double alpha = m == -INFINITY ? 0.0 : std::exp(static_cast<double>(m - m_new));
      sum *= alpha;
      for (int64_t j = 0; j < n; ++j) {
        const double p = s[j] == -INFINITY ? 0.0 : std::exp(static_cast<double>(s[j] - m_new));
        sum += p;
        const float got_p = probs[t][q * kLdp + j];
        if (p == 0.0) {
          EXPECT_EQ(got_p, 0.0f) << "q " << q << " tile " << t << " key " << j;
        } else {
          worst_p = std::max(worst_p, UlpError(got_p, p));
        }
      }
      m = m_new;
      key += n;
    }
    EXPECT_EQ(got.max[q], m) << "q " << q;  // max and subtraction are exact in f32
    if (sum == 0.0) {
      EXPECT_EQ(got.sum[q], 0.0f) << "q " << q;
    } else {
      worst_sum = std::max(worst_sum, std::fabs(got.sum[q] - sum) / sum);
    }
  }
  EXPECT_LE(worst_p, 2.0);
  EXPECT_LE(worst_sum, 1e-6);
  RecordError("SoftmaxTile probabilities, ulp", worst_p);
  RecordError("SoftmaxTile sums", worst_sum);
  // Padding lanes see nothing.
  for (int64_t q = kNq; q < kLanes; ++q) {
    EXPECT_EQ(got.max[q], -INFINITY);
    EXPECT_EQ(got.sum[q], 0.0f);
  }
}

// The accumulator is rescaled by exp(old max - new max) whenever the max
// grows, and left alone otherwise.
TEST(SoftmaxTileTest, RescalesTheAccumulatorWhenTheMaxGrows) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  constexpr int64_t kLanes = 16, kNq = 3, kRkv = 21;  // rkv past a vector multiple
  std::vector<int32_t> limit(kLanes, 0);
  for (int64_t q = 0; q < kNq; ++q) limit[q] = 100;
  // Running maxima 1, 2, 3 with sums 1 and accumulators 1; a one-key tile
  // in which query 0 rises to 5, query 1 stays at 2 and query 2 falls to -4.
  std::vector<float> scores(kLanes, 0.0f);
  scores[0] = 5, scores[1] = 2, scores[2] = -4;
  std::vector<float> acc(static_cast<size_t>(kNq * kRkv), 1.0f), probs(kNq * 32);
  std::vector<float> max = {1, 2, 3}, sum = {1, 1, 1};
  max.resize(kLanes, -INFINITY);
  sum.resize(kLanes, 0.0f);
  host::SoftmaxTile({kLanes, max.data(), sum.data(), limit.data()}, kNq, 1, 0, 1.0f, scores.data(),
                    probs.data(), 32, acc.data(), kRkv);
  for (int64_t i = 0; i < kRkv; ++i) {
    EXPECT_NEAR(acc[0 * kRkv + i], std::exp(1.0 - 5.0), 2e-7);  // max 1 -> 5
    EXPECT_EQ(acc[1 * kRkv + i], 1.0f);                         // max stays 2
    EXPECT_EQ(acc[2 * kRkv + i], 1.0f);                         // max stays 3
  }
  EXPECT_EQ(max[0], 5.0f);
  EXPECT_NEAR(sum[0], std::exp(-4.0) + 1.0, 1e-6);
  EXPECT_NEAR(sum[2], 1.0 + std::exp(-7.0), 1e-6);
  EXPECT_EQ(probs[1 * 32], 1.0f);  // query 1's score equals its max: exp(0)
}

// A lane's results depend only on its own scores, limit and state.
TEST(SoftmaxTileTest, LanesAreIndependent) {
  SkipUnlessRequestedIsa();
  if (::testing::Test::IsSkipped()) return;
  SCOPED_TRACE(host::GemmIsa());
  constexpr int64_t kLanes = 48, kNq = 40, kRkv = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<int32_t> limit(kLanes, 0);
  for (int64_t q = 0; q < kNq; ++q) limit[q] = static_cast<int32_t>(40 + q);
  std::vector<std::vector<float>> a, b;
  for (int64_t n : {32, 32}) {
    std::vector<float> t(static_cast<size_t>(n * kLanes));
    for (float& v : t) v = nd(rng);
    a.push_back(t);
    for (float& v : t) v = nd(rng);  // every lane different...
    b.push_back(t);
  }
  constexpr int64_t kMe = 21;
  for (size_t t = 0; t < a.size(); ++t) {  // ...but lane kMe
    for (size_t j = 0; j < a[t].size() / kLanes; ++j)
      b[t][j * kLanes + kMe] = a[t][j * kLanes + kMe];
  }
  const SoftmaxRun ra = RunTiles(kLanes, kNq, kRkv, limit, a, 0, 0.5f);
  const SoftmaxRun rb = RunTiles(kLanes, kNq, kRkv, limit, b, 0, 0.5f);
  EXPECT_EQ(std::memcmp(&ra.max[kMe], &rb.max[kMe], sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&ra.sum[kMe], &rb.sum[kMe], sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&ra.acc[kMe * kRkv], &rb.acc[kMe * kRkv], kRkv * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&ra.probs[kMe * 32], &rb.probs[kMe * 32], 32 * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(&ra.sum[kMe + 1], &rb.sum[kMe + 1], sizeof(float)), 0);
}

}  // namespace
}  // namespace mlag
