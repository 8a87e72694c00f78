#include "runtime/core/stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/poll.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kKernel:
      return "kernel";
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kComm:
      return "comm";
    case OpKind::kCopy:
      return "copy";
  }
  return "?";
}

namespace {

// Host graph: one entry per named op, each holding the closures launched
// inside that op's scope.
class HostGraph final : public Graph {
 public:
  HostGraph(std::vector<GraphNode> nodes, std::vector<std::vector<HostOp>> ops)
      : nodes_(std::move(nodes)), ops_(std::move(ops)) {
    for (size_t i = 0; i < nodes_.size(); ++i)
      nodes_[i].device_nodes = static_cast<int>(ops_[i].size());
  }

  const std::vector<GraphNode>& nodes() const override { return nodes_; }

  absl::Status Replay(Stream& stream) override {
    if (stream.is_cuda()) {
      return absl::InvalidArgumentError("host graph replayed on a CUDA stream");
    }
    if (stream.capturing()) {
      return absl::FailedPreconditionError("graph replay inside a capture is not supported");
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      for (HostOp& op : ops_[i]) {
        absl::Status s = op();
        if (!s.ok()) {
          return absl::Status(s.code(),
                              absl::StrCat("replay of node '", nodes_[i].name, "': ", s.message()));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  std::vector<GraphNode> nodes_;
  std::vector<std::vector<HostOp>> ops_;
};

#if MLAG_HAVE_CUDA
class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, std::vector<GraphNode> nodes)
      : graph_(graph), exec_(exec), nodes_(std::move(nodes)) {}
  ~CudaGraph() override {
    // Destructors log nothing and never throw; errors surface on the next
    // checked CUDA call.
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  const std::vector<GraphNode>& nodes() const override { return nodes_; }
  absl::Status Replay(Stream& stream) override {
    if (!stream.is_cuda())
      return absl::InvalidArgumentError("CUDA graph replayed on a host stream");
    MLAG_RETURN_IF_ERROR(stream.RecordReplayStart());
    MLAG_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream.native())));
    return stream.RecordReplayEnd();
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::vector<GraphNode> nodes_;
};
#endif

}  // namespace

// The op a CUDA graph node was added by.
struct CudaNodeTag {
  std::string name;
  OpKind kind;
  uint64_t scope_id;  // 0 = unscoped: the op is this one launch
  uint64_t launch;    // the launch that added it
};

struct Stream::CaptureState {
  std::vector<GraphNode> nodes;               // host only
  std::vector<uint64_t> node_scope;           // host only: scope id per node (0 = unscoped)
  std::vector<std::vector<HostOp>> host_ops;  // host only
  // CUDA only: every node of the capture's graph, tagged with its op.
  absl::flat_hash_map<void*, CudaNodeTag> cuda_tags;
  absl::Status first_error;
};

#if MLAG_HAVE_CUDA
namespace {

// The graph a stream is capturing into. cudaStreamGetCaptureInfo gained an
// edge-data output in CUDA 12.3 and took that form as its plain name in 13.
absl::StatusOr<cudaGraph_t> CapturingGraph(cudaStream_t stream) {
  cudaStreamCaptureStatus status;
  cudaGraph_t graph = nullptr;
#if CUDART_VERSION >= 13000
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr));
#else
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr));
#endif
  if (status != cudaStreamCaptureStatusActive || graph == nullptr) {
    return absl::FailedPreconditionError("the stream's capture was invalidated");
  }
  return graph;
}

absl::StatusOr<std::vector<cudaGraphNode_t>> GraphNodes(cudaGraph_t graph) {
  size_t count = 0;
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nodes.data(), &count));
  nodes.resize(count);
  return nodes;
}

// The graph's ops in dependency order: its nodes sorted topologically (ties
// in the order the ops launched), consecutive nodes of one op merged.
absl::StatusOr<std::vector<GraphNode>> ReadGraphOps(
    cudaGraph_t graph, const absl::flat_hash_map<void*, CudaNodeTag>& tags) {
  MLAG_ASSIGN_OR_RETURN(std::vector<cudaGraphNode_t> nodes, GraphNodes(graph));
  size_t edge_count = 0;
#if CUDART_VERSION >= 13000
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
#else
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, nullptr, nullptr, &edge_count));
#endif
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  // The edges' data too: kernels launched with programmatic dependent launch
  // (kernels/cuda/cuda_api.cuh) leave programmatic edges, which CUDA will
  // not list without it (cudaErrorLossyQuery). Either kind orders the ops.
#if CUDART_VERSION >= 13000
  std::vector<cudaGraphEdgeData> edge_data(edge_count);
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaGraphGetEdges(graph, from.data(), to.data(), edge_data.data(), &edge_count));
#elif CUDART_VERSION >= 12030
  std::vector<cudaGraphEdgeData> edge_data(edge_count);
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaGraphGetEdges_v2(graph, from.data(), to.data(), edge_data.data(), &edge_count));
#else
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, from.data(), to.data(), &edge_count));
#endif
  auto launch_of = [&](cudaGraphNode_t n) {
    auto it = tags.find(n);
    return it == tags.end() ? ~uint64_t{0} : it->second.launch;
  };
  absl::flat_hash_map<cudaGraphNode_t, int> indegree;
  absl::flat_hash_map<cudaGraphNode_t, std::vector<cudaGraphNode_t>> next;
  for (cudaGraphNode_t n : nodes) indegree[n] = 0;
  for (size_t i = 0; i < edge_count; ++i) {
    ++indegree[to[i]];
    next[from[i]].push_back(to[i]);
  }
  std::vector<cudaGraphNode_t> ready;
  for (cudaGraphNode_t n : nodes) {
    if (indegree[n] == 0) ready.push_back(n);
  }
  std::vector<GraphNode> ops;
  uint64_t last_scope = 0;
  uint64_t last_launch = 0;  // launches count from 1
  while (!ready.empty()) {
    // The earliest-launched ready node next.
    auto pick = std::min_element(
        ready.begin(), ready.end(),
        [&](cudaGraphNode_t a, cudaGraphNode_t b) { return launch_of(a) < launch_of(b); });
    cudaGraphNode_t n = *pick;
    ready.erase(pick);
    for (cudaGraphNode_t m : next[n]) {
      if (--indegree[m] == 0) ready.push_back(m);
    }
    auto it = tags.find(n);
    if (it == tags.end()) {
      // Added by a call outside LaunchCuda: shown for what it is.
      cudaGraphNodeType type;
      MLAG_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(n, &type));
      ops.push_back(
          {"(untagged)", type == cudaGraphNodeTypeKernel ? OpKind::kKernel : OpKind::kCopy, 1});
      last_scope = 0;
      last_launch = 0;
      continue;
    }
    const CudaNodeTag& tag = it->second;
    // One op: the nodes of one launch, or of one scope (NodeScope) in a row.
    const bool same_op = tag.scope_id != 0 ? tag.scope_id == last_scope : tag.launch == last_launch;
    if (!ops.empty() && same_op) {
      ++ops.back().device_nodes;
      continue;
    }
    ops.push_back({tag.name, tag.kind, 1});
    last_scope = tag.scope_id;
    last_launch = tag.launch;
  }
  return ops;
}

}  // namespace
#endif

Stream::Stream(Device* device) : device_(device) {}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(Device* device) {
  if (device == nullptr) return absl::InvalidArgumentError("Stream::Create: null device");
  std::unique_ptr<Stream> stream(new Stream(device));
  if (device->is_cuda()) {
#if MLAG_HAVE_CUDA
    MLAG_RETURN_IF_ERROR(device->MakeCurrent());
    cudaStream_t s = nullptr;
    MLAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream->native_ = s;
#else
    return absl::FailedPreconditionError("CUDA stream in a build without CUDA");
#endif
  }
  return stream;
}

Stream::~Stream() {
  attachments_.clear();  // library state first: it may still use the CUDA stream
  if (capturing_) device_->AddCapture(-1);
#if MLAG_HAVE_CUDA
  // A profile still open: its events are freed, its figures dropped (the
  // caller's profile may be gone already). An event still pending is freed
  // once it completes.
  for (const TimedLaunch& t : timed_) {
    if (t.start != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(t.start));
    if (t.end != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(t.end));
  }
  if (native_ != nullptr) {
    if (capturing_) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(static_cast<cudaStream_t>(native_), &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaStreamDestroy(static_cast<cudaStream_t>(native_));
  }
#endif
}

void Stream::ResolveName(absl::string_view default_name, OpKind kind, std::string* name,
                         OpKind* resolved_kind, uint64_t* scope_id) const {
  if (scopes_.empty()) {
    *name = std::string(default_name);
    *resolved_kind = kind;
    *scope_id = 0;
  } else {
    *name = scopes_.back().name;
    *resolved_kind = scopes_.back().kind;
    *scope_id = scopes_.back().id;
  }
}

absl::Status Stream::LaunchHost(absl::string_view default_name, OpKind kind, HostOp op) {
  if (is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host op '", default_name, "' launched on a CUDA stream"));
  }
  ++launches_;
  if (!capturing_ && host_profile_ == nullptr) return op();
  std::string name;
  OpKind resolved;
  uint64_t scope_id;
  ResolveName(default_name, kind, &name, &resolved, &scope_id);
  if (!capturing_) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = op();
    HostOpProfile::Entry& e = host_profile_->ops[name];
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++e.calls;
    return status;
  }
  CaptureState& c = *capture_;
  if (scope_id != 0 && !c.node_scope.empty() && c.node_scope.back() == scope_id) {
    c.host_ops.back().push_back(std::move(op));
  } else {
    c.nodes.push_back({std::move(name), resolved});
    c.node_scope.push_back(scope_id);
    c.host_ops.emplace_back();
    c.host_ops.back().push_back(std::move(op));
  }
  return absl::OkStatus();
}

absl::Status Stream::LaunchCuda(absl::string_view default_name, OpKind kind,
                                absl::FunctionRef<int(void* cuda_stream)> enqueue,
                                const OpCost& cost) {
  if (!is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA op '", default_name, "' launched on a host stream"));
  }
#if MLAG_HAVE_CUDA
  ++launches_;
  const bool timed = device_profile_ != nullptr && !capturing_;
  TimedLaunch t;
  if (timed) {
    absl::Status recorded = RecordEvent(&t.start);
    if (!recorded.ok()) {
      timed_.push_back(std::move(t));  // its event, if created, is freed with the others
      return recorded;
    }
  }
  const int error = enqueue(native_);
  if (timed) {
    absl::Status recorded = RecordEvent(&t.end);
    OpKind unused_kind;
    uint64_t unused_scope;
    ResolveName(default_name, kind, &t.name, &unused_kind, &unused_scope);
    t.cost = cost;
    timed_.push_back(std::move(t));  // owns the events from here, even on an error
    MLAG_RETURN_IF_ERROR(recorded);
  }
  if (error == 0 && !capturing_) return absl::OkStatus();  // the eager path: no names built
  std::string name;
  OpKind resolved;
  uint64_t scope_id;
  ResolveName(default_name, kind, &name, &resolved, &scope_id);
  absl::Status launched =
      CudaStatus(error, absl::StrCat("launch of '", name, "'").c_str(), MLAG_WHERE_);
  if (!capturing_) return launched;
  CaptureState& c = *capture_;
  if (!launched.ok()) {
    if (c.first_error.ok()) c.first_error = launched;
    return launched;
  }
  // Tag the nodes this op added (those of the graph under capture not seen
  // before); an op with nothing to do at this size adds none.
  absl::StatusOr<cudaGraph_t> graph = CapturingGraph(static_cast<cudaStream_t>(native_));
  absl::StatusOr<std::vector<cudaGraphNode_t>> all =
      graph.ok() ? GraphNodes(*graph)
                 : absl::StatusOr<std::vector<cudaGraphNode_t>>(graph.status());
  if (!all.ok()) {
    if (c.first_error.ok()) c.first_error = all.status();
    return all.status();
  }
  for (cudaGraphNode_t n : *all) {
    if (!c.cuda_tags.contains(n)) {
      c.cuda_tags.emplace(n, CudaNodeTag{name, resolved, scope_id, launches_});
    }
  }
  return absl::OkStatus();
#else
  (void)kind;
  (void)enqueue;
  return absl::FailedPreconditionError("CUDA launch in a build without CUDA");
#endif
}

absl::Status Stream::RecordEvent(void** event) {
#if MLAG_HAVE_CUDA
  cudaEvent_t e = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  *event = e;
  MLAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, static_cast<cudaStream_t>(native_)));
  return absl::OkStatus();
#else
  (void)event;
  return absl::FailedPreconditionError("device profiling in a build without CUDA");
#endif
}

absl::Status Stream::BeginDeviceProfile(DeviceOpProfile* profile) {
  if (!is_cuda()) return absl::InvalidArgumentError("BeginDeviceProfile on a host stream");
  MLAG_RETURN_IF_ERROR(RefuseDuringCapture("BeginDeviceProfile"));
  if (device_profile_ != nullptr) {
    return absl::FailedPreconditionError("BeginDeviceProfile: already profiling");
  }
  device_profile_ = profile;
  return absl::OkStatus();
}

absl::Status Stream::RecordReplayStart() {
  if (device_profile_ == nullptr || capturing_) return absl::OkStatus();
  timed_.emplace_back();
  return RecordEvent(&timed_.back().start);
}

absl::Status Stream::RecordReplayEnd() {
  if (device_profile_ == nullptr || capturing_ || timed_.empty()) return absl::OkStatus();
  return RecordEvent(&timed_.back().end);
}

absl::Status Stream::EndDeviceProfile() {
  if (device_profile_ == nullptr) {
    return absl::FailedPreconditionError("EndDeviceProfile without BeginDeviceProfile");
  }
  DeviceOpProfile* profile = device_profile_;
  device_profile_ = nullptr;
  std::vector<TimedLaunch> timed = std::move(timed_);
  timed_.clear();
  absl::Status status = Synchronize();
#if MLAG_HAVE_CUDA
  const cudaEvent_t first = timed.empty() ? nullptr : static_cast<cudaEvent_t>(timed[0].start);
  // Seconds from the profile's first event to `e`.
  auto since_first = [&](void* e, double* seconds) -> absl::Status {
    float ms = 0;
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, first, static_cast<cudaEvent_t>(e)));
    *seconds = ms / 1e3;
    return absl::OkStatus();
  };
  for (const TimedLaunch& t : timed) {
    if (!status.ok()) break;
    if (t.start == nullptr || t.end == nullptr) continue;
    double start = 0, end = 0;
    status = since_first(t.start, &start);
    if (status.ok()) status = since_first(t.end, &end);
    if (!status.ok()) break;
    if (t.name.empty()) {
      profile->replays.push_back({start, end});
      continue;
    }
    DeviceOpProfile::Entry& e = profile->ops[t.name];
    e.seconds += end - start;
    e.bytes += t.cost.bytes;
    e.flops += t.cost.flops;
    if (e.launches == 0 || t.cost.flops > 0) e.math = t.cost.math;
    ++e.launches;
  }
  for (const TimedLaunch& t : timed) {
    // Destroying an event frees its resources; its status carries nothing to act on.
    if (t.start != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(t.start));
    if (t.end != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(t.end));
  }
#endif
  return status;
}

absl::Status Stream::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("BeginCapture: already capturing");
  capture_ = std::make_unique<CaptureState>();
#if MLAG_HAVE_CUDA
  if (is_cuda()) {
    MLAG_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(static_cast<cudaStream_t>(native_),
                                                     cudaStreamCaptureModeThreadLocal));
  }
#endif
  capturing_ = true;
  device_->AddCapture(+1);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> Stream::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("EndCapture: not capturing");
  capturing_ = false;
  device_->AddCapture(-1);
  std::unique_ptr<CaptureState> c = std::move(capture_);
  if (!is_cuda()) {
    if (!c->first_error.ok()) return c->first_error;
    return std::unique_ptr<Graph>(new HostGraph(std::move(c->nodes), std::move(c->host_ops)));
  }
#if MLAG_HAVE_CUDA
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(static_cast<cudaStream_t>(native_), &graph);
  if (end != cudaSuccess) {
    // A failed launch invalidates the capture; its error names the op.
    if (!c->first_error.ok()) return c->first_error;
    return CudaStatus(end, "cudaStreamEndCapture", MLAG_WHERE_);
  }
  if (!c->first_error.ok()) {
    cudaGraphDestroy(graph);
    return c->first_error;
  }
  absl::StatusOr<std::vector<GraphNode>> ops = ReadGraphOps(graph, c->cuda_tags);
  if (!ops.ok()) {
    cudaGraphDestroy(graph);
    return ops.status();
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    return CudaStatus(err, "cudaGraphInstantiate", MLAG_WHERE_);
  }
  return std::unique_ptr<Graph>(new CudaGraph(graph, exec, std::move(*ops)));
#else
  return absl::FailedPreconditionError("CUDA capture in a build without CUDA");
#endif
}

absl::Status Stream::Synchronize() { return WaitUntilDone(nullptr); }

absl::Status Stream::WaitUntilDone(void* event) {
#if MLAG_HAVE_CUDA
  if (is_cuda()) {
    cudaStream_t s = static_cast<cudaStream_t>(native_);
    cudaEvent_t e = static_cast<cudaEvent_t>(event);
    if (watchdog_timeout_ == absl::ZeroDuration()) {
      if (e != nullptr) {
        MLAG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e));
      } else {
        MLAG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      }
      return absl::OkStatus();
    }
    // Poll, checking the health function, until the watchdog's deadline.
    return PollUntil(
        watchdog_timeout_,
        [&]() -> absl::StatusOr<bool> {
          const cudaError_t r = e != nullptr ? cudaEventQuery(e) : cudaStreamQuery(s);
          if (r == cudaSuccess) return true;
          if (r != cudaErrorNotReady) {
            return CudaStatus(r, e != nullptr ? "cudaEventQuery" : "cudaStreamQuery", MLAG_WHERE_);
          }
          if (watchdog_health_) MLAG_RETURN_IF_ERROR(watchdog_health_());
          return false;
        },
        [&](absl::Duration waited) {
          if (watchdog_timed_out_) return watchdog_timed_out_(waited);
          return absl::DeadlineExceededError(absl::StrCat(
              "the stream's work did not finish within ", absl::FormatDuration(watchdog_timeout_),
              " (waited ", absl::FormatDuration(waited), ")"));
        });
  }
#endif
  (void)event;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StreamEvent>> StreamEvent::Create(Stream* stream) {
  std::unique_ptr<StreamEvent> event(new StreamEvent(stream));
#if MLAG_HAVE_CUDA
  if (stream->is_cuda()) {
    cudaEvent_t e = nullptr;
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event->native_ = e;
  }
#endif
  return event;
}

StreamEvent::~StreamEvent() {
#if MLAG_HAVE_CUDA
  if (native_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(native_));
#endif
}

absl::Status StreamEvent::Record() {
  MLAG_RETURN_IF_ERROR(stream_->RefuseDuringCapture("recording an event to wait on"));
#if MLAG_HAVE_CUDA
  if (native_ != nullptr) {
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(native_),
                                              static_cast<cudaStream_t>(stream_->native())));
  }
#endif
  return absl::OkStatus();
}

absl::Status StreamEvent::Wait() { return stream_->WaitUntilDone(native_); }

void Stream::SetWatchdog(absl::Duration timeout, std::function<absl::Status()> health,
                         std::function<absl::Status(absl::Duration waited)> timed_out) {
  watchdog_timeout_ = timeout;
  const bool on = timeout != absl::ZeroDuration();
  watchdog_health_ = on ? std::move(health) : nullptr;
  watchdog_timed_out_ = on ? std::move(timed_out) : nullptr;
}

absl::Status Stream::RefuseDuringCapture(absl::string_view what) const {
  if (!capturing_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, " during a graph capture: graphs read inputs only from their buffers"));
}

absl::Status Stream::CopyFromHost(void* device_dst, const void* host_src, size_t bytes) {
  MLAG_RETURN_IF_ERROR(RefuseDuringCapture("a host-to-device copy"));
  if (bytes == 0) return absl::OkStatus();
  if (!is_cuda()) {
    std::memcpy(device_dst, host_src, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                                            static_cast<cudaStream_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::Status Stream::CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  MLAG_RETURN_IF_ERROR(RefuseDuringCapture("a device-to-host copy"));
  if (bytes == 0) return absl::OkStatus();
  if (!is_cuda()) {
    std::memcpy(host_dst, device_src, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost,
                                            static_cast<cudaStream_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::Status Stream::Memset(void* device_dst, int value, size_t bytes) {
  MLAG_RETURN_IF_ERROR(RefuseDuringCapture("a memset"));
  if (bytes == 0) return absl::OkStatus();
  if (!is_cuda()) {
    std::memset(device_dst, value, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(device_dst, value, bytes, static_cast<cudaStream_t>(native_)));
#endif
  return absl::OkStatus();
}

std::shared_ptr<void> Stream::attachment(const void* key) const {
  for (const auto& [k, v] : attachments_) {
    if (k == key) return v;
  }
  return nullptr;
}

void Stream::set_attachment(const void* key, std::shared_ptr<void> value) {
  for (auto it = attachments_.begin(); it != attachments_.end(); ++it) {
    if (it->first == key) {
      attachments_.erase(it);
      break;
    }
  }
  if (value != nullptr) attachments_.emplace_back(key, std::move(value));
}

NodeScope::NodeScope(Stream& stream, std::string name, OpKind kind) : stream_(stream) {
  stream_.scopes_.push_back({std::move(name), kind, stream_.next_scope_id_++});
}

NodeScope::~NodeScope() { stream_.scopes_.pop_back(); }

}  // namespace mlag
