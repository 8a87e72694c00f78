// The device side of the CUDA emulation: the language and instructions the
// kernels in kernels/cuda/ use, so that their own sources (kernels and
// launchers) compile as C++ and run on CPU fibers. With MLAG_CUDA_EMULATION
// defined, kernels/cuda/cuda_api.cuh includes this in place of
// <cuda_runtime.h>; builds with -Demulate_cuda=true compile every .cu file
// that way and link the emulated runtime (runtime.cc), which queues each
// launch on its stream's worker thread.
//
// What is emulated, and how:
//   * Threads are fibers (fiber.h), one OS thread, one block at a time. A
//     fiber runs until it reaches __syncthreads or a warp-collective
//     operation, so every interleaving the emulation produces is one a GPU
//     may produce; a barrier that not every live thread of the block (or
//     every lane of the warp) reaches is reported as a deadlock.
//   * __shared__ variables are function-local statics (shared by the block's
//     fibers) and dynamic shared memory is one buffer per launch ending at
//     an inaccessible guard page; both are filled with 0xff bytes before
//     each block, so that reading unwritten shared memory shows up in the
//     results and running past the dynamic size faults.
//   * mma.sync.m16n8k16 (bf16 inputs, f32 accumulate), mma.sync.m16n8k32
//     (e4m3 inputs, f32 accumulate), ldmatrix .x4 and .x4 .trans
//     and __shfl_xor_sync follow the PTX ISA's fragment and lane mappings,
//     written out independently below; the products are exact and summed in
//     double, then rounded once to f32.
//   * cp.async fills its destination with 0xff bytes at issue and copies
//     when cp.async.wait_group retires its group (the latest moment a GPU
//     may deliver it), so reading a slot before waiting for it, or issuing
//     into a slot still being read, shows up in the results; both addresses
//     must be 16-byte aligned.
//   * Warp collectives check that all 32 lanes called the same one.
//   * cub::BlockScan / cub::BlockReduce keep CUB's contract: results of a
//     reduction exist in thread 0 only (the others get a poison value), and
//     the temporary storage may not be reused without a barrier.
//   * Launches check what a GPU checks (block size <= 1024, grid y, z <=
//     65535, dynamic shared memory <= 48 KB unless raised with
//     cudaFuncSetAttribute, <= the device's 227 KB) and report a bad
//     configuration through cudaGetLastError. The device is an H100-like
//     compute capability 9.0 with 132 SMs.
//   * Launches are asynchronous: the grid runs on the stream's worker, in
//     stream order, when the work before it has run. Pointer arguments are
//     checked when it runs: device memory of the stream's device (or a peer
//     with access enabled) or pinned host memory, else the device faults
//     with cudaErrorIllegalAddress, naming the kernel and the argument.
//   * One grid runs at a time in the process (block state is global), so
//     grids of different streams interleave only between grids.
// Not emulated: timing, memory-model races between threads of a block
// (fibers are sequential), anything outside these kernels' needs.
#pragma once

#ifndef MLAG_CUDA_EMULATION
#error "define MLAG_CUDA_EMULATION before including cuda_emulation.h"
#endif

#include <math.h>
#include <sys/mman.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/emulation/emulated_runtime.h"
#include "kernels/cuda/emulation/fiber.h"

// ---- Language ----------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Static shared memory: function-local statics (one copy, shared by the
// block's fibers) in a section of their own, filled with 0xff before every
// block, so a read before any write this block shows up as NaN / garbage.
#define __shared__ static __attribute__((section("mlag_emu_shared")))
extern "C" char __start_mlag_emu_shared[] __attribute__((weak));
extern "C" char __stop_mlag_emu_shared[] __attribute__((weak));

// ---- Built-in variables and vector types ----------------------------------------

inline dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim, gridDim;

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
// IEEE round-to-nearest arithmetic, never contracted into an FMA.
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }

// Fibers run one at a time, so every write is visible to every later read:
// a fence has nothing to order.
inline void __threadfence() {}

// Fibers run one at a time, so read-modify-write is atomic by construction.
template <typename T, typename U>
T atomicAdd(T* p, U v) {
  const T old = *p;
  *p = static_cast<T>(old + static_cast<T>(v));
  return old;
}
template <typename T, typename U>
T atomicMin(T* p, U v) {
  const T old = *p;
  if (static_cast<T>(v) < old) *p = static_cast<T>(v);
  return old;
}
template <typename T, typename U>
T atomicMax(T* p, U v) {
  const T old = *p;
  if (static_cast<T>(v) > old) *p = static_cast<T>(v);
  return old;
}

namespace mlag::emu {

// ---- Fibers and barriers -------------------------------------------------------

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  std::abort();
}

// One cp.async copy, delivered when its group is waited for.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;  // 0: zeros
};

struct Fiber {
  FiberContext context;
  char* stack = nullptr;  // from the stack pool
  unsigned tid = 0;
  bool done = false;
  // griddepcontrol.wait executed (GridDependencySync): what a thread of a
  // grid launched with programmatic dependent launch must do before it
  // touches memory an earlier grid wrote.
  bool dependency_synced = false;
  std::vector<PendingCopy> open_group;             // issued, not committed
  std::deque<std::vector<PendingCopy>> committed;  // oldest first
};

// One block in flight: its fibers, the run queue and the barriers.
struct BlockState {
  std::vector<Fiber> fibers;
  std::deque<int> runnable;
  FiberContext scheduler;
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
  unsigned char* dynamic_smem = nullptr;  // ends at the guard page
  size_t dynamic_bytes = 0;
  std::function<void()> body;
  // Launched with programmatic dependent launch (MLAG_LAUNCH_PDL).
  bool programmatic = false;
  const char* kernel_name = "";
};

inline BlockState*& Block() {
  static BlockState* block = nullptr;
  return block;
}

inline unsigned char* DynamicSmem() { return Block()->dynamic_smem; }

// Gives the CPU back to the scheduler; the fiber resumes when it is
// runnable again.
inline void Park() {
  BlockState& b = *Block();
  Fiber& f = b.fibers[static_cast<size_t>(b.current)];
  SwitchFiber(&f.context, &b.scheduler);
  threadIdx.x = f.tid;  // the scheduler switched to us: restore our identity
}

[[noreturn]] inline void FiberEntry() {
  BlockState& b = *Block();
  b.body();
  Fiber& f = b.fibers[static_cast<size_t>(b.current)];
  if (b.programmatic && !f.dependency_synced) {
    std::fprintf(stderr, "cuda emulation: kernel %s, block (%u,%u,%u), thread %u\n", b.kernel_name,
                 blockIdx.x, blockIdx.y, blockIdx.z, f.tid);
    Fail(
        "a thread of a grid launched with programmatic dependent launch ended without "
        "griddepcontrol.wait (MLAG_GRID_DEPENDENCY_SYNC): it may have read what the grid before "
        "it was still writing");
  }
  f.done = true;
  --b.live;
  SwitchFiber(&f.context, &b.scheduler);  // for good: a finished fiber is never resumed
  Fail("a finished fiber was resumed");
}

// Fiber stacks, kept from launch to launch (grids run one at a time, under
// the kernel lock). Uninitialised: pages are touched as used.
inline constexpr size_t kFiberStackBytes = 128 * 1024;
inline char* FiberStack(size_t i) {
  static std::vector<std::unique_ptr<char[]>> pool;
  // Stack i starts (i mod 64) * 4160 bytes into its allocation. Allocations
  // this large are page-aligned mappings, so without the offset every
  // fiber's stack top, where each switch pops its registers, would fall in
  // the same cache set of L1 and of a 1 MiB L2, and each switch would miss.
  constexpr size_t kColourBytes = 4096 + 64;
  while (pool.size() <= i) {
    pool.emplace_back(new char[kFiberStackBytes + (pool.size() % 64) * kColourBytes]);
  }
  return pool[i].get() + (i % 64) * kColourBytes;
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
  const char* op[32];
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
// then every lane reads its results. `compute` may use only what the lanes
// deposited (it runs as whichever lane came last). Requires all 32 lanes of
// the warp live.
template <typename Deposit, typename Compute>
void WarpCollective(const char* op, Deposit deposit, Compute compute) {
  BlockState& b = *Block();
  const unsigned lane = threadIdx.x & 31;
  const unsigned warp = threadIdx.x >> 5;
  WarpExchange& ex = Exchanges()[warp];
  BlockState::Warp& w = b.warps[warp];
  ex.op[lane] = op;
  deposit(ex, lane);
  if (++w.arrived == 32) {
    for (int l = 0; l < 32; ++l) {
      if (std::strcmp(ex.op[l], op) != 0) {
        std::fprintf(stderr, "cuda emulation: warp %u: lane %d is in %s, lane %u in %s\n", warp, l,
                     ex.op[l], lane, op);
        Fail("the lanes of a warp reached different warp collectives");
      }
    }
    compute(ex);
    w.arrived = 0;
    for (int f : w.waiters) b.runnable.push_back(f);
    w.waiters.clear();
    return;
  }
  w.waiters.push_back(b.current);
  Park();
}

// Runs every block of `grid` with `block` threads of `body` (which reads
// threadIdx and blockIdx), one block after another, each with `smem_bytes`
// of dynamic shared memory.
// `programmatic`: launched with programmatic dependent launch; every thread
// must then execute GridDependencySync (checked as each thread ends).
inline void Launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body,
                   bool programmatic = false, const char* kernel_name = "") {
  const unsigned threads = block.x;
  if (block.y != 1 || block.z != 1) Fail("only 1-D thread blocks are emulated");
  if (threads == 0 || threads % 32 != 0) Fail("block size must be a multiple of 32");
  BlockState b;
  b.body = body;
  b.programmatic = programmatic;
  b.kernel_name = kernel_name;
  b.fibers.resize(threads);
  for (size_t i = 0; i < threads; ++i) b.fibers[i].stack = FiberStack(i);
  b.warps.resize(threads / 32);
  Exchanges().assign(threads / 32, WarpExchange{});
  // Dynamic shared memory (rounded up to 16 bytes) ends where an
  // inaccessible page begins.
  const size_t page = 4096;
  const size_t dyn = (smem_bytes + 15) / 16 * 16;
  const size_t mapped = (dyn + page - 1) / page * page + page;
  void* region = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) Fail("mmap of the dynamic shared memory");
  unsigned char* guard = static_cast<unsigned char*>(region) + mapped - page;
  if (mprotect(guard, page, PROT_NONE) != 0) Fail("mprotect of the guard page");
  b.dynamic_smem = guard - dyn;
  b.dynamic_bytes = dyn;
  Block() = &b;
  blockDim = dim3(threads);
  gridDim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        std::memset(b.dynamic_smem, 0xff, b.dynamic_bytes);
        if (__start_mlag_emu_shared != nullptr) {
          std::memset(__start_mlag_emu_shared, 0xff,
                      static_cast<size_t>(__stop_mlag_emu_shared - __start_mlag_emu_shared));
        }
        b.live = static_cast<int>(threads);
        b.runnable.clear();
        b.block_waiters.clear();
        for (unsigned t = 0; t < threads; ++t) {
          Fiber& f = b.fibers[t];
          f.tid = t;
          f.done = false;
          f.dependency_synced = false;
          PrepareFiber(&f.context, f.stack, kFiberStackBytes, FiberEntry);
          f.open_group.clear();
          f.committed.clear();
          b.runnable.push_back(static_cast<int>(t));
        }
        while (!b.runnable.empty()) {
          const int next = b.runnable.front();
          b.runnable.pop_front();
          b.current = next;
          threadIdx = dim3(b.fibers[static_cast<size_t>(next)].tid, 0, 0);
          SwitchFiber(&b.scheduler, &b.fibers[static_cast<size_t>(next)].context);
          // A fiber that finished while the others wait at a barrier they
          // can now pass (finished threads no longer count): release them.
          if (b.fibers[static_cast<size_t>(next)].done && !b.block_waiters.empty() &&
              static_cast<int>(b.block_waiters.size()) == b.live) {
            for (int w : b.block_waiters) b.runnable.push_back(w);
            b.block_waiters.clear();
          }
        }
        if (b.live != 0) Fail("deadlock: threads wait at a barrier the others never reach");
      }
    }
  }
  munmap(region, mapped);
  Block() = nullptr;
}

// Appends the pointer arguments of a launch to `out` (others, including
// structs holding pointers, are skipped: those pointers go unchecked).
template <typename T>
void CollectPointer(std::vector<const void*>* out, const T& arg) {
  if constexpr (std::is_pointer<T>::value) out->push_back(static_cast<const void*>(arg));
}

// kernel<<<grid, block, smem, stream>>>(args...): checks the configuration
// as the driver does (a bad one is reported through cudaGetLastError and
// nothing runs), then queues the grid on `stream` with copies of the
// arguments. `name` names the kernel in messages. `programmatic`: launched
// with programmatic stream serialization (MLAG_LAUNCH_PDL). Grids run one
// after another here, so it changes no result; the emulation checks what it
// demands of the kernel (every thread executes griddepcontrol.wait) and, in
// a capture, records the edge from the kernel node before as a programmatic
// one, as CUDA does.
template <typename Kernel>
auto Launcher(Kernel* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              const char* name, bool programmatic = false) {
  return [kernel, grid, block, smem, stream, name, programmatic](auto... args) {
    const int limit = MaxDynamicSmem(reinterpret_cast<const void*>(kernel));
    if (block.x == 0 || block.x > 1024 || block.y != 1 || block.z != 1 || grid.x == 0 ||
        grid.x > 0x7fffffffu || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
        smem > static_cast<size_t>(limit)) {
      SetLastError(cudaErrorInvalidConfiguration);
      return;
    }
    std::vector<const void*> pointers;
    (CollectPointer(&pointers, args), ...);
    const int device = StreamDevice(stream);
    WorkItem work;
    work.kind = WorkKind::kKernel;
    work.what = std::string("kernel ") + name;
    work.function = reinterpret_cast<const void*>(kernel);
    work.programmatic = programmatic;
    work.run = [=]() -> cudaError_t {
      for (size_t i = 0; i < pointers.size(); ++i) {
        if (pointers[i] == nullptr) continue;
        const std::string bad = CheckDeviceAccess(pointers[i], 0, device);
        if (!bad.empty()) {
          std::fprintf(stderr, "cuda emulation: kernel %s: pointer argument %zu: %s\n", name, i,
                       bad.c_str());
          return cudaErrorIllegalAddress;
        }
      }
      RunGridExclusive([&] {
        Launch(
            grid, block, smem, [&] { kernel(args...); }, programmatic, name);
      });
      return cudaSuccess;
    };
    const cudaError_t queued = Enqueue(stream, std::move(work));
    if (queued != cudaSuccess) SetLastError(queued);
  };
}

// ---- Memory and warp-level instructions -------------------------------------

inline Fiber& CurrentFiber() {
  BlockState& b = *Block();
  return b.fibers[static_cast<size_t>(b.current)];
}

// griddepcontrol.wait then griddepcontrol.launch_dependents: the grid
// before has finished (always so here) and the next may launch.
inline void GridDependencySync() { CurrentFiber().dependency_synced = true; }

// cp.async.cg.shared.global: 16 bytes, src_bytes of them read (the rest
// zero), delivered by a later CpAsyncWait.
inline void CpAsync16(void* smem_dst, const void* gmem_src, int src_bytes) {
  if ((reinterpret_cast<uintptr_t>(smem_dst) & 15) != 0 ||
      (src_bytes > 0 && (reinterpret_cast<uintptr_t>(gmem_src) & 15) != 0)) {
    Fail("cp.async with an address that is not 16-byte aligned");
  }
  if (src_bytes < 0 || src_bytes > 16) Fail("cp.async source size outside [0, 16]");
  std::memset(smem_dst, 0xff, 16);
  CurrentFiber().open_group.push_back({smem_dst, gmem_src, src_bytes});
}

inline void CpAsyncCommit() {
  Fiber& f = CurrentFiber();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

// cp.async.wait_group n: delivers every committed group but the newest n.
inline void CpAsyncWait(int n) {
  Fiber& f = CurrentFiber();
  while (static_cast<int>(f.committed.size()) > n) {
    for (const PendingCopy& c : f.committed.front()) {
      std::memset(c.dst, 0, 16);
      if (c.bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
    }
    f.committed.pop_front();
  }
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
      "mma.sync",
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

// An e4m3 byte's value (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits; S.1111.111 is NaN, there are no infinities), written out here from
// the format's definition rather than taken from the project's converters.
inline double E4M3Value(uint32_t byte) {
  const uint32_t e = (byte >> 3) & 15u, m = byte & 7u;
  if (e == 15u && m == 7u) return std::nan("");
  const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -9)
                            : std::ldexp(static_cast<double>(8u + m), static_cast<int>(e) - 10);
  return (byte & 0x80u) != 0 ? -mag : mag;
}

// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (sm_89+), d = a b + d.
// PTX ISA fragment layouts for 8-bit operands, groupID = lane >> 2,
// tig = lane % 4, bytes low to high within each register:
//   A (16 x 32): register 0: (groupID,     4 tig + {0..3})
//                register 1: (groupID + 8, 4 tig + {0..3})
//                register 2: (groupID,     4 tig + 16 + {0..3})
//                register 3: (groupID + 8, 4 tig + 16 + {0..3})
//   B (32 x 8):  register 0: (k = 4 tig + {0..3},      n = groupID)
//                register 1: (k = 4 tig + 16 + {0..3}, n = groupID)
//   C, D (16 x 8 f32): as m16n8k16.
// e4m3 products are exact in double; they are summed in double and rounded
// once to f32 (a GPU's accumulation may round more often).
inline void MmaM16N8K32E4M3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  float c_in[4] = {d[0], d[1], d[2], d[3]};
  WarpCollective(
      "mma.sync",
      [&](WarpExchange& ex, unsigned lane) {
        for (int r = 0; r < 4; ++r) ex.in[lane][r] = a[r];
        ex.in[lane][4] = b0;
        ex.in[lane][5] = b1;
        for (int r = 0; r < 4; ++r) std::memcpy(&ex.out[lane][r], &c_in[r], 4);
      },
      [](WarpExchange& ex) {
        double A[16][32], B[32][8];
        float C[16][8];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int e = 0; e < 4; ++e) {
            const auto byte = [&](int reg) { return (ex.in[lane][reg] >> (8 * e)) & 0xffu; };
            A[g][4 * t + e] = E4M3Value(byte(0));
            A[g + 8][4 * t + e] = E4M3Value(byte(1));
            A[g][4 * t + 16 + e] = E4M3Value(byte(2));
            A[g + 8][4 * t + 16 + e] = E4M3Value(byte(3));
            B[4 * t + e][g] = E4M3Value(byte(4));
            B[4 * t + 16 + e][g] = E4M3Value(byte(5));
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
            for (int k = 0; k < 32; ++k) acc += A[rows[r]][k] * B[k][cols[r]];
            const float v = static_cast<float>(acc + C[rows[r]][cols[r]]);
            std::memcpy(&ex.out[lane][r], &v, 4);
          }
        }
      });
  const unsigned lane = threadIdx.x & 31;
  std::memcpy(d, Exchanges()[threadIdx.x >> 5].out[lane], 16);
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8 m .. 8 m + 7 give the
// addresses of rows 0..7 of matrix m (8 b16 each); register m of lane
// (groupID, tig) receives elements (row groupID, col 2 tig) and (row
// groupID, col 2 tig + 1) of matrix m, low half first.
inline void LdMatrixX4(uint32_t (&r)[4], const uint16_t* row) {
  WarpCollective(
      "ldmatrix",
      [&](WarpExchange& ex, unsigned lane) {
        if ((reinterpret_cast<uintptr_t>(row) & 15) != 0)
          Fail("ldmatrix row address not 16-byte aligned");
        ex.ptr[lane] = row;
      },
      [](WarpExchange& ex) {
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int m = 0; m < 4; ++m) {
            const uint16_t* src = static_cast<const uint16_t*>(ex.ptr[8 * m + g]);
            ex.out[lane][m] =
                static_cast<uint32_t>(src[2 * t]) | (static_cast<uint32_t>(src[2 * t + 1]) << 16);
          }
        }
      });
  const unsigned lane = threadIdx.x & 31;
  for (int m = 0; m < 4; ++m) r[m] = Exchanges()[threadIdx.x >> 5].out[lane][m];
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8 m .. 8 m + 7 give
// the addresses of rows 0..7 of matrix m (8 b16 each); with .trans,
// register m of lane (groupID, tig) receives elements (row 2 tig, col
// groupID) and (row 2 tig + 1, col groupID) of matrix m, low half first.
inline void LdMatrixX4Trans(uint32_t (&r)[4], const uint16_t* row) {
  WarpCollective(
      "ldmatrix",
      [&](WarpExchange& ex, unsigned lane) {
        if ((reinterpret_cast<uintptr_t>(row) & 15) != 0)
          Fail("ldmatrix row address not 16-byte aligned");
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

// ---- Warp intrinsics (full mask only) ---------------------------------------------

namespace mlag::emu {

inline void RequireFullMask(unsigned mask, const char* what) {
  if (mask != 0xffffffffu) Fail(what);
}

// Each lane gives v and names the lane it reads (`from`, taken mod 32, as
// every lane may name a different one); it receives that lane's v.
template <typename T>
T Shuffle(T v, int from) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffled type");
  uint32_t words[2] = {0, 0};
  std::memcpy(words, &v, sizeof(T));
  WarpCollective(
      "shfl",
      [&](WarpExchange& ex, unsigned lane) {
        ex.in[lane][0] = words[0];
        ex.in[lane][1] = words[1];
        ex.in[lane][2] = static_cast<uint32_t>(from & 31);
      },
      [](WarpExchange& ex) {
        for (int lane = 0; lane < 32; ++lane) {
          const uint32_t src = ex.in[lane][2];
          ex.out[lane][0] = ex.in[src][0];
          ex.out[lane][1] = ex.in[src][1];
        }
      });
  const uint32_t* got = Exchanges()[threadIdx.x >> 5].out[threadIdx.x & 31];
  T r;
  std::memcpy(&r, got, sizeof(T));
  return r;
}

// Per lane, the mask of lanes whose `value` equals its own.
template <typename T>
unsigned MatchAny(T value) {
  static_assert(sizeof(T) <= 8, "matched type");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  WarpCollective(
      "match",
      [&](WarpExchange& ex, unsigned lane) {
        ex.in[lane][0] = static_cast<uint32_t>(bits);
        ex.in[lane][1] = static_cast<uint32_t>(bits >> 32);
      },
      [](WarpExchange& ex) {
        for (int lane = 0; lane < 32; ++lane) {
          unsigned m = 0;
          for (int other = 0; other < 32; ++other) {
            if (ex.in[other][0] == ex.in[lane][0] && ex.in[other][1] == ex.in[lane][1]) {
              m |= 1u << other;
            }
          }
          ex.out[lane][0] = m;
        }
      });
  return Exchanges()[threadIdx.x >> 5].out[threadIdx.x & 31][0];
}

}  // namespace mlag::emu

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  mlag::emu::RequireFullMask(mask, "__shfl_xor_sync: only the full mask is emulated");
  // A source lane outside the warp gives the lane its own value.
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int from = lane ^ lane_mask;
  return mlag::emu::Shuffle(v, from >= 0 && from < 32 ? from : lane);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
  mlag::emu::RequireFullMask(mask, "__shfl_sync: only the full mask is emulated");
  return mlag::emu::Shuffle(v, src_lane);
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T value) {
  mlag::emu::RequireFullMask(mask, "__match_any_sync: only the full mask is emulated");
  return mlag::emu::MatchAny(value);
}
template <typename T>
unsigned __match_all_sync(unsigned mask, T value, int* pred) {
  mlag::emu::RequireFullMask(mask, "__match_all_sync: only the full mask is emulated");
  const unsigned m = mlag::emu::MatchAny(value);
  *pred = m == 0xffffffffu;
  return *pred ? m : 0u;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  mlag::emu::RequireFullMask(mask, "__syncwarp: only the full mask is emulated");
  mlag::emu::WarpCollective(
      "syncwarp", [](mlag::emu::WarpExchange&, unsigned) {}, [](mlag::emu::WarpExchange&) {});
}

// ---- CUB block collectives ----------------------------------------------------------

namespace cub {

// A value no correct kernel reads: what a reduction leaves outside thread 0.
template <typename T>
T EmuPoison() {
  T v;
  std::memset(&v, 0xa5, sizeof(T));
  return v;
}

template <typename T, int kBlockThreads>
class BlockScan {
 public:
  struct TempStorage {
    T values[kBlockThreads];
  };
  explicit BlockScan(TempStorage& storage) : s_(storage) {}

  void ExclusiveSum(T in, T& out) {
    T total;
    ExclusiveSum(in, out, total);
  }
  void ExclusiveSum(T in, T& out, T& aggregate) {
    Gather(in);
    out = Sum(0, Tid());
    aggregate = Sum(0, kBlockThreads);
  }
  void InclusiveSum(T in, T& out, T& aggregate) {
    Gather(in);
    out = Sum(0, Tid() + 1);
    aggregate = Sum(0, kBlockThreads);
  }

 private:
  static int Tid() { return static_cast<int>(threadIdx.x); }
  void Gather(T in) {
    if (static_cast<int>(blockDim.x) != kBlockThreads) {
      mlag::emu::Fail("cub::BlockScan used with a different block size");
    }
    s_.values[Tid()] = in;
    __syncthreads();
  }
  T Sum(int begin, int end) const {
    T acc = T();
    for (int i = begin; i < end; ++i) acc = acc + s_.values[i];
    return acc;
  }
  TempStorage& s_;
};

template <typename T, int kBlockThreads>
class BlockReduce {
 public:
  struct TempStorage {
    T values[kBlockThreads];
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  T Sum(T in) {
    return Reduce(in, [](const T& a, const T& b) { return a + b; });
  }
  template <typename Op>
  T Reduce(T in, Op op) {
    if (static_cast<int>(blockDim.x) != kBlockThreads) {
      mlag::emu::Fail("cub::BlockReduce used with a different block size");
    }
    s_.values[threadIdx.x] = in;
    __syncthreads();
    if (threadIdx.x != 0) return EmuPoison<T>();
    T acc = s_.values[0];
    for (int i = 1; i < kBlockThreads; ++i) acc = op(acc, s_.values[i]);
    return acc;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub

[[noreturn]] inline void __trap() { mlag::emu::Fail("__trap"); }
