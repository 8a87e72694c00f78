// CUDA sampler (kernels/sampling.h), one 512-thread block per row.
//
// The rules are kernels/common/sampling_math.h's, computed without sorting and
// without scratch memory:
//   1. a block max of rank keys gives the greedy token and the largest logit;
//   2. top-k, top-p and the draw each become "the first token, in rank order
//      over the kept set, at which a running sum (of 1s, or of integer
//      masses) reaches a target", found by a radix descent over the order
//      key: three histogram passes (12, 12, 8 bits) over the row, then the
//      n-th token of the last group, which holds equal logits, in id order.
//   The kept set is always "rank key >= cut": top-k and top-p each move the
//   cut to the rank key of the token they stop at.
// Histogram sums are integers, so the pass structure and the atomics' order
// change nothing: the kernel picks exactly the host's token.
//
// Cost per sampled row: one pass for the max, three or four passes per stage
// (top-k when 0 < k < V, top-p when top_p < 1, the draw). Every pass reads the
// row (L2-resident); masses (an exp in double) are computed only for kept
// tokens whose key matches the prefix found so far. A warp whose 32 tokens
// all fall in one bin adds them with shuffles and one shared atomic.
#include "kernels/common/random.h"
#include "kernels/common/sampling_math.h"
#include "kernels/cuda/sampling.cuh"

namespace mlag::cuda {
namespace {

using u64 = unsigned long long;  // the type of the 64-bit atomics and of cub sums here

constexpr int kThreads = 512;
constexpr int kBins = 4096;  // 2^12, the widest digit
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kLastBins = 256;  // 2^8, the last digit
static_assert(kBins % kThreads == 0, "every thread owns the same number of bins");
static_assert(kThreads % 32 == 0, "whole warps");
constexpr uint32_t kNoDigit = 0xffffffffu;  // a token outside the histogram

using BlockReduceU64 = cub::BlockReduce<u64, kThreads>;
using BlockScanU64 = cub::BlockScan<u64, kThreads>;

struct SharedState {
  union {
    typename BlockReduceU64::TempStorage reduce;
    typename BlockScanU64::TempStorage scan;
  } cub;
  u64 hist[kBins];                       // value per digit of the current pass
  unsigned int group_count[kLastBins];   // last pass: tokens per digit,
  unsigned int group_min_id[kLastBins];  //   their lowest id
  unsigned int group_max_id[kLastBins];  //   and their highest id
  u64 best;                              // block max of rank keys
  u64 digit_above;                       // value of the bins above the chosen digit
  unsigned int digit;                    // the chosen digit
  unsigned int found_id;                 // NthInGroup's answer
};

struct RowContext {
  const float* logits;
  unsigned int vocab;  // < 2^31, so v + kThreads never wraps
  float max_logit;
  double inv_temperature;
  int shift;
};

// What a search's target is, given the total value of its kept set.
enum class Need { kCount, kTopP, kDraw };

__device__ __forceinline__ u64 NeedFromTotal(Need kind, u64 total, u64 count, float param) {
  switch (kind) {
    case Need::kCount:
      return count;
    case Need::kTopP:
      return SampleTopPTarget(total, param);
    default:
      return SampleDrawTarget(param, total);
  }
}

struct MaxOp {
  __device__ __forceinline__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};

// Id of the n-th (1-based) token, in ascending id order, among the kept
// tokens (rank key >= cut) whose order key is `key`. n is at most their
// number. Every thread gets the answer.
__device__ unsigned int NthInGroup(SharedState& s, const RowContext& row, uint32_t key, u64 cut,
                                   u64 n) {
  u64 seen = 0;
  for (unsigned int base = 0; base < row.vocab; base += kThreads) {
    const unsigned int v = base + threadIdx.x;
    u64 flag = 0;
    if (v < row.vocab) {
      const uint32_t k = SampleOrderKey(row.logits[v]);
      flag = (k == key && SampleRankKey(k, v) >= cut) ? 1 : 0;
    }
    u64 inclusive, tile;
    BlockScanU64(s.cub.scan).InclusiveSum(flag, inclusive, tile);
    if (flag != 0 && seen + inclusive == n) s.found_id = v;
    seen += tile;  // the same in every thread
    __syncthreads();
    if (seen >= n) break;
  }
  return s.found_id;
}

// The rank key of the first token, in rank order over the kept tokens (rank
// key >= cut), at which the running sum of values (1 each, or masses when
// kMass) reaches the target NeedFromTotal(need_kind, total kept value, ...).
// Every thread gets the answer.
template <bool kMass>
__device__ u64 FindCrossing(SharedState& s, const RowContext& row, u64 cut, Need need_kind,
                            u64 count, float param) {
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t prefix = 0;
  u64 above = 0;  // value of the kept tokens ranked before the prefix's group
  u64 need = 0;
  u64 group_value = 0, group_count = 0;
  unsigned int group_min = 0, group_max = 0;
  for (int pass = 0; pass < kSampleDigitPasses; ++pass) {
    const bool last = pass == kSampleDigitPasses - 1;
    for (int b = tid; b < kBins; b += kThreads) s.hist[b] = 0;
    if (last) {
      for (int b = tid; b < kLastBins; b += kThreads) {
        s.group_count[b] = 0;
        s.group_min_id[b] = 0xffffffffu;
        s.group_max_id[b] = 0;
      }
    }
    __syncthreads();
    // Warp-uniform trip count (base is the warp's first thread), so the
    // whole warp can take the fast path when all its lanes hit one bin
    // (equal logits would otherwise serialise on one shared atomic).
    const unsigned int lane = threadIdx.x & 31u;
    for (unsigned int base = threadIdx.x - lane; base < row.vocab; base += kThreads) {
      const unsigned int v = base + lane;
      uint32_t d = kNoDigit;
      u64 value = 0;
      if (v < row.vocab) {
        const float logit = row.logits[v];
        const uint32_t key = SampleOrderKey(logit);
        if (SamplePrefixMatches(key, pass, prefix) && SampleRankKey(key, v) >= cut) {
          value = kMass ? SampleTokenMass(logit, row.max_logit, row.inv_temperature, row.shift) : 1;
          if (value != 0) d = SampleDigit(key, pass);
        }
      }
      int warp_uniform = 0;
      __match_all_sync(0xffffffffu, d, &warp_uniform);
      if (warp_uniform) {
        if (d == kNoDigit) continue;
        // All 32 lanes hold tokens base .. base + 31 of bin d.
        for (int offset = 16; offset > 0; offset >>= 1) {
          value += __shfl_xor_sync(0xffffffffu, value, offset);
        }
        if (lane == 0) {
          atomicAdd(&s.hist[d], value);
          if (last) {
            atomicAdd(&s.group_count[d], 32u);
            atomicMin(&s.group_min_id[d], base);
            atomicMax(&s.group_max_id[d], base + 31u);
          }
        }
      } else if (d != kNoDigit) {
        atomicAdd(&s.hist[d], value);
        if (last) {
          atomicAdd(&s.group_count[d], 1u);
          atomicMin(&s.group_min_id[d], v);
          atomicMax(&s.group_max_id[d], v);
        }
      }
    }
    __syncthreads();

    // Thread t owns bins [kBins - 8 (t + 1), kBins - 8 t): thread order is
    // descending digit order, so an exclusive scan gives each thread the
    // value of every bin above its own.
    const int hi = kBins - 1 - tid * kBinsPerThread;
    u64 mine = 0;
    for (int j = 0; j < kBinsPerThread; ++j) mine += s.hist[hi - j];
    u64 before, total;
    BlockScanU64(s.cub.scan).ExclusiveSum(mine, before, total);
    if (pass == 0) need = NeedFromTotal(need_kind, total, count, param);
    // 1 <= rel <= total: pass 0 by the targets' ranges, later passes because
    // this pass's tokens are exactly the previous pass's chosen bin.
    const u64 rel = need - above;
    if (before < rel && rel <= before + mine) {
      u64 acc = before;
      for (int j = 0; j < kBinsPerThread; ++j) {
        const u64 h = s.hist[hi - j];
        if (acc + h >= rel) {
          s.digit = static_cast<unsigned int>(hi - j);
          s.digit_above = acc;
          break;
        }
        acc += h;
      }
    }
    __syncthreads();
    const unsigned int digit = s.digit;
    above += s.digit_above;
    prefix = SampleAppendDigit(prefix, pass, digit);
    if (last) {
      group_value = s.hist[digit];
      group_count = s.group_count[digit];
      group_min = s.group_min_id[digit];
      group_max = s.group_max_id[digit];
    }
    __syncthreads();  // the next pass (or search) overwrites the shared state
  }
  // The group of key `prefix`: group_count kept tokens of equal value.
  const u64 value = group_value / group_count;
  const u64 step = SampleGroupSteps(need - above, value);  // in [1, group_count]
  unsigned int id;
  if (step == 1) {
    id = group_min;
  } else if (step == group_count) {
    id = group_max;
  } else {
    id = NthInGroup(s, row, prefix, cut, step);
  }
  return SampleRankKey(prefix, id);
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* logits, int vocab, int64_t row_stride, const float* temperatures,
                 const int32_t* top_ks, const float* top_ps, const int64_t* seeds,
                 const int64_t* steps, int32_t* out_tokens) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  __shared__ SharedState s;
  const int64_t b = blockIdx.x;
  RowContext row;
  row.logits = logits + b * row_stride;
  row.vocab = static_cast<unsigned int>(vocab);

  u64 best = 0;
  for (unsigned int v = threadIdx.x; v < row.vocab; v += kThreads) {
    const u64 k = SampleRankKey(SampleOrderKey(row.logits[v]), v);
    best = k > best ? k : best;
  }
  best = BlockReduceU64(s.cub.reduce).Reduce(best, MaxOp());
  if (threadIdx.x == 0) s.best = best;
  __syncthreads();
  best = s.best;
  const unsigned int best_id = SampleIdFromRankKey(best);
  row.max_logit = SampleLogitFromKey(SampleOrderKeyFromRankKey(best));
  const float temperature = temperatures[b];
  if (!(temperature > 0.0f) || !isfinite(row.max_logit)) {
    if (threadIdx.x == 0) out_tokens[b] = static_cast<int32_t>(best_id);
    return;
  }
  row.inv_temperature = SampleInvTemperature(temperature);
  row.shift = SampleMassShift(vocab);

  u64 cut = 0;  // everything kept
  const int32_t top_k = top_ks[b];
  if (top_k > 0 && top_k < vocab) {
    cut = FindCrossing<false>(s, row, cut, Need::kCount, static_cast<u64>(top_k), 0.0f);
  }
  const float top_p = top_ps[b];
  if (top_p < 1.0f) cut = FindCrossing<true>(s, row, cut, Need::kTopP, 0, top_p);
  const float u =
      UniformFromCounter(static_cast<uint64_t>(seeds[b]), static_cast<uint64_t>(steps[b]));
  const u64 pick = FindCrossing<true>(s, row, cut, Need::kDraw, 0, u);
  if (threadIdx.x == 0) out_tokens[b] = static_cast<int32_t>(SampleIdFromRankKey(pick));
}

// ---- Top log-probabilities -------------------------------------------------
//
// One 512-thread block per row, in passes over the row:
//   1. the top-ranked token: its logit is the row's maximum (NaN excluded);
//   2. the sum of exp(logit - max) in double: the log-sum-exp;
//   3. the rank key of the k-th token, by FindCrossing's radix descent over
//      counts (three histogram passes, and part of a fourth when the k-th
//      token shares its logit with tokens on both sides of it); skipped for
//      k = 1 (the top token) and k = V (every token);
//   4. the k tokens ranked at or above it (rank keys are unique, so exactly
//      k) into shared memory, then each one's place by counting the keys
//      above it (k <= 64: 64 comparisons per thread).
// Cost per row: 6 reads of the row, 7 at worst, whatever k is (3 for k = 1
// or k = V); for V = 129280 that is 6 x 517 KB = 3.1 MB, the first from HBM
// and the others from L2 when the row stays there. A batch of 256 rows is one wave at two resident
// blocks per SM on 132 SMs; its 132 MB of logits exceed the 50 MB L2, so at
// worst every pass comes from HBM: 256 x 3.6 MB = 0.93 GB, about 0.2 ms at
// 4.8 TB/s, where copying the rows to the host moved the same 132 MB over
// PCIe into pageable memory.

using BlockReduceF64 = cub::BlockReduce<double, kThreads>;

struct TopLogprobsShared {
  SharedState search;  // FindCrossing's
  union {
    typename BlockReduceU64::TempStorage max;
    typename BlockReduceF64::TempStorage sum;
  } reduce;
  u64 best;                       // the top-ranked token's rank key
  double log_sum_exp;             // of the row, in double
  unsigned int found;             // keys collected so far
  u64 keys[kTopLogprobsMaxCols];  // the top k rank keys, in no order
};

__global__ void __launch_bounds__(kThreads)
    TopLogprobsKernel(const float* logits, int vocab, int64_t row_stride, const int32_t* ks,
                      int k_cols, int32_t* out_tokens, int64_t tokens_row_stride,
                      float* out_logprobs, int64_t logprobs_row_stride) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  __shared__ TopLogprobsShared s;
  const int64_t b = blockIdx.x;
  const unsigned int tid = threadIdx.x;
  const float* l = logits + b * row_stride;
  int32_t* tokens = out_tokens + b * tokens_row_stride;
  float* logprobs = out_logprobs + b * logprobs_row_stride;
  const int k_limit = k_cols < vocab ? k_cols : vocab;
  const int k_asked = ks[b];
  const int k = k_asked < 0 ? 0 : (k_asked > k_limit ? k_limit : k_asked);
  for (int i = k + static_cast<int>(tid); i < k_cols; i += kThreads) {
    tokens[i] = -1;
    logprobs[i] = -INFINITY;
  }
  if (k == 0) return;
  const unsigned int V = static_cast<unsigned int>(vocab);  // < 2^31: v + kThreads never wraps

  u64 best = 0;
  for (unsigned int v = tid; v < V; v += kThreads) {
    const u64 key = SampleRankKey(SampleOrderKey(l[v]), v);
    best = key > best ? key : best;
  }
  best = BlockReduceU64(s.reduce.max).Reduce(best, MaxOp());
  if (tid == 0) s.best = best;
  __syncthreads();
  best = s.best;
  // As host::TopLogprobs: max, then the sum of exp(logit - max), in double.
  const double max_logit = SampleLogitFromKey(SampleOrderKeyFromRankKey(best));
  double sum = 0.0;
  for (unsigned int v = tid; v < V; v += kThreads) {
    sum += exp(static_cast<double>(l[v]) - max_logit);
  }
  sum = BlockReduceF64(s.reduce.sum).Sum(sum);
  if (tid == 0) {
    s.log_sum_exp = max_logit + log(sum);
    s.found = 0;
  }
  __syncthreads();

  u64 cut = 0;  // k = V: every token
  if (k == 1) {
    cut = best;
  } else if (k < vocab) {
    RowContext row;  // FindCrossing reads only logits and vocab when counting
    row.logits = l;
    row.vocab = V;
    row.max_logit = 0.0f;
    row.inv_temperature = 0.0;
    row.shift = 0;
    cut = FindCrossing<false>(s.search, row, 0, Need::kCount, static_cast<u64>(k), 0.0f);
  }
  for (unsigned int v = tid; v < V; v += kThreads) {
    const u64 key = SampleRankKey(SampleOrderKey(l[v]), v);
    if (key >= cut) s.keys[atomicAdd(&s.found, 1u)] = key;
  }
  __syncthreads();
  if (static_cast<int>(tid) < k) {
    const u64 key = s.keys[tid];
    int place = 0;
    for (int j = 0; j < k; ++j) place += s.keys[j] > key ? 1 : 0;
    const unsigned int id = SampleIdFromRankKey(key);
    tokens[place] = static_cast<int32_t>(id);
    logprobs[place] = static_cast<float>(static_cast<double>(l[id]) - s.log_sum_exp);
  }
}

__global__ void FeedSampledTokensKernel(const int32_t* src, const int32_t* stop_ids,
                                        int stops_per_seq, const int32_t* query_start_loc,
                                        int64_t B, const int32_t* prev_tokens, int64_t P,
                                        int32_t* input_ids, int64_t* slot_mapping, int64_t T) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t b = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (b >= B) return;
  FeedSampledToken(b, src, stop_ids, stops_per_seq, query_start_loc, prev_tokens, P, input_ids,
                   slot_mapping, T);
}

// One block per row; its threads stride over the row's entries, which touch
// distinct logits (kernels/sampling.h), so no two threads write one logit.
__global__ void AdjustLogitsKernel(float* logits, int64_t V, int64_t logits_row_stride,
                                   const int32_t* offsets, const int32_t* tokens,
                                   const float* deltas, int64_t A) {
  MLAG_GRID_DEPENDENCY_SYNC();  // launched with PDL (cuda_api.cuh)
  const int64_t b = blockIdx.x;
  int64_t begin = 0, end = 0;
  AdjustmentRange(offsets, b, A, &begin, &end);
  float* row = logits + b * logits_row_stride;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    AdjustLogit(row, V, tokens, deltas, i);
  }
}

}  // namespace

cudaError_t LaunchAdjustLogits(float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                               const int32_t* offsets, const int32_t* tokens, const float* deltas,
                               int64_t A, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (B < 0 || B > 0x7fffffff || V < 1 || V > 0x7fffffff || A < 0) return cudaErrorInvalidValue;
  // A row has at most a few thousand entries and most rows none: one small
  // CTA per row, latency only (a node of about 2 us before "sample"); the
  // scattered 4-byte read-modify-writes of a row's entries hit one logits
  // row, which "sample" reads next from L2.
  constexpr unsigned int kAdjustThreads = 128;
  MLAG_LAUNCH_PDL(AdjustLogitsKernel, static_cast<unsigned int>(B), kAdjustThreads, 0, stream)
  (logits, V, logits_row_stride, offsets, tokens, deltas, A);
  return cudaGetLastError();
}

cudaError_t LaunchFeedSampledTokens(const int32_t* src, const int32_t* stop_ids, int stops_per_seq,
                                    const int32_t* query_start_loc, int64_t B,
                                    const int32_t* prev_tokens, int64_t P, int32_t* input_ids,
                                    int64_t* slot_mapping, int64_t T, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (B < 0 || B > 0x7fffffff || stops_per_seq < 0) return cudaErrorInvalidValue;
  // A few hundred sequences at most: one small CTA per 128, latency only
  // (about 2 us of a step, its first node).
  constexpr unsigned int kFeedThreads = 128;
  const unsigned int blocks = static_cast<unsigned int>((B + kFeedThreads - 1) / kFeedThreads);
  MLAG_LAUNCH_PDL(FeedSampledTokensKernel, blocks, kFeedThreads, 0, stream)
  (src, stop_ids, stops_per_seq, query_start_loc, B, prev_tokens, P, input_ids, slot_mapping, T);
  return cudaGetLastError();
}

cudaError_t LaunchSample(const float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                         const float* temperature, const int32_t* top_k, const float* top_p,
                         const int64_t* seeds, const int64_t* steps, int32_t* out_tokens,
                         cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (B < 0 || B > 0x7fffffff || V < 1 || V > 0x7fffffff) return cudaErrorInvalidValue;
  MLAG_LAUNCH_PDL(SampleKernel, static_cast<unsigned int>(B), kThreads, 0, stream)
  (logits, static_cast<int>(V), logits_row_stride, temperature, top_k, top_p, seeds, steps,
   out_tokens);
  return cudaGetLastError();
}

cudaError_t LaunchTopLogprobs(const float* logits, int64_t B, int64_t V, int64_t logits_row_stride,
                              const int32_t* k, int64_t k_cols, int32_t* out_tokens,
                              int64_t tokens_row_stride, float* out_logprobs,
                              int64_t logprobs_row_stride, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (B < 0 || B > 0x7fffffff || V < 1 || V > 0x7fffffff || k_cols < 1 ||
      k_cols > kTopLogprobsMaxCols) {
    return cudaErrorInvalidValue;
  }
  MLAG_LAUNCH_PDL(TopLogprobsKernel, static_cast<unsigned int>(B), kThreads, 0, stream)
  (logits, static_cast<int>(V), logits_row_stride, k, static_cast<int>(k_cols), out_tokens,
   tokens_row_stride, out_logprobs, logprobs_row_stride);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
