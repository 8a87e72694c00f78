// MLA attention over the paged latent cache on CUDA (kernels/mla_attention.h).
//
// The absorbed form is MQA: every query vector (a head of a decode row, or a
// (row, head) pair of a prefill block) scores the same key rows [c_kv | k_pe]
// (Rkv + dr wide) and sums the same value rows c_kv. One thread block handles
// up to 16 query vectors of one sequence over one range of cache tokens: it
// streams the range through shared memory in tiles (cp.async, double
// buffered), and every tile row it loads is used by all 16 vectors.
//
// Per tile of kTile tokens (64 for a bf16 cache, 32 for f32), 256 threads:
//   QK  warp w scores 8 vectors (w & 1 picks which 8) against kTile / 4
//       tokens; a lane holds kTile / 16 tokens x 8 vectors and an eighth of
//       the row (16-byte chunks ds, ds + 8, ...), the 8 lanes of a token
//       group then sum their partial dots with a transposing butterfly.
//   softmax  warp w updates the online softmax of vectors 2w and 2w + 1
//       (kernels/common/softmax_math.h) and writes the probabilities.
//   PV  thread t accumulates 8 vectors (t / 128 picks which) x 4 latent
//       dimensions (t % 128) in registers for the whole range.
// All arithmetic is f32 (bf16 cache rows are widened exactly).
//
// Decode (one row per sequence, its heads are the vectors; more than 16
// heads take several head groups) splits long sequences across blocks
// (flash-decoding): a one-block planner turns seq_lens into a split length
// and per-sequence item ranges on the device, so one captured graph serves
// any seq_lens; split items write a normalised partial output and its LSE to
// the workspace and a combine kernel merges them (LseAdd / LseMergeWeight, as
// the host kernel does). Unsplit sequences are written directly.
//
// Prefill runs the same block over 16 / min(H, 16) consecutive query rows of
// one sequence (vector = (row, head), each with its own causal limit) and
// the cache prefix up to its last row; no split. Rows that belong to no
// sequence are cleared by a separate kernel.
//
// Decode with a bf16 cache runs, by default, the tensor-core kernel of
// kernels/cuda/mla_decode_mma.cuh over the same items, plan, workspace and
// combine (LaunchDecodeAttend chooses; MlaDecodeKernel).
#include <math.h>

#include <cstdint>

#include "kernels/common/softmax_math.h"
#include "kernels/cuda/mla_attention.cuh"
#include "kernels/cuda/mla_attention_block.cuh"
#include "kernels/cuda/mla_decode_mma.cuh"

namespace mlag::cuda {
namespace {

using namespace mla_block;  // the block-level pieces both decode kernels share

constexpr int kPPitch = 20;           // floats per row of the probability tile [kTile][16]
constexpr int kSplitAlign = 64;       // split lengths are multiples of every tile size
constexpr int kMinSplitTokens = 128;  // shorter splits cost more to merge than they save
constexpr int kPlanThreads = 1024;
constexpr int kCombineThreads = 128;
constexpr int kCombinePerThread = static_cast<int>(kMlaMaxRkv) / kCombineThreads;

static_assert(kThreads == 256 && kVecs == 16, "the warp layout below assumes 8 warps, 16 vectors");
static_assert(kMlaMaxRkv <= 4 * (kThreads / 2), "PV covers 4 latent dims per thread");

// Tile shape per cache element type (uint16_t holds bf16 bits).
template <typename CacheT>
struct Tile;
template <>
struct Tile<uint16_t> {
  static constexpr int kRows = 64;
};
template <>
struct Tile<float> {
  static constexpr int kRows = 32;
};

// ---- Small device helpers --------------------------------------------------

// Both bf16 halves of a 32-bit word, widened exactly (Bf16ToF32 of each half;
// the lower half is the element at the lower address).
__device__ __forceinline__ void Bf16x2ToF32(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}

// 16 bytes of a shared-memory cache row as floats.
__device__ __forceinline__ void LoadChunk(const uint16_t* p, float (&out)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  Bf16x2ToF32(raw.x, out[0], out[1]);
  Bf16x2ToF32(raw.y, out[2], out[3]);
  Bf16x2ToF32(raw.z, out[4], out[5]);
  Bf16x2ToF32(raw.w, out[6], out[7]);
}
__device__ __forceinline__ void LoadChunk(const float* p, float (&out)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

// Four consecutive elements of a shared-memory cache row as floats.
__device__ __forceinline__ void Load4(const uint16_t* p, float (&out)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  Bf16x2ToF32(raw.x, out[0], out[1]);
  Bf16x2ToF32(raw.y, out[2], out[3]);
}
__device__ __forceinline__ void Load4(const float* p, float (&out)[4]) { LoadChunk(p, out); }

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One step of ReduceOver8Lanes over the live entries v[0, 2 * kHalf).
template <int kHalf, int N>
__device__ __forceinline__ void ButterflyStep(float (&v)[N], int lane, int mask) {
  const bool upper = (lane & mask) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
  }
}

// Sums v over the 8 lanes sharing lane / 8 with a transposing butterfly:
// in each of three steps the lanes that differ in one bit of lane % 8 swap
// halves, the lane with the bit set keeping the upper half of the live
// entries and the other the lower half, each adding its partner's copy.
// Afterwards the lane with ds = lane % 8 holds, in v[0, N/8), the sums of
// entries [ds * N/8, (ds + 1) * N/8). 28 shuffles for N = 32 instead of 96.
template <int N>
__device__ __forceinline__ void ReduceOver8Lanes(float (&v)[N], int lane) {
  static_assert(N % 8 == 0, "8 lanes share the values");
  ButterflyStep<N / 2>(v, lane, 4);
  ButterflyStep<N / 4>(v, lane, 2);
  ButterflyStep<N / 8>(v, lane, 1);
}

// Prefill: block -> (block of query rows of one sequence, head group).
// Sequence b has ceil(q_len_b / rows_per_item) row blocks; a block scan over
// the sequences finds the one holding this block's item.
__device__ void ResolvePrefill(const KernelParams& p, BlockItem& it) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int num_seqs = static_cast<int>(p.a.num_seqs);
  const int item = static_cast<int>(blockIdx.x) / p.head_groups;
  const int rows_per_item = p.rows_per_item;
  const int32_t* qsl = p.a.query_start_loc;
  if (threadIdx.x == 0) it.found_b = -1;
  __syncthreads();
  int running = 0;
  for (int base = 0; base < num_seqs; base += kThreads) {
    const int b = base + static_cast<int>(threadIdx.x);
    int blocks = 0;
    if (b < num_seqs) {
      const int q_len = max(0, qsl[b + 1] - qsl[b]);
      blocks = (q_len + rows_per_item - 1) / rows_per_item;
    }
    int first = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(blocks, first, total);
    if (b < num_seqs && item >= running + first && item < running + first + blocks) {
      it.found_b = b;
      it.found_block = item - running - first;
    }
    running += total;
    __syncthreads();
    if (it.found_b >= 0) break;
  }
  if (threadIdx.x == 0) {
    it.exit = 1;
    const int b = it.found_b;
    if (b >= 0) {
      const int q0 = qsl[b];
      const int q_len = max(0, qsl[b + 1] - q0);
      const int len = ClampLen(p.a.seq_lens[b], p.capacity);
      it.b = b;
      it.q0 = q0;
      it.context = max(0, len - q_len);
      it.row0 = q0 + it.found_block * rows_per_item;
      it.row1 = min(it.row0 + rows_per_item, q0 + q_len);
      it.begin = 0;
      it.end = min(len, it.context + (it.row1 - q0));
      it.exit = 0;
    }
  }
  __syncthreads();
  if (it.exit) return;
  const int v = threadIdx.x;
  if (v < kVecs) {
    const int heads = static_cast<int>(p.a.heads);
    const int row = it.row0 + v / p.heads_per_item;
    const int h = (static_cast<int>(blockIdx.x) % p.head_groups) * kVecs + v % p.heads_per_item;
    const bool used = v / p.heads_per_item < rows_per_item && row < it.row1 && row >= 0 &&
                      row < p.a.num_rows && h < heads;
    const int64_t r = row;
    const int len = ClampLen(p.a.seq_lens[it.b], p.capacity);
    it.q_latent[v] =
        used ? p.a.q_latent + r * p.a.q_latent_stride0 + h * p.a.q_latent_stride1 : nullptr;
    it.q_pe[v] = used ? p.a.q_pe + r * p.a.q_pe_stride0 + h * p.a.q_pe_stride1 : nullptr;
    it.limit[v] = used ? min(len, it.context + (row - it.q0) + 1) : 0;  // causal: up to itself
    it.out[v] = used ? p.a.out_latent + (r * heads + h) * p.a.rkv : nullptr;
    it.lse[v] = used ? p.a.lse + r * heads + h : nullptr;
  }
}

// Issues the copy of cache tokens [t0, t0 + kTile) of sequence it.b into
// `stage` ([kTile][pitch] elements): rows past it.end, rows in a block outside
// the cache and columns past rkv + dr become zeros.
template <typename CacheT>
__device__ __forceinline__ void LoadTile(const KernelParams& p, const BlockItem& it, int pitch,
                                         int t0, CacheT* stage) {
  constexpr int kTile = Tile<CacheT>::kRows;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(CacheT));
  constexpr int kThreadsPerRow = kThreads / kTile;
  const int r = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int sub = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int row_width = static_cast<int>(p.a.rkv + p.a.dr);
  const CacheT* cache = static_cast<const CacheT*>(p.a.cache);
  const CacheT* src = CacheRow<CacheT>(p, it, t0 + r, row_width);
  CacheT* dst = stage + r * pitch;
  if (p.vec_loads) {
    const int chunks = pitch / kChunk;  // pitch == row_width here
    for (int c = sub; c < chunks; c += kThreadsPerRow) {
      CpAsync16(dst + c * kChunk, src != nullptr ? src + c * kChunk : cache,
                src != nullptr ? 16 : 0);
    }
    CpAsyncCommit();
  } else {
    for (int e = sub; e < pitch; e += kThreadsPerRow) {
      dst[e] = (src != nullptr && e < row_width) ? src[e] : CacheT(0);
    }
  }
}

template <typename CacheT>
constexpr size_t DynamicSmemBytes(int pitch) {
  constexpr int kTile = Tile<CacheT>::kRows;
  return sizeof(float) * kVecs * pitch          // query vectors
         + 2 * sizeof(CacheT) * kTile * pitch   // two cache tiles
         + sizeof(float) * kVecs * (kTile + 4)  // scores
         + sizeof(float) * kTile * kPPitch;     // probabilities
}

// The attention kernel (decode and prefill); kPitch > 0 fixes the pitch at
// compile time (576: DeepSeek's 512 + 64, with 16-byte loads).
template <typename CacheT, int kPitch>
__global__ void __launch_bounds__(kThreads, 1) MlaAttendKernel(const KernelParams p) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  constexpr int kTile = Tile<CacheT>::kRows;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(CacheT));  // elements per 16 bytes
  constexpr int kPlanes = kChunk / 4;  // float4 planes a query chunk is stored in
  constexpr int kTpl = kTile / 16;     // tokens per lane in QK
  constexpr int kSPitch = kTile + 4;
  const int pitch = kPitch > 0 ? kPitch : p.pitch;

  MLAG_DYNAMIC_SMEM(unsigned char, smem_raw);
  float* q_s = reinterpret_cast<float*>(smem_raw);
  CacheT* kv_s = reinterpret_cast<CacheT*>(q_s + kVecs * pitch);
  float* s_s = reinterpret_cast<float*>(kv_s + 2 * kTile * pitch);
  float* p_s = s_s + kVecs * kSPitch;
  __shared__ BlockItem it;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;

  if (p.prefill) {
    ResolvePrefill(p, it);
  } else {
    ResolveDecode(p, it);
  }
  if (it.exit) return;  // uniform: every thread read it after a barrier
  __syncthreads();      // per-vector fields written by threads < 16

  const int rkv = static_cast<int>(p.a.rkv);
  const int row_width = rkv + static_cast<int>(p.a.dr);

  // Query vectors -> shared memory, f32, zero past rkv + dr and for unused
  // vectors. Element d of chunk c = d / kChunk sits in plane (d % kChunk) / 4
  // so that QK reads each plane of a chunk with one conflict-free float4.
  {
    const int plane_stride = pitch / kPlanes;
    for (int idx = tid; idx < kVecs * pitch; idx += kThreads) {
      const int v = idx / pitch;
      const int d = idx - v * pitch;
      float x = 0.0f;
      if (it.q_latent[v] != nullptr && d < row_width) {
        x = d < rkv ? it.q_latent[v][d] : it.q_pe[v][d - rkv];
      }
      const int c = d / kChunk, e = d % kChunk;
      q_s[v * pitch + (e >> 2) * plane_stride + c * 4 + (e & 3)] = x;
    }
  }

  const int num_tiles = (it.end - it.begin + kTile - 1) / kTile;
  if (num_tiles > 0) LoadTile<CacheT>(p, it, pitch, it.begin, kv_s);

  OnlineSoftmaxState state[2] = {OnlineSoftmaxInit(), OnlineSoftmaxInit()};  // vectors 2w, 2w+1
  float o[8][4];
#pragma unroll
  for (int h = 0; h < 8; ++h) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[h][e] = 0.0f;
  }
  const int pv_half = tid >> 7;    // PV: vectors [8 * pv_half, +8)
  const int d0 = (tid & 127) * 4;  // PV: latent dims [d0, d0 + 4)
  const float scale = p.a.scale;

  for (int i = 0; i < num_tiles; ++i) {
    const int t0 = it.begin + i * kTile;
    CpAsyncWaitAll();
    __syncthreads();  // tile i (and the queries) visible; every thread is past tile i-1
    if (i + 1 < num_tiles) {
      LoadTile<CacheT>(p, it, pitch, t0 + kTile, kv_s + ((i + 1) & 1) * kTile * pitch);
    }
    const CacheT* tile = kv_s + (i & 1) * kTile * pitch;

    // ---- QK: scores of 8 vectors x kTile / 4 tokens per warp.
    {
      const int vh = warp & 1;   // vectors [8 * vh, +8)
      const int tg = lane >> 3;  // token group
      const int ds = lane & 7;   // which chunks of the row
      const int r0 = (warp >> 1) * (kTile / 4) + tg * kTpl;
      float acc[8 * kTpl];
#pragma unroll
      for (int k = 0; k < 8 * kTpl; ++k) acc[k] = 0.0f;
      const int chunks = pitch / kChunk;
      const int plane_stride = pitch / kPlanes;
      const float* q_base = q_s + (vh * 8) * pitch;
#pragma unroll 3
      for (int c = ds; c < chunks; c += 8) {
        float kf[kTpl][kChunk];
#pragma unroll
        for (int t = 0; t < kTpl; ++t) LoadChunk(tile + (r0 + t) * pitch + c * kChunk, kf[t]);
#pragma unroll
        for (int h = 0; h < 8; ++h) {
          float qf[kChunk];
#pragma unroll
          for (int pl = 0; pl < kPlanes; ++pl) {
            const float4 q4 =
                *reinterpret_cast<const float4*>(q_base + h * pitch + pl * plane_stride + c * 4);
            qf[pl * 4 + 0] = q4.x;
            qf[pl * 4 + 1] = q4.y;
            qf[pl * 4 + 2] = q4.z;
            qf[pl * 4 + 3] = q4.w;
          }
#pragma unroll
          for (int t = 0; t < kTpl; ++t) {
#pragma unroll
            for (int e = 0; e < kChunk; ++e)
              acc[h * kTpl + t] = fmaf(qf[e], kf[t][e], acc[h * kTpl + t]);
          }
        }
      }
      // acc[h * kTpl + t] summed over the 8 lanes: this lane gets vector
      // 8 * vh + ds, tokens r0 + [0, kTpl).
      ReduceOver8Lanes<8 * kTpl>(acc, lane);
      const int v = vh * 8 + ds;
      const int limit = it.limit[v];
      float sc[kTpl];
#pragma unroll
      for (int t = 0; t < kTpl; ++t) sc[t] = t0 + r0 + t < limit ? acc[t] * scale : -INFINITY;
      float* dst = s_s + v * kSPitch + r0;
      if constexpr (kTpl == 4) {
        *reinterpret_cast<float4*>(dst) = make_float4(sc[0], sc[1], sc[2], sc[3]);
      } else {
        static_assert(kTpl == 2, "tiles of 32 or 64 tokens");
        *reinterpret_cast<float2*>(dst) = make_float2(sc[0], sc[1]);
      }
    }
    __syncthreads();  // scores visible

    // ---- Online softmax of vectors 2w, 2w + 1.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int v = warp * 2 + j;
      float sv[kTile / 32];
      float tile_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < kTile / 32; ++k) {
        sv[k] = s_s[v * kSPitch + lane + 32 * k];
        tile_max = fmaxf(tile_max, sv[k]);
      }
      tile_max = WarpMax(tile_max);
      const float alpha = OnlineSoftmaxRescale(&state[j], tile_max);
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kTile / 32; ++k) {
        const float pk = ExpShifted(sv[k], state[j].max);
        p_s[(lane + 32 * k) * kPPitch + v] = pk;
        sum += pk;
      }
      state[j].sum += WarpSum(sum);
      if (lane == 0) it.alpha[v] = alpha;
    }
    __syncthreads();  // probabilities and rescale factors visible

    // ---- PV: o[h][e] = alpha * o[h][e] + sum_t p[t][h] v[t][d0 + e].
#pragma unroll
    for (int h = 0; h < 8; ++h) {
      const float a = it.alpha[pv_half * 8 + h];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[h][e] *= a;
    }
    if (d0 < rkv) {
#pragma unroll 4
      for (int t = 0; t < kTile; ++t) {
        const float4 pa = *reinterpret_cast<const float4*>(p_s + t * kPPitch + pv_half * 8);
        const float4 pb = *reinterpret_cast<const float4*>(p_s + t * kPPitch + pv_half * 8 + 4);
        const float pr[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
        float vv[4];
        Load4(tile + t * pitch + d0, vv);
#pragma unroll
        for (int h = 0; h < 8; ++h) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[h][e] = fmaf(pr[h], vv[e], o[h][e]);
        }
      }
    }
  }

  // ---- Epilogue: out = o / sum, lse = max + ln(sum); zeros and -inf when
  // the vector saw no token.
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      it.inv_sum[warp * 2 + j] = OnlineSoftmaxInvSum(state[j]);
      it.lse_value[warp * 2 + j] = OnlineSoftmaxLse(state[j]);
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 8; ++h) {
    const int v = pv_half * 8 + h;
    float* out = it.out[v];
    if (out == nullptr) continue;
    const float inv = it.inv_sum[v];
    if (d0 + 4 <= rkv && (reinterpret_cast<uintptr_t>(out + d0) & 15) == 0) {
      *reinterpret_cast<float4*>(out + d0) =
          make_float4(o[h][0] * inv, o[h][1] * inv, o[h][2] * inv, o[h][3] * inv);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (d0 + e < rkv) out[d0 + e] = o[h][e] * inv;
      }
    }
    if (d0 == 0) *it.lse[v] = it.lse_value[v];
  }
}

// ---- Decode planning and merging -------------------------------------------

// Split length for a batch of `total` tokens that may use `extra` items beyond
// one per sequence: sum_b max(1, ceil(len_b / chunk)) <= num_seqs + total /
// chunk <= num_seqs + extra.
__device__ int SplitTokens(long long total, int extra) {
  if (extra <= 0) return kNoSplit;
  long long chunk = (total + extra - 1) / extra;
  if (chunk < kMinSplitTokens) chunk = kMinSplitTokens;
  chunk = (chunk + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  return chunk > kNoSplit ? kNoSplit : static_cast<int>(chunk);
}

// plan[b] = first item of sequence b, plan[num_seqs] = number of items,
// plan[num_seqs + 1] = split length. Sequence b gets max(1, ceil(len / chunk))
// items; item k covers tokens [k * chunk, min(len, (k + 1) * chunk)).
__global__ void __launch_bounds__(kPlanThreads)
    MlaDecodePlanKernel(const int32_t* __restrict__ seq_lens, int num_seqs, int capacity, int extra,
                        int* __restrict__ plan) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  using Reduce = cub::BlockReduce<long long, kPlanThreads>;
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } storage;
  __shared__ int chunk_s;
  const int tid = static_cast<int>(threadIdx.x);
  long long local = 0;
  for (int b = tid; b < num_seqs; b += kPlanThreads) local += ClampLen(seq_lens[b], capacity);
  const long long total = Reduce(storage.reduce).Sum(local);  // valid in thread 0
  if (tid == 0) {
    chunk_s = SplitTokens(total, extra);
    plan[num_seqs + 1] = chunk_s;
  }
  __syncthreads();
  const int chunk = chunk_s;
  int running = 0;
  for (int base = 0; base < num_seqs; base += kPlanThreads) {
    const int b = base + tid;
    int splits = 0;
    if (b < num_seqs) {
      const int len = ClampLen(seq_lens[b], capacity);
      splits = len <= chunk ? 1 : (len - 1) / chunk + 1;
    }
    int first = 0, total_splits = 0;
    Scan(storage.scan).ExclusiveSum(splits, first, total_splits);
    if (b < num_seqs) plan[b] = running + first;
    running += total_splits;
    __syncthreads();  // before the scan storage is reused
  }
  if (tid == 0) plan[num_seqs] = running;
}

// One block per (sequence, head): merges the items of a split sequence
// (sequences with one item were written directly). Sequences run on grid x
// (up to 2^31 - 1) and heads on y (at most 65535, and a model has <= 128):
// the engine allows 65536 sequences, one more than gridDim.y holds.
__global__ void __launch_bounds__(kCombineThreads)
    MlaDecodeCombineKernel(const int* __restrict__ plan, const float* __restrict__ part_out,
                           const float* __restrict__ part_lse, int heads, int rkv,
                           float* __restrict__ out, float* __restrict__ lse) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int b = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int first = plan[b];
  const int num_splits = plan[b + 1] - first;
  if (num_splits <= 1) return;
  float total = -INFINITY;
  for (int k = 0; k < num_splits; ++k) {
    total = LseAdd(total, part_lse[static_cast<int64_t>(first + k) * heads + h]);
  }
  __shared__ float weight[kCombineThreads];
  float acc[kCombinePerThread];
#pragma unroll
  for (int j = 0; j < kCombinePerThread; ++j) acc[j] = 0.0f;
  for (int k0 = 0; k0 < num_splits; k0 += kCombineThreads) {
    __syncthreads();  // the previous weights are consumed
    const int k = k0 + tid;
    weight[tid] = k < num_splits
                      ? LseMergeWeight(part_lse[static_cast<int64_t>(first + k) * heads + h], total)
                      : 0.0f;
    __syncthreads();
    const int n = min(kCombineThreads, num_splits - k0);
    for (int j = 0; j < n; ++j) {
      const float w = weight[j];
      if (w == 0.0f) continue;  // an empty part contributes nothing (as on the host)
      const float* src = part_out + (static_cast<int64_t>(first + k0 + j) * heads + h) * rkv;
#pragma unroll
      for (int q = 0; q < kCombinePerThread; ++q) {
        const int d = tid + q * kCombineThreads;
        if (d < rkv) acc[q] = fmaf(w, src[d], acc[q]);
      }
    }
  }
  float* dst = out + (static_cast<int64_t>(b) * heads + h) * rkv;
#pragma unroll
  for (int q = 0; q < kCombinePerThread; ++q) {
    const int d = tid + q * kCombineThreads;
    if (d < rkv) dst[d] = acc[q];
  }
  if (tid == 0) lse[static_cast<int64_t>(b) * heads + h] = total;
}

// Prefill rows owned by no sequence: zeros and -inf.
__global__ void __launch_bounds__(128)
    MlaPrefillClearKernel(const int32_t* __restrict__ query_start_loc, int num_seqs,
                          int64_t row_floats, int heads, float* __restrict__ out,
                          float* __restrict__ lse) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t r = blockIdx.x;
  if (r >= query_start_loc[0] && r < query_start_loc[num_seqs]) return;
  for (int64_t i = threadIdx.x; i < row_floats; i += blockDim.x) out[r * row_floats + i] = 0.0f;
  for (int i = threadIdx.x; i < heads; i += blockDim.x) lse[r * heads + i] = -INFINITY;
}

// ---- Host side -------------------------------------------------------------

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct WorkspaceLayout {
  size_t lse_offset, out_offset, total;
};

WorkspaceLayout Layout(int64_t items, int64_t heads, int64_t rkv) {
  WorkspaceLayout l;
  const size_t n = static_cast<size_t>(items), h = static_cast<size_t>(heads);
  l.lse_offset = AlignUp((n + 2) * sizeof(int32_t), 256);
  l.out_offset = l.lse_offset + AlignUp(n * h * sizeof(float), 256);
  l.total = l.out_offset + n * h * static_cast<size_t>(rkv) * sizeof(float);
  return l;
}

bool ValidArgs(const MlaAttentionArgs& a) {
  return a.num_seqs >= 0 && a.num_seqs < (int64_t{1} << 30) && a.num_rows >= 0 &&
         a.num_rows < (int64_t{1} << 31) - 1 && a.heads >= 1 && a.heads <= (1 << 20) &&
         MlaAttentionSupported(a.rkv, a.dr) &&
         (a.cache_dtype == DType::kF32 || a.cache_dtype == DType::kBF16) && a.block_size >= 1 &&
         a.block_size < (int64_t{1} << 30) && a.max_blocks >= 0 && a.num_blocks >= 0;
}

template <typename CacheT>
cudaError_t LaunchAttend(const KernelParams& p, unsigned grid, cudaStream_t stream) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(CacheT));
  const bool fixed =
      p.pitch == static_cast<int>(kMlaMaxRowWidth) && p.vec_loads && kMlaMaxRowWidth % kChunk == 0;
  void (*kernel)(KernelParams) = fixed ? MlaAttendKernel<CacheT, static_cast<int>(kMlaMaxRowWidth)>
                                       : MlaAttendKernel<CacheT, 0>;
  const size_t smem = DynamicSmemBytes<CacheT>(p.pitch);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  MLAG_LAUNCH_PDL(kernel, grid, kThreads, smem, stream)(p);
  return cudaGetLastError();
}

cudaError_t LaunchAttendForDtype(const KernelParams& p, unsigned grid, cudaStream_t stream) {
  return p.a.cache_dtype == DType::kBF16 ? LaunchAttend<uint16_t>(p, grid, stream)
                                         : LaunchAttend<float>(p, grid, stream);
}

KernelParams BaseParams(const MlaAttentionArgs& a) {
  KernelParams p{};
  p.a = a;
  const int64_t width = a.rkv + a.dr;
  const int64_t chunk = a.cache_dtype == DType::kBF16 ? 8 : 4;
  p.pitch = static_cast<int>((width + chunk - 1) / chunk * chunk);
  // 16-byte copies need 16-byte rows; an empty cache (nullptr) takes the
  // element path, which reads nothing when no block is valid.
  p.vec_loads =
      width % chunk == 0 && a.cache != nullptr && reinterpret_cast<uintptr_t>(a.cache) % 16 == 0;
  const int64_t capacity = a.max_blocks * a.block_size;
  p.capacity = static_cast<int>(capacity < kNoSplit ? capacity : kNoSplit);
  p.head_groups = static_cast<int>((a.heads + kVecs - 1) / kVecs);
  p.heads_per_item = static_cast<int>(a.heads < kVecs ? a.heads : kVecs);
  p.rows_per_item = kVecs / p.heads_per_item;
  return p;
}

}  // namespace

size_t MlaDecodeWorkspaceBytes(int64_t batch, int64_t heads, int64_t rkv, int64_t max_splits) {
  if (batch < 0 || heads < 1 || rkv < 1) return 0;
  return Layout(batch * (max_splits < 1 ? 1 : max_splits), heads, rkv).total;
}

int64_t MlaDecodeWorkspaceItems(size_t bytes, int64_t heads, int64_t rkv) {
  if (heads < 1 || rkv < 1) return 0;
  const size_t per_item =
      (static_cast<size_t>(heads) * static_cast<size_t>(rkv + 1) + 1) * sizeof(float);
  int64_t n = static_cast<int64_t>(bytes / per_item);
  if (n > (int64_t{1} << 30)) n = int64_t{1} << 30;
  while (n > 0 && Layout(n, heads, rkv).total > bytes) --n;
  return n;
}

namespace {

// The attention kernel of a decode call: the f32 kernel or a tensor-core one
// (see MlaDecodeKernel).
cudaError_t LaunchDecodeAttend(const KernelParams& p, unsigned grid, int device,
                               cudaStream_t stream) {
  int major = 0, smem_limit = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  // The dynamic ring plus the static BlockItem must fit one block's opt-in
  // shared memory (227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86/89:
  // there DeepSeek's 576-wide rows do not fit and only the f32 kernel's
  // limits apply).
  // The kernel's code must be built for sm_80 or newer too: a build whose
  // only target is older JIT-compiles PTX without mma.sync (the kernel traps).
  cudaFuncAttributes built{};
  err = cudaFuncGetAttributes(&built, MlaDecodeMmaKernel<true>);
  if (err != cudaSuccess) return err;
  const size_t smem = MmaSmemBytes(static_cast<int>(p.a.rkv + p.a.dr));
  const bool mma_usable = MlaDecodeMmaSupported(p.a.rkv, p.a.dr, p.a.cache_dtype) && p.vec_loads &&
                          major >= 8 && built.binaryVersion >= 80 && built.ptxVersion >= 80 &&
                          smem + sizeof(BlockItem) <= static_cast<size_t>(smem_limit);
  MlaDecodeKernel kind = p.a.decode_kernel;
  if (kind == MlaDecodeKernel::kAuto) {
    kind = mma_usable ? MlaDecodeKernel::kTensorCore : MlaDecodeKernel::kF32;
  }
  if (kind == MlaDecodeKernel::kF32) return LaunchAttendForDtype(p, grid, stream);
  if ((kind != MlaDecodeKernel::kTensorCore && kind != MlaDecodeKernel::kTensorCoreBf16Q) ||
      !mma_usable) {
    return cudaErrorNotSupported;
  }
  void (*kernel)(KernelParams) =
      kind == MlaDecodeKernel::kTensorCore ? MlaDecodeMmaKernel<true> : MlaDecodeMmaKernel<false>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  MLAG_LAUNCH_PDL(kernel, grid, kThreads, smem, stream)(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMlaDecode(const MlaAttentionArgs& a, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  if (!ValidArgs(a) || a.num_rows != a.num_seqs) return cudaErrorInvalidValue;
  const int num_seqs = static_cast<int>(a.num_seqs);
  if (num_seqs == 0) return cudaSuccess;
  KernelParams p = BaseParams(a);
  p.prefill = 0;

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int extra = 0;
  if (workspace != nullptr) {
    const int64_t items = MlaDecodeWorkspaceItems(workspace_bytes, a.heads, a.rkv);
    if (items < num_seqs) return cudaErrorInvalidValue;
    int sms = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    // About two waves of blocks (one block per SM fits).
    const int64_t wanted = (2 * static_cast<int64_t>(sms) + p.head_groups - 1) / p.head_groups;
    const int64_t room = items - num_seqs;
    extra = static_cast<int>(room < wanted ? room : wanted);
  }
  const int64_t num_items = static_cast<int64_t>(num_seqs) + extra;
  if (num_items * p.head_groups > 0x7fffffff) return cudaErrorInvalidValue;
  if (extra > 0) {
    const WorkspaceLayout l = Layout(num_items, a.heads, a.rkv);
    char* base = static_cast<char*>(workspace);
    p.plan = reinterpret_cast<int*>(base);
    p.part_lse = reinterpret_cast<float*>(base + l.lse_offset);
    p.part_out = reinterpret_cast<float*>(base + l.out_offset);
    MLAG_LAUNCH_PDL(MlaDecodePlanKernel, 1, kPlanThreads, 0, stream)
    (a.seq_lens, num_seqs, p.capacity, extra, reinterpret_cast<int*>(base));
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  err = LaunchDecodeAttend(p, static_cast<unsigned>(num_items * p.head_groups), device, stream);
  if (err != cudaSuccess || extra == 0) return err;
  MLAG_LAUNCH_PDL(MlaDecodeCombineKernel,
                  dim3(static_cast<unsigned>(num_seqs), static_cast<unsigned>(a.heads)),
                  kCombineThreads, 0, stream)
  (p.plan, p.part_out, p.part_lse, static_cast<int>(a.heads), static_cast<int>(a.rkv), a.out_latent,
   a.lse);
  return cudaGetLastError();
}

cudaError_t LaunchMlaPrefill(const MlaAttentionArgs& a, cudaStream_t stream) {
  if (!ValidArgs(a) || a.query_start_loc == nullptr) return cudaErrorInvalidValue;
  if (a.num_rows == 0) return cudaSuccess;
  KernelParams p = BaseParams(a);
  p.prefill = 1;
  MLAG_LAUNCH_PDL(MlaPrefillClearKernel, static_cast<unsigned>(a.num_rows), 128, 0, stream)
  (a.query_start_loc, static_cast<int>(a.num_seqs), a.heads * a.rkv, static_cast<int>(a.heads),
   a.out_latent, a.lse);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.num_seqs == 0) return err;
  // Row blocks: sum_b ceil(q_len_b / rows) <= num_rows / rows + num_seqs.
  const int64_t items = (a.num_rows + p.rows_per_item - 1) / p.rows_per_item + a.num_seqs;
  if (items * p.head_groups > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchAttendForDtype(p, static_cast<unsigned>(items * p.head_groups), stream);
}

}  // namespace mlag::cuda
