// The tensor-core MLA decode kernel (bf16 cache), launched by
// kernels/cuda/mla_attention.cu. Device code only; the CPU emulation
// (kernels/cuda/emulation/, and tests/emulation/device_language_test.cc)
// compiles it with MLAG_CUDA_EMULATION defined, where the
// warp-level instructions (mma, ldmatrix, shuffles) and cp.async run through
// an emulation of their documented semantics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/softmax_math.h"
#include "kernels/cuda/mla_attention_block.cuh"
#include "runtime/core/scalar_types.h"

namespace mlag::cuda::mla_block {

// ---- Tensor-core decode (bf16 cache) ---------------------------------------
//
// The f32 kernel above spends about two FMAs per cached byte, which bounds
// it well below the copy bandwidth of a Hopper GPU. This kernel does the two
// products of a tile on the tensor cores (mma.sync m16n8k16, bf16 operands,
// f32 accumulation), with the 16 query vectors (heads) as the M dimension:
//   S[16, T] = Q[16, W] . K[T, W]^T      (W = rkv + dr, the cache row)
//   O[16, rkv] += P[16, T] . V[T, rkv]   (V = the first rkv columns of K)
// The cache rows are bf16 and used as they are. Q is f32; with kSplitQ it is
// carried as two bf16 parts, hi = bf16(q) and lo = bf16(q - hi), and both are
// multiplied (16 significant bits, about f32-accurate scores); without it Q
// is rounded to bf16 once. P is rounded to bf16 and the softmax sum adds the
// rounded values, so the weights applied are exactly the weights normalised.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with
// floating point type"), g = lane / 4, c = lane % 4, each 32-bit register
// holding two bf16 with the lower column / k index in the low half:
//   A 16x16 (row):  a[0] = (g, 2c..2c+1)  a[1] = (g+8, 2c..)
//                   a[2] = (g, 2c+8..)    a[3] = (g+8, 2c+8..)
//   B 16x8 (col):   b[0] = (k 2c..2c+1, n g)  b[1] = (k 2c+8.., n g)
//   C/D 16x8 f32:   d[0], d[1] = (g, 2c), (g, 2c+1)
//                   d[2], d[3] = (g+8, 2c), (g+8, 2c+1)
// For QK the B operand is K^T: b[0] = K[token g][dims 2c, 2c+1], one 32-bit
// shared load. For PV it is V with k = token: b[0] = V[tokens 2c, 2c+1][dim
// g], which ldmatrix .trans delivers from row-major token rows.
//
// One thread block (8 warps) per (item, head group), as in the f32 kernel
// (ResolveDecode), streaming the item's tokens in tiles of kMmaTile through a
// kMmaStages-deep cp.async ring. Per tile:
//   QK  warp w multiplies the k-steps (16 columns) w, w + 8, ... of the row
//       for all kMmaTile tokens, its Q fragments held in registers for the
//       whole kernel, and writes its partial scores to shared memory;
//   softmax  16 threads per head sum the 8 partials of 2 tokens each, update
//       the head's online softmax (kernels/common/softmax_math.h) and write
//       bf16 probabilities and the rescale factor;
//   PV  warp w owns rkv / 64 consecutive n-tiles (8 latent dims each) of O
//       in registers for the whole item.
inline constexpr int kMmaTile = 32;   // tokens per pipeline stage
inline constexpr int kMmaStages = 3;  // cp.async ring depth (two tiles in flight)
inline constexpr int kMmaWarps = kThreads / 32;
inline constexpr int kMmaKsPerWarp =
    static_cast<int>(kMlaMaxRowWidth / 16 + kMmaWarps - 1) / kMmaWarps;
inline constexpr int kMmaNtPerWarp = static_cast<int>(kMlaMaxRkv / 8 + kMmaWarps - 1) / kMmaWarps;
inline constexpr int kMmaSPitch = kMmaTile + 8;  // floats per row of a partial score tile
inline constexpr int kMmaPPitch = kMmaTile + 8;  // bf16 per row of the probability tile
inline constexpr int kMmaPad = 8;                // bf16 after each cache row in shared memory

static_assert(kMmaWarps == 8 && kMmaTile == 32,
              "the softmax step maps 16 threads x 2 tokens per head");
static_assert(kMmaStages >= 2, "the ring needs a tile in flight");

// Shared-memory row pitch (bf16) of a cache row of `width` (a multiple of 16):
// an odd number of 16-byte units, so the 8 rows an ldmatrix or a B-fragment
// load touches fall in 8 different bank groups.
__host__ __device__ inline constexpr int MmaRowPitch(int width) { return width + kMmaPad; }

inline constexpr size_t MmaSmemBytes(int width) {
  return sizeof(uint16_t) * kMmaStages * kMmaTile * MmaRowPitch(width)  // cache ring
         + sizeof(float) * kMmaWarps * kVecs * kMmaSPitch               // partial scores
         + sizeof(uint16_t) * kVecs * kMmaPPitch                        // probabilities
         + sizeof(float) * kVecs;                                       // rescale factors
}

// The tensor-core instructions (kernels/cuda/warp_ops.cuh).
using ::mlag::cuda::LdMatrixX4Trans;
using ::mlag::cuda::MmaBf16;
using ::mlag::cuda::PackBf16;

// Element d of query vector v of this block (zero for an unused vector).
__device__ __forceinline__ float QueryElem(const BlockItem& it, int v, int d, int rkv) {
  if (it.q_latent[v] == nullptr) return 0.0f;
  return d < rkv ? it.q_latent[v][d] : it.q_pe[v][d - rkv];
}

// Issues the cp.async copies of cache tokens [t0, t0 + kMmaTile) of sequence
// it.b into `stage` ([kMmaTile][pitch] bf16; columns past `width` are never
// read). Rows past it.end or in a block outside the cache become zeros. The
// caller commits the group.
__device__ __forceinline__ void LoadMmaTile(const KernelParams& p, const BlockItem& it, int width,
                                            int pitch, int t0, uint16_t* stage) {
  constexpr int kThreadsPerRow = kThreads / kMmaTile;
  const int r = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int sub = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const uint16_t* cache = static_cast<const uint16_t*>(p.a.cache);
  const uint16_t* src = CacheRow<uint16_t>(p, it, t0 + r, width);
  uint16_t* dst = stage + r * pitch;
  for (int c = sub; c < width / 8; c += kThreadsPerRow) {
    CpAsync16(dst + c * 8, src != nullptr ? src + c * 8 : cache, src != nullptr ? 16 : 0);
  }
}

// Decode with a bf16 cache, (rkv + dr) % 16 == 0, rkv % 8 == 0, 16-byte
// aligned rows (MmaDecodeUsable). Same items, outputs and workspace as the
// f32 kernel in decode mode.
template <bool kSplitQ>
__global__ void __launch_bounds__(kThreads, 1) MlaDecodeMmaKernel(const KernelParams p) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  MLAG_DYNAMIC_SMEM(unsigned char, smem_raw);
  const int rkv = static_cast<int>(p.a.rkv);
  const int width = rkv + static_cast<int>(p.a.dr);
  const int pitch = MmaRowPitch(width);
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem_raw);  // [stages][tile][pitch]
  float* red_s = reinterpret_cast<float*>(kv_s + kMmaStages * kMmaTile * pitch);  // [warp][16][SP]
  uint16_t* p_s = reinterpret_cast<uint16_t*>(red_s + kMmaWarps * kVecs * kMmaSPitch);  // [16][PP]
  float* alpha_s = reinterpret_cast<float*>(p_s + kVecs * kMmaPPitch);                  // [16]
  __shared__ BlockItem it;

  ResolveDecode(p, it);
  if (it.exit) return;  // uniform: every thread read it after a barrier
  __syncthreads();      // per-vector fields written by threads < 16

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int c = lane & 3;

  // Start the ring before building the query fragments, so that the first
  // tiles are in flight meanwhile. One commit per slot keeps the group count
  // uniform (empty groups complete at once).
  const int num_tiles = (it.end - it.begin + kMmaTile - 1) / kMmaTile;
#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < num_tiles) {
      LoadMmaTile(p, it, width, pitch, it.begin + s * kMmaTile, kv_s + s * kMmaTile * pitch);
    }
    CpAsyncCommit();
  }

  // This warp's A fragments of Q: k-steps warp + 8 i (zero past the row).
  const int ksteps = width / 16;
  uint32_t q_hi[kMmaKsPerWarp][4];
  uint32_t q_lo[kSplitQ ? kMmaKsPerWarp : 1][4];
#pragma unroll
  for (int i = 0; i < kMmaKsPerWarp; ++i) {
    const int ks = warp + kMmaWarps * i;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int v = g + 8 * (r & 1);
      const int d = ks * 16 + 2 * c + 8 * (r >> 1);
      const float x0 = ks < ksteps ? QueryElem(it, v, d, rkv) : 0.0f;
      const float x1 = ks < ksteps ? QueryElem(it, v, d + 1, rkv) : 0.0f;
      const uint16_t h0 = F32ToBf16(x0), h1 = F32ToBf16(x1);
      q_hi[i][r] = PackBf16(h0, h1);
      if constexpr (kSplitQ) {
        q_lo[i][r] = PackBf16(F32ToBf16(x0 - Bf16ToF32(h0)), F32ToBf16(x1 - Bf16ToF32(h1)));
      }
    }
  }

  // Softmax role: head hv, tokens [j0, j0 + 2) of each tile; the 16 threads
  // of a head (one half-warp) hold identical copies of its state.
  const int hv = tid >> 4;
  const int j0 = (tid & 15) * 2;
  const int limit = it.limit[hv];
  const float scale = p.a.scale;
  OnlineSoftmaxState state = OnlineSoftmaxInit();

  // PV role: n-tiles [nt0, nt0 + nt_count) of the latent dims.
  const int ntiles = rkv / 8;
  const int nt_per_warp = (ntiles + kMmaWarps - 1) / kMmaWarps;
  const int nt0 = warp * nt_per_warp;
  const int nt_count = max(0, min(nt_per_warp, ntiles - nt0));
  float o[kMmaNtPerWarp][4];
#pragma unroll
  for (int m = 0; m < kMmaNtPerWarp; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[m][e] = 0.0f;
  }

  for (int i = 0; i < num_tiles; ++i) {
    CpAsyncWait<kMmaStages - 2>();  // tile i has landed (later ones may be in flight)
    __syncthreads();                // tile i visible to all; every thread is done with tile i - 1,
                                    // its ring slot, the partial scores and the probabilities
    {
      const int next = i + kMmaStages - 1;
      if (next < num_tiles) {
        LoadMmaTile(p, it, width, pitch, it.begin + next * kMmaTile,
                    kv_s + (next % kMmaStages) * kMmaTile * pitch);
      }
      CpAsyncCommit();
    }
    const uint16_t* tile = kv_s + (i % kMmaStages) * kMmaTile * pitch;
    const int t0 = it.begin + i * kMmaTile;

    // ---- QK over this warp's k-steps -> partial scores.
    {
      float s[kMmaTile / 8][4];
#pragma unroll
      for (int nt = 0; nt < kMmaTile / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kMmaKsPerWarp; ++k) {
        const int ks = warp + kMmaWarps * k;
        if (ks < ksteps) {
#pragma unroll
          for (int nt = 0; nt < kMmaTile / 8; ++nt) {
            const uint16_t* krow = tile + (nt * 8 + g) * pitch + ks * 16 + 2 * c;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 8);
            MmaBf16(s[nt], q_hi[k], b0, b1);
            if constexpr (kSplitQ) MmaBf16(s[nt], q_lo[k], b0, b1);
          }
        }
      }
      float* red = red_s + warp * kVecs * kMmaSPitch;
#pragma unroll
      for (int nt = 0; nt < kMmaTile / 8; ++nt) {
        *reinterpret_cast<float2*>(red + g * kMmaSPitch + nt * 8 + 2 * c) =
            make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(red + (g + 8) * kMmaSPitch + nt * 8 + 2 * c) =
            make_float2(s[nt][2], s[nt][3]);
      }
    }
    __syncthreads();  // partial scores visible

    // ---- Online softmax of head hv over tokens t0 + j0, t0 + j0 + 1.
    {
      float2 dot = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) {
        const float2 part =
            *reinterpret_cast<const float2*>(red_s + (w * kVecs + hv) * kMmaSPitch + j0);
        dot.x += part.x;
        dot.y += part.y;
      }
      const float s0 = t0 + j0 < limit ? dot.x * scale : -INFINITY;
      const float s1 = t0 + j0 + 1 < limit ? dot.y * scale : -INFINITY;
      float tile_max = fmaxf(s0, s1);
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      }
      const float alpha = OnlineSoftmaxRescale(&state, tile_max);
      const uint16_t p0 = F32ToBf16(ExpShifted(s0, state.max));
      const uint16_t p1 = F32ToBf16(ExpShifted(s1, state.max));
      // xor butterflies give every lane of the half-warp the same sum.
      float psum = Bf16ToF32(p0) + Bf16ToF32(p1);
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      state.sum += psum;
      *reinterpret_cast<uint32_t*>(p_s + hv * kMmaPPitch + j0) = PackBf16(p0, p1);
      if ((tid & 15) == 0) alpha_s[hv] = alpha;
    }
    __syncthreads();  // probabilities and rescale factors visible

    // ---- PV: o = alpha o + P V over this warp's n-tiles.
    {
      const float a_lo = alpha_s[g], a_hi = alpha_s[g + 8];
      uint32_t pa[kMmaTile / 16][4];
#pragma unroll
      for (int ks = 0; ks < kMmaTile / 16; ++ks) {
        const uint16_t* prow = p_s + g * kMmaPPitch + ks * 16 + 2 * c;
        pa[ks][0] = *reinterpret_cast<const uint32_t*>(prow);
        pa[ks][1] = *reinterpret_cast<const uint32_t*>(prow + 8 * kMmaPPitch);
        pa[ks][2] = *reinterpret_cast<const uint32_t*>(prow + 8);
        pa[ks][3] = *reinterpret_cast<const uint32_t*>(prow + 8 * kMmaPPitch + 8);
      }
#pragma unroll
      for (int m = 0; m < kMmaNtPerWarp; ++m) {
        o[m][0] *= a_lo;
        o[m][1] *= a_lo;
        o[m][2] *= a_hi;
        o[m][3] *= a_hi;
        if (m < nt_count) {
          // Matrix q of the ldmatrix = tokens [8 q, 8 q + 8) x dims of n-tile
          // nt0 + m, so lane l points at token l: registers 0, 1 are the B
          // fragment of tokens [0, 16), registers 2, 3 of tokens [16, 32).
          static_assert(kMmaTile == 32, "one ldmatrix.x4 covers the tile's 32 tokens");
          uint32_t v[4];
          LdMatrixX4Trans(v, tile + lane * pitch + (nt0 + m) * 8);
          MmaBf16(o[m], pa[0], v[0], v[1]);
          MmaBf16(o[m], pa[1], v[2], v[3]);
        }
      }
    }
  }

  // ---- Epilogue: out = o / sum, lse = max + ln(sum); zeros and -inf when a
  // vector saw no token.
  if ((tid & 15) == 0) {
    it.inv_sum[hv] = OnlineSoftmaxInvSum(state);
    it.lse_value[hv] = OnlineSoftmaxLse(state);
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int v = g + 8 * half;
    float* out = it.out[v];
    if (out == nullptr) continue;
    const float inv = it.inv_sum[v];
    const bool aligned = (reinterpret_cast<uintptr_t>(out) & 7) == 0;  // d is even
#pragma unroll
    for (int m = 0; m < kMmaNtPerWarp; ++m) {
      if (m < nt_count) {
        const int d = (nt0 + m) * 8 + 2 * c;
        if (aligned) {
          *reinterpret_cast<float2*>(out + d) =
              make_float2(o[m][2 * half] * inv, o[m][2 * half + 1] * inv);
        } else {
          out[d] = o[m][2 * half] * inv;
          out[d + 1] = o[m][2 * half + 1] * inv;
        }
      }
    }
  }
  if (tid < kVecs && it.lse[tid] != nullptr) *it.lse[tid] = it.lse_value[tid];
}

}  // namespace mlag::cuda::mla_block
