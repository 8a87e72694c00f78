// The emulated runtime's internal interface, shared by its parts: the
// kernel launcher of the device language (cuda_emulation.h), the emulated
// cuBLASLt (cublaslt.cc) and NCCL (nccl.cc) enqueue their work on emulated
// streams through it, and check pointers against the emulated devices'
// allocations. Not for the project's code, which sees only the public API
// in include/.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "include/cuda_runtime.h"

namespace mlag::emu {

// ---- Errors and diagnostics -------------------------------------------------------

// Sets the calling thread's last error (what cudaGetLastError returns).
void SetLastError(cudaError_t error);

// Prints "cuda emulation: <what>" to stderr and aborts: for a rule whose
// breach would hang or corrupt a real GPU, so that it cannot go unnoticed.
[[noreturn]] void FatalRule(const std::string& what);

// ---- Memory -----------------------------------------------------------------------

enum class MemoryKind { kUnregistered, kDevice, kPinnedHost };

struct MemoryInfo {
  MemoryKind kind = MemoryKind::kUnregistered;
  int device = -1;             // kDevice: its device
  const char* base = nullptr;  // start of the allocation
  size_t bytes = 0;            // its size
};

// What `p` points into. A pointer one past the end of an allocation counts
// as inside it (an empty range there is valid).
MemoryInfo Lookup(const void* p);

// OK when [p, p + bytes) lies in device memory usable by kernels on
// `device` (its own, a peer's with peer access enabled) or in pinned host
// memory; otherwise a message naming what is wrong (empty when OK).
std::string CheckDeviceAccess(const void* p, size_t bytes, int device);

// ---- Work on streams ----------------------------------------------------------------

// The kind of graph node work becomes when it is captured.
enum class WorkKind { kKernel, kMemcpy, kMemset, kCollective, kHost };

struct WorkItem {
  WorkKind kind = WorkKind::kKernel;
  std::string what;                // for messages, e.g. "kernel RmsNormKernel"
  const void* function = nullptr;  // kernels: the entry point (graph update compares it)
  // Kernels: launched with programmatic stream serialization. Captured after
  // a kernel node, its edge from that node is a programmatic dependency.
  bool programmatic = false;
  // The work. Runs on the stream's worker thread, in stream order; may run
  // again at every replay when captured. An error other than cudaSuccess
  // becomes the device's sticky error.
  std::function<cudaError_t()> run;
  // Runs instead of `run` when the work is queued on a stream whose device
  // has faulted (which runs nothing more): releases what `run` would have
  // released (a communicator's pending count, a graph launch's references),
  // so destroying or aborting a communicator does not wait for ever.
  std::function<void()> on_skip;
  // Collectives: the communicator the work uses; graphs capturing it hold a
  // reference (see CommGraphRef).
  void* communicator = nullptr;
};

// The device of `stream` (nullptr and cudaStreamLegacy: the current
// device's legacy stream), or -1 for an invalid handle.
int StreamDevice(cudaStream_t stream);

// True while `stream` is capturing.
bool StreamCapturing(cudaStream_t stream);

// Enqueues `item` on `stream`, or records it as a graph node while the
// stream captures. Kernel work must be launched on a stream of the current
// device.
cudaError_t Enqueue(cudaStream_t stream, WorkItem item);

// True when the calling thread may not make a "potentially unsafe" call now
// (a capture of its own that is not relaxed, or another thread's global
// capture); such calls fail and invalidate those captures.
bool CaptureForbidsUnsafeCalls();
// Invalidates the captures CaptureForbidsUnsafeCalls found, naming `call`.
void InvalidateCapturesFor(const char* call);

// ---- Kernels ------------------------------------------------------------------------

// The dynamic shared memory limit of `function` (48 KB unless raised with
// cudaFuncSetAttribute), and the device's opt-in maximum.
int MaxDynamicSmem(const void* function);
inline constexpr int kSmemDefault = 48 * 1024;
inline constexpr int kSmemOptin = 227 * 1024;
inline constexpr int kSms = 132;

// Runs `grid` under the process-wide kernel lock: the fiber emulation keeps
// block state in globals, so one grid runs at a time, whichever its stream.
void RunGridExclusive(const std::function<void()>& grid);

// ---- NCCL ---------------------------------------------------------------------------

// A graph (or executable graph) that captured collectives of communicator
// `comm` takes (+1) or drops (-1) a reference to it. While such objects
// exist the communicator cannot be destroyed or aborted (NCCL 2.26 and later
// wait for them).
void CommGraphRef(void* comm, int delta);
// A graph launch queued or running holds the communicators of its
// collectives until it has run (NCCL's references live as long as the
// launch): destroy and abort wait for these, abort after telling the
// collectives to give up.
void CommLaunchRef(void* comm, int delta);

}  // namespace mlag::emu
