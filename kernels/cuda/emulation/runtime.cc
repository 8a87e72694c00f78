// The emulated CUDA runtime: devices, memory, streams with a worker thread
// each, events, stream capture and graphs. See README.md for what is
// modelled and which rules are enforced.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/emulation/emulated_runtime.h"

namespace mlag::emu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxDevices = 64;
constexpr size_t kDefaultMemoryBytes = size_t{16} << 30;
constexpr size_t kDeviceAlignment = 256;  // cudaMalloc's guarantee
// Fresh device memory holds this byte (NaN in every float format), so a
// read of memory nothing wrote shows up in results.
constexpr unsigned char kPoison = 0xff;

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// ---- Configuration --------------------------------------------------------------

// MLAG_EMULATED_GPUS (default 4): a count in [0, 64]. -1 when malformed.
int ConfiguredDeviceCount() {
  const char* env = std::getenv("MLAG_EMULATED_GPUS");
  if (env == nullptr || *env == '\0') return 4;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 0 || n > kMaxDevices) {
    std::fprintf(stderr, "cuda emulation: MLAG_EMULATED_GPUS='%s' is not a count in [0, %d]\n", env,
                 kMaxDevices);
    return -1;
  }
  return static_cast<int>(n);
}

// MLAG_EMULATED_COMPUTE_CAPABILITY (default 90): major * 10 + minor of every
// device, in [50, 120], read at each query (so a test can emulate an older
// GPU for the paths that depend on it). 90 when malformed, with a message.
int ConfiguredComputeCapability() {
  const char* env = std::getenv("MLAG_EMULATED_COMPUTE_CAPABILITY");
  if (env == nullptr || *env == '\0') return 90;
  char* end = nullptr;
  const long cc = std::strtol(env, &end, 10);
  if (*end != '\0' || cc < 50 || cc > 120) {
    std::fprintf(stderr,
                 "cuda emulation: MLAG_EMULATED_COMPUTE_CAPABILITY='%s' is not major * 10 + minor "
                 "in [50, 120]; using 90\n",
                 env);
    return 90;
  }
  return static_cast<int>(cc);
}

// MLAG_EMULATED_GPU_MEMORY: bytes per device, with an optional K, M or G
// suffix (default 16 GiB). 0 when malformed.
size_t ConfiguredMemoryBytes() {
  const char* env = std::getenv("MLAG_EMULATED_GPU_MEMORY");
  if (env == nullptr || *env == '\0') return kDefaultMemoryBytes;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(env, &end, 10);
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  if (*end == 'M' || *end == 'm') shift = 20;
  if (*end == 'G' || *end == 'g') shift = 30;
  if (shift != 0) ++end;
  if (*end != '\0' || n == 0 || n > (~0ull >> shift)) {
    std::fprintf(stderr,
                 "cuda emulation: MLAG_EMULATED_GPU_MEMORY='%s' is not a byte count "
                 "(K, M or G suffix allowed)\n",
                 env);
    return 0;
  }
  return static_cast<size_t>(n << shift);
}

}  // namespace

// ---- Streams ----------------------------------------------------------------------

// Work queued on a stream: runs after the `waits` (other streams reaching a
// sequence number) in the order it was enqueued.
struct QueuedWork {
  WorkItem item;
  std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> waits;
};

struct CaptureState;

}  // namespace mlag::emu

struct CUstream_st {
  int device = 0;
  bool legacy = false;
  bool blocking = true;  // synchronises with the legacy stream
  std::mutex mu;
  std::condition_variable cv;
  std::deque<mlag::emu::QueuedWork> queue;
  uint64_t enqueued = 0;   // work items submitted
  uint64_t completed = 0;  // work items finished
  bool shutdown = false;
  std::unique_ptr<mlag::emu::CaptureState> capture;  // host threads only, under the runtime lock
};

struct CUevent_st {
  int device = 0;
  bool timing = true;
  bool captured = false;                // recorded during a capture: may not be queried
  std::shared_ptr<CUstream_st> stream;  // where it was last recorded
  uint64_t seq = 0;                     // ... after this many items
  std::shared_ptr<std::atomic<int64_t>> reached_ns;  // when the record ran (0: not yet)
};

struct CUgraphNode_st {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  mlag::emu::WorkItem item;
};

struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;  // in capture order
  std::vector<std::pair<CUgraphNode_st*, CUgraphNode_st*>> edges;
  std::vector<cudaGraphEdgeData> edge_data;  // parallel to edges
  std::vector<void*> communicators;          // referenced by collective nodes
  ~CUgraph_st() {
    for (void* c : communicators) mlag::emu::CommGraphRef(c, -1);
  }
};

struct CUgraphExec_st {
  int device = 0;
  std::vector<cudaGraphNodeType> types;  // per node, in launch order
  std::vector<mlag::emu::WorkItem> items;
  std::vector<void*> communicators;
  ~CUgraphExec_st() {
    for (void* c : communicators) mlag::emu::CommGraphRef(c, -1);
  }
};

namespace mlag::emu {

struct CaptureState {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  unsigned long long id = 0;
  bool invalidated = false;
  std::string why;  // what invalidated it
  std::unique_ptr<CUgraph_st> graph;
  CUgraphNode_st* last = nullptr;  // the capture's current dependency
};

namespace {

struct Allocation {
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int device = -1;
};

struct DeviceState {
  int index = 0;
  size_t total_bytes = 0;
  size_t used_bytes = 0;
  std::vector<bool> peer_access;  // enabled towards each device
  std::shared_ptr<CUstream_st> legacy;
  std::atomic<int> sticky{cudaSuccess};  // the first fault of work on this device
};

// The process-wide state. Leaked on purpose: workers of streams nobody
// destroyed may still run while static destructors do.
struct Runtime {
  std::mutex mu;
  int device_count = 0;
  std::vector<std::unique_ptr<DeviceState>> devices;
  std::map<uintptr_t, Allocation> allocations;                   // by start address
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;  // live handles
  std::set<CUevent_st*> events;
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  unsigned long long next_capture_id = 1;
  std::map<const void*, int> smem_limits;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  std::mutex kernel_mu;                    // one grid at a time (see RunGridExclusive)
};

Runtime& R() {
  static Runtime* runtime = [] {
    auto* r = new Runtime();
    const int n = ConfiguredDeviceCount();
    const size_t bytes = ConfiguredMemoryBytes();
    r->device_count = n < 0 || bytes == 0 ? -1 : n;
    for (int i = 0; i < std::max(n, 0); ++i) {
      auto d = std::make_unique<DeviceState>();
      d->index = i;
      d->total_bytes = bytes;
      d->peer_access.assign(static_cast<size_t>(n), false);
      r->devices.push_back(std::move(d));
    }
    return r;
  }();
  return *runtime;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local cudaStreamCaptureMode t_interaction_mode = cudaStreamCaptureModeGlobal;

// Records `e` as the thread's last error and returns it.
cudaError_t Err(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

bool ValidDevice(int device) { return device >= 0 && device < R().device_count; }

DeviceState& Dev(int device) { return *R().devices[static_cast<size_t>(device)]; }

// cudaErrorNoDevice / cudaErrorInitializationError when there is nothing to
// run on; else the current device's sticky error.
cudaError_t CheckContext() {
  Runtime& r = R();
  if (r.device_count < 0) return cudaErrorInitializationError;
  if (r.device_count == 0) return cudaErrorNoDevice;
  return static_cast<cudaError_t>(Dev(t_device).sticky.load());
}

// ---- Stream machinery ----------------------------------------------------------

void WaitFor(CUstream_st* s, uint64_t seq) {
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->completed >= seq; });
}

void Worker(std::shared_ptr<CUstream_st> s) {
  for (;;) {
    QueuedWork work;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return !s->queue.empty() || s->shutdown; });
      if (s->queue.empty()) return;  // shut down and drained
      work = std::move(s->queue.front());
      s->queue.pop_front();
    }
    for (auto& [other, seq] : work.waits) WaitFor(other.get(), seq);
    DeviceState& d = Dev(s->device);
    if (d.sticky.load() == cudaSuccess) {
      const cudaError_t e = work.item.run();
      if (e != cudaSuccess) {
        int expected = cudaSuccess;
        if (d.sticky.compare_exchange_strong(expected, e)) {
          std::fprintf(stderr, "cuda emulation: cuda:%d: %s failed with %s: %s\n", s->device,
                       work.item.what.c_str(), cudaGetErrorName(e), cudaGetErrorString(e));
        }
      }
    } else if (work.item.on_skip) {
      work.item.on_skip();  // after a fault the device runs nothing more, as a real context
    }
    std::lock_guard<std::mutex> lock(s->mu);
    ++s->completed;
    s->cv.notify_all();
  }
}

std::shared_ptr<CUstream_st> NewStream(int device, bool legacy, bool blocking) {
  auto s = std::make_shared<CUstream_st>();
  s->device = device;
  s->legacy = legacy;
  s->blocking = blocking;
  std::thread(Worker, s).detach();
  return s;
}

// The stream a handle names (nullptr and cudaStreamLegacy: the current
// device's legacy stream); nullptr for an unknown handle. Caller holds R().mu.
std::shared_ptr<CUstream_st> ResolveLocked(cudaStream_t handle) {
  Runtime& r = R();
  if (handle == nullptr || handle == cudaStreamLegacy) {
    if (!ValidDevice(t_device)) return nullptr;
    DeviceState& d = Dev(t_device);
    if (!d.legacy) d.legacy = NewStream(t_device, true, true);
    return d.legacy;
  }
  auto it = r.streams.find(handle);
  return it == r.streams.end() ? nullptr : it->second;
}

// The last sequence number enqueued on `s` (the caller holds R().mu, which
// serialises every enqueue).
uint64_t Tail(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mu);
  return s->enqueued;
}

// Appends work to `s` with the legacy stream's implicit ordering: work on
// the legacy stream waits for all earlier work on the device's blocking
// streams, and work on a blocking stream waits for earlier legacy work.
// `waits`: what else the item waits for (an event's stream position).
// Caller holds R().mu. Returns the item's sequence number (1-based).
uint64_t PushLocked(const std::shared_ptr<CUstream_st>& s, WorkItem item,
                    std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> waits = {}) {
  Runtime& r = R();
  QueuedWork work;
  work.item = std::move(item);
  work.waits = std::move(waits);
  DeviceState& d = Dev(s->device);
  if (s->legacy) {
    for (auto& [handle, other] : r.streams) {
      if (other->device == s->device && other->blocking && !other->legacy) {
        work.waits.emplace_back(other, Tail(other.get()));
      }
    }
  } else if (s->blocking && d.legacy) {
    work.waits.emplace_back(d.legacy, Tail(d.legacy.get()));
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->queue.push_back(std::move(work));
  const uint64_t seq = ++s->enqueued;
  s->cv.notify_all();
  return seq;
}

// ---- Capture rules ---------------------------------------------------------------

// Captures whose mode forbids the calling thread's unsafe calls. Caller
// holds R().mu.
std::vector<CUstream_st*> ForbiddingCapturesLocked() {
  std::vector<CUstream_st*> out;
  if (t_interaction_mode == cudaStreamCaptureModeRelaxed) return out;
  const std::thread::id me = std::this_thread::get_id();
  for (auto& [handle, s] : R().streams) {
    if (!s->capture || s->capture->invalidated) continue;
    const CaptureState& c = *s->capture;
    if ((c.thread == me && c.mode != cudaStreamCaptureModeRelaxed) ||
        (c.thread != me && c.mode == cudaStreamCaptureModeGlobal)) {
      out.push_back(s.get());
    }
  }
  return out;
}

void Invalidate(CUstream_st* s, const std::string& why) {
  if (s->capture && !s->capture->invalidated) {
    s->capture->invalidated = true;
    s->capture->why = why;
  }
}

// For an unsafe call: cudaErrorStreamCaptureUnsupported (and the offending
// captures invalidated) when a capture forbids it. Caller holds R().mu.
cudaError_t UnsafeCallLocked(const char* call) {
  std::vector<CUstream_st*> forbidding = ForbiddingCapturesLocked();
  if (forbidding.empty()) return cudaSuccess;
  for (CUstream_st* s : forbidding) {
    Invalidate(s, std::string(call) + " was called during the capture");
  }
  return cudaErrorStreamCaptureUnsupported;
}

// Using the legacy stream while a blocking stream of its device captures
// would make an implicit dependency on the capture: cudaErrorStreamCaptureImplicit,
// and those captures are invalidated. Caller holds R().mu.
cudaError_t LegacyUseLocked(const std::shared_ptr<CUstream_st>& s, const char* call) {
  if (!s->legacy) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  for (auto& [handle, other] : R().streams) {
    if (other->device == s->device && other->blocking && other->capture &&
        !other->capture->invalidated) {
      Invalidate(other.get(), std::string(call) + " used the legacy stream during the capture");
      e = cudaErrorStreamCaptureImplicit;
    }
  }
  return e;
}

cudaGraphNodeType NodeType(WorkKind kind) {
  switch (kind) {
    case WorkKind::kKernel:
      return cudaGraphNodeTypeKernel;
    case WorkKind::kMemcpy:
      return cudaGraphNodeTypeMemcpy;
    case WorkKind::kMemset:
      return cudaGraphNodeTypeMemset;
    case WorkKind::kCollective:
      return cudaGraphNodeTypeKernel;  // NCCL's are kernels
    case WorkKind::kHost:
      return cudaGraphNodeTypeHost;
  }
  return cudaGraphNodeTypeEmpty;
}

// Adds `item` to the capture of `s` as a node depending on the previous one.
void RecordLocked(CUstream_st* s, WorkItem item) {
  CaptureState& c = *s->capture;
  auto node = std::make_unique<CUgraphNode_st>();
  node->type = NodeType(item.kind);
  if (item.communicator != nullptr &&
      std::find(c.graph->communicators.begin(), c.graph->communicators.end(), item.communicator) ==
          c.graph->communicators.end()) {
    c.graph->communicators.push_back(item.communicator);
    CommGraphRef(item.communicator, +1);
  }
  node->item = std::move(item);
  if (c.last != nullptr) {
    c.graph->edges.emplace_back(c.last, node.get());
    // A kernel launched with programmatic stream serialization right after
    // a kernel: a programmatic edge from that kernel's programmatic port.
    cudaGraphEdgeData data{};
    if (node->item.programmatic && c.last->type == cudaGraphNodeTypeKernel) {
      data.from_port = cudaGraphKernelNodePortProgrammatic;
      data.type = cudaGraphDependencyTypeProgrammatic;
    }
    c.graph->edge_data.push_back(data);
  }
  c.last = node.get();
  c.graph->nodes.push_back(std::move(node));
}

// Enqueues, or records while capturing; the common path of every stream
// operation. Caller holds R().mu.
cudaError_t SubmitLocked(const std::shared_ptr<CUstream_st>& s, WorkItem item,
                         uint64_t* seq = nullptr) {
  if (s->capture) {
    if (s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    RecordLocked(s.get(), std::move(item));
    if (seq != nullptr) *seq = 0;
    return cudaSuccess;
  }
  const cudaError_t implicit = LegacyUseLocked(s, item.what.c_str());
  if (implicit != cudaSuccess) return implicit;
  const uint64_t n = PushLocked(s, std::move(item));
  if (seq != nullptr) *seq = n;
  return cudaSuccess;
}

// ---- Memory helpers ----------------------------------------------------------------

// The allocation containing [p, p + bytes), or allocations.end().
std::map<uintptr_t, Allocation>::iterator FindLocked(const void* p) {
  Runtime& r = R();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = r.allocations.upper_bound(a);
  if (it == r.allocations.begin()) return r.allocations.end();
  --it;
  if (a <= it->first + it->second.bytes) return it;
  return r.allocations.end();
}

MemoryInfo LookupLocked(const void* p) {
  MemoryInfo info;
  if (p == nullptr) return info;
  auto it = FindLocked(p);
  if (it == R().allocations.end()) return info;
  info.kind = it->second.kind;
  info.device = it->second.device;
  info.base = reinterpret_cast<const char*>(it->first);
  info.bytes = it->second.bytes;
  return info;
}

bool RangeInside(const MemoryInfo& m, const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  return c >= m.base && c + bytes <= m.base + m.bytes;
}

// Classifies a copy's endpoints and checks them against `kind`.
struct CopyEnds {
  MemoryInfo dst, src;
  bool dst_host = false, src_host = false;  // pageable or pinned host memory
  bool dst_pinned = false, src_pinned = false;
};

cudaError_t ClassifyCopyLocked(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                               CopyEnds* ends) {
  ends->dst = LookupLocked(dst);
  ends->src = LookupLocked(src);
  ends->dst_host = ends->dst.kind != MemoryKind::kDevice;
  ends->src_host = ends->src.kind != MemoryKind::kDevice;
  ends->dst_pinned = ends->dst.kind == MemoryKind::kPinnedHost;
  ends->src_pinned = ends->src.kind == MemoryKind::kPinnedHost;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  switch (kind) {
    case cudaMemcpyHostToHost:
      if (!ends->dst_host || !ends->src_host) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyHostToDevice:
      if (ends->dst_host || !ends->src_host) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDeviceToHost:
      if (!ends->dst_host || ends->src_host) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDeviceToDevice:
      if (ends->dst_host || ends->src_host) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
  // Device (and pinned) ranges must lie inside their allocation.
  if (ends->dst.kind != MemoryKind::kUnregistered && !RangeInside(ends->dst, dst, bytes)) {
    return cudaErrorInvalidValue;
  }
  if (ends->src.kind != MemoryKind::kUnregistered && !RangeInside(ends->src, src, bytes)) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

// ---- Internal interface -------------------------------------------------------------

void SetLastError(cudaError_t error) { Err(error); }

void FatalRule(const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

MemoryInfo Lookup(const void* p) {
  std::lock_guard<std::mutex> lock(R().mu);
  return LookupLocked(p);
}

std::string CheckDeviceAccess(const void* p, size_t bytes, int device) {
  std::lock_guard<std::mutex> lock(R().mu);
  const MemoryInfo m = LookupLocked(p);
  if (m.kind == MemoryKind::kUnregistered) {
    return Hex(p) + " is not device memory (nor pinned host memory)";
  }
  if (!RangeInside(m, p, bytes)) {
    return Hex(p) + " + " + std::to_string(bytes) + " bytes runs past its allocation of " +
           std::to_string(m.bytes) + " bytes";
  }
  if (m.kind == MemoryKind::kDevice && m.device != device &&
      !Dev(device).peer_access[static_cast<size_t>(m.device)]) {
    return Hex(p) + " is memory of cuda:" + std::to_string(m.device) +
           ", used on cuda:" + std::to_string(device) + " without peer access";
  }
  return "";
}

int StreamDevice(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (CheckContext() == cudaErrorNoDevice || R().device_count < 0) return -1;
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  return s ? s->device : -1;
}

bool StreamCapturing(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  return s && s->capture != nullptr;
}

cudaError_t Enqueue(cudaStream_t stream, WorkItem item) {
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (item.kind == WorkKind::kKernel && s->device != t_device) {
    return Err(cudaErrorInvalidResourceHandle);  // a stream of another device
  }
  return Err(SubmitLocked(s, std::move(item)));
}

bool CaptureForbidsUnsafeCalls() {
  std::lock_guard<std::mutex> lock(R().mu);
  return !ForbiddingCapturesLocked().empty();
}

void InvalidateCapturesFor(const char* call) {
  std::lock_guard<std::mutex> lock(R().mu);
  UnsafeCallLocked(call);
}

int MaxDynamicSmem(const void* function) {
  std::lock_guard<std::mutex> lock(R().mu);
  auto it = R().smem_limits.find(function);
  return it == R().smem_limits.end() ? kSmemDefault : it->second;
}

void RunGridExclusive(const std::function<void()>& grid) {
  std::lock_guard<std::mutex> lock(R().kernel_mu);
  grid();
}

}  // namespace mlag::emu

using namespace mlag::emu;  // NOLINT: the C API below implements the emulation

// ---- Errors -------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define MLAG_EMU_NAME(e) \
  case e:                \
    return #e;
    MLAG_EMU_NAME(cudaSuccess)
    MLAG_EMU_NAME(cudaErrorInvalidValue)
    MLAG_EMU_NAME(cudaErrorMemoryAllocation)
    MLAG_EMU_NAME(cudaErrorInitializationError)
    MLAG_EMU_NAME(cudaErrorInvalidConfiguration)
    MLAG_EMU_NAME(cudaErrorInvalidPitchValue)
    MLAG_EMU_NAME(cudaErrorInvalidDevicePointer)
    MLAG_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    MLAG_EMU_NAME(cudaErrorInsufficientDriver)
    MLAG_EMU_NAME(cudaErrorInvalidDeviceFunction)
    MLAG_EMU_NAME(cudaErrorNoDevice)
    MLAG_EMU_NAME(cudaErrorInvalidDevice)
    MLAG_EMU_NAME(cudaErrorInvalidResourceHandle)
    MLAG_EMU_NAME(cudaErrorIllegalState)
    MLAG_EMU_NAME(cudaErrorNotReady)
    MLAG_EMU_NAME(cudaErrorIllegalAddress)
    MLAG_EMU_NAME(cudaErrorPeerAccessAlreadyEnabled)
    MLAG_EMU_NAME(cudaErrorPeerAccessNotEnabled)
    MLAG_EMU_NAME(cudaErrorLaunchFailure)
    MLAG_EMU_NAME(cudaErrorNotPermitted)
    MLAG_EMU_NAME(cudaErrorNotSupported)
    MLAG_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    MLAG_EMU_NAME(cudaErrorLossyQuery)
    MLAG_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    MLAG_EMU_NAME(cudaErrorStreamCaptureImplicit)
    MLAG_EMU_NAME(cudaErrorCapturedEvent)
    MLAG_EMU_NAME(cudaErrorStreamCaptureWrongThread)
    MLAG_EMU_NAME(cudaErrorGraphExecUpdateFailure)
    MLAG_EMU_NAME(cudaErrorUnknown)
#undef MLAG_EMU_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error (see MLAG_EMULATED_GPUS / MLAG_EMULATED_GPU_MEMORY)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorPeerAccessAlreadyEnabled:
      return "peer access is already enabled";
    case cudaErrorPeerAccessNotEnabled:
      return "peer access has not been enabled";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotPermitted:
      return "operation not permitted";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorLossyQuery:
      return "the query cannot be answered without losing information (edge data)";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorGraphExecUpdateFailure:
      return "the graph update was not performed because it included changes which violated "
             "constraints specific to instantiated graph update";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  if (e == cudaSuccess && R().device_count > 0)
    e = static_cast<cudaError_t>(Dev(t_device).sticky.load());
  return e;
}

cudaError_t cudaPeekAtLastError() {
  if (t_last_error != cudaSuccess) return t_last_error;
  return R().device_count > 0 ? static_cast<cudaError_t>(Dev(t_device).sticky.load()) : cudaSuccess;
}

// ---- Devices --------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Err(cudaErrorInvalidValue);
  const int n = R().device_count;
  if (n < 0) {
    *count = 0;
    return Err(cudaErrorInitializationError);
  }
  *count = n;
  return n == 0 ? Err(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Err(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (R().device_count <= 0)
    return Err(R().device_count < 0 ? cudaErrorInitializationError : cudaErrorNoDevice);
  if (!ValidDevice(device)) return Err(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return Err(cudaErrorInvalidValue);
  if (!ValidDevice(device)) return Err(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "emulated sm_90 (CPU fibers)");
  prop->totalGlobalMem = Dev(device).total_bytes;
  prop->sharedMemPerBlock = kSmemDefault;
  prop->sharedMemPerBlockOptin = kSmemOptin;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = kSms;
  prop->major = ConfiguredComputeCapability() / 10;
  prop->minor = ConfiguredComputeCapability() % 10;
  // One bus id per device index, the same in every process of the host, as
  // the GPUs of one machine: NCCL tells devices apart by it.
  prop->pciBusID = 0x10 + device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return Err(cudaErrorInvalidValue);
  if (!ValidDevice(device)) return Err(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = kSmemOptin;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = kSms;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = ConfiguredComputeCapability() / 10;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = ConfiguredComputeCapability() % 10;
      return cudaSuccess;
  }
  return Err(cudaErrorInvalidValue);
}

namespace {

// Waits until every work item enqueued on `streams` so far has run.
void Drain(const std::vector<std::shared_ptr<CUstream_st>>& streams) {
  for (const auto& s : streams) WaitFor(s.get(), Tail(s.get()));
}

std::vector<std::shared_ptr<CUstream_st>> DeviceStreamsLocked(int device) {
  std::vector<std::shared_ptr<CUstream_st>> out;
  for (auto& [handle, s] : R().streams) {
    if (s->device == device) out.push_back(s);
  }
  if (Dev(device).legacy) out.push_back(Dev(device).legacy);
  return out;
}

}  // namespace

cudaError_t cudaDeviceSynchronize() {
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    const cudaError_t ctx = CheckContext();
    if (ctx != cudaSuccess) return Err(ctx);
    const cudaError_t unsafe = UnsafeCallLocked("cudaDeviceSynchronize");
    if (unsafe != cudaSuccess) return Err(unsafe);
    streams = DeviceStreamsLocked(t_device);
  }
  Drain(streams);
  return Err(CheckContext());
}

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device) {
  if (can_access == nullptr) return Err(cudaErrorInvalidValue);
  if (!ValidDevice(device) || !ValidDevice(peer_device)) return Err(cudaErrorInvalidDevice);
  *can_access = device != peer_device ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (flags != 0) return Err(cudaErrorInvalidValue);
  if (!ValidDevice(t_device) || !ValidDevice(peer_device) || peer_device == t_device) {
    return Err(cudaErrorInvalidDevice);
  }
  std::vector<bool>::reference enabled =
      Dev(t_device).peer_access[static_cast<size_t>(peer_device)];
  if (enabled) return Err(cudaErrorPeerAccessAlreadyEnabled);
  enabled = true;
  return cudaSuccess;
}

namespace {

// The host's MemAvailable in bytes (SIZE_MAX when unknown): an emulated
// device's memory is host memory, so it can never have more free than that.
size_t HostAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return SIZE_MAX;
  char line[256];
  size_t bytes = SIZE_MAX;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      bytes = static_cast<size_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

}  // namespace

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  const DeviceState& d = Dev(t_device);
  // What the device has left, and never more than the host memory behind it.
  if (free_bytes != nullptr)
    *free_bytes = std::min(d.total_bytes - d.used_bytes, HostAvailableBytes());
  if (total_bytes != nullptr) *total_bytes = d.total_bytes;
  return cudaSuccess;
}

// ---- Memory ---------------------------------------------------------------------------

namespace {

cudaError_t Allocate(void** ptr, size_t bytes, MemoryKind kind, const char* call) {
  if (ptr == nullptr) return Err(cudaErrorInvalidValue);
  *ptr = nullptr;
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  const cudaError_t unsafe = UnsafeCallLocked(call);
  if (unsafe != cudaSuccess) return Err(unsafe);
  if (bytes == 0) return cudaSuccess;
  DeviceState& d = Dev(t_device);
  if (kind == MemoryKind::kDevice && bytes > d.total_bytes - d.used_bytes) {
    return Err(cudaErrorMemoryAllocation);
  }
  const size_t rounded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  void* p = std::aligned_alloc(kDeviceAlignment, rounded);
  if (p == nullptr) return Err(cudaErrorMemoryAllocation);
  if (kind == MemoryKind::kDevice) {
    std::memset(p, kPoison, rounded);
    d.used_bytes += bytes;
  }
  R().allocations[reinterpret_cast<uintptr_t>(p)] =
      Allocation{bytes, kind, kind == MemoryKind::kDevice ? t_device : -1};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Release(void* ptr, MemoryKind kind, const char* call) {
  if (ptr == nullptr) return cudaSuccess;
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    const cudaError_t unsafe = UnsafeCallLocked(call);
    if (unsafe != cudaSuccess) return Err(unsafe);
    auto it = R().allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == R().allocations.end() || it->second.kind != kind) {
      return Err(kind == MemoryKind::kDevice ? cudaErrorInvalidDevicePointer
                                             : cudaErrorInvalidValue);
    }
    // cudaFree waits for the device's work, which may still use the memory;
    // cudaFreeHost for every device's (any may copy from pinned memory).
    if (it->second.kind == MemoryKind::kDevice) {
      streams = DeviceStreamsLocked(it->second.device);
    } else {
      for (size_t d = 0; d < R().devices.size(); ++d) {
        for (auto& st : DeviceStreamsLocked(static_cast<int>(d))) streams.push_back(std::move(st));
      }
    }
  }
  Drain(streams);
  std::lock_guard<std::mutex> lock(R().mu);
  auto it = R().allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == R().allocations.end()) return Err(cudaErrorInvalidDevicePointer);
  if (it->second.kind == MemoryKind::kDevice) Dev(it->second.device).used_bytes -= it->second.bytes;
  R().allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  return Allocate(ptr, bytes, MemoryKind::kDevice, "cudaMalloc");
}
cudaError_t cudaFree(void* ptr) { return Release(ptr, MemoryKind::kDevice, "cudaFree"); }
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return Allocate(ptr, bytes, MemoryKind::kPinnedHost, "cudaMallocHost");
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (flags != cudaHostAllocDefault) return Err(cudaErrorNotSupported);
  return Allocate(ptr, bytes, MemoryKind::kPinnedHost, "cudaHostAlloc");
}
cudaError_t cudaFreeHost(void* ptr) {
  return Release(ptr, MemoryKind::kPinnedHost, "cudaFreeHost");
}

namespace {

// A copy as stream work: `dst` <- `src`, reading `src` when the work runs.
WorkItem CopyWork(void* dst, const void* src, size_t bytes) {
  WorkItem w;
  w.kind = WorkKind::kMemcpy;
  w.what = "memcpy of " + std::to_string(bytes) + " bytes";
  w.run = [dst, src, bytes] {
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  };
  return w;
}

// A copy from pageable host memory: the source is taken now, delivered when
// the work runs (a later change of the source does not reach the device,
// and the device may see the data only after the call returned).
WorkItem StagedCopyWork(void* dst, const void* src, size_t bytes) {
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + bytes);
  WorkItem w;
  w.kind = WorkKind::kMemcpy;
  w.what = "memcpy of " + std::to_string(bytes) + " bytes from pageable host memory";
  w.run = [dst, staged] {
    std::memcpy(dst, staged->data(), staged->size());
    return cudaSuccess;
  };
  return w;
}

// cudaMemcpy / cudaMemcpyAsync. `sync`: the blocking API (legacy stream).
cudaError_t Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                 bool sync) {
  std::shared_ptr<CUstream_st> s;
  uint64_t seq = 0;
  bool wait = false;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    const cudaError_t ctx = CheckContext();
    if (ctx != cudaSuccess) return Err(ctx);
    if (sync) {
      const cudaError_t unsafe = UnsafeCallLocked("cudaMemcpy");
      if (unsafe != cudaSuccess) return Err(unsafe);
    }
    s = ResolveLocked(sync ? nullptr : stream);
    if (!s) return Err(cudaErrorInvalidResourceHandle);
    CopyEnds ends;
    const cudaError_t bad = ClassifyCopyLocked(dst, src, bytes, kind, &ends);
    if (bad != cudaSuccess) return Err(bad);
    if (bytes == 0) return cudaSuccess;
    const bool pageable_src = ends.src_host && !ends.src_pinned;
    const bool pageable_dst = ends.dst_host && !ends.dst_pinned;
    if (s->capture && (pageable_src || pageable_dst)) {
      Invalidate(s.get(), "a copy from or to pageable host memory was captured");
      return Err(cudaErrorStreamCaptureUnsupported);
    }
    if (ends.src_host && ends.dst_host) {
      // Host to host: synchronous, no stream involved.
      std::memmove(dst, src, bytes);
      return cudaSuccess;
    }
    // From pageable memory the source is staged now; cudaMemcpy then
    // returns before the device has the data, as the real one may.
    WorkItem work = pageable_src ? StagedCopyWork(dst, src, bytes) : CopyWork(dst, src, bytes);
    const cudaError_t e = SubmitLocked(s, std::move(work), &seq);
    if (e != cudaSuccess) return Err(e);
    // Blocking cases: any copy into pageable memory (its data must be there
    // on return), and cudaMemcpy with pinned memory on either side.
    wait = pageable_dst || (sync && !pageable_src && (ends.src_host || ends.dst_host));
  }
  if (wait && seq > 0) WaitFor(s.get(), seq);
  return Err(static_cast<cudaError_t>(Dev(s->device).sticky.load()));
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return Copy(dst, src, bytes, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return Copy(dst, src, bytes, kind, stream, false);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (width > dpitch || width > spitch) return Err(cudaErrorInvalidPitchValue);
  if (height == 0 || width == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  // Device to device only (all the project needs), both spans inside their
  // allocations.
  const MemoryInfo d = LookupLocked(dst), sm = LookupLocked(src);
  if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return Err(cudaErrorNotSupported);
  if (d.kind != MemoryKind::kDevice || sm.kind != MemoryKind::kDevice ||
      !RangeInside(d, dst, dpitch * (height - 1) + width) ||
      !RangeInside(sm, src, spitch * (height - 1) + width)) {
    return Err(cudaErrorInvalidValue);
  }
  WorkItem w;
  w.kind = WorkKind::kMemcpy;
  w.what =
      "2D memcpy of " + std::to_string(height) + " rows of " + std::to_string(width) + " bytes";
  w.run = [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
    }
    return cudaSuccess;
  };
  return Err(SubmitLocked(s, std::move(w)));
}

namespace {

cudaError_t Set(void* ptr, int value, size_t bytes, cudaStream_t stream, bool sync) {
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  if (sync) {
    const cudaError_t unsafe = UnsafeCallLocked("cudaMemset");
    if (unsafe != cudaSuccess) return Err(unsafe);
  }
  std::shared_ptr<CUstream_st> s = ResolveLocked(sync ? nullptr : stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  const MemoryInfo m = LookupLocked(ptr);
  if (m.kind == MemoryKind::kUnregistered || !RangeInside(m, ptr, bytes)) {
    return Err(cudaErrorInvalidValue);
  }
  WorkItem w;
  w.kind = WorkKind::kMemset;
  w.what = "memset of " + std::to_string(bytes) + " bytes";
  w.run = [ptr, value, bytes] {
    std::memset(ptr, value, bytes);
    return cudaSuccess;
  };
  // Both forms return before the device has done it (cudaMemset too, for
  // device memory): the legacy stream orders it.
  return Err(SubmitLocked(s, std::move(w)));
}

}  // namespace

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  return Set(ptr, value, bytes, nullptr, true);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return Set(ptr, value, bytes, stream, false);
}

// ---- Streams --------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~1u) != 0) return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  std::shared_ptr<CUstream_st> s = NewStream(t_device, false, (flags & cudaStreamNonBlocking) == 0);
  R().streams[s.get()] = s;
  *stream = s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  auto it = R().streams.find(stream);
  if (it == R().streams.end()) return Err(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUstream_st> s = it->second;
  if (s->capture) s->capture.reset();  // an unfinished capture is dropped with it
  R().streams.erase(it);
  // Like the real call, this returns at once: work already queued still
  // runs, and the worker exits when it has.
  std::lock_guard<std::mutex> slock(s->mu);
  s->shutdown = true;
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::shared_ptr<CUstream_st> s;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    const cudaError_t ctx = CheckContext();
    if (ctx != cudaSuccess) return Err(ctx);
    s = ResolveLocked(stream);
    if (!s) return Err(cudaErrorInvalidResourceHandle);
    if (s->capture) {
      Invalidate(s.get(), "cudaStreamSynchronize of the capturing stream");
      return Err(cudaErrorStreamCaptureUnsupported);
    }
    const cudaError_t unsafe = UnsafeCallLocked("cudaStreamSynchronize");
    if (unsafe != cudaSuccess) return Err(unsafe);
    const cudaError_t implicit = LegacyUseLocked(s, "cudaStreamSynchronize");
    if (implicit != cudaSuccess) return Err(implicit);
    seq = Tail(s.get());
  }
  WaitFor(s.get(), seq);
  return Err(static_cast<cudaError_t>(Dev(s->device).sticky.load()));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    Invalidate(s.get(), "cudaStreamQuery of the capturing stream");
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  const cudaError_t unsafe = UnsafeCallLocked("cudaStreamQuery");
  if (unsafe != cudaSuccess) return Err(unsafe);
  const cudaError_t sticky = static_cast<cudaError_t>(Dev(s->device).sticky.load());
  if (sticky != cudaSuccess) return Err(sticky);
  std::lock_guard<std::mutex> slock(s->mu);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

// ---- Events ----------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~cudaEventDisableTiming) != 0) return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  auto* e = new CUevent_st();
  e->device = t_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  R().events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().events.erase(event) == 0) return Err(cudaErrorInvalidResourceHandle);
  delete event;  // a record still queued holds its own reference to the time
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().events.count(event) == 0) return Err(cudaErrorInvalidResourceHandle);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    // Recorded inside a capture: usable for cross-stream ordering within
    // it, never to query or wait on from the host.
    event->captured = true;
    return cudaSuccess;
  }
  const cudaError_t implicit = LegacyUseLocked(s, "cudaEventRecord");
  if (implicit != cudaSuccess) return Err(implicit);
  auto reached = std::make_shared<std::atomic<int64_t>>(0);
  WorkItem w;
  w.kind = WorkKind::kKernel;
  w.what = "event record";
  w.run = [reached] {
    reached->store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
    return cudaSuccess;
  };
  event->captured = false;
  event->stream = s;
  event->reached_ns = reached;
  event->seq = PushLocked(s, std::move(w));
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<CUstream_st> s;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (R().events.count(event) == 0) return Err(cudaErrorInvalidResourceHandle);
    if (event->captured) return Err(cudaErrorCapturedEvent);
    const cudaError_t unsafe = UnsafeCallLocked("cudaEventSynchronize");
    if (unsafe != cudaSuccess) return Err(unsafe);
    s = event->stream;
    seq = event->seq;
  }
  if (!s) return cudaSuccess;  // never recorded: complete
  WaitFor(s.get(), seq);
  return Err(static_cast<cudaError_t>(Dev(s->device).sticky.load()));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().events.count(event) == 0) return Err(cudaErrorInvalidResourceHandle);
  if (event->captured) return Err(cudaErrorCapturedEvent);
  const cudaError_t unsafe = UnsafeCallLocked("cudaEventQuery");
  if (unsafe != cudaSuccess) return Err(unsafe);
  if (!event->stream) return cudaSuccess;
  std::lock_guard<std::mutex> slock(event->stream->mu);
  return event->stream->completed >= event->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (ms == nullptr) return Err(cudaErrorInvalidValue);
  if (R().events.count(start) == 0 || R().events.count(end) == 0) {
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (!start->timing || !end->timing || !start->reached_ns || !end->reached_ns) {
    return Err(cudaErrorInvalidResourceHandle);
  }
  const int64_t a = start->reached_ns->load(), b = end->reached_ns->load();
  if (a == 0 || b == 0) return Err(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(b - a) / 1e6);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (flags != 0) return Err(cudaErrorInvalidValue);
  if (R().events.count(event) == 0) return Err(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (s->capture || event->captured) return Err(cudaErrorNotSupported);  // no cross-stream capture
  if (!event->stream) return cudaSuccess;
  WorkItem w;
  w.what = "event wait";
  w.run = [] { return cudaSuccess; };
  const cudaError_t implicit = LegacyUseLocked(s, w.what.c_str());
  if (implicit != cudaSuccess) return Err(implicit);
  PushLocked(s, std::move(w), {{event->stream, event->seq}});
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  WorkItem w;
  w.kind = WorkKind::kHost;
  w.what = "host function";
  w.run = [fn, user_data] {
    fn(user_data);
    return cudaSuccess;
  };
  return Err(SubmitLocked(s, std::move(w)));
}

// ---- Kernels --------------------------------------------------------------------------

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return Err(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > kSmemOptin) {
    return Err(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lock(R().mu);
  R().smem_limits[func] = value;
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr) return Err(cudaErrorInvalidValue);
  if (func == nullptr) return Err(cudaErrorInvalidDeviceFunction);
  // Every emulated kernel counts as built for the emulated device (9.0).
  attr->binaryVersion = 90;
  attr->ptxVersion = 90;
  attr->maxThreadsPerBlock = 1024;
  attr->maxDynamicSharedSizeBytes = static_cast<size_t>(MaxDynamicSmem(func));
  return cudaSuccess;
}

// ---- Stream capture ---------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return Err(cudaErrorInvalidValue);
  }
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (s->legacy) return Err(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (s->capture) return Err(cudaErrorIllegalState);
  auto c = std::make_unique<CaptureState>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->id = R().next_capture_id++;
  c->graph = std::make_unique<CUgraph_st>();
  s->capture = std::move(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return Err(cudaErrorInvalidValue);
  *graph = nullptr;
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (!s->capture) return Err(cudaErrorIllegalState);
  if (s->capture->mode != cudaStreamCaptureModeRelaxed &&
      s->capture->thread != std::this_thread::get_id()) {
    return Err(cudaErrorStreamCaptureWrongThread);
  }
  std::unique_ptr<CaptureState> c = std::move(s->capture);
  if (c->invalidated) {
    std::fprintf(stderr, "cuda emulation: capture %llu invalidated: %s\n", c->id, c->why.c_str());
    return Err(cudaErrorStreamCaptureInvalidated);
  }
  *graph = c->graph.release();
  R().graphs.insert(*graph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** dependencies,
                                     const cudaGraphEdgeData** edge_data,
                                     size_t* num_dependencies) {
  if (status == nullptr) return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  const CaptureState* c = s->capture.get();
  *status = c == nullptr     ? cudaStreamCaptureStatusNone
            : c->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  if (id != nullptr) *id = c ? c->id : 0;
  if (graph != nullptr) *graph = c ? c->graph.get() : nullptr;
  // The dependency set is the capture's last node (a pointer into the
  // capture, valid until its next operation).
  if (dependencies != nullptr) {
    *dependencies =
        c && c->last ? reinterpret_cast<const cudaGraphNode_t*>(&s->capture->last) : nullptr;
  }
  if (edge_data != nullptr) *edge_data = nullptr;
  if (num_dependencies != nullptr) *num_dependencies = c && c->last ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return Err(cudaErrorInvalidValue);
  std::swap(*mode, t_interaction_mode);
  return cudaSuccess;
}

// ---- Graphs ------------------------------------------------------------------------------

namespace {

bool KnownGraphLocked(cudaGraph_t g) { return g != nullptr && R().graphs.count(g) != 0; }

// `g` as a capture in progress (its graph is visible through
// cudaStreamGetCaptureInfo) or a finished graph.
bool ReadableGraphLocked(cudaGraph_t g) {
  if (g == nullptr) return false;
  if (R().graphs.count(g) != 0) return true;
  for (auto& [handle, s] : R().streams) {
    if (s->capture && s->capture->graph.get() == g) return true;
  }
  return false;
}

// The nodes of `g` in an order that respects its edges (captures are
// chains, so this is capture order; checked anyway).
std::vector<CUgraphNode_st*> TopologicalOrder(const CUgraph_st& g) {
  std::map<CUgraphNode_st*, int> indegree;
  std::map<CUgraphNode_st*, std::vector<CUgraphNode_st*>> next;
  for (const auto& n : g.nodes) indegree[n.get()] = 0;
  for (const auto& [from, to] : g.edges) {
    ++indegree[to];
    next[from].push_back(to);
  }
  std::vector<CUgraphNode_st*> order;
  std::deque<CUgraphNode_st*> ready;
  for (const auto& n : g.nodes) {
    if (indegree[n.get()] == 0) ready.push_back(n.get());
  }
  while (!ready.empty()) {
    CUgraphNode_st* n = ready.front();
    ready.pop_front();
    order.push_back(n);
    for (CUgraphNode_st* m : next[n]) {
      if (--indegree[m] == 0) ready.push_back(m);
    }
  }
  return order;
}

}  // namespace

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  if (num_nodes == nullptr) return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  if (!ReadableGraphLocked(graph)) return Err(cudaErrorInvalidValue);
  const size_t n = graph->nodes.size();
  if (nodes != nullptr) {
    for (size_t i = 0; i < std::min(n, *num_nodes); ++i) nodes[i] = graph->nodes[i].get();
    *num_nodes = std::min(n, *num_nodes);
  } else {
    *num_nodes = n;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphGetEdges(cudaGraph_t graph, cudaGraphNode_t* from, cudaGraphNode_t* to,
                              cudaGraphEdgeData* edge_data, size_t* num_edges) {
  if (num_edges == nullptr || ((from == nullptr) != (to == nullptr)))
    return Err(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(R().mu);
  if (!ReadableGraphLocked(graph)) return Err(cudaErrorInvalidValue);
  const size_t n = graph->edges.size();
  if (from == nullptr) {
    *num_edges = n;
    return cudaSuccess;
  }
  const size_t k = std::min(n, *num_edges);
  // As CUDA: edges with data (programmatic ones) cannot be listed without it.
  if (edge_data == nullptr) {
    for (const cudaGraphEdgeData& d : graph->edge_data) {
      if (d.type != 0 || d.from_port != 0 || d.to_port != 0) return Err(cudaErrorLossyQuery);
    }
  }
  for (size_t i = 0; i < k; ++i) {
    from[i] = graph->edges[i].first;
    to[i] = graph->edges[i].second;
    if (edge_data != nullptr) edge_data[i] = graph->edge_data[i];
  }
  *num_edges = k;
  return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type) {
  if (node == nullptr || type == nullptr) return Err(cudaErrorInvalidValue);
  *type = node->type;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::unique_ptr<CUgraph_st> owned;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (R().graphs.erase(graph) == 0) return Err(cudaErrorInvalidValue);
    owned.reset(graph);
  }
  return cudaSuccess;  // owned's destructor drops its communicator references
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (exec == nullptr) return Err(cudaErrorInvalidValue);
  *exec = nullptr;
  std::lock_guard<std::mutex> lock(R().mu);
  if (!KnownGraphLocked(graph) || flags != 0) return Err(cudaErrorInvalidValue);
  auto e = std::make_unique<CUgraphExec_st>();
  e->device = t_device;
  for (CUgraphNode_st* n : TopologicalOrder(*graph)) {
    e->types.push_back(n->type);
    e->items.push_back(n->item);
  }
  for (void* c : graph->communicators) {
    e->communicators.push_back(c);
    CommGraphRef(c, +1);
  }
  *exec = e.release();
  R().execs.insert(*exec);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(R().mu);
  const cudaError_t ctx = CheckContext();
  if (ctx != cudaSuccess) return Err(ctx);
  if (R().execs.count(exec) == 0) return Err(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUstream_st> s = ResolveLocked(stream);
  if (!s) return Err(cudaErrorInvalidResourceHandle);
  if (s->capture) return Err(cudaErrorNotSupported);  // graphs within captures are not emulated
  if (s->device != exec->device) return Err(cudaErrorInvalidResourceHandle);
  // One work item running every node in order, with the node bodies as
  // they are now (a later update does not change a launch already queued).
  // The launch holds the communicators it uses until it has run.
  std::vector<WorkItem> items = exec->items;
  std::vector<void*> comms = exec->communicators;
  for (void* c : comms) CommLaunchRef(c, +1);
  WorkItem w;
  w.kind = WorkKind::kKernel;
  w.what = "graph launch of " + std::to_string(items.size()) + " nodes";
  w.run = [items = std::move(items), comms] {
    cudaError_t result = cudaSuccess;
    for (const WorkItem& item : items) {
      result = item.run();
      if (result != cudaSuccess) {
        std::fprintf(stderr, "cuda emulation: graph node %s failed\n", item.what.c_str());
        break;
      }
    }
    for (void* c : comms) CommLaunchRef(c, -1);
    return result;
  };
  w.on_skip = [comms] {
    for (void* c : comms) CommLaunchRef(c, -1);
  };
  const cudaError_t e = SubmitLocked(s, std::move(w));
  if (e != cudaSuccess) {
    for (void* c : exec->communicators) CommLaunchRef(c, -1);
  }
  return Err(e);
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo* result_info) {
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().execs.count(exec) == 0 || !KnownGraphLocked(graph) || result_info == nullptr) {
    return Err(cudaErrorInvalidValue);
  }
  *result_info = cudaGraphExecUpdateResultInfo{cudaGraphExecUpdateSuccess, nullptr, nullptr};
  const std::vector<CUgraphNode_st*> order = TopologicalOrder(*graph);
  auto fail = [&](cudaGraphExecUpdateResult why, CUgraphNode_st* node) {
    result_info->result = why;
    result_info->errorNode = node;
    return Err(cudaErrorGraphExecUpdateFailure);
  };
  if (order.size() != exec->items.size())
    return fail(cudaGraphExecUpdateErrorTopologyChanged, nullptr);
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i]->type != exec->types[i])
      return fail(cudaGraphExecUpdateErrorNodeTypeChanged, order[i]);
    if (order[i]->item.function != exec->items[i].function) {
      return fail(cudaGraphExecUpdateErrorFunctionChanged, order[i]);
    }
    if (order[i]->item.communicator != exec->items[i].communicator) {
      return fail(cudaGraphExecUpdateErrorParametersChanged, order[i]);
    }
  }
  for (size_t i = 0; i < order.size(); ++i) exec->items[i] = order[i]->item;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::unique_ptr<CUgraphExec_st> owned;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (R().execs.erase(exec) == 0) return Err(cudaErrorInvalidValue);
    owned.reset(exec);
  }
  return cudaSuccess;
}
