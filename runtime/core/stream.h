// Streams launch named ops; a capture turns a sequence of launches into a
// replayable Graph whose nodes keep the ops' names and kinds.
//
// Every op is launched with a name and an OpKind. On the host an eager launch
// runs the op at once; during a capture the op is recorded as a closure bound
// to the tensor addresses it was launched with, and Graph::Replay runs the
// recorded closures in order. On CUDA the op enqueues its kernels on the stream;
// during a capture (thread-local mode) they land in a cudaGraph_t, and the nodes
// each op added are tagged with its name; the graph's node list is then read
// back from the cudaGraph_t.
//
// Discipline (the same on both backends): a graph reads its inputs only through
// the buffers it was captured with. To feed new data, write into those buffers
// and replay. No allocation is allowed during a capture.
//
// Naming: a launch is named by the innermost NodeScope on the stream when there
// is one (e.g. "layers.3.attn.kv_update"), else by the kernel's own name. All
// launches inside one NodeScope form one graph node.
//
// Example:
//   MLAG_RETURN_IF_ERROR(stream.BeginCapture());
//   { NodeScope s(stream, "layers.0.attn.kv_update", OpKind::kKernel);
//     MLAG_RETURN_IF_ERROR(MlaKvUpdate(stream, ...)); }
//   MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, stream.EndCapture());
//   for (const GraphNode& n : g->nodes()) ...;
//   MLAG_RETURN_IF_ERROR(g->Replay(stream));
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"

namespace mlag {

enum class OpKind : uint8_t { kKernel, kGemm, kComm, kCopy };

// "kernel", "gemm", "comm", "copy".
absl::string_view OpKindName(OpKind kind);

// One named op of a graph. On CUDA an op may have become several nodes of
// the cudaGraph_t (a kernel per launch, a memset, a copy): device_nodes
// counts them; on the host it counts the op's recorded closures.
struct GraphNode {
  std::string name;
  OpKind kind;
  int device_nodes = 1;
};

class Stream;

// A captured sequence of ops, replayable on the stream it was captured on (or
// another stream of the same device).
class Graph {
 public:
  virtual ~Graph() = default;
  // The named ops of the graph, in the order they run. On CUDA this is read
  // from the captured cudaGraph_t (its nodes in dependency order, each
  // mapped to the op that added it), so it shows what the GPU will replay.
  virtual const std::vector<GraphNode>& nodes() const = 0;
  // Runs the graph once on `stream` (asynchronously on CUDA).
  virtual absl::Status Replay(Stream& stream) = 0;
};

// The body of a host op. It runs at launch (eager) or at every replay, so it
// must not allocate device memory and must only touch memory bound at launch.
using HostOp = std::function<absl::Status()>;

// Wall time of the host ops a stream ran eagerly, by node name (the name a
// graph would give the op: its innermost NodeScope, else its own).
struct HostOpProfile {
  struct Entry {
    double seconds = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Entry> ops;
};

// What one op costs, as its launch declares it from the shapes it is given:
// the bytes it must move between memory and the chip (every operand read
// once, every result written once) and its multiply-adds times two, with the
// dtype of the operands those run on (what tensor-core peak bounds the op).
// A part that depends on data the launch cannot see (the cached tokens an
// attention reads, the experts a batch routes to) is left out; whoever knows
// it adds it (mlag bench).
struct OpCost {
  double bytes = 0;
  double flops = 0;
  DType math = DType::kF32;
};

// Device time of the ops a CUDA stream ran eagerly, by node name (as
// HostOpProfile), each launch timed by a pair of events around it, with the
// cost its launch declared; and the graphs it replayed, each timed the same
// way (for the GPU's idle time between consecutive replays).
struct DeviceOpProfile {
  struct Entry {
    double seconds = 0;
    double bytes = 0;
    double flops = 0;
    // Its first launch's, replaced by each later launch's that has flops
    // (a linear node: the GEMM's, not its input conversion's).
    DType math = DType::kF32;
    int64_t launches = 0;
  };
  std::map<std::string, Entry> ops;
  struct Replay {
    double start_seconds = 0;  // from the first event of the profile
    double end_seconds = 0;
  };
  std::vector<Replay> replays;
};

class Stream {
 public:
  // A new stream on `device`, which must outlive it.
  static absl::StatusOr<std::unique_ptr<Stream>> Create(Device* device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device& device() const { return *device_; }
  bool is_cuda() const { return device_->is_cuda(); }
  // The cudaStream_t (as void*), or nullptr on the host.
  void* native() const { return native_; }

  // Host device: runs `op` now, or records it when capturing.
  absl::Status LaunchHost(absl::string_view default_name, OpKind kind, HostOp op);

  // While set, every host op run eagerly is timed into `profile` (`mlag
  // bench --profile`); nullptr stops. Graph replays are not timed.
  void set_host_profile(HostOpProfile* profile) { host_profile_ = profile; }

  // CUDA device: `enqueue` enqueues the op's work on native() and returns
  // a cudaError_t as int. When capturing, the graph nodes it adds are tagged.
  // `cost` is what the op moves and computes (read only while profiling).
  absl::Status LaunchCuda(absl::string_view default_name, OpKind kind,
                          absl::FunctionRef<int(void* cuda_stream)> enqueue,
                          const OpCost& cost = {});

  // CUDA: from Begin to End, every eager launch and every graph replay on
  // the stream is timed by events (`mlag bench --profile`); End waits for
  // the stream and adds the times to `profile`. Not during a capture.
  // Timing each launch separates launches the GPU would overlap, and adds
  // an event's cost to each: the figures are per-op upper bounds.
  absl::Status BeginDeviceProfile(DeviceOpProfile* profile);
  absl::Status EndDeviceProfile();
  // Called by a CUDA graph's Replay around its launch while profiling.
  absl::Status RecordReplayStart();
  absl::Status RecordReplayEnd();

  absl::Status BeginCapture();
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture();
  bool capturing() const { return capturing_; }

  // Waits for all work on the stream (no-op on the host, which is
  // synchronous). With a watchdog set, waits at most its timeout and checks
  // its health function while waiting (see SetWatchdog).
  absl::Status Synchronize();

  // Makes Synchronize give up after `timeout` with the error
  // `timed_out(waited)` returns (empty: a plain DeadlineExceeded), and fail
  // as soon as `health` returns an error (polled while waiting): for streams
  // whose work waits on other ranks (collectives), so a dead or hung peer
  // surfaces as an error instead of a hang. The engine passes a
  // PeerTimeoutError (runtime/core/peer_fault.h), so the watchdog reports a
  // peer fault as the communicators do. `health` may be empty. A zero
  // timeout removes the watchdog.
  void SetWatchdog(absl::Duration timeout, std::function<absl::Status()> health,
                   std::function<absl::Status(absl::Duration waited)> timed_out = nullptr);

  // Stream-ordered copies and fills outside any graph (refused during a
  // capture): run now on the host; enqueued on CUDA (cudaMemcpyAsync /
  // cudaMemsetAsync), so they are ordered with the stream's kernels. A copy
  // from pinned host memory (Device::AllocatePinned) is asynchronous: keep
  // the source unchanged until the stream has run it. A copy into pageable
  // host memory returns when the data is there.
  absl::Status CopyFromHost(void* device_dst, const void* host_src, size_t bytes);
  absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes);
  absl::Status Memset(void* device_dst, int value, size_t bytes);

  // Library state kept per stream (the cuBLASLt context of
  // kernels/cuda_blas.cc), found by `key` and released with the stream,
  // before its CUDA stream is destroyed. A stream has one user thread.
  std::shared_ptr<void> attachment(const void* key) const;
  void set_attachment(const void* key, std::shared_ptr<void> value);  // nullptr erases

  // Number of ops launched eagerly plus ops recorded, since creation.
  uint64_t launches() const { return launches_; }

 private:
  friend class NodeScope;
  struct Scope {
    std::string name;
    OpKind kind;
    uint64_t id;
  };
  struct CaptureState;

  explicit Stream(Device* device);
  // The name, kind and scope id a launch gets (scope id 0 = no scope).
  void ResolveName(absl::string_view default_name, OpKind kind, std::string* name,
                   OpKind* resolved_kind, uint64_t* scope_id) const;

  absl::Status RefuseDuringCapture(absl::string_view what) const;
  // Synchronize's wait, for everything queued (event nullptr) or up to a
  // recorded cudaEvent_t.
  absl::Status WaitUntilDone(void* event);
  friend class StreamEvent;

  Device* device_;
  void* native_ = nullptr;
  bool capturing_ = false;
  absl::Duration watchdog_timeout_ = absl::ZeroDuration();
  std::function<absl::Status()> watchdog_health_;
  std::function<absl::Status(absl::Duration)> watchdog_timed_out_;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> attachments_;
  uint64_t launches_ = 0;
  HostOpProfile* host_profile_ = nullptr;
  // Device profiling (BeginDeviceProfile): one timed launch or replay.
  struct TimedLaunch {
    std::string name;  // empty: a graph replay
    OpCost cost;
    void* start = nullptr;  // cudaEvent_t
    void* end = nullptr;
  };
  absl::Status RecordEvent(void** event);
  DeviceOpProfile* device_profile_ = nullptr;
  std::vector<TimedLaunch> timed_;
  uint64_t next_scope_id_ = 1;
  std::vector<Scope> scopes_;
  std::unique_ptr<CaptureState> capture_;
};

// A point in a stream's work, for the host to wait on without waiting for
// what was queued after it (the engine's overlapped loop waits for step N's
// results while step N+1 runs). Record marks the point after the work
// enqueued so far (refused during a capture); Wait returns once the stream
// has run that far, under the stream's watchdog as Synchronize. An event
// never recorded is complete. On the host both return at once: the host
// stream runs each op at launch.
class StreamEvent {
 public:
  static absl::StatusOr<std::unique_ptr<StreamEvent>> Create(Stream* stream);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  absl::Status Record();
  absl::Status Wait();

 private:
  explicit StreamEvent(Stream* stream) : stream_(stream) {}
  Stream* stream_;
  void* native_ = nullptr;  // cudaEvent_t on CUDA
};

// Names every launch on `stream` while alive; launches within one scope form
// one graph node. Scopes nest; the innermost wins.
class NodeScope {
 public:
  NodeScope(Stream& stream, std::string name, OpKind kind);
  ~NodeScope();
  NodeScope(const NodeScope&) = delete;
  NodeScope& operator=(const NodeScope&) = delete;

 private:
  Stream& stream_;
};

}  // namespace mlag
