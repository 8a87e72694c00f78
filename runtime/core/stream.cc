#include "runtime/core/stream.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kKernel: return "kernel";
    case OpKind::kGemm: return "gemm";
    case OpKind::kComm: return "comm";
    case OpKind::kCopy: return "copy";
  }
  return "?";
}

namespace {

// Host graph: one entry per named op, each holding the closures launched
// inside that op's scope.
class HostGraph final : public Graph {
 public:
  HostGraph(std::vector<GraphNode> nodes, std::vector<std::vector<HostOp>> ops)
      : nodes_(std::move(nodes)), ops_(std::move(ops)) {}

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
          return absl::Status(s.code(), absl::StrCat("replay of node '", nodes_[i].name,
                                                     "': ", s.message()));
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
    if (!stream.is_cuda()) return absl::InvalidArgumentError("CUDA graph replayed on a host stream");
    MLAG_CUDA_RETURN_IF_ERROR(
        cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream.native())));
    return absl::OkStatus();
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::vector<GraphNode> nodes_;
};
#endif

}  // namespace

struct Stream::CaptureState {
  std::vector<GraphNode> nodes;
  std::vector<uint64_t> node_scope;          // scope id per node (0 = unscoped)
  std::vector<std::vector<HostOp>> host_ops;  // host only
  absl::flat_hash_set<void*> seen_cuda_nodes;  // CUDA only
  absl::Status first_error;
};

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
  if (capturing_) device_->AddCapture(-1);
#if MLAG_HAVE_CUDA
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
  if (!capturing_) return op();
  std::string name;
  OpKind resolved;
  uint64_t scope_id;
  ResolveName(default_name, kind, &name, &resolved, &scope_id);
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
                                absl::FunctionRef<int(void* cuda_stream)> enqueue) {
  if (!is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA op '", default_name, "' launched on a host stream"));
  }
#if MLAG_HAVE_CUDA
  ++launches_;
  std::string name;
  OpKind resolved;
  uint64_t scope_id;
  ResolveName(default_name, kind, &name, &resolved, &scope_id);
  std::string call = absl::StrCat("launch of '", name, "'");
  absl::Status launched = CudaStatus(enqueue(native_), call.c_str(), MLAG_WHERE_);
  if (!capturing_) return launched;
  CaptureState& c = *capture_;
  if (!launched.ok()) {
    if (c.first_error.ok()) c.first_error = launched;
    return launched;
  }
  // Tag the nodes this op added: read the graph under capture and take the
  // nodes not seen before.
  cudaStreamCaptureStatus status;
  cudaGraph_t graph = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(native_), &status,
                                                     nullptr, &graph, nullptr, nullptr, nullptr));
  size_t count = 0;
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> all(count);
  MLAG_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, all.data(), &count));
  bool added = false;
  for (cudaGraphNode_t n : all) added |= c.seen_cuda_nodes.insert(n).second;
  if (!added) return absl::OkStatus();  // e.g. an op with nothing to do at this size
  if (!(scope_id != 0 && !c.node_scope.empty() && c.node_scope.back() == scope_id)) {
    c.nodes.push_back({std::move(name), resolved});
    c.node_scope.push_back(scope_id);
  }
  return absl::OkStatus();
#else
  (void)kind;
  (void)enqueue;
  return absl::FailedPreconditionError("CUDA launch in a build without CUDA");
#endif
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
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    return CudaStatus(err, "cudaGraphInstantiate", MLAG_WHERE_);
  }
  return std::unique_ptr<Graph>(new CudaGraph(graph, exec, std::move(c->nodes)));
#else
  return absl::FailedPreconditionError("CUDA capture in a build without CUDA");
#endif
}

absl::Status Stream::Synchronize() {
#if MLAG_HAVE_CUDA
  if (is_cuda()) {
    MLAG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(native_)));
  }
#endif
  return absl::OkStatus();
}

NodeScope::NodeScope(Stream& stream, std::string name, OpKind kind) : stream_(stream) {
  stream_.scopes_.push_back({std::move(name), kind, stream_.next_scope_id_++});
}

NodeScope::~NodeScope() { stream_.scopes_.pop_back(); }

}  // namespace mlag
