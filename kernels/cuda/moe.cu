// CUDA kernels for kernels/moe.h: the router, and the routed experts as a
// device-planned grouped GEMM (see kernels/cuda/moe.cuh for the contract).
#include <algorithm>

#include "kernels/common/routing_math.h"
#include "kernels/cuda/fp8_gemm.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/warp_ops.cuh"

namespace mlag::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- Router --------------------------------------------------------------------

// Shared memory a router block may use; warps per block follow from E.
constexpr int kRouteSmemBytes = 48 * 1024;
constexpr int kRouteMaxWarps = 8;

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
__global__ void __launch_bounds__(kRouteMaxWarps* kWarpSize)
    MoeRouteKernel(MoeRouteParams p, const float* __restrict__ logits, int64_t ld,
                   const float* __restrict__ bias, int64_t num_tokens, int32_t* __restrict__ ids,
                   float* __restrict__ weights) {
  MLAG_DYNAMIC_SMEM(float, route_smem);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + warp;
  if (t >= num_tokens) return;  // the whole warp leaves; no block barrier follows
  const int E = p.num_experts;
  const int K = p.top_k;
  float* s = route_smem + static_cast<size_t>(warp) * (2 * static_cast<size_t>(E) + p.n_group);
  float* sel = s + E;
  float* group_score = sel + E;
  const float* l = logits + t * ld;

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

// The slot of row tile `tile` (tiles past the plan: -1).
__device__ __forceinline__ int SlotOfTile(const int32_t* tile_offsets, int L, int tile) {
  if (tile >= tile_offsets[L]) return -1;
  int lo = 0, hi = L - 1;  // the last slot whose first tile is <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

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
  MLAG_LAUNCH(kernel, grid, 256, 0, stream)(p);
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

// ---- Routed experts: grouped GEMM on tensor cores (bf16 and fp8 weights) ------------
//
// The weights are the bulk of a decode step's bytes, so this kernel is built
// to stream them at the copy bandwidth: the weights' rows (the output
// features) are the mma's M dimension and the slot's rows (tokens) its N
// ("swap AB": a decode expert has a handful of rows, a 16-wide M would waste
// 15/16 of the tensor core on them, an 8-wide N wastes at most 7/8 of an
// instruction that is nowhere near the bottleneck).
//
// A CTA (4 warps) owns 64 weight rows and a row tile of BT = 8 NT slot rows:
//   gate_up: features [f0, f0 + 32) of the slot's gate (warps 0, 1) and up
//            (warps 2, 3) rows, so that silu(gate) * up is formed in the
//            epilogue (one exchange through shared memory);
//   down:    features [f0, f0 + 64).
// Per stage it copies 128 bytes of each weight row (64 bf16 or 128 e4m3,
// one fp8 scale block) and of each activation row with 16-byte cp.async into
// a TcStages-deep ring; chunk c of row r sits at chunk c ^ (r % 8) of the
// row's 128 bytes, so the 8 rows one ldmatrix phase (or one B-fragment load)
// touches fall in 8 different bank groups. Per 32-byte k step, warp w takes
// its 16 x 32-byte A fragment with one ldmatrix .x4 and each 8-row B
// fragment with two 32-bit loads (kernels/cuda/warp_ops.cuh: the bf16
// m16n8k16 and e4m3 m16n8k32 fragments have the same byte layout).
//   bf16: d += W x on the f32 accumulator, x rounded to bf16 once (as the
//         bf16 cuBLASLt matmul of Linear does);
//   fp8:  each 128-wide K block is summed in its own f32 fragment and added
//         as part * (sw * sx), the weight row's and the activation row's
//         block scales (as the dense FP8 GEMM, kernels/cuda/fp8_gemm.cuh),
//         x quantized per row and 128-column block (LaunchQuantizeFp8Rows).
//
// Design figures (H200: 132 SMs, ~4.8 TB/s; DeepSeek-V2-Lite experts, D =
// 2048, I = 1408, bf16, batch 1, 6 experts): gate_up runs 6 x 44 = 264 CTAs
// (2 per SM, one wave), down 6 x 32 = 192 (one wave at <= 2 per SM). A BT = 8
// CTA has a 5-stage ring of 9 KB (45 KB of shared memory), 4 stages = 32 KB
// of weights in flight, so 48-64 KB per SM against the ~30 KB that Little's
// law asks of each SM at that bandwidth (~0.8 us latency): the weights stream
// at the copy bandwidth once the ring is full; the fill (~1 us) and the
// epilogue against 12-22 us of streaming per GEMM predict ~85% of the copy
// bandwidth for the routed experts at batch 1, and the same up to batch 64
// (at most 6 rows per expert: one BT = 8 tile). Every CTA reads its own
// weight rows once; the activation tile (1-8 KB per stage) comes from L2.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // weight rows per CTA
constexpr int kTcRowBytes = 128;        // bytes of each row per stage
constexpr int kTcChunks = kTcRowBytes / 16;

__host__ __device__ constexpr int TcStages(int bt) { return bt <= 8 ? 5 : bt <= 16 ? 4 : 3; }
__host__ __device__ constexpr size_t TcSmemBytes(int bt) {
  return static_cast<size_t>(TcStages(bt)) * (kTcRows + bt) * kTcRowBytes;
}
static_assert(TcSmemBytes(64) <= 48 * 1024, "every ring fits the default dynamic shared memory");
static_assert(TcSmemBytes(8) <= 48 * 1024 && TcSmemBytes(16) <= 48 * 1024 &&
                  TcSmemBytes(32) <= 48 * 1024,
              "every ring fits the default dynamic shared memory");

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
__device__ __forceinline__ int TcChunk(int row, int chunk) {
  return row * kTcChunks + (chunk ^ (row & 7));
}

struct TcGemmArgs {
  // Activations, staged: bf16 or e4m3 rows of a_pitch bytes (a multiple of
  // 16), zero from the row's k values to a_pitch. gate_up: one row per token
  // (gathered through token_of_row); down: one row per plan row.
  const uint8_t* a;
  int64_t a_pitch;
  const float* a_scales;  // fp8: [staged rows, ceil(k / 128)]
  const int32_t* token_of_row;
  const void* b;  // slot s at b + s * b_slot_stride elements; rows of k
  int64_t b_slot_stride;
  const float* b_scales;  // fp8: as GroupedGemmArgs
  int64_t b_scales_slot_stride;
  int n, k;
  void* c;  // gate_up: bf16 act (bf16 weights) or f32 act (fp8); down: f32 y
  int64_t ldc;
  int c_zero_to;  // gate_up bf16: columns [n, c_zero_to) of each row written 0
  const int32_t* offsets;
  const int32_t* tile_offsets;
  int num_slots;
};

// WT: uint16_t (bf16) or uint8_t (e4m3). kVecW: weight rows are 16-byte
// aligned (k * sizeof(WT) % 16 == 0), copied with cp.async; otherwise element
// by element (odd K; no checkpoint of the supported models has one).
template <typename WT, bool kGateUp, int NT, bool kVecW>
__global__ void __launch_bounds__(kTcThreads) MoeTcGemmKernel(TcGemmArgs p) {
  constexpr int BT = 8 * NT;
  constexpr int S = TcStages(BT);
  constexpr bool kFp8 = sizeof(WT) == 1;
  constexpr int kStageBytes = (kTcRows + BT) * kTcRowBytes;
  constexpr int kALoads = (BT * kTcChunks + kTcThreads - 1) / kTcThreads;
  MLAG_DYNAMIC_SMEM(unsigned char, smem);

  const int slot = SlotOfTile(p.tile_offsets, p.num_slots, static_cast<int>(blockIdx.x));
  if (slot < 0) return;
  const int row0 = p.offsets[slot] + (static_cast<int>(blockIdx.x) - p.tile_offsets[slot]) * BT;
  const int rows = min(BT, p.offsets[slot + 1] - row0);
  const int f0 = static_cast<int>(blockIdx.y) * (kGateUp ? kTcRows / 2 : kTcRows);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t k = p.k;
  const int64_t row_bytes = k * static_cast<int64_t>(sizeof(WT));
  const int nk = static_cast<int>((row_bytes + kTcRowBytes - 1) / kTcRowBytes);

  // Global weight row of tile row j, or -1 past the features.
  auto weight_row = [&](int j) -> int64_t {
    const int f = kGateUp ? f0 + (j & 31) : f0 + j;
    if (f >= p.n) return -1;
    return kGateUp && j >= 32 ? static_cast<int64_t>(p.n) + f : f;
  };
  const WT* b_slot = static_cast<const WT*>(p.b) + static_cast<int64_t>(slot) * p.b_slot_stride;
  // This thread's copies: weight rows tid / 8 + 16 i, chunk tid % 8;
  // activation chunks tid + 128 i.
  const int ld_chunk = tid % kTcChunks;
  const uint8_t* w_src[kTcRows * kTcChunks / kTcThreads];
#pragma unroll
  for (int i = 0; i < kTcRows * kTcChunks / kTcThreads; ++i) {
    const int64_t r = weight_row(tid / kTcChunks + 16 * i);
    w_src[i] = r >= 0 ? reinterpret_cast<const uint8_t*>(b_slot + r * k) : nullptr;
  }
  const uint8_t* a_src[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int idx = tid + i * kTcThreads;
    const int m = idx / kTcChunks;
    const uint8_t* src = nullptr;
    if (idx < BT * kTcChunks && m < rows) {
      const int64_t r = kGateUp ? p.token_of_row[row0 + m] : row0 + m;
      src = p.a + r * p.a_pitch;
    }
    a_src[i] = src;
  }

  auto load_stage = [&](int kt, int s) {
    unsigned char* st = smem + s * kStageBytes;
    const int64_t byte0 = static_cast<int64_t>(kt) * kTcRowBytes;
#pragma unroll
    for (int i = 0; i < kTcRows * kTcChunks / kTcThreads; ++i) {
      const int j = tid / kTcChunks + 16 * i;
      const int64_t byte = byte0 + ld_chunk * 16;
      unsigned char* dst = st + TcChunk(j, ld_chunk) * 16;
      if constexpr (kVecW) {
        const bool in = w_src[i] != nullptr && byte < row_bytes;
        CpAsync16(dst, in ? w_src[i] + byte : p.b, in ? 16 : 0);
      } else {
        WT* d = reinterpret_cast<WT*>(dst);
        for (int e = 0; e < 16 / static_cast<int>(sizeof(WT)); ++e) {
          const int64_t el = byte / static_cast<int64_t>(sizeof(WT)) + e;
          d[e] = w_src[i] != nullptr && el < k ? reinterpret_cast<const WT*>(w_src[i])[el] : WT{0};
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int idx = tid + i * kTcThreads;
      if (idx >= BT * kTcChunks) break;
      const int m = idx / kTcChunks, ch = idx % kTcChunks;
      const int64_t byte = byte0 + ch * 16;
      const bool in = a_src[i] != nullptr && byte < p.a_pitch;
      CpAsync16(st + kTcRows * kTcRowBytes + TcChunk(m, ch) * 16, in ? a_src[i] + byte : p.a,
                in ? 16 : 0);
    }
  };

  // One commit per slot, loaded or not, keeps the group count uniform.
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) load_stage(s, s);
    CpAsyncCommit();
  }

  // fp8 scales of this thread's two weight rows and 2 NT activation rows.
  const int64_t scale_blocks = (k + 127) / 128;
  const float* sw_row[2] = {nullptr, nullptr};
  int sx_row[NT][2];  // staged activation row of each of this thread's columns, or -1
  if constexpr (kFp8) {
    for (int h = 0; h < 2; ++h) {
      const int64_t r = weight_row(16 * warp + g + 8 * h);
      if (r >= 0) {
        sw_row[h] =
            p.b_scales + static_cast<int64_t>(slot) * p.b_scales_slot_stride + r * scale_blocks;
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = nt * 8 + 2 * c + h;
      sx_row[nt][h] = !kFp8 || m >= rows ? -1 : kGateUp ? p.token_of_row[row0 + m] : row0 + m;
    }
  }

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }
  // ldmatrix: lane l gives row l % 8 (+ 8 for lanes 8-15, 24-31) of the
  // warp's 16 rows, 16-byte column block l / 16 of the k step.
  const int a_row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
  const int a_half = lane >> 4;

  for (int kt = 0; kt < nk; ++kt) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free
    if (kt + S - 1 < nk) load_stage(kt + S - 1, (kt + S - 1) % S);
    CpAsyncCommit();

    float w_scale[2] = {0.0f, 0.0f};
    if constexpr (kFp8) {
      for (int h = 0; h < 2; ++h) w_scale[h] = sw_row[h] != nullptr ? sw_row[h][kt] : 0.0f;
    }
    float part[NT][4];
    if constexpr (kFp8) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) part[nt][e] = 0.0f;
      }
    }
    const unsigned char* st = smem + (kt % S) * kStageBytes;
    const unsigned char* xs = st + kTcRows * kTcRowBytes;
    // Wide tiles keep NT independent mmas per k step without unrolling the
    // k steps too (which would hold every step's B fragments in registers).
#pragma unroll(NT >= 4 ? 1 : kTcChunks / 2)
    for (int ks = 0; ks < kTcChunks / 2; ++ks) {
      uint32_t a[4];
      LdMatrixX4(a, st + TcChunk(a_row, 2 * ks + a_half) * 16);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int m = nt * 8 + g;
        const uint32_t b0 =
            *reinterpret_cast<const uint32_t*>(xs + TcChunk(m, 2 * ks) * 16 + 4 * c);
        const uint32_t b1 =
            *reinterpret_cast<const uint32_t*>(xs + TcChunk(m, 2 * ks + 1) * 16 + 4 * c);
        if constexpr (kFp8) {
          MmaE4M3(part[nt], a, b0, b1);
        } else {
          MmaBf16(acc[nt], a, b0, b1);
        }
      }
    }
    if constexpr (kFp8) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float x_scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          x_scale[h] = sx_row[nt][h] >= 0 ? p.a_scales[sx_row[nt][h] * scale_blocks + kt] : 0.0f;
        }
        acc[nt][0] += part[nt][0] * (w_scale[0] * x_scale[0]);
        acc[nt][1] += part[nt][1] * (w_scale[0] * x_scale[1]);
        acc[nt][2] += part[nt][2] * (w_scale[1] * x_scale[0]);
        acc[nt][3] += part[nt][3] * (w_scale[1] * x_scale[1]);
      }
    }
  }

  if constexpr (kGateUp) {
    // Warps 2, 3 hand their up values to warps 0, 1 (same lanes, same
    // features) through the drained ring.
    CpAsyncWaitAll();
    __syncthreads();
    float* up_s = reinterpret_cast<float*>(smem);  // [2 warps][32 lanes][NT * 4]
    if (warp >= 2) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          up_s[((warp - 2) * 32 + lane) * NT * 4 + nt * 4 + e] = acc[nt][e];
      }
    }
    __syncthreads();
    if (warp >= 2) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = nt * 8 + 2 * c + (e & 1);
        const int f = f0 + 16 * warp + g + 8 * (e >> 1);
        if (m >= rows) continue;
        const int64_t at = static_cast<int64_t>(row0 + m) * p.ldc + f;
        if (f < p.n) {
          // silu(gate) * up, the host's expression.
          const float gate = acc[nt][e];
          const float v =
              gate / (1.0f + expf(-gate)) * up_s[(warp * 32 + lane) * NT * 4 + nt * 4 + e];
          if constexpr (kFp8) {
            static_cast<float*>(p.c)[at] = v;
          } else {
            static_cast<uint16_t*>(p.c)[at] = F32ToBf16(v);
          }
        } else if (!kFp8 && f < p.c_zero_to) {
          static_cast<uint16_t*>(p.c)[at] = 0;
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = nt * 8 + 2 * c + (e & 1);
        const int f = f0 + 16 * warp + g + 8 * (e >> 1);
        if (m < rows && f < p.n) {
          static_cast<float*>(p.c)[static_cast<int64_t>(row0 + m) * p.ldc + f] = acc[nt][e];
        }
      }
    }
  }
}

// bf16 rows [rows, pitch] from f32 x [rows, cols] (row stride ld), zero
// from cols to pitch.
__global__ void __launch_bounds__(256)
    StageBf16RowsKernel(const float* __restrict__ x, int64_t ld, int64_t rows, int64_t cols,
                        int64_t pitch, uint16_t* __restrict__ out) {
  const int64_t n = rows * pitch;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / pitch, col = idx - r * pitch;
    out[idx] = col < cols ? F32ToBf16(x[r * ld + col]) : uint16_t{0};
  }
}

// Row tile height from the shapes alone (a graph replays the same kernels):
// the smallest of 8, 16, 32, 64 that holds the average rows per local
// expert, so that an expert's weights are read by as few row tiles as
// possible (each reads them in full) without idling the mma's N.
int TcTileRows(int64_t pairs, int64_t L) {
  const int64_t experts = std::max<int64_t>(1, std::min(L, pairs));
  const int64_t avg = (pairs + experts - 1) / experts;
  return avg <= 8 ? 8 : avg <= 16 ? 16 : avg <= 32 ? 32 : 64;
}

template <typename WT, bool kGateUp, int NT>
cudaError_t LaunchTcGemmNt(const TcGemmArgs& p, int max_tiles, cudaStream_t stream) {
  const int features = kGateUp ? kTcRows / 2 : kTcRows;
  const dim3 grid(static_cast<unsigned>(max_tiles),
                  static_cast<unsigned>((p.n + features - 1) / features));
  const bool vec_w = p.k * static_cast<int64_t>(sizeof(WT)) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.b) % 16 == 0;
  auto* const kernel =
      vec_w ? MoeTcGemmKernel<WT, kGateUp, NT, true> : MoeTcGemmKernel<WT, kGateUp, NT, false>;
  MLAG_LAUNCH(kernel, grid, kTcThreads, TcSmemBytes(8 * NT), stream)(p);
  return cudaGetLastError();
}

template <typename WT, bool kGateUp>
cudaError_t LaunchTcGemm(int tile_rows, const TcGemmArgs& p, int max_tiles, cudaStream_t stream) {
  switch (tile_rows) {
    case 8:
      return LaunchTcGemmNt<WT, kGateUp, 1>(p, max_tiles, stream);
    case 16:
      return LaunchTcGemmNt<WT, kGateUp, 2>(p, max_tiles, stream);
    case 32:
      return LaunchTcGemmNt<WT, kGateUp, 4>(p, max_tiles, stream);
    default:
      return LaunchTcGemmNt<WT, kGateUp, 8>(p, max_tiles, stream);
  }
}

// ---- Routed experts: combine --------------------------------------------------------

constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* __restrict__ y, const int32_t* __restrict__ row_of,
                     const float* __restrict__ topk_weights, int64_t T, int K, int D,
                     float* __restrict__ out) {
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
    MLAG_LAUNCH(StageBf16RowsKernel, static_cast<unsigned>(blocks), 256, 0, stream)
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
  MLAG_LAUNCH(MoeRouteKernel, static_cast<unsigned>(blocks), warps * kWarpSize, smem, stream)
  (params, logits, logits_ld, correction_bias, num_tokens, topk_ids, topk_weights);
  return cudaGetLastError();
}

size_t MoeExpertsWorkspaceBytes(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L) {
  return MakeExpertsLayout(T, K, D, I, L).total;
}

cudaError_t MoeExpertsOnTensorCores(int device, DType w_dtype, bool* yes) {
  *yes = false;
  const int needed = w_dtype == DType::kBF16 ? 80 : w_dtype == DType::kF8E4M3 ? 89 : 0;
  if (needed == 0) return cudaSuccess;
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  // The kernels' code must be built for such a target too (PTX of an older
  // one would trap).
  cudaFuncAttributes built{};
  err = cudaFuncGetAttributes(&built, MoeTcGemmKernel<uint8_t, true, 1, true>);
  if (err != cudaSuccess) return err;
  *yes =
      major * 10 + minor >= needed && built.binaryVersion >= needed && built.ptxVersion >= needed;
  return cudaSuccess;
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
    MLAG_LAUNCH(MoePlanKernel, 1, kPlanThreads, static_cast<size_t>(a.L) * sizeof(int32_t), stream)
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
  MLAG_LAUNCH(MoeCombineKernel, static_cast<unsigned>(blocks), kCombineThreads, 0, stream)
  (y, row_of, a.topk_weights, a.T, a.K, a.D, a.out);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
