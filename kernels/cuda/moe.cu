// CUDA kernels for kernels/moe.h: the router, and the routed experts as a
// device-planned grouped GEMM (see kernels/cuda/moe.cuh for the contract).
#include <algorithm>

#include "kernels/common/routing_math.h"
#include "kernels/cuda/fp8_gemm.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/tc_gemm.cuh"

namespace mlag::cuda {
namespace {

using tc_gemm::LaunchTcGemm;
using tc_gemm::SlotOfTile;
using tc_gemm::TcGemmArgs;
using tc_gemm::TcTileRows;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- Router --------------------------------------------------------------------

// Shared memory a router block may use; warps per block follow from E.
constexpr int kRouteSmemBytes = 48 * 1024;
constexpr int kRouteMaxWarps = 8;
// Without an opt-in: the fused gate's route smem for 4 warps of E = 1536.
constexpr size_t kGateRouteMaxSmemBytes = 48 * 1024;

// Per-warp scratch: scores s [E], selection scores [E], group scores [G].
size_t RouteWarpBytes(int E, int G) { return (2 * static_cast<size_t>(E) + G) * sizeof(float); }

int RouteWarpsPerBlock(int E, int G) {
  const size_t w = kRouteSmemBytes / RouteWarpBytes(E, G);
  return w > static_cast<size_t>(kRouteMaxWarps) ? kRouteMaxWarps : static_cast<int>(w);
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Butterfly sum: every lane ends with the same bits (each step adds the same
// two values in both lanes of a pair).
__device__ __forceinline__ float WarpSum(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// One warp per token. Block: RouteWarpsPerBlock warps; dynamic shared memory:
// that many RouteWarpBytes slices.
// Routes token t (logits `l`, E floats) with the calling warp; `s` is the
// warp's RouteWarpBytes of shared memory. Writes ids[t * K ..] and
// weights[t * K ..].
__device__ void RouteToken(const MoeRouteParams& p, const float* l, const float* __restrict__ bias,
                           float* s, int64_t t, int32_t* __restrict__ ids,
                           float* __restrict__ weights) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int E = p.num_experts;
  const int K = p.top_k;
  float* sel = s + E;
  float* group_score = sel + E;

  if (p.sigmoid) {
    for (int e = lane; e < E; e += kWarpSize) s[e] = RoutingSigmoid(l[e]);
  } else {
    float m = -INFINITY;
    for (int e = lane; e < E; e += kWarpSize) m = fmaxf(m, l[e]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += kWarpSize) {
      const float v = expf(l[e] - m);
      s[e] = v;
      sum += v;
    }
    sum = WarpSum(sum);
    for (int e = lane; e < E; e += kWarpSize) s[e] = s[e] / sum;
  }
  // Selection scores: the bias steers selection only (noaux_tc). NaN ranks
  // as -inf so that the ranking is a strict total order in every lane.
  const bool use_bias = p.method == kMoeNoauxTc && bias != nullptr;
  for (int e = lane; e < E; e += kWarpSize) {
    const float v = use_bias ? s[e] + bias[e] : s[e];
    sel[e] = v != v ? -INFINITY : v;
  }
  __syncwarp();

  if (p.method != kMoeGreedy) {
    const int G = p.n_group;
    const int per_group = E / G;
    for (int g = lane; g < G; g += kWarpSize) {
      const float* v = sel + static_cast<size_t>(g) * per_group;
      group_score[g] =
          p.method == kMoeNoauxTc ? GroupScoreTop2Sum(v, per_group) : GroupScoreMax(v, per_group);
    }
    __syncwarp();
    // A group is kept when fewer than topk_group groups rank before it: the
    // same set TopKSelect keeps on the host, the order being strict.
    for (int g = lane; g < G; g += kWarpSize) {
      const float gs = group_score[g];
      int rank = 0;
      for (int h = 0; h < G; ++h) rank += RoutingBetter(group_score[h], h, gs, g) ? 1 : 0;
      if (rank < p.topk_group) continue;
      float* v = sel + static_cast<size_t>(g) * per_group;
      for (int i = 0; i < per_group; ++i) v[i] = -INFINITY;
    }
    __syncwarp();
  }

  // Top-k: the k-th winner is the best entry ranking strictly after the
  // (k-1)-th, so nothing needs marking. Each lane scans its experts, then a
  // butterfly leaves the warp's best in every lane.
  int32_t* tok_ids = ids + t * K;
  float* tok_w = weights + t * K;
  float prev_s = 0.0f;
  int prev_i = -1;
  for (int k = 0; k < K; ++k) {
    float best_s = 0.0f;
    int best_i = -1;
    for (int e = lane; e < E; e += kWarpSize) {
      const float v = sel[e];
      if (prev_i >= 0 && !RoutingBetter(prev_s, prev_i, v, e)) continue;
      if (best_i < 0 || RoutingBetter(v, e, best_s, best_i)) {
        best_s = v;
        best_i = e;
      }
    }
    for (int off = kWarpSize / 2; off > 0; off /= 2) {
      const float os = __shfl_xor_sync(kFullMask, best_s, off);
      const int oi = __shfl_xor_sync(kFullMask, best_i, off);
      if (oi >= 0 && (best_i < 0 || RoutingBetter(os, oi, best_s, best_i))) {
        best_s = os;
        best_i = oi;
      }
    }
    // Unreachable with K <= (selectable experts), kept as a guard: ids
    // outside [0, E) are skipped by MoeExperts.
    if (best_i < 0) {
      for (int j = k + lane; j < K; j += kWarpSize) {
        tok_ids[j] = -1;
        tok_w[j] = 0.0f;
      }
      break;
    }
    if (lane == 0) {
      tok_ids[k] = best_i;
      tok_w[k] = s[best_i];
    }
    prev_s = best_s;
    prev_i = best_i;
  }
  __syncwarp();
  if (lane != 0) return;
  // Weights exactly as the host computes them, in k order (lane 0 rereads its
  // own writes).
  const bool sigmoid = p.sigmoid;
  if (p.norm_topk_prob) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += tok_w[k];
    if (sigmoid) sum += 1e-20f;
    for (int k = 0; k < K; ++k) tok_w[k] /= sum;
  }
  if (!p.norm_topk_prob || sigmoid) {
    for (int k = 0; k < K; ++k) tok_w[k] *= p.routed_scaling_factor;
  }
}

__global__ void __launch_bounds__(kRouteMaxWarps* kWarpSize)
    MoeRouteKernel(MoeRouteParams p, const float* __restrict__ logits, int64_t ld,
                   const float* __restrict__ bias, int64_t num_tokens, int32_t* __restrict__ ids,
                   float* __restrict__ weights) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  MLAG_DYNAMIC_SMEM(float, route_smem);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + warp;
  if (t >= num_tokens) return;  // the whole warp leaves; no block barrier follows
  float* s =
      route_smem + static_cast<size_t>(warp) * (2 * static_cast<size_t>(p.num_experts) + p.n_group);
  RouteToken(p, logits + t * ld, bias, s, t, ids, weights);
}

// ---- Router: the gate and the routing in one launch ----------------------------------

// Warps per CTA of the fused gate (one CTA per expert, each warp a quarter
// of the row).
constexpr int kGateWarps = 4;
// Tokens whose dot products one pass over a weight row accumulates.
constexpr int kGateTokenGroup = 8;

// Phase 1, CTA e: logits[t][e] = sum_d x[t][d] w[e][d] for every token. Warp
// q takes the q-th quarter of the row (128-column aligned), each lane sums
// its d = 4 * lane + 128 * i in order, a butterfly adds the lanes, and warp
// 0 adds the quarters in order: the same order for any T (a token's logits
// do not depend on the batch). Phase 2, the last CTA to finish (a counter,
// reset by that CTA for the next launch): one warp per token routes from the
// logits the other CTAs wrote, read with volatile loads (past the L1) into
// shared memory. Dynamic shared memory: kGateWarps RouteWarpBytes slices
// plus kGateWarps * E floats of logits.
__global__ void __launch_bounds__(kGateWarps* kWarpSize)
    MoeGateRouteKernel(MoeRouteParams p, const float* __restrict__ x, int64_t x_ld,
                       const float* __restrict__ w, int64_t D, const float* __restrict__ bias,
                       int64_t num_tokens, float* logits, int64_t ld, int32_t* counter,
                       int32_t* __restrict__ ids, float* __restrict__ weights) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  MLAG_DYNAMIC_SMEM(float, gate_smem);
  __shared__ float quarter[kGateWarps][kMoeGateRouteMaxTokens];
  __shared__ int last;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int E = p.num_experts;
  const int64_t e = blockIdx.x;
  const int64_t span = (D + 4 * 128 - 1) / (4 * 128) * 128;  // columns a quarter, 128-aligned
  const int64_t d0 = warp * span, d1 = D < d0 + span ? D : d0 + span;
  const float* we = w + e * D;
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kGateTokenGroup) {
    const int n =
        static_cast<int>(num_tokens - t0 < kGateTokenGroup ? num_tokens - t0 : kGateTokenGroup);
    float acc[kGateTokenGroup];
#pragma unroll
    for (int j = 0; j < kGateTokenGroup; ++j) acc[j] = 0.0f;
#pragma unroll 4
    for (int64_t d = d0 + 4 * lane; d < d1; d += 4 * kWarpSize) {
      const int m = d1 - d < 4 ? static_cast<int>(d1 - d) : 4;
      float wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) wv[i] = i < m ? we[d + i] : 0.0f;
#pragma unroll
      for (int j = 0; j < kGateTokenGroup; ++j) {
        if (j >= n) break;
        const float* xr = x + (t0 + j) * x_ld + d;
        for (int i = 0; i < m; ++i) acc[j] = fmaf(xr[i], wv[i], acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kGateTokenGroup; ++j) {
      if (j >= n) break;
      const float v = WarpSum(acc[j]);
      if (lane == 0) quarter[warp][t0 + j] = v;
    }
  }
  __syncthreads();
  if (warp == 0) {
    for (int64_t t = lane; t < num_tokens; t += kWarpSize) {
      float v = quarter[0][t];
      for (int q = 1; q < kGateWarps; ++q) v += quarter[q][t];
      logits[t * ld + e] = v;
    }
  }
  // Publish this CTA's logits, then count it in.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0;  // every CTA has counted: ready for the next launch
  float* s = gate_smem + static_cast<size_t>(warp) * (2 * static_cast<size_t>(E) + p.n_group);
  float* l = gate_smem +
             static_cast<size_t>(kGateWarps) * (2 * static_cast<size_t>(E) + p.n_group) +
             static_cast<size_t>(warp) * E;
  for (int64_t t = warp; t < num_tokens; t += kGateWarps) {
    const volatile float* row = logits + t * ld;
    for (int i = lane; i < E; i += kWarpSize) l[i] = row[i];
    __syncwarp();
    RouteToken(p, l, bias, s, t, ids, weights);
    __syncwarp();
  }
}

// ---- Routed experts: plan --------------------------------------------------------

constexpr int kPlanThreads = 1024;

// The local slot of pair i, or -1 when its expert is not held here.
__device__ __forceinline__ int SlotOf(const int32_t* __restrict__ ids,
                                      const int32_t* __restrict__ map, int i, int E, int L) {
  const int32_t e = ids[i];
  if (e < 0 || e >= E) return -1;
  const int32_t slot = map[e];
  return slot >= 0 && slot < L ? slot : -1;
}

// One CTA. Writes offsets[L+1] (first row of each slot), tile_offsets[L+1]
// (first row tile of `bm` rows of each slot), row_of[pairs] (the pair's row,
// or -1) and token_of_row[N]. Rows of a slot are in ascending pair order.
// Dynamic shared memory: L ints.
__global__ void __launch_bounds__(kPlanThreads)
    MoePlanKernel(const int32_t* __restrict__ ids, int pairs, int K,
                  const int32_t* __restrict__ map, int E, int L, int bm,
                  int32_t* __restrict__ offsets, int32_t* __restrict__ tile_offsets,
                  int32_t* __restrict__ row_of, int32_t* __restrict__ token_of_row) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  using BlockScan = cub::BlockScan<int32_t, kPlanThreads>;
  MLAG_DYNAMIC_SMEM(int32_t, cursor);  // counts, then the next free row per slot
  __shared__ int32_t chunk_slot[kPlanThreads];
  __shared__ int32_t chunk_row[kPlanThreads];
  __shared__ typename BlockScan::TempStorage scan_storage;
  const int tid = static_cast<int>(threadIdx.x);

  for (int s = tid; s < L; s += kPlanThreads) cursor[s] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += kPlanThreads) {
    const int slot = SlotOf(ids, map, i, E, L);
    if (slot >= 0) atomicAdd(&cursor[slot], 1);
  }
  __syncthreads();

  int32_t row_base = 0, tile_base = 0;
  for (int c = 0; c < L; c += kPlanThreads) {
    const int s = c + tid;
    const int32_t n = s < L ? cursor[s] : 0;
    const int32_t tiles = (n + bm - 1) / bm;
    int32_t row_excl, row_total, tile_excl, tile_total;
    BlockScan(scan_storage).ExclusiveSum(n, row_excl, row_total);
    __syncthreads();
    BlockScan(scan_storage).ExclusiveSum(tiles, tile_excl, tile_total);
    __syncthreads();
    if (s < L) {
      offsets[s] = row_base + row_excl;
      tile_offsets[s] = tile_base + tile_excl;
      cursor[s] = row_base + row_excl;
    }
    row_base += row_total;
    tile_base += tile_total;
  }
  if (tid == 0) {
    offsets[L] = row_base;
    tile_offsets[L] = tile_base;
  }
  __syncthreads();

  // Stable placement, 1024 pairs at a time: warp 0 walks the chunk's 32
  // warps-worth of slots in order; lanes with the same slot get consecutive
  // rows (by lane), and their leader advances the slot's cursor.
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int c = 0; c < pairs; c += kPlanThreads) {
    const int i = c + tid;
    chunk_slot[tid] = i < pairs ? SlotOf(ids, map, i, E, L) : -1;
    __syncthreads();
    if (warp == 0) {
      for (int w = 0; w < kPlanThreads / kWarpSize; ++w) {
        const int slot = chunk_slot[w * kWarpSize + lane];
        const unsigned peers = __match_any_sync(kFullMask, slot);
        const int leader = __ffs(peers) - 1;
        int32_t base = 0;
        if (slot >= 0 && lane == leader) {
          base = cursor[slot];
          cursor[slot] = base + __popc(peers);
        }
        base = __shfl_sync(kFullMask, base, leader);
        chunk_row[w * kWarpSize + lane] = slot >= 0 ? base + __popc(peers & lanes_below) : -1;
        __syncwarp();
      }
    }
    __syncthreads();
    if (i < pairs) {
      const int32_t row = chunk_row[tid];
      row_of[i] = row;
      if (row >= 0) token_of_row[row] = i / K;
    }
    // chunk_slot / chunk_row are rewritten only after the next barrier.
  }
}

// ---- Routed experts: grouped GEMM -------------------------------------------------

// C[r, c] = sum_j A[r, j] * B_slot[c, j] over the rows r of each slot, both
// operands K-contiguous. blockIdx.x is a row tile of the plan (slot found by
// binary search in tile_offsets), blockIdx.y a tile of BN output columns.
struct GroupedGemmArgs {
  const float* a;  // kGateUp: x (rows gathered via token_of_row); else act
  int64_t lda;
  const int32_t* token_of_row;  // kGateUp only
  const void* b;                // slot s at b + s * b_slot_stride; rows of length k
  int64_t b_slot_stride;
  // fp8 weights: row r of slot s has its 128-column block scales at
  // b_scales + s * b_scales_slot_stride + r * ceil(k / 128).
  const float* b_scales;
  int64_t b_scales_slot_stride;
  int n;  // output columns (kGateUp: I, up rows at b row n + c)
  int k;  // reduction length
  float* c;
  int64_t ldc;
  const int32_t* offsets;
  const int32_t* tile_offsets;
  int num_slots;
};

// A weight element as f32: f32 as is, bf16 widened (exact), fp8 e4m3 times
// its block scale `s` (the row's scales), rounded once (Fp8Dequantize).
__device__ __forceinline__ float WeightAsF32(const float* w, const float*, int64_t i) {
  return w[i];
}
__device__ __forceinline__ float WeightAsF32(const uint16_t* w, const float*, int64_t i) {
  return Bf16ToF32(w[i]);
}
__device__ __forceinline__ float WeightAsF32(const uint8_t* w, const float* s, int64_t i) {
  return F8E4M3ToF32(w[i]) * s[i / 128];
}

// WT: the weights' storage type, float, uint16_t (bf16) or uint8_t (fp8).
template <int BM, int BN, int BK, int TM, int TN, bool kGateUp, typename WT>
__global__ void __launch_bounds__((BM / TM) * (BN / TN)) MoeGroupedGemmKernel(GroupedGemmArgs p) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kColThreads = BN / TN;
  constexpr int kALoads = BM * BK / kThreads;
  constexpr int kBLoads = BN * BK / kThreads;
  constexpr int kNumB = kGateUp ? 2 : 1;
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0, "tile loads must divide");
  static_assert(kThreads % BK == 0, "a thread keeps its column of the k tile");

  const int tile = static_cast<int>(blockIdx.x);
  const int slot = SlotOfTile(p.tile_offsets, p.num_slots, tile);
  if (slot < 0) return;  // beyond the planned tiles
  const int row0 = p.offsets[slot] + (tile - p.tile_offsets[slot]) * BM;
  const int rows = min(BM, p.offsets[slot + 1] - row0);
  const int col0 = static_cast<int>(blockIdx.y) * BN;
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % kColThreads;
  const int ty = tid / kColThreads;
  // The k column a thread loads is the same for all its loads.
  const int load_k = tid % BK;

  // +1 padding: the transposed stores hit distinct banks.
  __shared__ float as[BK][BM + 1];
  __shared__ float bs[kNumB][BK][BN + 1];

  const float* a_row[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int m = (tid + i * kThreads) / BK;
    const float* ptr = nullptr;
    if (m < rows) {
      const int64_t r = kGateUp ? p.token_of_row[row0 + m] : row0 + m;
      ptr = p.a + r * p.lda;
    }
    a_row[i] = ptr;
  }
  const WT* b_slot = static_cast<const WT*>(p.b) + static_cast<int64_t>(slot) * p.b_slot_stride;
  const WT* b_row[kNumB][kBLoads];
  const float* s_row[kNumB][kBLoads];  // fp8 scales, else unused
  const int64_t scale_blocks = (p.k + 127) / 128;
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int c = col0 + (tid + i * kThreads) / BK;
#pragma unroll
    for (int h = 0; h < kNumB; ++h) {
      const int64_t r = static_cast<int64_t>(h) * p.n + c;
      b_row[h][i] = c < p.n ? b_slot + r * p.k : nullptr;
      s_row[h][i] = p.b_scales != nullptr && c < p.n
                        ? p.b_scales + slot * p.b_scales_slot_stride + r * scale_blocks
                        : nullptr;
    }
  }

  float acc[kNumB][TM][TN];
#pragma unroll
  for (int h = 0; h < kNumB; ++h) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[h][i][j] = 0.0f;
    }
  }

  for (int k0 = 0; k0 < p.k; k0 += BK) {
    const int kk = k0 + load_k;
    const bool k_ok = kk < p.k;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int m = (tid + i * kThreads) / BK;
      as[load_k][m] = a_row[i] != nullptr && k_ok ? a_row[i][kk] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int c = (tid + i * kThreads) / BK;
#pragma unroll
      for (int h = 0; h < kNumB; ++h) {
        bs[h][load_k][c] =
            b_row[h][i] != nullptr && k_ok ? WeightAsF32(b_row[h][i], s_row[h][i], kk) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < BK; ++j) {
      float a_frag[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) a_frag[i] = as[j][ty * TM + i];
#pragma unroll
      for (int h = 0; h < kNumB; ++h) {
#pragma unroll
        for (int n = 0; n < TN; ++n) {
          const float b = bs[h][j][tx + n * kColThreads];
#pragma unroll
          for (int i = 0; i < TM; ++i) acc[h][i][n] = fmaf(a_frag[i], b, acc[h][i][n]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = ty * TM + i;
    if (m >= rows) continue;
    float* c_row = p.c + static_cast<int64_t>(row0 + m) * p.ldc;
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      const int c = col0 + tx + n * kColThreads;
      if (c >= p.n) continue;
      if constexpr (kGateUp) {
        // silu(gate) * up, the host's expression.
        const float g = acc[0][i][n];
        c_row[c] = g / (1.0f + expf(-g)) * acc[kNumB - 1][i][n];
      } else {
        c_row[c] = acc[0][i][n];
      }
    }
  }
}

// Two tile shapes, chosen from the shapes alone (so a graph replays the same
// kernels): short tiles when experts get few rows each (decode), tall ones
// otherwise. Results are bitwise the same with either.
struct TileConfig {
  int bm;
};
constexpr int kTileK = 16;
constexpr int kTileN = 64;
constexpr TileConfig kSmallTiles{16};
constexpr TileConfig kLargeTiles{64};
// Average rows per local expert from which the tall tiles are used.
constexpr int64_t kLargeTileRows = 32;

template <bool kGateUp, typename WT>
cudaError_t LaunchGroupedGemm(const TileConfig& cfg, const GroupedGemmArgs& p, int max_tiles,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_tiles),
                  static_cast<unsigned>((p.n + kTileN - 1) / kTileN));
  auto* const kernel = cfg.bm == kLargeTiles.bm
                           ? MoeGroupedGemmKernel<64, kTileN, kTileK, 4, 4, kGateUp, WT>
                           : MoeGroupedGemmKernel<16, kTileN, kTileK, 1, 4, kGateUp, WT>;
  MLAG_LAUNCH_PDL(kernel, grid, 256, 0, stream)(p);
  return cudaGetLastError();
}

template <bool kGateUp>
cudaError_t LaunchGroupedGemm(DType w_dtype, const TileConfig& cfg, const GroupedGemmArgs& p,
                              int max_tiles, cudaStream_t stream) {
  switch (w_dtype) {
    case DType::kBF16:
      return LaunchGroupedGemm<kGateUp, uint16_t>(cfg, p, max_tiles, stream);
    case DType::kF8E4M3:
      if (p.b_scales == nullptr) return cudaErrorInvalidValue;
      return LaunchGroupedGemm<kGateUp, uint8_t>(cfg, p, max_tiles, stream);
    default:
      return LaunchGroupedGemm<kGateUp, float>(cfg, p, max_tiles, stream);
  }
}

// bf16 rows [rows, pitch] from f32 x [rows, cols] (row stride ld), zero
// from cols to pitch.
__global__ void __launch_bounds__(256)
    StageBf16RowsKernel(const float* __restrict__ x, int64_t ld, int64_t rows, int64_t cols,
                        int64_t pitch, uint16_t* __restrict__ out) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t n = rows * pitch;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / pitch, col = idx - r * pitch;
    out[idx] = col < cols ? F32ToBf16(x[r * ld + col]) : uint16_t{0};
  }
}

// ---- Routed experts: combine --------------------------------------------------------

constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* __restrict__ y, const int32_t* __restrict__ row_of,
                     const float* __restrict__ topk_weights, int64_t T, int K, int D,
                     float* __restrict__ out) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t n = T * D;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / D;
    const int64_t d = idx - t * D;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {  // k order: deterministic
      const int32_t row = row_of[t * K + k];
      if (row >= 0) acc += topk_weights[t * K + k] * y[static_cast<int64_t>(row) * D + d];
    }
    out[idx] = acc;
  }
}

// ---- Workspace layout ----------------------------------------------------------------

struct ExpertsLayout {
  size_t offsets, tile_offsets, row_of, token_of_row, act, y, x_staged, act_staged, total;
};

size_t AlignUp256(size_t v) { return (v + 255) / 256 * 256; }

// bf16 elements per staged row of `cols`: 16-byte rows for cp.async.
int64_t Bf16Pitch(int64_t cols) { return (cols + 7) / 8 * 8; }

// Byte offset of the e4m3 rows in a LaunchQuantizeFp8Rows region of
// [rows, cols] (its scales come first; Fp8QuantizedBytes).
size_t Fp8RowsOffset(int64_t rows, int64_t cols) {
  return AlignUp256(static_cast<size_t>(rows * ((cols + 127) / 128)) * sizeof(float));
}

// Activations staged for the tensor-core GEMMs: bf16 rows, or e4m3 rows and
// their scales, whichever the weights' dtype asks for.
size_t StagedBytes(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return std::max(static_cast<size_t>(rows * Bf16Pitch(cols)) * sizeof(uint16_t),
                  Fp8QuantizedBytes(rows, cols));
}

ExpertsLayout MakeExpertsLayout(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L) {
  const size_t pairs = static_cast<size_t>(T < 0 || K < 0 ? 0 : T * K);
  const size_t slots = static_cast<size_t>(L < 0 ? 0 : L) + 1;
  const size_t d = static_cast<size_t>(D < 0 ? 0 : D);
  const size_t i = static_cast<size_t>(I < 0 ? 0 : I);
  ExpertsLayout l{};
  size_t at = 0;
  l.offsets = at;
  at += AlignUp256(slots * sizeof(int32_t));
  l.tile_offsets = at;
  at += AlignUp256(slots * sizeof(int32_t));
  l.row_of = at;
  at += AlignUp256(pairs * sizeof(int32_t));
  l.token_of_row = at;
  at += AlignUp256(pairs * sizeof(int32_t));
  l.act = at;
  at += AlignUp256(pairs * i * sizeof(float));
  l.y = at;
  at += AlignUp256(pairs * d * sizeof(float));
  l.x_staged = at;
  at += AlignUp256(StagedBytes(T < 0 ? 0 : T, D));
  l.act_staged = at;
  at += AlignUp256(StagedBytes(static_cast<int64_t>(pairs), I));
  l.total = at;
  return l;
}

// Steps 2 and 3 of LaunchMoeExperts on tensor cores, after the plan (row
// tiles of `bm` rows): stage x (bf16, or e4m3 per row and 128-column block),
// gate_up (bf16 weights: act written in bf16, staged for down as it is; fp8:
// act in f32, then quantized like x), down -> y.
cudaError_t LaunchTensorCoreExperts(const MoeExpertsArgs& a, const ExpertsLayout& layout, int bm,
                                    int max_tiles, cudaStream_t stream) {
  char* ws = static_cast<char*>(a.workspace);
  const bool fp8 = a.w_dtype == DType::kF8E4M3;
  const int pairs = a.T * a.K;
  uint8_t* x_staged = reinterpret_cast<uint8_t*>(ws + layout.x_staged);
  uint8_t* act_staged = reinterpret_cast<uint8_t*>(ws + layout.act_staged);
  float* act = reinterpret_cast<float*>(ws + layout.act);
  cudaError_t err = cudaSuccess;

  TcGemmArgs gu{};
  if (fp8) {
    gu.a = x_staged + Fp8RowsOffset(a.T, a.D);
    gu.a_pitch = Fp8QuantizedPitch(a.D);
    gu.a_scales = reinterpret_cast<const float*>(x_staged);
    err = LaunchQuantizeFp8Rows(a.x, a.T, a.D, a.x_ld, const_cast<uint8_t*>(gu.a),
                                reinterpret_cast<float*>(x_staged), stream);
  } else {
    gu.a = x_staged;
    gu.a_pitch = Bf16Pitch(a.D) * static_cast<int64_t>(sizeof(uint16_t));
    const int64_t n = static_cast<int64_t>(a.T) * Bf16Pitch(a.D);
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535 * 8);
    MLAG_LAUNCH_PDL(StageBf16RowsKernel, static_cast<unsigned>(blocks), 256, 0, stream)
    (a.x, a.x_ld, a.T, a.D, Bf16Pitch(a.D), reinterpret_cast<uint16_t*>(x_staged));
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;
  gu.token_of_row = reinterpret_cast<const int32_t*>(ws + layout.token_of_row);
  gu.b = a.w_gate_up;
  gu.b_slot_stride = int64_t{2} * a.I * a.D;
  gu.b_scales = a.w_gate_up_scales;
  gu.b_scales_slot_stride = int64_t{2} * a.I * ((a.D + 127) / 128);
  gu.n = a.I;
  gu.k = a.D;
  gu.c = fp8 ? static_cast<void*>(act) : static_cast<void*>(act_staged);
  gu.ldc = fp8 ? a.I : Bf16Pitch(a.I);
  gu.c_zero_to = static_cast<int>(Bf16Pitch(a.I));
  gu.offsets = reinterpret_cast<const int32_t*>(ws + layout.offsets);
  gu.tile_offsets = reinterpret_cast<const int32_t*>(ws + layout.tile_offsets);
  gu.num_slots = a.L;

  TcGemmArgs dn = gu;
  dn.token_of_row = nullptr;
  dn.b = a.w_down;
  dn.b_slot_stride = static_cast<int64_t>(a.D) * a.I;
  dn.b_scales = a.w_down_scales;
  dn.b_scales_slot_stride = static_cast<int64_t>(a.D) * ((a.I + 127) / 128);
  dn.n = a.D;
  dn.k = a.I;
  dn.c = ws + layout.y;
  dn.ldc = a.D;
  dn.c_zero_to = 0;
  if (fp8) {
    dn.a = act_staged + Fp8RowsOffset(pairs, a.I);
    dn.a_pitch = Fp8QuantizedPitch(a.I);
    dn.a_scales = reinterpret_cast<const float*>(act_staged);
  } else {
    dn.a = act_staged;
    dn.a_pitch = Bf16Pitch(a.I) * static_cast<int64_t>(sizeof(uint16_t));
    dn.a_scales = nullptr;
  }

  // I == 0: no activations; down then sums nothing (k = 0: y = 0).
  if (a.I > 0) {
    err = fp8 ? LaunchTcGemm<uint8_t, true>(bm, gu, max_tiles, stream)
              : LaunchTcGemm<uint16_t, true>(bm, gu, max_tiles, stream);
    if (err != cudaSuccess) return err;
    if (fp8) {
      err = LaunchQuantizeFp8Rows(act, pairs, a.I, a.I, const_cast<uint8_t*>(dn.a),
                                  const_cast<float*>(dn.a_scales), stream);
      if (err != cudaSuccess) return err;
    }
  }
  return fp8 ? LaunchTcGemm<uint8_t, false>(bm, dn, max_tiles, stream)
             : LaunchTcGemm<uint16_t, false>(bm, dn, max_tiles, stream);
}

}  // namespace

cudaError_t LaunchMoeRoute(const MoeRouteParams& params, const float* logits, int64_t logits_ld,
                           const float* correction_bias, int64_t num_tokens, int32_t* topk_ids,
                           float* topk_weights, cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  const int E = params.num_experts;
  const int G = params.n_group;
  if (E <= 0 || E > kMoeRouteMaxExperts || G <= 0 || G > E || E % G != 0 || params.topk_group < 1 ||
      params.topk_group > G || params.top_k <= 0 || params.top_k > E) {
    return cudaErrorInvalidValue;
  }
  const int warps = RouteWarpsPerBlock(E, G);
  if (warps < 1) return cudaErrorInvalidValue;
  const int64_t blocks = (num_tokens + warps - 1) / warps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(warps) * RouteWarpBytes(E, G);
  MLAG_LAUNCH_PDL(MoeRouteKernel, static_cast<unsigned>(blocks), warps * kWarpSize, smem, stream)
  (params, logits, logits_ld, correction_bias, num_tokens, topk_ids, topk_weights);
  return cudaGetLastError();
}

bool MoeGateRouteFits(int E, int G) {
  return E > 0 && G > 0 && E <= kMoeRouteMaxExperts &&
         kGateWarps * (RouteWarpBytes(E, G) + static_cast<size_t>(E) * sizeof(float)) <=
             kGateRouteMaxSmemBytes;
}

cudaError_t LaunchMoeGateRoute(const MoeRouteParams& params, const float* x, int64_t x_ld,
                               const float* w_gate, int64_t D, const float* correction_bias,
                               int64_t num_tokens, float* logits, int64_t logits_ld,
                               int32_t* counter, int32_t* topk_ids, float* topk_weights,
                               cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  const int E = params.num_experts;
  const int G = params.n_group;
  if (E <= 0 || E > kMoeRouteMaxExperts || G <= 0 || G > E || E % G != 0 || params.topk_group < 1 ||
      params.topk_group > G || params.top_k <= 0 || params.top_k > E ||
      num_tokens > kMoeGateRouteMaxTokens || D < 0 || counter == nullptr) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = kGateWarps * (RouteWarpBytes(E, G) + static_cast<size_t>(E) * sizeof(float));
  if (smem > kGateRouteMaxSmemBytes) return cudaErrorInvalidValue;
  MLAG_LAUNCH_PDL(MoeGateRouteKernel, static_cast<unsigned>(E), kGateWarps * kWarpSize, smem,
                  stream)
  (params, x, x_ld, w_gate, D, correction_bias, num_tokens, logits, logits_ld, counter, topk_ids,
   topk_weights);
  return cudaGetLastError();
}

size_t MoeExpertsWorkspaceBytes(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L) {
  return MakeExpertsLayout(T, K, D, I, L).total;
}

cudaError_t MoeExpertsOnTensorCores(int device, DType w_dtype, bool* yes) {
  *yes = false;
  const int needed = w_dtype == DType::kBF16 ? 80 : w_dtype == DType::kF8E4M3 ? 89 : 0;
  return needed == 0 ? cudaSuccess : tc_gemm::TcGemmSupported(device, needed, yes);
}

cudaError_t LaunchMoeExperts(const MoeExpertsArgs& a, cudaStream_t stream) {
  if (a.T < 0 || a.K < 0 || a.E < 0 || a.L < 0 || a.D < 0 || a.I < 0 || a.L > kMoeMaxLocalExperts ||
      a.D > kMoeMaxColumns || a.I > kMoeMaxColumns ||
      static_cast<int64_t>(a.T) * a.K > 0x7fffffff - 64) {  // room for the tile round-up
    return cudaErrorInvalidValue;
  }
  const ExpertsLayout layout = MakeExpertsLayout(a.T, a.K, a.D, a.I, a.L);
  if (a.workspace_bytes < layout.total || (a.workspace == nullptr && layout.total > 0)) {
    return cudaErrorInvalidValue;
  }
  if (a.w_dtype == DType::kF8E4M3 &&
      (a.w_gate_up_scales == nullptr || a.w_down_scales == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.T == 0 || a.D == 0) return cudaSuccess;
  char* ws = static_cast<char*>(a.workspace);
  int32_t* row_of = reinterpret_cast<int32_t*>(ws + layout.row_of);
  float* y = reinterpret_cast<float*>(ws + layout.y);
  const int pairs = a.T * a.K;

  if (pairs > 0) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    bool tensor_cores = false;
    err = MoeExpertsOnTensorCores(device, a.w_dtype, &tensor_cores);
    if (err != cudaSuccess) return err;
    int32_t* offsets = reinterpret_cast<int32_t*>(ws + layout.offsets);
    int32_t* tile_offsets = reinterpret_cast<int32_t*>(ws + layout.tile_offsets);
    int32_t* token_of_row = reinterpret_cast<int32_t*>(ws + layout.token_of_row);
    float* act = reinterpret_cast<float*>(ws + layout.act);
    const TileConfig cfg = static_cast<int64_t>(pairs) >= kLargeTileRows * (a.L > 0 ? a.L : 1)
                               ? kLargeTiles
                               : kSmallTiles;
    const int bm = tensor_cores ? TcTileRows(pairs, a.L) : cfg.bm;
    MLAG_LAUNCH_PDL(MoePlanKernel, 1, kPlanThreads, static_cast<size_t>(a.L) * sizeof(int32_t),
                    stream)
    (a.topk_ids, pairs, a.K, a.expert_map, a.E, a.L, bm, offsets, tile_offsets, row_of,
     token_of_row);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    // Worst case over every routing: sum over slots of ceil(n_s / bm).
    const int max_tiles = (pairs + bm - 1) / bm + (a.L < pairs ? a.L : pairs);

    if (tensor_cores) {
      err = LaunchTensorCoreExperts(a, layout, bm, max_tiles, stream);
      if (err != cudaSuccess) return err;
    } else {
      GroupedGemmArgs gu{};
      gu.a = a.x;
      gu.lda = a.x_ld;
      gu.token_of_row = token_of_row;
      gu.b = a.w_gate_up;
      gu.b_slot_stride = int64_t{2} * a.I * a.D;
      gu.n = a.I;
      gu.k = a.D;
      gu.c = act;
      gu.ldc = a.I;
      gu.offsets = offsets;
      gu.tile_offsets = tile_offsets;
      gu.num_slots = a.L;
      // I == 0: no activations; the down GEMM then sums nothing (y = 0).
      gu.b_scales = a.w_gate_up_scales;
      gu.b_scales_slot_stride = int64_t{2} * a.I * ((a.D + 127) / 128);
      if (a.I > 0) {
        err = LaunchGroupedGemm<true>(a.w_dtype, cfg, gu, max_tiles, stream);
        if (err != cudaSuccess) return err;
      }

      GroupedGemmArgs dn = gu;
      dn.a = act;
      dn.lda = a.I;
      dn.token_of_row = nullptr;
      dn.b = a.w_down;
      dn.b_slot_stride = static_cast<int64_t>(a.D) * a.I;
      dn.n = a.D;
      dn.k = a.I;
      dn.c = y;
      dn.ldc = a.D;
      dn.b_scales = a.w_down_scales;
      dn.b_scales_slot_stride = static_cast<int64_t>(a.D) * ((a.I + 127) / 128);
      err = LaunchGroupedGemm<false>(a.w_dtype, cfg, dn, max_tiles, stream);
      if (err != cudaSuccess) return err;
    }
  }

  const int64_t n = static_cast<int64_t>(a.T) * a.D;
  int64_t blocks = (n + kCombineThreads - 1) / kCombineThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  MLAG_LAUNCH_PDL(MoeCombineKernel, static_cast<unsigned>(blocks), kCombineThreads, 0, stream)
  (y, row_of, a.topk_weights, a.T, a.K, a.D, a.out);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
