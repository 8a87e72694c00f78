// Cases of the MLA ops (kernels/mla_kv_update.h, kernels/mla_attention.h):
// the KV-cache write, decode attention with every MlaDecodeKernel choice,
// with and without a decode workspace, and prefill (chunked, causal, over a
// cached prefix), each against a reference computed in double from the
// inputs as stored.
//
// Tolerances:
//   kv_update  bit-exact: the cast to the cache dtype is one
//              round-to-nearest-even on every backend. Rows of negative or
//              out-of-range slots, and every other cache byte, keep their
//              bytes.
//   attention  f32 arithmetic (the host kernel, the CUDA f32 decode kernel,
//              prefill): out_latent and lse within 1e-5 normwise of the
//              double reference (about 100x f32 epsilon for softmax sums a
//              few hundred terms deep); 3e-5 with a 4096-token sequence in
//              the batch (the sums run 4096 terms deep).
//              The tensor-core decode kernels (CUDA kTensorCore,
//              kTensorCoreBf16Q, and kAuto where it picks them: a bf16 cache
//              of supported widths on compute capability >= 8.0) round on
//              purpose: q to a bf16 hi + lo pair (or to bf16), the
//              probabilities to bf16. Their tolerance comes per case from a
//              double-precision model of exactly that rounding (Arithmetic
//              below): within 4x the model's own distance from the exact
//              reference plus the f32 tolerance. The GPU differs from the
//              model only in its f32 accumulation order and in the running
//              maximum each probability is rounded at, so its error has the
//              model's size. The model itself must stay within the
//              documented precision: 4e-3 with the split q, 2e-2 with a bf16 q.
//   Rows with no keys (seq_len 0, prefill rows of no sequence) must be exact
//   zeros with lse -inf.
//
// The host has one decode kernel and ignores the kernel choice and the
// workspace: there every choice gets the f32 tolerance.
//
// Splits: decode with a workspace on CUDA plans on the device and splits
// long sequences over several thread blocks, merged through their LSEs; the
// plan is read back from the workspace and must have split every sequence
// longer than the minimum split. The host splits a sequence holding most of
// a batch's tokens across threads (asserted for the 4096-token case). The
// naive cases score with explicit keys W_UK c_kv, as multi-head attention
// does, so they check the absorbed form the kernels compute against it.
//
// Caches are paged in random block order, every row holding no token left
// as the harness's poison (NaN in f32 and bf16), so a read past a seq_len or
// through a wrong block id shows up as NaN in the output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/host/mla_attention.h"
#include "kernels/host/parallel.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_kv_update.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "mlag_config.h"
#include "tests/ops/harness.h"
#include "tests/status_matchers.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag::ops_test {
namespace {

const DType kF32 = DType::kF32, kBF16 = DType::kBF16;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The f32 attention tolerances (see the top of the file).
constexpr double kTol = 1e-5;
constexpr double kTolLong = 3e-5;

std::string Str(DType d) { return std::string(DTypeName(d)); }

// Writes `values` as the view elements of `b` (row-major) and uploads them.
void SetValues(Context& ctx, Buf& b, const std::vector<double>& values) {
  const std::vector<int64_t>& elems = b.ViewElements();
  ASSERT_EQ(elems.size(), values.size()) << b.name;
  for (size_t i = 0; i < values.size(); ++i)
    StoreElement(b.dtype, b.host.data(), elems[i], values[i]);
  ctx.Upload(b);
}

template <typename T>
std::vector<double> Doubles(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The device buffer of `b` still holds what its mirror holds (the poison of
// an output no run wrote).
void ExpectUnwritten(Context& ctx, const Buf& b) {
  EXPECT_TRUE(ctx.Download(b) == b.host) << b.name << ": written by a call that was refused";
}

// ---- KV update -------------------------------------------------------------------------

struct KvCase {
  DType input, cache;
  int64_t rkv, dr;
  int64_t block_size, num_blocks;
  int64_t rows, tokens;  // rows of kv_c / k_pe; tokens = slot_mapping entries <= rows
};

std::string Name(const KvCase& c) {
  return absl::StrCat(Str(c.input), "->", Str(c.cache), " ", c.rkv, "+", c.dr, " block ",
                      c.block_size, " ", c.tokens, " of ", c.rows, " rows");
}

// The contract of kernels/mla_kv_update.h: for t < T with 0 <= slot < num
// slots, cache row `slot` = [kv_c[t] | k_pe[t]] rounded to the cache dtype;
// nothing else in the cache changes. `dummy`: every slot negative (a dummy
// run), which must change nothing at all.
void KvUpdateCase(Context& ctx, const KvCase& c, bool dummy) {
  const int64_t width = c.rkv + c.dr;
  const int64_t num_slots = c.num_blocks * c.block_size;
  // Inputs longer than slot_mapping (graph padding): only the first T rows
  // are read. Rows padded, as column slices of the projection output are.
  Buf& kv_c = ctx.Make("kv_c", c.input, {c.rows, c.rkv}, 3, 1);
  Buf& k_pe = ctx.Make("k_pe", c.input, {c.rows, c.dr}, 5, 2);
  ctx.Randomize(kv_c, -4.0, 4.0);
  ctx.Randomize(k_pe, -4.0, 4.0);
  Buf& cache = ctx.Make("cache", c.cache, {c.num_blocks, c.block_size, width}, 0, 2, 3);
  ctx.Randomize(cache, -8.0, 8.0);  // what the cache held before

  // Distinct random slots; among them dummy rows (-1), a negative slot, one
  // just past the cache, one that wraps into the cache if truncated to 32
  // bits, and slot 0 (the first row of block 0 is a real slot here).
  std::mt19937 rng(ctx.NextSeed());
  std::vector<int64_t> perm(static_cast<size_t>(num_slots - 1));
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + c.tokens);
  if (dummy) {
    std::fill(slots.begin(), slots.end(), -1);
  } else {
    slots[0] = -1;
    slots[2] = num_slots;
    slots[4] = -1;
    slots[5] = -7;
    slots[7] = (int64_t{1} << 33) + 3;
    slots[static_cast<size_t>(c.tokens - 1)] = 0;
  }
  Buf& slot_mapping = ctx.Make("slot_mapping", DType::kI64, {c.tokens}, 0, 1, 1);
  SetValues(ctx, slot_mapping, Doubles(slots));

  const std::vector<double> kv = kv_c.Values(), pe = k_pe.Values();
  std::vector<double> want = cache.Values();
  std::vector<uint8_t> want_bytes = cache.host;
  int64_t written = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    const int64_t slot = slots[static_cast<size_t>(t)];
    if (slot < 0 || slot >= num_slots) continue;
    ++written;
    for (int64_t i = 0; i < width; ++i) {
      const double v = i < c.rkv ? kv[static_cast<size_t>(t * c.rkv + i)]
                                 : pe[static_cast<size_t>(t * c.dr + i - c.rkv)];
      want[static_cast<size_t>(slot * width + i)] = RoundTo(c.cache, v);
      StoreElement(c.cache, want_bytes.data(), cache.offset + slot * width + i, v);
    }
  }
  EXPECT_EQ(written, dummy ? 0 : c.tokens - 5);  // 3 negative slots, 2 past the cache

  ctx.RunOp({&cache},
            [&](Stream& s) { return MlaKvUpdate(s, kv_c.t, k_pe.t, slot_mapping.t, cache.t); },
            true, {&cache});
  ctx.ExpectClose(cache, want, Tolerance::Exact());
  // Byte for byte (the values above compare -0 and +0 equal).
  const std::vector<uint8_t> got = ctx.Download(cache);
  int64_t rows_differ = 0;
  const size_t row_bytes = static_cast<size_t>(width) * cache.esize();
  for (int64_t r = 0; r < num_slots; ++r) {
    const size_t at = static_cast<size_t>(cache.offset + r * width) * cache.esize();
    rows_differ += std::memcmp(got.data() + at, want_bytes.data() + at, row_bytes) != 0;
  }
  EXPECT_EQ(rows_differ, 0) << "cache rows whose bytes differ from the contract's";
}

// MlaRopeKvUpdate's contract: the same bytes in q_pe, k_pe and the cache as
// ApplyRope and then MlaKvUpdate on the same backend (each checked against
// its double reference by the apply_rope and mla_kv_update cases). Inputs as
// the MLA block has them: q_pe the rope part of q, k_pe that of the latent
// row; positions out of range on both sides, dummy slots, and fewer slot
// entries than tokens (graph padding). `norm`: the latent's RMSNorm fused
// too, against RmsNorm into an f32 buffer before MlaKvUpdate; kv_c must then
// be left as it was.
void RopeKvUpdateCase(Context& ctx, const KvCase& c, int64_t heads, bool norm) {
  const int64_t width = c.rkv + c.dr, dn = 24;
  const int64_t num_slots = c.num_blocks * c.block_size;
  const int64_t positions = 200;
  std::mt19937 rng(ctx.NextSeed());
  // The table: any f32 values do (both paths read the same ones).
  std::vector<double> table_values(static_cast<size_t>(positions * c.dr));
  std::vector<int64_t> slot_values(static_cast<size_t>(c.tokens));
  std::vector<double> pos_values(static_cast<size_t>(c.rows));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  for (double& v : table_values) v = unit(rng);
  for (int64_t t = 0; t < c.rows; ++t) {
    pos_values[static_cast<size_t>(t)] = t % 7 == 3   ? -1.0
                                         : t % 7 == 5 ? static_cast<double>(positions + t)
                                                      : static_cast<double>(rng() % positions);
  }
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t t = 0; t < c.tokens; ++t) {
    slot_values[static_cast<size_t>(t)] = t % 4 == 1 ? -1 : perm[static_cast<size_t>(t)];
  }
  struct Set {
    Buf *table, *pos, *q, *k, *kv_c, *slots, *cache;
  };
  auto make = [&](const std::string& tag) {
    Set b;
    b.table = &ctx.Make("table" + tag, kF32, {positions, c.dr});
    SetValues(ctx, *b.table, table_values);
    b.pos = &ctx.Make("positions" + tag, DType::kI32, {c.rows}, 0, 1, 1);
    SetValues(ctx, *b.pos, pos_values);
    b.q = &ctx.MakeStrided("q_pe" + tag, kF32, {c.rows, heads, c.dr},
                           {heads * (dn + c.dr), dn + c.dr, 1}, dn);
    b.k = &ctx.MakeStrided("k_pe" + tag, kF32, {c.rows, c.dr}, {width, 1}, c.rkv);
    b.kv_c = &ctx.Make("kv_c" + tag, c.input, {c.rows, c.rkv}, 3, 1);
    b.slots = &ctx.Make("slot_mapping" + tag, DType::kI64, {c.tokens}, 0, 1, 1);
    SetValues(ctx, *b.slots, Doubles(slot_values));
    b.cache = &ctx.Make("cache" + tag, c.cache, {c.num_blocks, c.block_size, width}, 0, 2, 3);
    return b;
  };
  Set fused = make(""), pair = make(" (two ops)");
  ctx.Randomize(*fused.q, -2.0, 2.0);
  ctx.Randomize(*fused.k, -2.0, 2.0);
  ctx.Randomize(*fused.kv_c, -4.0, 4.0);
  ctx.Randomize(*fused.cache, -8.0, 8.0);
  for (auto [from, to] : {std::pair{fused.q, pair.q},
                          {fused.k, pair.k},
                          {fused.kv_c, pair.kv_c},
                          {fused.cache, pair.cache}}) {
    to->host = from->host;
    ctx.Upload(*to);
  }

  Stream& stream = ctx.stream();
  Buf& norm_weight = ctx.Make("latent_norm.weight", c.input, {c.rkv});
  ctx.Randomize(norm_weight, 0.5, 1.5);
  const KvLatentNorm latent_norm{norm_weight.t, 1e-6f};
  Buf& normed = ctx.Make("normed (two ops)", kF32, {c.rows, c.rkv});
  ASSERT_OK(ApplyRope(stream, pair.pos->t, pair.table->t, pair.q->t, pair.k->t));
  if (norm) {
    ASSERT_OK(RmsNorm(stream, pair.kv_c->t, norm_weight.t, latent_norm.eps, normed.t));
  }
  ASSERT_OK(
      MlaKvUpdate(stream, norm ? normed.t : pair.kv_c->t, pair.k->t, pair.slots->t, pair.cache->t));
  ASSERT_OK(stream.Synchronize());
  ctx.RunOp({fused.q, fused.k, fused.cache},
            [&](Stream& s) {
              return MlaRopeKvUpdate(s, fused.pos->t, fused.table->t, fused.q->t, fused.kv_c->t,
                                     fused.k->t, fused.slots->t, fused.cache->t,
                                     norm ? &latent_norm : nullptr);
            },
            true, {fused.q, fused.k, fused.cache});
  EXPECT_TRUE(ctx.Download(*fused.kv_c) == fused.kv_c->host) << "kv_c written";
  for (auto [got, want] :
       {std::pair{fused.q, pair.q}, {fused.k, pair.k}, {fused.cache, pair.cache}}) {
    EXPECT_TRUE(ctx.Download(*got) == ctx.Download(*want))
        << got->name << ": differs from ApplyRope then MlaKvUpdate";
  }
  // The op did something: some rows rotated, some cache rows written.
  EXPECT_FALSE(ctx.Download(*fused.q) == fused.q->host) << "q_pe unchanged";
  EXPECT_FALSE(ctx.Download(*fused.cache) == fused.cache->host) << "cache unchanged";
}

// ---- Paged caches and queries ------------------------------------------------------------

struct Dims {
  int64_t heads, rkv, dr;
  int64_t width() const { return rkv + dr; }
};

// Sequences in a paged cache on the backend. Each page assignment (`tables`)
// gives every sequence its own pages, in random order, from a pool whose
// block 0 (the null block) no sequence uses; table entries past a sequence's
// pages point at block 0, and one spare column is left at it. Rows holding
// no token keep the poison (NaN).
struct Paged {
  int64_t block_size = 0, max_blocks = 0, num_blocks = 0, width = 0;
  Buf* cache = nullptr;
  Buf* block_table = nullptr;                // [B, max_blocks], rows padded
  Buf* seq_lens = nullptr;                   // [B]
  std::vector<std::vector<int32_t>> tables;  // per assignment, [B * max_blocks]
  std::vector<int32_t> lens;                 // what seq_lens holds
  std::vector<double> rows;  // the cache as stored [num_blocks * block_size * width]

  int64_t batch() const { return static_cast<int64_t>(lens.size()); }
  // Cache row of token s of sequence b under assignment `table`.
  int64_t Slot(int table, int64_t b, int64_t s) const {
    const int32_t block =
        tables[static_cast<size_t>(table)][static_cast<size_t>(b * max_blocks + s / block_size)];
    return static_cast<int64_t>(block) * block_size + s % block_size;
  }
};

// A cache of `dtype` for sequences of `lens` tokens (seq_lens holds them),
// with room for `capacity[b]` >= lens[b] tokens each (default: lens); token
// rows uniform in (-1, 1) unless `fill` is false (the cache stays poison).
// block_table holds assignment 0.
Paged MakePaged(Context& ctx, const Dims& d, DType dtype, int64_t block_size,
                const std::vector<int32_t>& lens, std::vector<int32_t> capacity = {},
                int num_tables = 1, bool fill = true) {
  if (capacity.empty()) capacity = lens;
  Paged p;
  p.block_size = block_size;
  p.width = d.width();
  p.lens = lens;
  const int64_t batch = static_cast<int64_t>(lens.size());
  int64_t used = 0;
  for (int32_t len : capacity) {
    const int64_t n = (len + block_size - 1) / block_size;
    used += n;
    p.max_blocks = std::max(p.max_blocks, n);
  }
  p.max_blocks += 1;
  p.num_blocks = num_tables * used + 1 + 3;  // the null block and three never used
  std::mt19937 rng(ctx.NextSeed());
  std::vector<int32_t> pool(static_cast<size_t>(p.num_blocks - 1));
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (int k = 0; k < num_tables; ++k) {
    std::vector<int32_t> table(static_cast<size_t>(batch * p.max_blocks), 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j * block_size < capacity[static_cast<size_t>(b)]; ++j) {
        table[static_cast<size_t>(b * p.max_blocks + j)] = pool[next++];
      }
    }
    p.tables.push_back(std::move(table));
  }
  // Contiguous at offset 0: the tensor-core kernels need 16-byte rows.
  p.cache = &ctx.Make("cache", dtype, {p.num_blocks, block_size, p.width}, 0, 0, 2);
  if (fill) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int k = 0; k < num_tables; ++k) {
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t s = 0; s < capacity[static_cast<size_t>(b)]; ++s) {
          const int64_t row = p.Slot(k, b, s) * p.width;
          for (int64_t i = 0; i < p.width; ++i)
            StoreElement(dtype, p.cache->host.data(), row + i, u(rng));
        }
      }
    }
    ctx.Upload(*p.cache);
  }
  p.rows = p.cache->Values();
  p.block_table = &ctx.Make("block_table", DType::kI32, {batch, p.max_blocks}, 1, 1);
  SetValues(ctx, *p.block_table, Doubles(p.tables[0]));
  p.seq_lens = &ctx.Make("seq_lens", DType::kI32, {batch}, 0, 1, 1);
  SetValues(ctx, *p.seq_lens, Doubles(lens));
  return p;
}

// Query rows: q_latent [n, H, rkv] and q_pe [n, H, dr], rows padded, with
// the softmax scale. Plain form: uniform in (-1, 1), so that scores
// scale * (q . k) have a standard deviation of about 2 (neither flat nor
// one-hot). Naive form (dn > 0): per head W_UK [dn, rkv] and q_nope [dn],
// and q_latent = W_UK^T q_nope computed in double and stored as f32, the
// weight absorption of arXiv:2405.04434 §2.1.2; the reference then scores
// the naive way, q_nope . (W_UK c) + q_pe . k_pe.
struct Queries {
  Buf* q_latent = nullptr;
  Buf* q_pe = nullptr;
  float scale = 0.0f;
  std::vector<double> values;  // [n, H, width]: q_latent then q_pe, as stored
  int64_t dn = 0;
  std::vector<double> w_uk;    // [H, dn, rkv]
  std::vector<double> q_nope;  // [n, H, dn]
};

Queries MakeQueries(Context& ctx, const Dims& d, int64_t n, int64_t dn = 0) {
  Queries q;
  const int64_t lat_row = d.rkv + 3, pe_row = d.dr + 1;
  q.q_latent = &ctx.MakeStrided("q_latent", kF32, {n, d.heads, d.rkv},
                                {d.heads * lat_row, lat_row, 1}, 1, 2);
  q.q_pe = &ctx.MakeStrided("q_pe", kF32, {n, d.heads, d.dr}, {d.heads * pe_row, pe_row, 1}, 2);
  ctx.Randomize(*q.q_latent);
  ctx.Randomize(*q.q_pe);
  q.scale = static_cast<float>(2.0 / std::sqrt(static_cast<double>(d.width()) / 9.0));
  if (dn > 0) {
    q.dn = dn;
    q.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dn + d.dr)));
    // q_latent_i = sum_k W_UK[k][i] q_nope[k] has variance dn a^2 / 9 and
    // q_latent . c variance rkv dn a^2 / 27: scores of standard deviation 2.
    const double a = 2.0 / (q.scale * std::sqrt(static_cast<double>(d.rkv * dn) / 27.0));
    std::mt19937 rng(ctx.NextSeed());
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int64_t i = 0; i < d.heads * dn * d.rkv; ++i) q.w_uk.push_back(a * u(rng));
    for (int64_t i = 0; i < n * d.heads * dn; ++i) q.q_nope.push_back(u(rng));
    std::vector<double> latent;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t i = 0; i < d.rkv; ++i) {
          double acc = 0.0;
          for (int64_t k = 0; k < dn; ++k) {
            acc += q.w_uk[static_cast<size_t>((h * dn + k) * d.rkv + i)] *
                   q.q_nope[static_cast<size_t>((r * d.heads + h) * dn + k)];
          }
          latent.push_back(acc);
        }
      }
    }
    SetValues(ctx, *q.q_latent, latent);
  }
  const std::vector<double> lat = q.q_latent->Values(), pe = q.q_pe->Values();
  for (int64_t rh = 0; rh < n * d.heads; ++rh) {
    q.values.insert(q.values.end(), lat.begin() + rh * d.rkv, lat.begin() + (rh + 1) * d.rkv);
    q.values.insert(q.values.end(), pe.begin() + rh * d.dr, pe.begin() + (rh + 1) * d.dr);
  }
  return q;
}

// ---- The reference ---------------------------------------------------------------------

// Query row r attends to the first `keys` tokens of sequence `seq` (keys 0:
// to nothing; then its output is zeros and its lse -inf).
struct RowKeys {
  int64_t seq, keys;
};

// The arithmetic a reference does: exact (in double), or the model of a
// tensor-core decode kernel: the cache as stored, q as bf16 hi plus, with
// the split q, lo = bf16(q - hi); exact score sums; probabilities
// exp(score - max) rounded to bf16 and normalised by the sum of the rounded
// values.
enum class Arithmetic { kExact, kTensorCoreSplitQ, kTensorCoreBf16Q };

struct Attention {
  std::vector<double> out;  // [n, H, rkv]
  std::vector<double> lse;  // [n, H]
};

// Softmax attention of every query row over its keys under cache
// assignment `table`: score(s) = scale * (q_latent . c_kv(s) + q_pe . k_pe(s))
// (the naive form's q_nope . (W_UK c_kv(s)) in place of the first term for
// naive queries), out = sum_s p_s c_kv(s) / sum_s p_s, lse = ln sum_s
// exp(score(s)). With naive queries, out_latent is still the right thing to
// compare: the naive output W_UV^h sum_s p_s c_kv(s) is linear in it.
Attention Reference(const Dims& d, const Paged& p, int table, const Queries& q,
                    const std::vector<RowKeys>& rows, Arithmetic arith = Arithmetic::kExact) {
  const int64_t w = d.width(), n = static_cast<int64_t>(rows.size());
  Attention a;
  a.out.assign(static_cast<size_t>(n * d.heads * d.rkv), 0.0);
  a.lse.assign(static_cast<size_t>(n * d.heads), -kInf);
  const bool naive = q.dn > 0 && arith == Arithmetic::kExact;
  std::vector<double> qv(static_cast<size_t>(w)), scores, acc(static_cast<size_t>(d.rkv));
  std::vector<double> k_nope(static_cast<size_t>(q.dn));
  std::vector<int64_t> slots;
  for (int64_t r = 0; r < n; ++r) {
    const RowKeys& rk = rows[static_cast<size_t>(r)];
    if (rk.keys == 0) continue;
    slots.clear();
    for (int64_t s = 0; s < rk.keys; ++s) slots.push_back(p.Slot(table, rk.seq, s));
    for (int64_t h = 0; h < d.heads; ++h) {
      const size_t rh = static_cast<size_t>(r * d.heads + h);
      for (int64_t i = 0; i < w; ++i) {
        const double x = q.values[rh * static_cast<size_t>(w) + static_cast<size_t>(i)];
        const double hi = RoundTo(kBF16, x);
        qv[static_cast<size_t>(i)] = arith == Arithmetic::kExact ? x
                                     : arith == Arithmetic::kTensorCoreBf16Q
                                         ? hi
                                         : hi + RoundTo(kBF16, x - hi);
      }
      scores.assign(slots.size(), 0.0);
      double max = -kInf;
      for (size_t s = 0; s < slots.size(); ++s) {
        const double* row = &p.rows[static_cast<size_t>(slots[s] * w)];
        double dot = 0.0;
        if (naive) {
          for (int64_t k = 0; k < q.dn; ++k) {
            const double* wk = &q.w_uk[static_cast<size_t>((h * q.dn + k) * d.rkv)];
            double kn = 0.0;
            for (int64_t i = 0; i < d.rkv; ++i) kn += wk[i] * row[i];
            dot += q.q_nope[rh * static_cast<size_t>(q.dn) + static_cast<size_t>(k)] * kn;
          }
          for (int64_t i = d.rkv; i < w; ++i) dot += qv[static_cast<size_t>(i)] * row[i];
        } else {
          for (int64_t i = 0; i < w; ++i) dot += qv[static_cast<size_t>(i)] * row[i];
        }
        scores[s] = static_cast<double>(q.scale) * dot;
        max = std::max(max, scores[s]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (size_t s = 0; s < slots.size(); ++s) {
        double e = std::exp(scores[s] - max);
        if (arith != Arithmetic::kExact) e = RoundTo(kBF16, e);
        sum += e;
        const double* row = &p.rows[static_cast<size_t>(slots[s] * w)];
        for (int64_t i = 0; i < d.rkv; ++i) acc[static_cast<size_t>(i)] += e * row[i];
      }
      for (int64_t i = 0; i < d.rkv; ++i) {
        a.out[rh * static_cast<size_t>(d.rkv) + static_cast<size_t>(i)] =
            acc[static_cast<size_t>(i)] / sum;
      }
      a.lse[rh] = max + std::log(sum);
    }
  }
  return a;
}

// The harness's f32 measure (Tolerance::f32): max |got - want| / max |want|
// over finite want; an infinity must match exactly (else +inf).
double NormwiseError(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return kInf;
      continue;
    }
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / std::max(ref, 1e-30);
}

// out_latent and lse against `want` within `tol`; rows with no keys exact
// zeros (their lse -inf is matched exactly by ExpectClose).
void ExpectAttention(Context& ctx, const Buf& out, const Buf& lse, const Attention& want,
                     const std::vector<RowKeys>& rows, double tol) {
  ctx.ExpectClose(out, want.out, Tolerance::F32(tol));
  ctx.ExpectClose(lse, want.lse, Tolerance::F32(tol));
  const std::vector<double> got = ctx.DeviceValues(out);
  const size_t row = got.size() / std::max<size_t>(rows.size(), 1);
  int64_t nonzero = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].keys != 0) continue;
    for (size_t i = 0; i < row; ++i) nonzero += got[r * row + i] != 0.0;
  }
  EXPECT_EQ(nonzero, 0) << "out_latent elements of rows with no keys that are not exact zeros";
}

// ---- Decode ------------------------------------------------------------------------------

bool IsTensorCore(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kTensorCore || k == MlaDecodeKernel::kTensorCoreBf16Q;
}

// What the tensor-core kernels take (kernels/mla_decode_kernel.h); an
// explicit choice on anything else is InvalidArgument.
bool TensorCoreShapes(const Dims& d, DType cache) {
  return cache == kBF16 && d.width() % 16 == 0 && d.rkv % 8 == 0;
}

int CudaComputeMajor() {
  int major = 0;
#if MLAG_HAVE_CUDA
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return 0;
  }
#endif
  return major;
}

// Whether `kernel` runs on the tensor cores on the CUDA backend: an explicit
// choice, or kAuto on a bf16 cache of supported widths (compute capability
// >= 8.0: the emulated device and the H100/H200 are 9.0).
bool RunsOnTensorCores(MlaDecodeKernel kernel, DType cache, const Dims& d) {
  if (IsTensorCore(kernel)) return true;
  return kernel == MlaDecodeKernel::kAuto && TensorCoreShapes(d, cache) && CudaComputeMajor() >= 8;
}

// The tolerance of a decode on `ctx`'s backend (see the top of the file).
double DecodeTolerance(Context& ctx, const Dims& d, const Paged& p, int table, const Queries& q,
                       const std::vector<RowKeys>& rows, const Attention& want,
                       MlaDecodeKernel kernel, double f32_tol) {
  if (!ctx.is_cuda() || !RunsOnTensorCores(kernel, p.cache->dtype, d)) return f32_tol;
  const bool split_q = kernel != MlaDecodeKernel::kTensorCoreBf16Q;
  const Attention model = Reference(
      d, p, table, q, rows, split_q ? Arithmetic::kTensorCoreSplitQ : Arithmetic::kTensorCoreBf16Q);
  const double model_err =
      std::max(NormwiseError(model.out, want.out), NormwiseError(model.lse, want.lse));
  EXPECT_LT(model_err, split_q ? 4e-3 : 2e-2) << "precision of the tensor-core arithmetic itself";
  return 4.0 * model_err + f32_tol;
}

// The CUDA planner's shortest split (kMinSplitTokens in
// kernels/cuda/mla_attention.cu). The planner picks max(this, total tokens /
// extra items), and the default workspace lets a launch take about
// 2 * SMs / head_groups extra items (264 / head_groups on the 132 SMs of an
// H100/H200 or the emulated device). The batches here hold at most 4401
// tokens, so on any such device the split length is this minimum and every
// longer sequence is split.
constexpr int32_t kCudaMinSplitTokens = 128;

// The plan the device planner left in `ws` (layout in
// kernels/cuda/mla_attention.cuh: int32 plan[num_seqs + 2] = the first item
// of each sequence, the item count, the split length) must split every
// sequence longer than the minimum split into ceil(len / split) items.
void ExpectSplitPlan(Context& ctx, const MlaDecodeWorkspace& ws, const std::vector<int32_t>& lens) {
  const size_t n = lens.size();
  std::vector<int32_t> plan(n + 2);
  ASSERT_GE(ws.bytes(), plan.size() * sizeof(int32_t));
  ASSERT_OK(ctx.stream().Synchronize());
  ASSERT_OK(
      ctx.backend().device().CopyToHost(plan.data(), ws.data(), plan.size() * sizeof(int32_t)));
  const int32_t split = plan[n + 1];
  EXPECT_EQ(split, kCudaMinSplitTokens) << "split length";
  int32_t items = 0, split_seqs = 0;
  for (size_t b = 0; b < n; ++b) {
    EXPECT_EQ(plan[b], items) << "first item of sequence " << b;
    const int32_t len = lens[b];
    items += len <= split ? 1 : (len - 1) / split + 1;
    split_seqs += len > split;
  }
  EXPECT_EQ(plan[n], items) << "item count";
  EXPECT_GE(plan[n], static_cast<int32_t>(n) + split_seqs) << "long sequences must be split";
}

// Decodes sequences `p.lens` (row b: sequence b over all its tokens) with
// `kernel`, on CUDA with and without a workspace, and checks the outputs.
// An explicit tensor-core kernel on shapes or a cache it does not take must
// be refused with InvalidArgument, writing nothing.
void CheckDecode(Context& ctx, const Dims& d, const Paged& p, const Queries& q,
                 MlaDecodeKernel kernel, double f32_tol, int64_t out_offset) {
  const int64_t batch = p.batch();
  std::vector<RowKeys> rows;
  for (int64_t b = 0; b < batch; ++b) rows.push_back({b, p.lens[static_cast<size_t>(b)]});
  const Attention want = Reference(d, p, 0, q, rows);
  const bool refused =
      ctx.is_cuda() && IsTensorCore(kernel) && !TensorCoreShapes(d, p.cache->dtype);
  const double tol = refused ? 0.0 : DecodeTolerance(ctx, d, p, 0, q, rows, want, kernel, f32_tol);
  // Made before any capture (RunOp captures), sized for this batch.
  ASSERT_OK_AND_ASSIGN(MlaDecodeWorkspace ws,
                       MlaDecodeWorkspace::Create(ctx.backend().device(), batch, d.heads, d.rkv));
  if (ctx.is_cuda()) {
    EXPECT_GT(ws.bytes(), 0u);
  }
  for (bool with_ws : {true, false}) {
    if (!ctx.is_cuda() && !with_ws) continue;  // the host ignores the workspace
    SCOPED_TRACE(with_ws ? "with a workspace" : "without a workspace");
    Buf& out = ctx.Output("out_latent", kF32, {batch, d.heads, d.rkv}, 0, out_offset, 2);
    Buf& lse = ctx.Output("lse", kF32, {batch, d.heads}, 0, 1 - out_offset, 1);
    auto op = [&](Stream& s) {
      return MlaDecode(s, q.q_latent->t, q.q_pe->t, p.cache->t, p.block_table->t, p.seq_lens->t,
                       q.scale, out.t, lse.t, with_ws ? &ws : nullptr, kernel);
    };
    if (refused) {
      EXPECT_EQ(op(ctx.stream()).code(), absl::StatusCode::kInvalidArgument);
      ExpectUnwritten(ctx, out);
      ExpectUnwritten(ctx, lse);
      continue;
    }
    ctx.RunOp({&out, &lse}, op);
    ExpectAttention(ctx, out, lse, want, rows, tol);
    if (ctx.is_cuda() && with_ws) ExpectSplitPlan(ctx, ws, p.lens);
  }
}

struct DecodeShape {
  std::string name;
  Dims d;
  std::vector<int32_t> lens;
  double tol;
  bool splits_on_host;  // a sequence the host's public entry point splits
};

struct DecodeConfig {
  DType cache;
  int64_t block_size;
  MlaDecodeKernel kernel;
};

std::string Name(const DecodeConfig& c) {
  return absl::StrCat(Str(c.cache), " cache block ", c.block_size, " ",
                      MlaDecodeKernelName(c.kernel));
}

void DecodeCase(Context& ctx, const DecodeShape& shape, const DecodeConfig& c, int64_t out_offset) {
  if (shape.splits_on_host && !ctx.is_cuda()) {
    const int32_t longest = *std::max_element(shape.lens.begin(), shape.lens.end());
    ASSERT_LT(host::kAttentionSplitTokens, longest) << "the host must split the longest sequence";
  }
  const Paged p = MakePaged(ctx, shape.d, c.cache, c.block_size, shape.lens);
  const Queries q = MakeQueries(ctx, shape.d, p.batch());
  CheckDecode(ctx, shape.d, p, q, c.kernel, shape.tol, out_offset);
}

// The naive form: queries from q_nope and W_UK, scored as multi-head
// attention with explicit keys W_UK c.
void NaiveDecodeCase(Context& ctx, const Dims& d, int64_t dn, const std::vector<int32_t>& lens,
                     int64_t block_size) {
  const Paged p = MakePaged(ctx, d, kF32, block_size, lens);
  const Queries q = MakeQueries(ctx, d, p.batch(), dn);
  CheckDecode(ctx, d, p, q, MlaDecodeKernel::kF32, kTol, 1);
}

// A bf16 cache written by MlaKvUpdate on the backend, then decoded: decode
// reads exactly what kv_update stored (the inputs rounded to bf16).
void DecodeAfterKvUpdateCase(Context& ctx, int64_t block_size) {
  const Dims d{3, 40, 8};
  const std::vector<int32_t> lens = {0, 1, 17, 64, 300};
  Paged p = MakePaged(ctx, d, kBF16, block_size, lens, {}, 1, /*fill=*/false);
  int64_t total = 0;
  for (int32_t len : lens) total += len;
  Buf& kv_c = ctx.Make("kv_c", kF32, {total + 2, d.rkv}, 3);
  Buf& k_pe = ctx.Make("k_pe", kF32, {total + 2, d.dr}, 1);
  ctx.Randomize(kv_c);
  ctx.Randomize(k_pe);
  std::vector<double> slots;
  for (int64_t b = 0; b < p.batch(); ++b) {
    for (int64_t s = 0; s < lens[static_cast<size_t>(b)]; ++s) {
      slots.push_back(static_cast<double>(p.Slot(0, b, s)));
    }
  }
  slots.push_back(-1);  // a padding row
  Buf& slot_mapping = ctx.Make("slot_mapping", DType::kI64, {total + 1});
  SetValues(ctx, slot_mapping, slots);
  ctx.RunOp({p.cache},
            [&](Stream& s) { return MlaKvUpdate(s, kv_c.t, k_pe.t, slot_mapping.t, p.cache->t); },
            true, {p.cache});
  const std::vector<double> kv = kv_c.Values(), pe = k_pe.Values();
  for (int64_t t = 0; t < total; ++t) {
    const int64_t row = static_cast<int64_t>(slots[static_cast<size_t>(t)]) * d.width();
    for (int64_t i = 0; i < d.width(); ++i) {
      p.rows[static_cast<size_t>(row + i)] =
          RoundTo(kBF16, i < d.rkv ? kv[static_cast<size_t>(t * d.rkv + i)]
                                   : pe[static_cast<size_t>(t * d.dr + i - d.rkv)]);
    }
  }
  ctx.ExpectClose(*p.cache, p.rows, Tolerance::Exact());  // token rows; the rest still NaN
  const Queries q = MakeQueries(ctx, d, p.batch());
  CheckDecode(ctx, d, p, q, MlaDecodeKernel::kAuto, kTol, 0);
}

// One graph captured once and replayed after new seq_lens and a new block
// table are written into the same buffers: every data-dependent decision
// (on CUDA, the split plan) is taken when the graph runs, so each replay
// must match the reference on the new contents, and an eager run on them
// byte for byte.
void CapturedDecodeCase(Context& ctx, DType cache_dtype, MlaDecodeKernel kernel) {
  const Dims d{20, 64, 16};  // two head groups on CUDA
  const std::vector<int32_t> first = {5, 0, 300, 64, 1, 700};
  const std::vector<int32_t> second = {700, 33, 0, 200, 0, 1};
  std::vector<int32_t> capacity(first.size());
  for (size_t b = 0; b < first.size(); ++b) capacity[b] = std::max(first[b], second[b]);
  Paged p = MakePaged(ctx, d, cache_dtype, 64, first, capacity, /*num_tables=*/2);
  const Queries q = MakeQueries(ctx, d, p.batch());
  ASSERT_OK_AND_ASSIGN(
      MlaDecodeWorkspace ws,
      MlaDecodeWorkspace::Create(ctx.backend().device(), p.batch(), d.heads, d.rkv));
  Buf& out = ctx.Output("out_latent", kF32, {p.batch(), d.heads, d.rkv}, 0, 1, 1);
  Buf& lse = ctx.Output("lse", kF32, {p.batch(), d.heads}, 0, 1, 1);
  auto op = [&](Stream& s) {
    return MlaDecode(s, q.q_latent->t, q.q_pe->t, p.cache->t, p.block_table->t, p.seq_lens->t,
                     q.scale, out.t, lse.t, &ws, kernel);
  };
  ASSERT_OK(ctx.stream().BeginCapture());
  const absl::Status recorded = op(ctx.stream());
  absl::StatusOr<std::unique_ptr<Graph>> graph = ctx.stream().EndCapture();
  ASSERT_OK(recorded);
  ASSERT_OK(graph);
  struct Step {
    const std::vector<int32_t>* lens;
    int table;
  };
  for (const Step& step : {Step{&first, 0}, Step{&second, 1}, Step{&first, 0}}) {
    SCOPED_TRACE(
        absl::StrCat(step.lens == &first ? "first" : "second", " seq_lens, table ", step.table));
    p.lens = *step.lens;
    SetValues(ctx, *p.seq_lens, Doubles(p.lens));
    SetValues(ctx, *p.block_table, Doubles(p.tables[static_cast<size_t>(step.table)]));
    ctx.Poison(out);
    ctx.Poison(lse);
    ASSERT_OK(ctx.stream().Synchronize());
    ASSERT_OK((*graph)->Replay(ctx.stream()));
    ASSERT_OK(ctx.stream().Synchronize());
    std::vector<RowKeys> rows;
    for (int64_t b = 0; b < p.batch(); ++b) rows.push_back({b, p.lens[static_cast<size_t>(b)]});
    const Attention want = Reference(d, p, step.table, q, rows);
    const double tol = DecodeTolerance(ctx, d, p, step.table, q, rows, want, kernel, kTol);
    ExpectAttention(ctx, out, lse, want, rows, tol);
    const std::vector<uint8_t> replay_out = ctx.Download(out), replay_lse = ctx.Download(lse);
    if (ctx.is_cuda()) ExpectSplitPlan(ctx, ws, p.lens);
    ctx.Poison(out);
    ctx.Poison(lse);
    ASSERT_OK(op(ctx.stream()));
    ASSERT_OK(ctx.stream().Synchronize());
    EXPECT_TRUE(ctx.Download(out) == replay_out) << "out_latent: eager differs from the replay";
    EXPECT_TRUE(ctx.Download(lse) == replay_lse) << "lse: eager differs from the replay";
  }
}

// ---- Prefill -----------------------------------------------------------------------------

struct PrefillShape {
  std::string name;
  Dims d;
  std::vector<int32_t> cached, fresh;  // per sequence: tokens before, new tokens (query rows)
  int64_t lead, tail;                  // query rows before the first and after the last sequence
  int64_t dn;                          // > 0: naive queries
};

// Sequence b has cached[b] tokens before its fresh[b] query rows; its row i
// sits at position cached[b] + i and attends causally to [0, cached[b] + i].
// The lead and tail rows belong to no sequence: zeros and lse -inf.
void PrefillCase(Context& ctx, const PrefillShape& c, DType cache_dtype, int64_t block_size) {
  const int64_t batch = static_cast<int64_t>(c.cached.size());
  std::vector<int32_t> lens(c.cached.size());
  for (size_t b = 0; b < lens.size(); ++b) lens[b] = c.cached[b] + c.fresh[b];
  const Paged p = MakePaged(ctx, c.d, cache_dtype, block_size, lens);
  std::vector<double> starts;
  std::vector<RowKeys> rows(static_cast<size_t>(c.lead), RowKeys{0, 0});
  for (int64_t b = 0; b < batch; ++b) {
    starts.push_back(static_cast<double>(rows.size()));
    for (int32_t i = 0; i < c.fresh[static_cast<size_t>(b)]; ++i) {
      rows.push_back({b, c.cached[static_cast<size_t>(b)] + i + 1});
    }
  }
  starts.push_back(static_cast<double>(rows.size()));
  for (int64_t i = 0; i < c.tail; ++i) rows.push_back({0, 0});
  const int64_t n = static_cast<int64_t>(rows.size());
  Buf& query_start_loc = ctx.Make("query_start_loc", DType::kI32, {batch + 1}, 0, 1, 1);
  SetValues(ctx, query_start_loc, starts);
  const Queries q = MakeQueries(ctx, c.d, n, c.dn);
  Buf& out = ctx.Output("out_latent", kF32, {n, c.d.heads, c.d.rkv}, 0, 1, 2);
  Buf& lse = ctx.Output("lse", kF32, {n, c.d.heads}, 0, 0, 1);
  ctx.RunOp({&out, &lse}, [&](Stream& s) {
    return MlaPrefill(s, q.q_latent->t, q.q_pe->t, p.cache->t, p.block_table->t, p.seq_lens->t,
                      query_start_loc.t, q.scale, out.t, lse.t);
  });
  ExpectAttention(ctx, out, lse, Reference(c.d, p, 0, q, rows), rows, kTol);
}

}  // namespace

void AddMlaCases(CaseList& cases) {
  // KV update: odd widths with tiny blocks, tiny-v3's, DeepSeek's; every
  // input and cache dtype pair.
  const KvCase kv_shapes[] = {{kF32, kF32, 37, 6, 5, 7, 14, 11},
                              {kF32, kF32, 40, 8, 16, 5, 30, 25},
                              {kF32, kF32, 512, 64, 16, 9, 40, 33}};
  for (KvCase c : kv_shapes) {
    for (auto [in, cache] : {std::pair{kF32, kF32}, {kF32, kBF16}, {kBF16, kBF16}, {kBF16, kF32}}) {
      c.input = in;
      c.cache = cache;
      cases.Add("mla_kv_update", Name(c), [c](Context& ctx) { KvUpdateCase(ctx, c, false); });
    }
  }
  for (DType cache : {kF32, kBF16}) {
    const KvCase c{kF32, cache, 37, 6, 5, 7, 14, 11};
    cases.Add("mla_kv_update", "all slots -1 " + Name(c),
              [c](Context& ctx) { KvUpdateCase(ctx, c, true); });
  }
  // Rope fused into the cache write: kv_c f32 or bf16, either cache dtype.
  for (auto [in, cache] : {std::pair{kF32, kF32}, {kF32, kBF16}, {kBF16, kBF16}}) {
    for (const KvCase& shape :
         {KvCase{kF32, kF32, 37, 6, 5, 7, 14, 11}, KvCase{kF32, kF32, 512, 64, 16, 9, 40, 33}}) {
      KvCase c = shape;
      c.input = in;
      c.cache = cache;
      for (int64_t heads : {1, 3, 16}) {
        for (bool norm : {false, true}) {
          cases.Add("mla_rope_kv_update",
                    absl::StrCat(Name(c), " ", heads, " heads", norm ? " latent norm" : ""),
                    [c, heads, norm](Context& ctx) { RopeKvUpdateCase(ctx, c, heads, norm); });
        }
      }
    }
  }

  // Decode: every kernel choice on each cache dtype and block size.
  using K = MlaDecodeKernel;
  const DecodeConfig configs[] = {
      {kF32, 16, K::kF32},
      {kF32, 64, K::kF32},
      {kBF16, 16, K::kF32},
      {kBF16, 64, K::kF32},
      {kF32, 16, K::kAuto},
      {kBF16, 64, K::kAuto},
      {kBF16, 16, K::kTensorCore},
      {kBF16, 64, K::kTensorCore},
      {kBF16, 16, K::kTensorCoreBf16Q},
      {kBF16, 64, K::kTensorCoreBf16Q},
      {kF32, 64, K::kTensorCore},  // refused on CUDA: the tensor cores need a bf16 cache
  };
  const DecodeShape shapes[] = {
      // Width 48: lengths around the block and tile sizes, one empty; one
      // head group.
      {"h3 40+8", {3, 40, 8}, {1, 2, 15, 0, 16, 17, 63, 64, 65, 129, 255, 256, 300}, kTol, false},
      // Width 43, not a multiple of 16 bytes (the f32 kernel's element-wise
      // tile loads; the tensor-core kernels refuse it and kAuto takes f32),
      // and two head groups, the second partial.
      {"h20 37+6", {20, 37, 6}, {0, 3, 200, 70, 300}, kTol, false},
      // Width 80 (tiny-v3's attention), two head groups.
      {"h20 64+16", {20, 64, 16}, {0, 3, 200, 70, 300, 33}, kTol, false},
      // DeepSeek V2/V3's 512 + 64, few heads and tokens (one split sequence).
      {"h4 512+64", {4, 512, 64}, {1, 37, 0, 150}, kTol, false},
      // A 4096-token sequence next to short ones: split on every backend.
      {"h3 40+8 long", {3, 40, 8}, {4096, 0, 5, 300}, kTolLong, true},
  };
  int i = 0;
  for (const DecodeShape& shape : shapes) {
    for (const DecodeConfig& c : configs) {
      const int64_t out_offset = i++ % 2;
      cases.Add("mla_decode", shape.name + " " + Name(c),
                [shape, c, out_offset](Context& ctx) { DecodeCase(ctx, shape, c, out_offset); });
    }
  }
  // DeepSeek's 16 heads at its widths: one full head group (every query
  // vector of a thread block used), on each decode kernel.
  const DecodeShape deepseek{"h16 512+64", {16, 512, 64}, {1, 37, 0, 150}, kTol, false};
  for (const DecodeConfig& c : {DecodeConfig{kF32, 16, K::kF32}, DecodeConfig{kBF16, 64, K::kAuto},
                                DecodeConfig{kBF16, 16, K::kTensorCoreBf16Q}}) {
    const int64_t out_offset = i++ % 2;
    cases.Add("mla_decode", deepseek.name + " " + Name(c), [deepseek, c, out_offset](Context& ctx) {
      DecodeCase(ctx, deepseek, c, out_offset);
    });
  }
  for (int64_t block_size : {16, 64}) {
    cases.Add(
        "mla_decode", absl::StrCat("naive MHA h3 40+8 dn 12 block ", block_size),
        [block_size](Context& ctx) {
          NaiveDecodeCase(ctx, {3, 40, 8}, 12, {1, 2, 15, 0, 16, 17, 64, 65, 129, 300}, block_size);
        });
    cases.Add("mla_decode", absl::StrCat("after kv_update bf16 block ", block_size),
              [block_size](Context& ctx) { DecodeAfterKvUpdateCase(ctx, block_size); });
  }
  cases.Add("mla_decode", "naive MHA h4 512+64 dn 32 block 64", [](Context& ctx) {
    NaiveDecodeCase(ctx, {4, 512, 64}, 32, {1, 37, 160}, 64);
  });
  cases.Add("mla_decode", "graph replay new seq_lens bf16 auto",
            [](Context& ctx) { CapturedDecodeCase(ctx, kBF16, MlaDecodeKernel::kAuto); });
  cases.Add("mla_decode", "graph replay new seq_lens f32 f32",
            [](Context& ctx) { CapturedDecodeCase(ctx, kF32, MlaDecodeKernel::kF32); });

  // Prefill: chunked (cached prefixes), an empty chunk, padding rows.
  const PrefillShape prefills[] = {
      {"h3 40+8", {3, 40, 8}, {0, 5, 70}, {1, 7, 20}, 0, 3, 0},
      {"h20 37+6 leading padding", {20, 37, 6}, {9, 0, 30, 4}, {5, 0, 4, 1}, 2, 1, 0},
      {"h4 512+64", {4, 512, 64}, {40, 0, 64}, {9, 4, 1}, 1, 1, 0},
      {"naive MHA h3 40+8 dn 12", {3, 40, 8}, {0, 5, 70}, {1, 7, 20}, 0, 3, 12},
  };
  for (const PrefillShape& shape : prefills) {
    for (auto [cache, block_size] :
         {std::pair<DType, int64_t>{kF32, 16}, {kBF16, 64}, {kBF16, 16}, {kF32, 64}}) {
      cases.Add("mla_prefill", absl::StrCat(shape.name, " ", Str(cache), " block ", block_size),
                [shape, cache = cache, block_size = block_size](Context& ctx) {
                  PrefillCase(ctx, shape, cache, block_size);
                });
    }
  }
  // DeepSeek's 16 heads at its widths (a full head group), on an f32 cache
  // in 16-token blocks and a bf16 one in 64-token blocks.
  const PrefillShape deepseek_prefill{
      "h16 512+64", {16, 512, 64}, {150, 0, 64}, {17, 6, 1}, 0, 2, 0};
  for (auto [cache, block_size] : {std::pair<DType, int64_t>{kF32, 16}, {kBF16, 64}}) {
    cases.Add("mla_prefill",
              absl::StrCat(deepseek_prefill.name, " ", Str(cache), " block ", block_size),
              [deepseek_prefill, cache = cache, block_size = block_size](Context& ctx) {
                PrefillCase(ctx, deepseek_prefill, cache, block_size);
              });
  }
}

}  // namespace mlag::ops_test
