// MLA kernels (rope, kv_update, decode, prefill) against double-precision
// references written here: YaRN constants (the formulas of the Hugging Face
// modeling_deepseek.py), rope rotation on interleaved pairs, the KV write
// contract of kernels/mla_kv_update.h (vLLM's concat_and_cache_mla), and
// absorbed-form attention against naive multi-head attention built from
// kv_b_proj (W_UK, W_UV).
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
#include "kernels/host/mla_attention.h"
#include "kernels/host/parallel.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "kernels/rope.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

// ---- Error bookkeeping: the largest relative error per op, printed at exit.

std::map<std::string, double>& MaxErrors() {
  static std::map<std::string, double> errors;
  return errors;
}

void Record(const std::string& op, double err) {
  double& e = MaxErrors()[op];
  e = std::max(e, err);
}

class ErrorReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [op, err] : MaxErrors()) std::printf("max_rel_err %s %.3g\n", op.c_str(), err);
  }
};
[[maybe_unused]] ::testing::Environment* const kErrorReport =
    ::testing::AddGlobalTestEnvironment(new ErrorReport);

// max |got - want| / max |want| (normwise); NaN in got gives +inf.
double RelError(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return kInf;
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / std::max(ref, 1e-30);
}

std::vector<float> Uniform(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) {
    do f = u(rng);
    while (f == 0.0f);
  }
  return v;
}

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
double GRef(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }
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
  Record("inv_freq", max_err);

  const float scale = MlaSoftmaxScale(48, p);
  EXPECT_NEAR(scale, 0.174017, 0.5e-6 + 1e-7);
  const double scale_rel = std::abs(scale - SoftmaxScaleRef(48, p)) / SoftmaxScaleRef(48, p);
  EXPECT_LT(scale_rel, 1e-6);
  Record("softmax_scale", scale_rel);
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
  Record("rope_table", err);

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
  Record("rope", std::max(q_err, k_err));
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
// KV update

uint64_t Fnv1a(const unsigned char* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// FNV-1a over every cache row not in `written`.
uint64_t ChecksumUnwritten(const Owned& cache, const std::vector<bool>& written) {
  const size_t row_bytes = static_cast<size_t>(cache.t.size(2)) * DTypeSize(cache.t.dtype());
  const auto* base = static_cast<const unsigned char*>(cache.t.data());
  uint64_t h = 1469598103934665603ull;
  for (size_t r = 0; r < written.size(); ++r) {
    if (!written[r]) h = Fnv1a(base + r * row_bytes, row_bytes, h);
  }
  return h;
}

struct KvUpdateCase {
  DType input;
  DType cache;
};

class KvUpdateTest : public ::testing::TestWithParam<KvUpdateCase> {};

TEST_P(KvUpdateTest, WritesOnlyMappedSlots) {
  const DType in_dtype = GetParam().input, cache_dtype = GetParam().cache;
  const int rkv = 37, dr = 6, pad = 5, num_blocks = 7, block_size = 5;
  const int num_slots = num_blocks * block_size;
  const int rows = 14, tokens = 11;  // inputs longer than slot_mapping (graph padding)

  // kv_c and k_pe are column slices of one [rows, rkv + dr + pad] buffer.
  Owned kv = Make(in_dtype, {rows, rkv + dr + pad});
  const std::vector<double> kv_values = testing::FillRandom(kv, 21);
  const Tensor kv_c = kv.t.Slice(1, 0, rkv);
  const Tensor k_pe = kv.t.Slice(1, rkv, rkv + dr);

  Owned cache = Make(cache_dtype, {num_blocks, block_size, rkv + dr});
  testing::FillRandom(cache, 22, -5.0f, 5.0f);
  const size_t cache_bytes = cache.t.nbytes();
  std::vector<unsigned char> before(cache_bytes);
  std::memcpy(before.data(), cache.t.data(), cache_bytes);

  // Distinct random slots, with -1 (dummy rows) and one out-of-range slot.
  std::mt19937 rng(23);
  std::vector<int64_t> perm(num_slots - 1);
  std::iota(perm.begin(), perm.end(), 1);  // slot 0 is used by token 10 only
  std::shuffle(perm.begin(), perm.end(), rng);
  Owned slots = Make(DType::kI64, {tokens});
  int64_t* slot = slots.data<int64_t>();
  for (int t = 0; t < tokens; ++t) slot[t] = perm[t];
  slot[0] = -1;
  slot[4] = -1;
  slot[5] = -7;
  slot[9] = num_slots;  // past the end: skipped
  slot[10] = 0;         // slot 0 (the null block's first row) is a real slot here
  std::vector<int> writer(num_slots, -1);
  for (int t = 0; t < tokens; ++t) {
    if (slot[t] >= 0 && slot[t] < num_slots) writer[slot[t]] = t;
  }
  std::vector<bool> written(num_slots);
  for (int s = 0; s < num_slots; ++s) written[s] = writer[s] >= 0;
  const uint64_t sum_before = ChecksumUnwritten(cache, written);

  ASSERT_OK(MlaKvUpdate(HostStream(), kv_c, k_pe, slots.t, cache.t));

  EXPECT_EQ(ChecksumUnwritten(cache, written), sum_before);
  const size_t esize = DTypeSize(cache_dtype);
  const size_t row_bytes = (rkv + dr) * esize;
  int64_t checked = 0;
  for (int s = 0; s < num_slots; ++s) {
    const auto* got = static_cast<const unsigned char*>(cache.t.data()) + s * row_bytes;
    if (writer[s] < 0) {
      EXPECT_EQ(std::memcmp(got, before.data() + s * row_bytes, row_bytes), 0) << "slot " << s;
      continue;
    }
    // Expected bytes: the input rounded to the cache dtype (bit-exact copy for
    // the same dtype).
    const int t = writer[s];
    std::vector<unsigned char> want(row_bytes);
    for (int i = 0; i < rkv + dr; ++i) {
      // kv_c then k_pe are adjacent columns of the input buffer.
      StoreFromF32(cache_dtype, want.data(), i,
                   static_cast<float>(kv_values[t * (rkv + dr + pad) + i]));
    }
    if (in_dtype == cache_dtype) {
      const auto* in_row =
          static_cast<const unsigned char*>(kv.t.data()) + t * (rkv + dr + pad) * esize;
      EXPECT_EQ(std::memcmp(want.data(), in_row, row_bytes), 0);
    }
    EXPECT_EQ(std::memcmp(got, want.data(), row_bytes), 0) << "slot " << s << " token " << t;
    ++checked;
  }
  EXPECT_EQ(checked, 7);  // 11 tokens, 3 negative, 1 out of range

  // A dummy run (all -1) changes nothing.
  for (int t = 0; t < tokens; ++t) slot[t] = -1;
  std::vector<unsigned char> after(cache_bytes);
  std::memcpy(after.data(), cache.t.data(), cache_bytes);
  ASSERT_OK(MlaKvUpdate(HostStream(), kv_c, k_pe, slots.t, cache.t));
  EXPECT_EQ(std::memcmp(after.data(), cache.t.data(), cache_bytes), 0);
  Record("kv_update", 0.0);  // bit-exact
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvUpdateTest,
                         ::testing::Values(KvUpdateCase{DType::kF32, DType::kF32},
                                           KvUpdateCase{DType::kF32, DType::kBF16},
                                           KvUpdateCase{DType::kBF16, DType::kBF16},
                                           KvUpdateCase{DType::kBF16, DType::kF32}),
                         [](const ::testing::TestParamInfo<KvUpdateCase>& info) {
                           return std::string(DTypeName(info.param.input)) + "_to_" +
                                  std::string(DTypeName(info.param.cache));
                         });

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
// Attention

struct Dims {
  int heads, rkv, dr, dn, dv;
};

// kv_b_proj per head: W_UK^h [dn, rkv] and W_UV^h [dv, rkv], plus the scale.
struct Weights {
  std::vector<double> w_uk;  // [H, dn, rkv]
  std::vector<double> w_uv;  // [H, dv, rkv]
  float scale;
};

Weights MakeWeights(const Dims& d, uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  w.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dn + d.dr)));
  // Scores scale*(q~.c + q_pe.k_pe) with standard deviation about 2, so the
  // softmax is neither flat nor one-hot: q~_r has variance dn a^2 / 9 and
  // q~.c variance rkv dn a^2 / 27.
  const double a = 2.0 / (w.scale * std::sqrt(d.rkv * d.dn / 27.0));
  for (float f : Uniform(static_cast<size_t>(d.heads) * d.dn * d.rkv, rng)) w.w_uk.push_back(a * f);
  for (float f : Uniform(static_cast<size_t>(d.heads) * d.dv * d.rkv, rng)) w.w_uv.push_back(f);
  return w;
}

// Sequences in a paged cache: pages in random order from a pool whose block 0
// (the null block) is never used; every cache row that holds no token is NaN,
// so reading past seq_len poisons the output.
struct PagedKv {
  int block_size = 0;
  int max_blocks = 0;
  std::vector<int> lens;
  Owned cache, block_table, seq_lens;
  // What the cache holds for token s of sequence b, and what was written
  // before rounding to the cache dtype (equal for f32).
  std::vector<std::vector<double>> c, pe, c_in, pe_in;
};

PagedKv MakePagedKv(const Dims& d, int block_size, const std::vector<int>& lens, DType dtype,
                    uint32_t seed, bool via_kv_update) {
  PagedKv kv;
  kv.block_size = block_size;
  kv.lens = lens;
  const int batch = static_cast<int>(lens.size());
  int used = 0;
  for (int len : lens) {
    const int n = (len + block_size - 1) / block_size;
    used += n;
    kv.max_blocks = std::max(kv.max_blocks, n);
  }
  kv.max_blocks += 1;  // a spare column left at the null block
  const int num_blocks = used + 1 + 3;
  const int row = d.rkv + d.dr;
  kv.cache = Make(dtype, {num_blocks, block_size, row});
  testing::PoisonNaN(kv.cache);
  kv.block_table = Make(DType::kI32, {batch, kv.max_blocks});
  kv.seq_lens = Make(DType::kI32, {batch});
  std::mt19937 rng(seed);
  std::vector<int> pool(num_blocks - 1);
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  int total = 0;
  for (int b = 0; b < batch; ++b) {
    kv.seq_lens.data<int32_t>()[b] = lens[b];
    total += lens[b];
    for (int j = 0; j * block_size < lens[b]; ++j) {
      kv.block_table.data<int32_t>()[b * kv.max_blocks + j] = pool[next++];
    }
  }
  auto slot_of = [&](int b, int s) {
    return static_cast<int64_t>(kv.block_table.data<int32_t>()[b * kv.max_blocks + s / block_size]) *
               block_size + s % block_size;
  };

  // Inputs for every token: rows of a [total + 2, row + 3] buffer.
  const int in_row = row + 3;
  Owned input = Make(DType::kF32, {total + 2, in_row});
  testing::FillRandom(input, seed + 1);
  const float* in = input.data<float>();
  if (via_kv_update) {
    Owned slots = Make(DType::kI64, {total + 1});
    int t = 0;
    for (int b = 0; b < batch; ++b) {
      for (int s = 0; s < lens[b]; ++s) slots.data<int64_t>()[t++] = slot_of(b, s);
    }
    slots.data<int64_t>()[total] = -1;  // a padding row
    EXPECT_OK(MlaKvUpdate(HostStream(), input.t.Slice(1, 0, d.rkv),
                            input.t.Slice(1, d.rkv, row), slots.t, kv.cache.t)
                    );
  } else {
    int t = 0;
    for (int b = 0; b < batch; ++b) {
      for (int s = 0; s < lens[b]; ++s, ++t) {
        for (int i = 0; i < row; ++i) kv.cache.set(slot_of(b, s) * row + i, in[t * in_row + i]);
      }
    }
  }
  int t = 0;
  kv.c.resize(batch);
  kv.pe.resize(batch);
  kv.c_in.resize(batch);
  kv.pe_in.resize(batch);
  for (int b = 0; b < batch; ++b) {
    for (int s = 0; s < lens[b]; ++s, ++t) {
      for (int i = 0; i < row; ++i) {
        const double stored = kv.cache.get(slot_of(b, s) * row + i);
        const double given = in[t * in_row + i];
        (i < d.rkv ? kv.c[b] : kv.pe[b]).push_back(stored);
        (i < d.rkv ? kv.c_in[b] : kv.pe_in[b]).push_back(given);
      }
    }
  }
  return kv;
}

// Query rows: q_nope and q_pe per head (double), and the kernel inputs
// q_latent = W_UK^T q_nope (computed in double, rounded to f32) and q_pe, as
// column slices of one [n, H, rkv + dr + 1] buffer.
struct QueryRows {
  int n = 0;
  std::vector<double> q_nope;  // [n, H, dn]
  std::vector<double> q_pe;    // [n, H, dr]
  Owned buffer;
  Tensor q_latent, q_pe_t;
};

QueryRows MakeQueries(const Dims& d, const Weights& w, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  QueryRows q;
  q.n = n;
  for (float f : Uniform(static_cast<size_t>(n) * d.heads * d.dn, rng)) q.q_nope.push_back(f);
  for (float f : Uniform(static_cast<size_t>(n) * d.heads * d.dr, rng)) q.q_pe.push_back(f);
  const int width = d.rkv + d.dr + 1;
  q.buffer = Make(DType::kF32, {std::max(n, 1), d.heads, width});
  testing::PoisonNaN(q.buffer);
  float* buf = q.buffer.data<float>();
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < d.heads; ++h) {
      float* dst = buf + (static_cast<size_t>(r) * d.heads + h) * width;
      const double* qn = &q.q_nope[(static_cast<size_t>(r) * d.heads + h) * d.dn];
      for (int i = 0; i < d.rkv; ++i) {
        double acc = 0.0;
        for (int k = 0; k < d.dn; ++k) acc += w.w_uk[(static_cast<size_t>(h) * d.dn + k) * d.rkv + i] * qn[k];
        dst[i] = static_cast<float>(acc);
      }
      for (int i = 0; i < d.dr; ++i) {
        dst[d.rkv + i] = static_cast<float>(q.q_pe[(static_cast<size_t>(r) * d.heads + h) * d.dr + i]);
      }
    }
  }
  q.q_latent = q.buffer.t.Slice(0, 0, n).Slice(2, 0, d.rkv);
  q.q_pe_t = q.buffer.t.Slice(0, 0, n).Slice(2, d.rkv, d.rkv + d.dr);
  return q;
}

// Naive multi-head attention of query row r (sequence b) over its first
// `keys` tokens: k_nope_h = W_UK^h c, v_h = W_UV^h c, all in double.
// Writes o [H, dv] and lse [H].
void ReferenceAttention(const Dims& d, const Weights& w, const PagedKv& kv, bool use_inputs,
                        const QueryRows& q, int r, int b, int keys, double* o, double* lse) {
  const std::vector<double>& c = use_inputs ? kv.c_in[b] : kv.c[b];
  const std::vector<double>& pe = use_inputs ? kv.pe_in[b] : kv.pe[b];
  std::vector<double> scores(keys), k_nope(d.dn), v(static_cast<size_t>(keys) * d.dv);
  for (int h = 0; h < d.heads; ++h) {
    const double* qn = &q.q_nope[(static_cast<size_t>(r) * d.heads + h) * d.dn];
    const double* qp = &q.q_pe[(static_cast<size_t>(r) * d.heads + h) * d.dr];
    double max_score = -kInf;
    for (int s = 0; s < keys; ++s) {
      const double* cs = &c[static_cast<size_t>(s) * d.rkv];
      double score = 0.0;
      for (int k = 0; k < d.dn; ++k) {
        const double* wk = &w.w_uk[(static_cast<size_t>(h) * d.dn + k) * d.rkv];
        double kn = 0.0;
        for (int i = 0; i < d.rkv; ++i) kn += wk[i] * cs[i];
        score += qn[k] * kn;
      }
      for (int i = 0; i < d.dr; ++i) score += qp[i] * pe[static_cast<size_t>(s) * d.dr + i];
      scores[s] = w.scale * score;
      max_score = std::max(max_score, scores[s]);
      for (int k = 0; k < d.dv; ++k) {
        const double* wv = &w.w_uv[(static_cast<size_t>(h) * d.dv + k) * d.rkv];
        double vk = 0.0;
        for (int i = 0; i < d.rkv; ++i) vk += wv[i] * cs[i];
        v[static_cast<size_t>(s) * d.dv + k] = vk;
      }
    }
    double sum = 0.0;
    for (int s = 0; s < keys; ++s) sum += std::exp(scores[s] - max_score);
    for (int k = 0; k < d.dv; ++k) {
      double acc = 0.0;
      for (int s = 0; s < keys; ++s) acc += std::exp(scores[s] - max_score) * v[static_cast<size_t>(s) * d.dv + k];
      o[h * d.dv + k] = keys > 0 ? acc / sum : 0.0;
    }
    lse[h] = keys > 0 ? max_score + std::log(sum) : -kInf;
  }
}

// o_h = W_UV^h out_latent_h in double, for row r.
void ProjectOut(const Dims& d, const Weights& w, const Owned& out_latent, int r, double* o) {
  for (int h = 0; h < d.heads; ++h) {
    for (int k = 0; k < d.dv; ++k) {
      double acc = 0.0;
      for (int i = 0; i < d.rkv; ++i) {
        acc += w.w_uv[(static_cast<size_t>(h) * d.dv + k) * d.rkv + i] *
               out_latent.get((static_cast<int64_t>(r) * d.heads + h) * d.rkv + i);
      }
      o[h * d.dv + k] = acc;
    }
  }
}

struct AttnErrors {
  double out = 0.0;  // normwise relative error of o = W_UV out_latent
  double lse = 0.0;  // max |lse - ref| / max(1, |ref|)
};

// Compares rows [0, n) of out_latent / lse against the reference: row r is
// sequence seq_of[r] attending to its first keys_of[r] tokens. Rows with no
// keys must be exactly zero with lse -inf.
AttnErrors CheckAgainstReference(const Dims& d, const Weights& w, const PagedKv& kv,
                                 bool use_inputs, const QueryRows& q, const Owned& out_latent,
                                 const Owned& lse, const std::vector<int>& seq_of,
                                 const std::vector<int>& keys_of) {
  AttnErrors e;
  EXPECT_EQ(testing::CountNaN(out_latent), 0);
  EXPECT_EQ(testing::CountNaN(lse), 0);
  std::vector<double> got, want;
  std::vector<double> o(static_cast<size_t>(d.heads) * d.dv), o_ref(o.size()), l_ref(d.heads);
  for (int r = 0; r < q.n; ++r) {
    if (keys_of[r] == 0) {
      for (int i = 0; i < d.heads * d.rkv; ++i) {
        EXPECT_EQ(out_latent.get(static_cast<int64_t>(r) * d.heads * d.rkv + i), 0.0f) << "row " << r;
      }
      for (int h = 0; h < d.heads; ++h) {
        EXPECT_EQ(lse.get(r * d.heads + h), -std::numeric_limits<float>::infinity()) << "row " << r;
      }
      continue;
    }
    ProjectOut(d, w, out_latent, r, o.data());
    ReferenceAttention(d, w, kv, use_inputs, q, r, seq_of[r], keys_of[r], o_ref.data(), l_ref.data());
    got.insert(got.end(), o.begin(), o.end());
    want.insert(want.end(), o_ref.begin(), o_ref.end());
    for (int h = 0; h < d.heads; ++h) {
      const double l = lse.get(r * d.heads + h);
      e.lse = std::max(e.lse, std::isfinite(l) ? std::abs(l - l_ref[h]) / std::max(1.0, std::abs(l_ref[h]))
                                               : kInf);
    }
  }
  e.out = RelError(got, want);
  return e;
}

struct DecodeRun {
  Owned out, lse;
};

DecodeRun RunDecode(const Dims& d, const Weights& w, const PagedKv& kv, const QueryRows& q,
                    int64_t forced_split = 0) {
  const int n = q.n;
  DecodeRun run;
  run.out = Make(DType::kF32, {n, d.heads, d.rkv});
  run.lse = Make(DType::kF32, {n, d.heads});
  testing::PoisonNaN(run.out);
  testing::PoisonNaN(run.lse);
  absl::Status st;
  if (forced_split > 0) {
    st = host::MlaDecode(q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t, kv.seq_lens.t, w.scale,
                         run.out.t, run.lse.t, forced_split);
  } else {
    st = MlaDecode(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t, kv.seq_lens.t,
                   w.scale, run.out.t, run.lse.t);
  }
  EXPECT_OK(st);
  return run;
}

// Decode rows: row b is sequence b over all its tokens.
AttnErrors DecodeAndCheck(const Dims& d, const Weights& w, const PagedKv& kv, const QueryRows& q,
                          bool use_inputs = false, int64_t forced_split = 0) {
  DecodeRun run = RunDecode(d, w, kv, q, forced_split);
  std::vector<int> seq_of(q.n);
  std::iota(seq_of.begin(), seq_of.end(), 0);
  return CheckAgainstReference(d, w, kv, use_inputs, q, run.out, run.lse, seq_of, kv.lens);
}

class MlaDecodeTest : public ::testing::TestWithParam<int> {};

TEST_P(MlaDecodeTest, MatchesNaiveAttention) {
  const int block_size = GetParam();
  const Dims d{3, 40, 8, 12, 10};
  const Weights w = MakeWeights(d, 31);
  const std::vector<int> lens = {1, 2, 15, 0, 16, 17, 64, 65, 129, 300};
  const PagedKv kv = MakePagedKv(d, block_size, lens, DType::kF32, 32 + block_size, false);
  const QueryRows q = MakeQueries(d, w, static_cast<int>(lens.size()), 33);
  const AttnErrors e = DecodeAndCheck(d, w, kv, q);
  EXPECT_LT(e.out, 1e-5);
  EXPECT_LT(e.lse, 1e-5);
  Record("mla_decode", e.out);
  Record("mla_decode_lse", e.lse);
  // Forced splits (1 token, an odd length across page boundaries) agree too.
  for (int64_t split : {1, 7, 97}) {
    const AttnErrors es = DecodeAndCheck(d, w, kv, q, false, split);
    EXPECT_LT(es.out, 1e-5) << "split " << split;
    EXPECT_LT(es.lse, 1e-5) << "split " << split;
    Record("mla_decode_split", es.out);
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, MlaDecodeTest, ::testing::Values(16, 64));

TEST(MlaDecodeLarge, DeepSeekWidths) {
  const Dims d{16, 512, 64, 32, 24};
  const Weights w = MakeWeights(d, 41);
  const std::vector<int> lens = {1, 37, 260};
  const PagedKv kv = MakePagedKv(d, 64, lens, DType::kF32, 42, false);
  const QueryRows q = MakeQueries(d, w, 3, 43);
  const AttnErrors e = DecodeAndCheck(d, w, kv, q);
  EXPECT_LT(e.out, 1e-5);
  EXPECT_LT(e.lse, 1e-5);
  Record("mla_decode", e.out);
  Record("mla_decode_lse", e.lse);
}

// A 3000-token sequence is split (partial softmax per split, LSE merge) by
// the public entry point itself.
TEST(MlaDecodeSplit, LongSequenceSplitsAndMatches) {
  const Dims d{3, 40, 8, 12, 10};
  const Weights w = MakeWeights(d, 51);
  const std::vector<int> lens = {3000, 5};
  const int64_t split = host::DecodeSplitTokens(3005, host::NumThreads());
  ASSERT_LT(split, 3000) << "the split threshold must trigger splitting here";
  EXPECT_GE(split, host::kMinDecodeSplitTokens);
  const PagedKv kv = MakePagedKv(d, 16, lens, DType::kF32, 52, false);
  const QueryRows q = MakeQueries(d, w, 2, 53);
  const AttnErrors e = DecodeAndCheck(d, w, kv, q);
  EXPECT_LT(e.out, 1e-5);
  EXPECT_LT(e.lse, 1e-5);
  Record("mla_decode_split", e.out);
  Record("mla_decode_lse", e.lse);
  const AttnErrors e1 = DecodeAndCheck(d, w, kv, q, false, 1000);
  EXPECT_LT(e1.out, 1e-5);
  Record("mla_decode_split", e1.out);
}

// bf16 cache written by MlaKvUpdate. Against the reference on the values the
// cache holds (bf16-rounded) the error stays at f32 level; against the
// unrounded inputs it is dominated by bf16 rounding (relative 2^-9 per
// element), which moves each score by up to a few 1e-3 for these O(2) scores
// and each value by 2^-9: 2e-2 normwise bounds both with margin.
TEST(MlaDecodeBf16, KvUpdateThenDecode) {
  const Dims d{3, 40, 8, 12, 10};
  const Weights w = MakeWeights(d, 61);
  const std::vector<int> lens = {0, 1, 17, 64, 300};
  for (int block_size : {16, 64}) {
    const PagedKv kv = MakePagedKv(d, block_size, lens, DType::kBF16, 62 + block_size, true);
    // The kv_update wrote exactly the rounded inputs.
    for (size_t b = 0; b < lens.size(); ++b) {
      for (size_t i = 0; i < kv.c[b].size(); ++i) {
        ASSERT_EQ(kv.c[b][i], Bf16ToF32(F32ToBf16(static_cast<float>(kv.c_in[b][i]))));
      }
    }
    const QueryRows q = MakeQueries(d, w, static_cast<int>(lens.size()), 63);
    const AttnErrors stored = DecodeAndCheck(d, w, kv, q, false);
    EXPECT_LT(stored.out, 1e-5);
    EXPECT_LT(stored.lse, 1e-5);
    Record("mla_decode_bf16_vs_stored", stored.out);
    const AttnErrors inputs = DecodeAndCheck(d, w, kv, q, true);
    EXPECT_LT(inputs.out, 2e-2);
    EXPECT_LT(inputs.lse, 2e-2);
    EXPECT_GT(inputs.out, 0.0);  // the rounding is visible: the test can fail
    Record("mla_decode_bf16_vs_f32_inputs", inputs.out);
  }
}

// Prefill over cached prefixes plus new tokens equals decode applied one new
// token at a time, and the double reference.
TEST(MlaPrefillTest, MatchesDecodePerTokenAndReference) {
  const Dims d{3, 40, 8, 12, 10};
  const Weights w = MakeWeights(d, 71);
  const std::vector<int> cached = {0, 5, 70};
  const std::vector<int> fresh = {1, 7, 20};
  const int padding_rows = 3;
  for (int block_size : {16, 64}) {
    std::vector<int> lens;
    for (size_t b = 0; b < cached.size(); ++b) lens.push_back(cached[b] + fresh[b]);
    const PagedKv kv = MakePagedKv(d, block_size, lens, DType::kF32, 72 + block_size, true);
    const int batch = static_cast<int>(lens.size());
    int rows = 0;
    Owned qsl = Make(DType::kI32, {batch + 1});
    std::vector<int> seq_of, keys_of;
    for (int b = 0; b < batch; ++b) {
      qsl.data<int32_t>()[b] = rows;
      for (int i = 0; i < fresh[b]; ++i) {
        seq_of.push_back(b);
        keys_of.push_back(cached[b] + i + 1);
      }
      rows += fresh[b];
    }
    qsl.data<int32_t>()[batch] = rows;
    for (int i = 0; i < padding_rows; ++i) {
      seq_of.push_back(0);
      keys_of.push_back(0);  // padding: zeros and -inf
    }
    const QueryRows q = MakeQueries(d, w, rows + padding_rows, 73);
    Owned out = Make(DType::kF32, {rows + padding_rows, d.heads, d.rkv});
    Owned lse = Make(DType::kF32, {rows + padding_rows, d.heads});
    testing::PoisonNaN(out);
    testing::PoisonNaN(lse);
    const absl::Status st = MlaPrefill(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t,
                                       kv.block_table.t, kv.seq_lens.t, qsl.t, w.scale, out.t,
                                       lse.t);
    ASSERT_OK(st);
    const AttnErrors e = CheckAgainstReference(d, w, kv, false, q, out, lse, seq_of, keys_of);
    EXPECT_LT(e.out, 1e-5);
    EXPECT_LT(e.lse, 1e-5);
    Record("mla_prefill", e.out);
    Record("mla_prefill_lse", e.lse);

    // Decode, one row per new token: a batch whose row r is sequence
    // seq_of[r] with seq_len = its causal limit.
    Owned bt = Make(DType::kI32, {rows, kv.max_blocks});
    Owned sl = Make(DType::kI32, {rows});
    for (int r = 0; r < rows; ++r) {
      std::memcpy(bt.data<int32_t>() + r * kv.max_blocks,
                  kv.block_table.data<int32_t>() + seq_of[r] * kv.max_blocks,
                  kv.max_blocks * sizeof(int32_t));
      sl.data<int32_t>()[r] = keys_of[r];
    }
    Owned dec_out = Make(DType::kF32, {rows, d.heads, d.rkv});
    Owned dec_lse = Make(DType::kF32, {rows, d.heads});
    testing::PoisonNaN(dec_out);
    testing::PoisonNaN(dec_lse);
    const Tensor q_lat = q.q_latent.Slice(0, 0, rows), q_pe = q.q_pe_t.Slice(0, 0, rows);
    ASSERT_OK(MlaDecode(HostStream(), q_lat, q_pe, kv.cache.t, bt.t, sl.t, w.scale, dec_out.t,
                          dec_lse.t)
                    );
    std::vector<double> want(dec_out.numel()), want_lse(dec_lse.numel());
    for (int64_t i = 0; i < dec_out.numel(); ++i) want[i] = dec_out.get(i);
    for (int64_t i = 0; i < dec_lse.numel(); ++i) want_lse[i] = dec_lse.get(i);
    std::vector<float> got(out.data<float>(), out.data<float>() + dec_out.numel());
    std::vector<float> got_lse(lse.data<float>(), lse.data<float>() + dec_lse.numel());
    const double vs_decode = testing::MaxRelError(got.data(), want.data(), want.size());
    const double vs_decode_lse = testing::MaxRelError(got_lse.data(), want_lse.data(), want_lse.size());
    EXPECT_LT(vs_decode, 1e-6);
    EXPECT_LT(vs_decode_lse, 1e-6);
    Record("mla_prefill_vs_decode", std::max(vs_decode, vs_decode_lse));
  }
}

TEST(MlaAttentionArgs, RejectsBadArguments) {
  const Dims d{2, 8, 4, 4, 4};
  const Weights w = MakeWeights(d, 81);
  const PagedKv kv = MakePagedKv(d, 4, {5, 3}, DType::kF32, 82, false);
  const QueryRows q = MakeQueries(d, w, 2, 83);
  Owned out = Make(DType::kF32, {2, d.heads, d.rkv});
  Owned lse = Make(DType::kF32, {2, d.heads});
  Owned lse_bad = Make(DType::kF32, {2, d.heads + 1});
  absl::Status st = MlaDecode(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t,
                              kv.seq_lens.t, w.scale, out.t, lse_bad.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st;
  Owned cache16 = Make(DType::kF16, {kv.cache.t.size(0), 4, d.rkv + d.dr});
  st = MlaDecode(HostStream(), q.q_latent, q.q_pe_t, cache16.t, kv.block_table.t, kv.seq_lens.t,
                 w.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cache"), std::string::npos) << st;

  // Data checks: a seq_len past the block table, a block id past the cache.
  kv.seq_lens.data<int32_t>()[1] = kv.max_blocks * 4 + 1;
  st = MlaDecode(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t, kv.seq_lens.t,
                 w.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("seq_lens[1]"), std::string::npos) << st;
  kv.seq_lens.data<int32_t>()[1] = 3;
  kv.block_table.data<int32_t>()[kv.max_blocks] = static_cast<int32_t>(kv.cache.t.size(0));
  st = MlaDecode(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t, kv.seq_lens.t,
                 w.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block_table[1][0]"), std::string::npos) << st;

  // Prefill: more query rows than tokens in the sequence.
  kv.block_table.data<int32_t>()[kv.max_blocks] = 1;
  Owned qsl = Make(DType::kI32, {3});
  qsl.data<int32_t>()[1] = 1;
  qsl.data<int32_t>()[2] = 2;
  kv.seq_lens.data<int32_t>()[0] = 0;
  st = MlaPrefill(HostStream(), q.q_latent, q.q_pe_t, kv.cache.t, kv.block_table.t, kv.seq_lens.t,
                  qsl.t, w.scale, out.t, lse.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("query_start_loc"), std::string::npos) << st;
}

}  // namespace
}  // namespace mlag
