// A CPU emulation of the slice of CUDA that the tensor-core MLA decode
// kernel (kernels/cuda/mla_decode_mma.cuh) uses, so that the kernel's own
// source runs on a machine without a GPU and is checked against the host
// kernel. Include this first, with MLAG_CUDA_EMULATION defined, then the
// kernel headers.
//
// What is emulated, and how:
//   * Threads are fibers (ucontext), one OS thread, one block at a time. A
//     fiber runs until it reaches __syncthreads or a warp-collective
//     operation, so every interleaving the emulation produces is one a GPU
//     may produce; a barrier that not every live thread of the block (or
//     every lane of the warp) reaches is reported as a deadlock.
//   * __shared__ variables are function-local statics (shared by the block's
//     fibers); dynamic shared memory is one buffer per launch, filled with
//     NaN bytes (0xff) before each block so that reading unwritten shared
//     memory shows up in the results.
//   * mma.sync.m16n8k16 (bf16 inputs, f32 accumulate), ldmatrix .x4 .trans
//     and __shfl_xor_sync follow the PTX ISA's fragment and lane mappings,
//     written out independently below; the products are exact and summed in
//     double, then rounded once to f32.
//   * cp.async copies at once (commit and wait are no-ops): a copy issued
//     into a ring slot still being read corrupts the results.
// Not emulated: timing, memory-model races between threads of a block
// (fibers are sequential), anything outside this kernel's needs.
#pragma once

#ifndef MLAG_CUDA_EMULATION
#error "define MLAG_CUDA_EMULATION before including cuda_emulation.h"
#endif

#include <math.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

// ---- Language ----------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

using cudaError_t = int;
using cudaStream_t = void*;

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace mlag::emu {

// ---- Fibers and barriers -------------------------------------------------------

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  std::abort();
}

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  unsigned tid = 0;
  bool done = false;
};

// One block in flight: its fibers, the run queue and the barriers.
struct BlockState {
  std::vector<Fiber> fibers;
  std::deque<int> runnable;
  ucontext_t scheduler;
  int current = -1;
  int live = 0;
  // __syncthreads: fibers waiting for the rest of the block.
  std::vector<int> block_waiters;
  // Warp collectives: per warp, the lanes that have arrived.
  struct Warp {
    std::vector<int> waiters;
    int arrived = 0;
  };
  std::vector<Warp> warps;
  std::vector<unsigned char> dynamic_smem;
  std::function<void()> body;
};

inline BlockState*& Block() {
  static BlockState* block = nullptr;
  return block;
}

inline unsigned char* DynamicSmem() { return Block()->dynamic_smem.data(); }

// Gives the CPU back to the scheduler; the fiber resumes when it is
// runnable again.
inline void Park() {
  BlockState& b = *Block();
  Fiber& f = b.fibers[static_cast<size_t>(b.current)];
  if (swapcontext(&f.context, &b.scheduler) != 0) Fail("swapcontext");
  threadIdx.x = f.tid;  // the scheduler switched to us: restore our identity
}

inline void FiberEntry() {
  BlockState& b = *Block();
  b.body();
  b.fibers[static_cast<size_t>(b.current)].done = true;
  --b.live;
  // Returning switches to uc_link (the scheduler).
}

}  // namespace mlag::emu

inline void __syncthreads() {
  using namespace mlag::emu;
  BlockState& b = *Block();
  b.block_waiters.push_back(b.current);
  if (static_cast<int>(b.block_waiters.size()) == b.live) {
    // Last to arrive: release the others (in arrival order) and go on.
    for (int w : b.block_waiters) {
      if (w != b.current) b.runnable.push_back(w);
    }
    b.block_waiters.clear();
    return;
  }
  Park();
}

namespace mlag::emu {

// Per-warp exchange buffers of the collectives: what each lane gave and
// what each lane receives.
struct WarpExchange {
  uint32_t in[32][8];
  const void* ptr[32];
  uint32_t out[32][4];
};

inline std::vector<WarpExchange>& Exchanges() {
  static std::vector<WarpExchange> ex;
  return ex;
}

// Runs a warp collective: every lane deposits its inputs with `deposit`; the
// last lane to arrive runs `compute` for the whole warp (filling out[][]);
// then every lane reads its results. Requires all 32 lanes of the warp live.
template <typename Deposit, typename Compute>
void WarpCollective(Deposit deposit, Compute compute) {
  BlockState& b = *Block();
  const unsigned lane = threadIdx.x & 31;
  const unsigned warp = threadIdx.x >> 5;
  WarpExchange& ex = Exchanges()[warp];
  BlockState::Warp& w = b.warps[warp];
  deposit(ex, lane);
  if (++w.arrived == 32) {
    compute(ex);
    w.arrived = 0;
    for (int f : w.waiters) b.runnable.push_back(f);
    w.waiters.clear();
    return;
  }
  w.waiters.push_back(b.current);
  Park();
}

// Runs `grid` blocks of `threads` threads of `body` (which reads threadIdx
// and blockIdx), one block after another, each with `smem_bytes` of
// dynamic shared memory.
inline void Launch(unsigned grid, unsigned threads, size_t smem_bytes,
                   const std::function<void()>& body) {
  if (threads == 0 || threads % 32 != 0) Fail("block size must be a multiple of 32");
  constexpr size_t kStack = 256 * 1024;
  BlockState b;
  b.body = body;
  b.fibers.resize(threads);
  b.warps.resize(threads / 32);
  Exchanges().assign(threads / 32, WarpExchange{});
  b.dynamic_smem.resize(smem_bytes + 16);
  Block() = &b;
  blockDim.x = threads;
  gridDim.x = grid;
  for (unsigned block = 0; block < grid; ++block) {
    blockIdx.x = block;
    std::memset(b.dynamic_smem.data(), 0xff, b.dynamic_smem.size());
    b.live = static_cast<int>(threads);
    b.runnable.clear();
    b.block_waiters.clear();
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = b.fibers[t];
      f.tid = t;
      f.done = false;
      f.stack.resize(kStack);
      if (getcontext(&f.context) != 0) Fail("getcontext");
      f.context.uc_stack.ss_sp = f.stack.data();
      f.context.uc_stack.ss_size = f.stack.size();
      f.context.uc_link = &b.scheduler;
      makecontext(&f.context, FiberEntry, 0);
      b.runnable.push_back(static_cast<int>(t));
    }
    while (!b.runnable.empty()) {
      const int next = b.runnable.front();
      b.runnable.pop_front();
      b.current = next;
      threadIdx.x = b.fibers[static_cast<size_t>(next)].tid;
      if (swapcontext(&b.scheduler, &b.fibers[static_cast<size_t>(next)].context) != 0) {
        Fail("swapcontext");
      }
      // A fiber that finished while others wait at a barrier they can now
      // pass (the finished one no longer counts): release them.
      if (b.fibers[static_cast<size_t>(next)].done && !b.block_waiters.empty() &&
          static_cast<int>(b.block_waiters.size()) == b.live) {
        for (int w : b.block_waiters) b.runnable.push_back(w);
        b.block_waiters.clear();
      }
    }
    if (b.live != 0) Fail("deadlock: threads wait at a barrier the others never reach");
  }
  Block() = nullptr;
}

// ---- Memory and warp-level instructions -------------------------------------

inline void CpAsync16(void* smem_dst, const void* gmem_src, int src_bytes) {
  std::memset(smem_dst, 0, 16);
  if (src_bytes > 0) std::memcpy(smem_dst, gmem_src, static_cast<size_t>(src_bytes));
}

inline float Bf16Lo(uint32_t w) { return __uint_as_float(w << 16); }
inline float Bf16Hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Element `half` (0 low, 1 high) of a register holding two bf16.
inline float Bf16Half(uint32_t w, int half) { return half == 0 ? Bf16Lo(w) : Bf16Hi(w); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a b + d.
// PTX ISA fragment layouts, groupID = lane >> 2, tig = lane % 4:
//   A (16 x 16): a0,a1: (groupID,     2 tig + {0,1})   register 0
//                a2,a3: (groupID + 8, 2 tig + {0,1})   register 1
//                a4,a5: (groupID,     2 tig + 8 + {0,1}) register 2
//                a6,a7: (groupID + 8, 2 tig + 8 + {0,1}) register 3
//   B (16 x 8):  b0,b1: (k = 2 tig + {0,1},     n = groupID) register 0
//                b2,b3: (k = 2 tig + 8 + {0,1}, n = groupID) register 1
//   C, D (16 x 8 f32): c0,c1: (groupID, 2 tig + {0,1}); c2,c3: (groupID + 8, ...)
inline void MmaM16N8K16Bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  float c_in[4] = {d[0], d[1], d[2], d[3]};
  WarpCollective(
      [&](WarpExchange& ex, unsigned lane) {
        for (int r = 0; r < 4; ++r) ex.in[lane][r] = a[r];
        ex.in[lane][4] = b0;
        ex.in[lane][5] = b1;
        for (int r = 0; r < 4; ++r) std::memcpy(&ex.out[lane][r], &c_in[r], 4);
      },
      [](WarpExchange& ex) {
        float A[16][16], B[16][8], C[16][8];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int e = 0; e < 2; ++e) {
            A[g][2 * t + e] = Bf16Half(ex.in[lane][0], e);
            A[g + 8][2 * t + e] = Bf16Half(ex.in[lane][1], e);
            A[g][2 * t + 8 + e] = Bf16Half(ex.in[lane][2], e);
            A[g + 8][2 * t + 8 + e] = Bf16Half(ex.in[lane][3], e);
            B[2 * t + e][g] = Bf16Half(ex.in[lane][4], e);
            B[2 * t + 8 + e][g] = Bf16Half(ex.in[lane][5], e);
          }
          float c[4];
          std::memcpy(c, ex.out[lane], 16);
          C[g][2 * t] = c[0];
          C[g][2 * t + 1] = c[1];
          C[g + 8][2 * t] = c[2];
          C[g + 8][2 * t + 1] = c[3];
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          const int rows[4] = {g, g, g + 8, g + 8};
          const int cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
          for (int r = 0; r < 4; ++r) {
            double acc = 0.0;
            for (int k = 0; k < 16; ++k) {
              acc += static_cast<double>(A[rows[r]][k]) * B[k][cols[r]];
            }
            const float v = static_cast<float>(acc + C[rows[r]][cols[r]]);
            std::memcpy(&ex.out[lane][r], &v, 4);
          }
        }
      });
  const unsigned lane = threadIdx.x & 31;
  std::memcpy(d, Exchanges()[threadIdx.x >> 5].out[lane], 16);
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8 m .. 8 m + 7 give
// the addresses of rows 0..7 of matrix m (8 b16 each); with .trans,
// register m of lane (groupID, tig) receives elements (row 2 tig, col
// groupID) and (row 2 tig + 1, col groupID) of matrix m, low half first.
inline void LdMatrixX4Trans(uint32_t (&r)[4], const uint16_t* row) {
  WarpCollective(
      [&](WarpExchange& ex, unsigned lane) {
        if ((reinterpret_cast<uintptr_t>(row) & 15) != 0) Fail("ldmatrix row address not 16-byte aligned");
        ex.ptr[lane] = row;
      },
      [](WarpExchange& ex) {
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int m = 0; m < 4; ++m) {
            const uint16_t* r0 = static_cast<const uint16_t*>(ex.ptr[8 * m + 2 * t]);
            const uint16_t* r1 = static_cast<const uint16_t*>(ex.ptr[8 * m + 2 * t + 1]);
            ex.out[lane][m] = static_cast<uint32_t>(r0[g]) | (static_cast<uint32_t>(r1[g]) << 16);
          }
        }
      });
  const unsigned lane = threadIdx.x & 31;
  for (int m = 0; m < 4; ++m) r[m] = Exchanges()[threadIdx.x >> 5].out[lane][m];
}

}  // namespace mlag::emu

// __shfl_xor_sync with a full mask: lane l receives v of lane l ^ lane_mask.
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  using namespace mlag::emu;
  if (mask != 0xffffffffu) Fail("__shfl_xor_sync: only the full mask is emulated");
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  WarpCollective([&](WarpExchange& ex, unsigned lane) { ex.in[lane][0] = bits; },
                 [lane_mask](WarpExchange& ex) {
                   for (int lane = 0; lane < 32; ++lane) {
                     ex.out[lane][0] = ex.in[lane ^ (lane_mask & 31)][0];
                   }
                 });
  const uint32_t got = Exchanges()[threadIdx.x >> 5].out[threadIdx.x & 31][0];
  float r;
  std::memcpy(&r, &got, 4);
  return r;
}

[[noreturn]] inline void __trap() { mlag::emu::Fail("__trap"); }
