// The grouped GEMM on tensor cores behind the routed experts
// (kernels/cuda/moe.cu: bf16 and fp8 weights) and the dense FP8 block-scaled
// GEMM (kernels/cuda/fp8_gemm.cu). Device code and its launchers, included by
// those two .cu files only.
//
// C[r, f] = sum_k A[r, k] W_slot[f, k] for the rows r of each slot (an
// expert; a dense GEMM is one slot whose rows are the tile's rows), both
// operands K-contiguous. The weights are the bulk of a decode step's bytes,
// so this kernel is built to stream them at the copy bandwidth: the weights' rows (the output
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
// at the copy bandwidth once the ring is full. gate_up moves 69 MB (14 us at
// 4.8 TB/s), down 35 MB (7 us); a ~1 us fill and the epilogue against that,
// and ~90% of the copy bandwidth reachable by any streaming kernel, predict
// ~80% of the copy bandwidth for the routed experts at batch 1. Up to batch
// 64 (<= 6 rows per expert on average: one BT = 8 tile each, every expert
// touched, 2816 gate_up CTAs in ~5 waves) the same. At 256 (24 rows: BT =
// 32) the experts still stream at ~80%: 24 rows give ~24 FLOP per weight
// byte, far under the ~200 of the H200's bf16 ridge, so no batch up to 256
// makes them compute-bound. Every CTA reads its own weight rows once; the
// activation tile (1-8 KB per stage) comes from L2.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"
#include "kernels/cuda/warp_ops.cuh"

namespace mlag::cuda::tc_gemm {

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
  // The plan (MoePlanKernel): slot s owns rows [offsets[s], offsets[s+1])
  // and row tiles [tile_offsets[s], tile_offsets[s+1]). nullptr: one dense
  // slot of dense_rows rows, row tile blockIdx.x.
  const int32_t* offsets;
  const int32_t* tile_offsets;
  int num_slots;
  int dense_rows;
  // Split K (down / dense only): CTA z of gridDim.z sums K stages [z s, z s
  // + s) of s = split_stages (0: all) and writes C + z c_split_stride.
  int split_stages;
  int64_t c_split_stride;
};

// WT: uint16_t (bf16) or uint8_t (e4m3). kVecW: weight rows are 16-byte
// aligned (k * sizeof(WT) % 16 == 0), copied with cp.async; otherwise element
// by element (odd K; no checkpoint of the supported models has one).
template <typename WT, bool kGateUp, int NT, bool kVecW>
__global__ void __launch_bounds__(kTcThreads) TcGemmKernel(TcGemmArgs p) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  constexpr int BT = 8 * NT;
  constexpr int S = TcStages(BT);
  constexpr bool kFp8 = sizeof(WT) == 1;
  constexpr int kStageBytes = (kTcRows + BT) * kTcRowBytes;
  constexpr int kALoads = (BT * kTcChunks + kTcThreads - 1) / kTcThreads;
  MLAG_DYNAMIC_SMEM(unsigned char, smem);

  int slot = 0, row0 = static_cast<int>(blockIdx.x) * BT, rows = 0;
  if (p.offsets == nullptr) {
    rows = min(BT, p.dense_rows - row0);
  } else {
    slot = SlotOfTile(p.tile_offsets, p.num_slots, static_cast<int>(blockIdx.x));
    if (slot < 0) return;
    row0 = p.offsets[slot] + (static_cast<int>(blockIdx.x) - p.tile_offsets[slot]) * BT;
    rows = min(BT, p.offsets[slot + 1] - row0);
  }
  if (rows <= 0) return;
  const int f0 = static_cast<int>(blockIdx.y) * (kGateUp ? kTcRows / 2 : kTcRows);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t k = p.k;
  const int64_t row_bytes = k * static_cast<int64_t>(sizeof(WT));
  // K stages [kt0, kt1): all of them, or this CTA's split (blockIdx.z).
  const int nk_all = static_cast<int>((row_bytes + kTcRowBytes - 1) / kTcRowBytes);
  const int kt0 = p.split_stages > 0 ? static_cast<int>(blockIdx.z) * p.split_stages : 0;
  const int kt1 = p.split_stages > 0 ? min(nk_all, kt0 + p.split_stages) : nk_all;
  const int nk = kt1 > kt0 ? kt1 - kt0 : 0;

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
  // (The element-wise path finds its rows again per stage: it keeps no
  // pointers in registers.)
  const uint8_t* w_src[kTcRows * kTcChunks / kTcThreads] = {};
  if constexpr (kVecW) {
#pragma unroll
    for (int i = 0; i < kTcRows * kTcChunks / kTcThreads; ++i) {
      const int64_t r = weight_row(tid / kTcChunks + 16 * i);
      w_src[i] = r >= 0 ? reinterpret_cast<const uint8_t*>(b_slot + r * k) : nullptr;
    }
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
        const int64_t r = weight_row(j);
        const WT* src = r >= 0 ? b_slot + r * k : nullptr;
#pragma unroll
        for (int e = 0; e < 16 / static_cast<int>(sizeof(WT)); ++e) {
          const int64_t el = byte / static_cast<int64_t>(sizeof(WT)) + e;
          d[e] = src != nullptr && el < k ? src[el] : WT{0};
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
    if (s < nk) load_stage(kt0 + s, s);
    CpAsyncCommit();
  }

  // fp8 scales of this thread's two weight rows and 2 NT activation rows.
  const int64_t scale_blocks = (k + 127) / 128;
  const float* sw_row[2] = {nullptr, nullptr};
  int sx_row[NT][2];  // staged activation row of each of this thread's columns, or -1
  if constexpr (kFp8) {
#pragma unroll
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

  for (int i = 0; i < nk; ++i) {
    const int kt = kt0 + i;  // the K stage; i its place in the ring
    CpAsyncWait<S - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free
    if (i + S - 1 < nk) load_stage(kt + S - 1, (i + S - 1) % S);
    CpAsyncCommit();

    float w_scale[2] = {0.0f, 0.0f};
    if constexpr (kFp8) {
#pragma unroll
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
    const unsigned char* st = smem + (i % S) * kStageBytes;
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
    float* c_split = static_cast<float*>(p.c) + blockIdx.z * p.c_split_stride;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // d[e] of n-tile nt: slot row m, feature f.
        const int m = nt * 8 + 2 * c + (e & 1), f = f0 + 16 * warp + g + 8 * (e >> 1);
        if (m < rows && f < p.n) c_split[static_cast<int64_t>(row0 + m) * p.ldc + f] = acc[nt][e];
      }
    }
  }
}

// Whether `device` has tensor cores for an mma of compute capability
// `needed` (80: bf16, 89: e4m3) and this build has code for them (a build
// for an older target only would JIT PTX that traps).
inline cudaError_t TcGemmSupported(int device, int needed, bool* yes) {
  *yes = false;
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes built{};
  err = cudaFuncGetAttributes(&built, TcGemmKernel<uint8_t, false, 1, true>);
  if (err != cudaSuccess) return err;
  *yes =
      major * 10 + minor >= needed && built.binaryVersion >= needed && built.ptxVersion >= needed;
  return cudaSuccess;
}

// Row tile height of a grouped GEMM from the shapes alone (a graph replays the same kernels):
// the smallest of 8, 16, 32, 64 that holds the average rows per local
// expert, so that an expert's weights are read by as few row tiles as
// possible (each reads them in full) without idling the mma's N.
inline int TcTileRows(int64_t pairs, int64_t L) {
  const int64_t experts = std::max<int64_t>(1, std::min(L, pairs));
  const int64_t avg = (pairs + experts - 1) / experts;
  return avg <= 8 ? 8 : avg <= 16 ? 16 : avg <= 32 ? 32 : 64;
}

template <typename WT, bool kGateUp, int NT>
cudaError_t LaunchTcGemmNt(const TcGemmArgs& p, int max_tiles, int splits, cudaStream_t stream) {
  const int features = kGateUp ? kTcRows / 2 : kTcRows;
  const dim3 grid(static_cast<unsigned>(max_tiles),
                  static_cast<unsigned>((p.n + features - 1) / features),
                  static_cast<unsigned>(splits));
  const bool vec_w = p.k * static_cast<int64_t>(sizeof(WT)) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.b) % 16 == 0;
  auto* const kernel =
      vec_w ? TcGemmKernel<WT, kGateUp, NT, true> : TcGemmKernel<WT, kGateUp, NT, false>;
  MLAG_LAUNCH_PDL(kernel, grid, kTcThreads, TcSmemBytes(8 * NT), stream)(p);
  return cudaGetLastError();
}

// `splits` > 1 (not for gate_up): p.split_stages and p.c_split_stride set.
template <typename WT, bool kGateUp>
cudaError_t LaunchTcGemm(int tile_rows, const TcGemmArgs& p, int max_tiles, cudaStream_t stream,
                         int splits = 1) {
  if (kGateUp && splits != 1) return cudaErrorInvalidValue;
  switch (tile_rows) {
    case 8:
      return LaunchTcGemmNt<WT, kGateUp, 1>(p, max_tiles, splits, stream);
    case 16:
      return LaunchTcGemmNt<WT, kGateUp, 2>(p, max_tiles, splits, stream);
    case 32:
      return LaunchTcGemmNt<WT, kGateUp, 4>(p, max_tiles, splits, stream);
    default:
      return LaunchTcGemmNt<WT, kGateUp, 8>(p, max_tiles, splits, stream);
  }
}

}  // namespace mlag::cuda::tc_gemm
