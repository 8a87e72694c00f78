// Token-sampling math shared by the host and CUDA samplers
// (kernels/sampling.h). Standard library only (see runtime/core/host_device.h).
//
// The two backends must draw the same token from the same logits, seed and
// step, and a CUDA block cannot add doubles in the host's order. So sampling
// is defined here on integers, and every floating-point step is a fixed
// sequence of correctly rounded IEEE operations (explicit fma, no operation
// the compiler could contract), which the host and the GPU evaluate alike:
//
//   rank        tokens are ranked by logit, higher first, lower id first among
//               equal logits (NaN below -inf). Equal logits are equal
//               probabilities, so this is "descending probability, lower id
//               first on ties" without rounding getting a say. A token's place
//               is one 64-bit SampleRankKey (larger = earlier), unique per id.
//   mass        token v weighs q_v = floor(2^shift * SampleExp((l_v - l_max) /
//               T)), an integer; shift = SampleMassShift(V) keeps the sum of
//               all V masses below 2^62, so integer sums are exact and do not
//               depend on the order of addition. The top token weighs 2^shift
//               (>= 2^31); tokens below 2^-shift of it weigh 0 and are never
//               drawn (for V = 129280 that is a probability below 3e-14).
//   top-k       the first k tokens by rank (k <= 0 or k >= V: all).
//   top-p       of those, the shortest prefix whose mass reaches
//               SampleTopPTarget(kept mass, top_p) (the first token always).
//   draw        the first kept token at which the running mass reaches
//               SampleDrawTarget(UniformFromCounter(seed, step), kept mass):
//               an inverse-CDF draw over the kept tokens in rank order.
//   greedy      temperature <= 0 (or NaN), or no finite maximum logit: the
//               top-ranked token (all-NaN row: token 0).
//
// The host sorts rank keys; the CUDA kernel finds the same cut points with
// radix descents over the order keys (SampleDigit, SamplePrefixMatches,
// SampleGroupSteps below), so it needs no scratch memory.
#pragma once

#include <math.h>
#include <stdint.h>

#include <cstring>

#include "runtime/core/host_device.h"
#include "runtime/core/scalar_types.h"

namespace mlag {

// ---- Arithmetic the compiler may not rearrange -------------------------------
// nvcc contracts a * b + c into an fma unless told otherwise; the _rn
// intrinsics are never contracted. The host build targets baseline x86-64
// (no FMA), where g++ cannot contract either; the sampling math below uses no
// a * b + c expression anyway, only explicit fma.
MLAG_HD double SampleMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

MLAG_HD double SampleSub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

MLAG_HD double SampleDiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// uint64 -> double, round to nearest (values below 2^63 on the host, where
// g++ uses a signed conversion).
MLAG_HD double SampleU64ToDouble(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __ull2double_rn(v);
#else
  return static_cast<double>(v);
#endif
}

// 2^e as a double, exact for -1022 <= e <= 1023.
MLAG_HD double SamplePow2(int e) {
  const uint64_t bits = static_cast<uint64_t>(1023 + e) << 52;
  double d;
  memcpy(&d, &bits, sizeof(d));
  return d;
}

// ---- Rank --------------------------------------------------------------------

// A key whose unsigned order is the order of logits: NaN -> 0 (below every
// number), -0 -> +0 (equal logits, equal keys); every other float maps to a
// distinct key, so equal keys mean equal logits.
MLAG_HD uint32_t SampleOrderKey(float logit) {
  uint32_t u = F32Bits(logit);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0u;  // NaN
  if (magnitude == 0) u = 0;               // -0 and +0 are the same logit
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The logit of a key from SampleOrderKey (key 0 gives a NaN).
MLAG_HD float SampleLogitFromKey(uint32_t key) {
  return F32FromBits((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The place of token `id` with order key `order_key`: larger ranks earlier.
// Unique per id; the high half is the order key, the low half ~id.
MLAG_HD uint64_t SampleRankKey(uint32_t order_key, uint32_t id) {
  return (static_cast<uint64_t>(order_key) << 32) | static_cast<uint64_t>(0xffffffffu - id);
}

MLAG_HD uint32_t SampleIdFromRankKey(uint64_t rank_key) {
  return 0xffffffffu - static_cast<uint32_t>(rank_key & 0xffffffffu);
}

MLAG_HD uint32_t SampleOrderKeyFromRankKey(uint64_t rank_key) {
  return static_cast<uint32_t>(rank_key >> 32);
}

// ---- Mass ----------------------------------------------------------------------

// Mass shift for a vocabulary of `vocab` >= 1 tokens: 62 - bit_length(vocab),
// so vocab * 2^shift < 2^62. In [31, 61] for vocab < 2^31.
MLAG_HD int SampleMassShift(int64_t vocab) {
  int bits = 0;
  for (uint64_t v = static_cast<uint64_t>(vocab); v != 0; v >>= 1) ++bits;
  return 62 - bits;
}

// Below this argument SampleExp returns 0: e^-45 * 2^61 < 1, so no mass
// shift can give such a token a nonzero mass.
constexpr double kSampleExpCutoff = -45.0;

// e^x for x <= 0, as the same fixed sequence of IEEE operations on host and
// device: x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by its degree-13
// Taylor polynomial in Horner form with explicit fma (truncation error below
// 5e-18), times 2^k. About 1 ulp from the true value; exactly 1 at 0; 0 for
// x < kSampleExpCutoff and for NaN.
MLAG_HD double SampleExp(double x) {
  if (!(x >= kSampleExpCutoff)) return 0.0;
  if (x > 0.0) x = 0.0;  // callers pass x <= 0; keep 2^k in range regardless
  const double kLog2e = 0x1.71547652b82fep+0;
  const double kLn2Hi = 0x1.62e42fee00000p-1;  // 32 significant bits: k * kLn2Hi is exact
  const double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double k = rint(SampleMul(x, kLog2e));  // in [-65, 0]
  double r = fma(-k, kLn2Hi, x);
  r = fma(-k, kLn2Lo, r);
  double p = 0x1.6124613a86d09p-33;      // 1/13!
  p = fma(p, r, 0x1.1eed8eff8d898p-29);  // 1/12!
  p = fma(p, r, 0x1.ae64567f544e4p-26);  // 1/11!
  p = fma(p, r, 0x1.27e4fb7789f5cp-22);  // 1/10!
  p = fma(p, r, 0x1.71de3a556c734p-19);  // 1/9!
  p = fma(p, r, 0x1.a01a01a01a01ap-16);  // 1/8!
  p = fma(p, r, 0x1.a01a01a01a01ap-13);  // 1/7!
  p = fma(p, r, 0x1.6c16c16c16c17p-10);  // 1/6!
  p = fma(p, r, 0x1.1111111111111p-7);   // 1/5!
  p = fma(p, r, 0x1.5555555555555p-5);   // 1/4!
  p = fma(p, r, 0x1.5555555555555p-3);   // 1/3!
  p = fma(p, r, 0x1.0000000000000p-1);   // 1/2!
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  return SampleMul(p, SamplePow2(static_cast<int>(k)));
}

// 1 / temperature in double (temperature > 0; +inf gives 0).
MLAG_HD double SampleInvTemperature(float temperature) {
  return SampleDiv(1.0, static_cast<double>(temperature));
}

// The integer mass of a token with logit `logit` when the row's largest
// logit is `max_logit` (finite): 2^shift for a token at the maximum,
// floor(2^shift * SampleExp((logit - max_logit) * inv_temperature)) else,
// 0 for NaN and -inf. Tokens with equal logits get equal masses.
MLAG_HD uint64_t SampleTokenMass(float logit, float max_logit, double inv_temperature, int shift) {
  if (!(logit > -INFINITY)) return 0;                                // NaN, -inf
  if (logit == max_logit) return static_cast<uint64_t>(1) << shift;  // also when 1/T is inf
  const double x = SampleMul(SampleSub(static_cast<double>(logit), static_cast<double>(max_logit)),
                             inv_temperature);
  const double w = SampleMul(SampleExp(x), SamplePow2(shift));  // exact scaling
  return static_cast<uint64_t>(w);                              // truncation, w < 2^shift
}

// ---- Cut points ----------------------------------------------------------------

// Top-p's target within a kept mass `kept_mass` >= 1: the smallest integer at
// or above top_p * kept_mass (both rounded to double once, then multiplied),
// clamped to [1, kept_mass]. The kept prefix is the shortest whose mass
// reaches it. Meant for top_p < 1; top_p <= 0 keeps just the first token.
MLAG_HD uint64_t SampleTopPTarget(uint64_t kept_mass, float top_p) {
  const double t = SampleMul(SampleU64ToDouble(kept_mass), static_cast<double>(top_p));
  if (!(t > 1.0)) return 1;
  const double c = ceil(t);
  if (c >= SampleU64ToDouble(kept_mass)) return kept_mass;
  const uint64_t target = static_cast<uint64_t>(c);
  return target < kept_mass ? target : kept_mass;
}

// The draw's target for a uniform u in [0, 1) over a kept mass `mass` >= 1:
// floor(u * mass) + 1, in [1, mass]. The drawn token is the first kept one
// at which the running mass reaches it, so token v is drawn for a share
// q_v / mass of the u values (to the resolution of u's 24 bits).
MLAG_HD uint64_t SampleDrawTarget(float u, uint64_t mass) {
  double t = SampleMul(static_cast<double>(u), SampleU64ToDouble(mass));
  if (!(t > 0.0)) t = 0.0;
  uint64_t r = t >= SampleU64ToDouble(mass) ? mass : static_cast<uint64_t>(t);
  if (r >= mass) r = mass - 1;
  return r + 1;
}

// ---- Radix descent (the CUDA sampler's search, emulated by the host test) ---
//
// A search finds the first token, in rank order over a kept set, at which a
// running sum of values (1 per token to count, or masses) reaches a target.
// It narrows the order key 12 + 12 + 8 bits at a time: each pass histograms
// the values of kept tokens whose key matches the prefix found so far by
// their next digit, and takes the highest digit whose bins from the top
// reach the target. The last pass leaves one group of tokens with the same
// key, hence the same logit and the same value; the answer is its
// SampleGroupSteps-th token in id order.

constexpr int kSampleDigitPasses = 3;

// Bit width of the digit of `pass` (0, 1, 2): 12, 12, 8.
MLAG_HD int SampleDigitBits(int pass) { return pass < 2 ? 12 : 8; }

// The digit of `key` examined in `pass`.
MLAG_HD uint32_t SampleDigit(uint32_t key, int pass) {
  return pass == 0 ? key >> 20 : (pass == 1 ? (key >> 8) & 0xfffu : key & 0xffu);
}

// True when the digits of `key` before `pass` equal `prefix` (the digits
// chosen so far, most significant first).
MLAG_HD bool SamplePrefixMatches(uint32_t key, int pass, uint32_t prefix) {
  return pass == 0 ? true : (pass == 1 ? (key >> 20) == prefix : (key >> 8) == prefix);
}

// Appends the digit chosen in `pass` to `prefix`.
MLAG_HD uint32_t SampleAppendDigit(uint32_t prefix, int pass, uint32_t digit) {
  return (prefix << SampleDigitBits(pass)) | digit;
}

// In a group of `count` tokens of `value` each (value >= 1), the 1-based
// position of the token at which a running sum starting at 0 first reaches
// `need` (1 <= need <= count * value): ceil(need / value).
MLAG_HD uint64_t SampleGroupSteps(uint64_t need, uint64_t value) {
  return (need + value - 1) / value;
}

// ---- Feeding sampled tokens (kernels/sampling.h's FeedSampledTokens) ------------
// One sequence b of the feed: its placeholder token becomes the token the
// previous step sampled for it, and its slot -1 when that token stops it.
MLAG_HD void FeedSampledToken(int64_t b, const int32_t* src, const int32_t* stop_ids,
                              int stops_per_seq, const int32_t* query_start_loc,
                              const int32_t* prev_tokens, int64_t P, int32_t* input_ids,
                              int64_t* slot_mapping, int64_t T) {
  const int32_t from = src[b];
  const int32_t t = query_start_loc[b];
  if (from < 0 || from >= P || t < 0 || t >= T) return;
  const int32_t token = prev_tokens[from];
  input_ids[t] = token;
  for (int i = 0; i < stops_per_seq; ++i) {
    const int32_t stop = stop_ids[b * stops_per_seq + i];
    if (stop >= 0 && stop == token) slot_mapping[t] = -1;
  }
}

// ---- Logit adjustments (kernels/sampling.h's AdjustLogits) --------------------
// Entry i of row b's adjustments: logits[b, tokens[i]] += deltas[i], a token
// outside [0, V) skipped. Rows list each token at most once, so the entries
// of a row touch distinct logits and may run in any order.
MLAG_HD void AdjustLogit(float* row, int64_t V, const int32_t* tokens, const float* deltas,
                         int64_t i) {
  const int32_t token = tokens[i];
  if (token >= 0 && token < V) row[token] += deltas[i];
}

// Row b's entries [begin, end): offsets clamped to [0, A] and ordered, so a
// bad offset skips entries and never reads outside them.
MLAG_HD void AdjustmentRange(const int32_t* offsets, int64_t b, int64_t A, int64_t* begin,
                             int64_t* end) {
  int64_t lo = offsets[b], hi = offsets[b + 1];
  lo = lo < 0 ? 0 : (lo > A ? A : lo);
  hi = hi < lo ? lo : (hi > A ? A : hi);
  *begin = lo;
  *end = hi;
}

}  // namespace mlag
