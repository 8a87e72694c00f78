#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/check.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/device.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/poll.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

namespace ci = comm_internal;

absl::Status NcclStatus(ncclResult_t result, const char* call, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  std::string message = absl::StrCat(call, " failed with ", ncclGetErrorString(result), " (",
                                     static_cast<int>(result), ")");
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

// Calls an NCCL function and returns a Status naming it on failure.
#define MLAG_NCCL_CALL(fn, ...) MLAG_RETURN_IF_ERROR(NcclStatus(fn(__VA_ARGS__), #fn))

// Makes `device` current until destroyed, then restores the caller's device.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (previous_ >= 0 && previous_ != current_) cudaSetDevice(previous_);
  }
  absl::Status Enter(int device) {
    MLAG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    current_ = device;
    if (device != previous_) MLAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return absl::OkStatus();
  }

 private:
  int previous_ = -1;
  int current_ = -1;
};

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kF8E4M3:  // moved as bytes; never reduced
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace

struct NcclCommunicator::Handle {
  ncclComm_t comm = nullptr;  // nullptr after Abort
  absl::Status aborted;       // what every call returns after Abort
  int device = -1;
  absl::Duration timeout = absl::Seconds(60);
  std::function<absl::Status()> peer_health;  // SetPeerHealth; inherited by splits
  cudaStream_t stream = nullptr;              // Barrier / AllReduceScalar
  int64_t* scalar = nullptr;                  // one device element for them

  ~Handle() {
    // Destructors never fail: errors here surface on the next checked call.
    ScopedDevice scoped;
    if (device >= 0) (void)scoped.Enter(device);
    if (comm != nullptr) ncclCommDestroy(comm);
    if (scalar != nullptr) cudaFree(scalar);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Handle> handle, int rank, int size)
    : handle_(std::move(handle)), rank_(rank), size_(size) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::device() const { return handle_->device; }
ncclComm_t NcclCommunicator::native() const { return handle_->comm; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Wrap(ncclComm_t comm, int device,
                                                                     absl::Duration timeout) {
  auto handle = std::make_unique<Handle>();
  handle->comm = comm;
  handle->device = device;
  handle->timeout = timeout;
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(device));
  MLAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&handle->stream, cudaStreamNonBlocking));
  MLAG_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&handle->scalar), sizeof(int64_t)));
  // On the handle's own stream: the legacy stream cudaMemset uses is not
  // ordered with it.
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(handle->scalar, 0, sizeof(int64_t), handle->stream));
  MLAG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(handle->stream));
  int rank = 0;
  int size = 0;
  MLAG_NCCL_CALL(ncclCommUserRank, comm, &rank);
  MLAG_NCCL_CALL(ncclCommCount, comm, &size);
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(handle), rank, size));
}

absl::StatusOr<ncclUniqueId> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id{};
  MLAG_NCCL_CALL(ncclGetUniqueId, &id);
  return id;
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(int rank, int size,
                                                                       const ncclUniqueId& id,
                                                                       int device,
                                                                       absl::Duration timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator::Create: rank ", rank, " of size ", size));
  }
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(device));
  ncclComm_t comm = nullptr;
  MLAG_NCCL_CALL(ncclCommInitRank, &comm, size, id, rank);
  return Wrap(comm, device, timeout);
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> NcclCommunicator::InitAll(
    std::vector<int> devices, absl::Duration timeout) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("NcclCommunicator::InitAll: no devices");
  }
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  MLAG_NCCL_CALL(ncclCommInitAll, comms.data(), static_cast<int>(devices.size()), devices.data());
  std::vector<std::unique_ptr<Communicator>> out;
  absl::Status failed;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (!failed.ok()) {  // destroy the rest rather than leak them
      ScopedDevice scoped;
      (void)scoped.Enter(devices[i]);
      ncclCommDestroy(comms[i]);
      continue;
    }
    absl::StatusOr<std::unique_ptr<Communicator>> c = Wrap(comms[i], devices[i], timeout);
    if (c.ok()) {
      out.push_back(std::move(c).value());
    } else {
      failed = c.status();
    }
  }
  if (!failed.ok()) return failed;
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::CreateOverMpi(
    Communicator& world, int device, absl::Duration timeout) {
  ncclUniqueId id{};
  if (world.rank() == 0) {
    MLAG_ASSIGN_OR_RETURN(id, NewUniqueId());
  }
  // The id is plain bytes: broadcast it as a u8 host tensor.
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Device> host, Device::Create("host"));
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, Stream::Create(host.get()));
  Tensor id_bytes(&id, DType::kU8, {static_cast<int64_t>(sizeof(id))});
  MLAG_RETURN_IF_ERROR(world.Broadcast(*stream, id_bytes, 0));
  return Create(world.rank(), world.size(), id, device, timeout);
}

absl::Status NcclCommunicator::CheckStream(absl::string_view op, const Stream& stream) const {
  MLAG_RETURN_IF_ERROR(handle_->aborted);
  if (!stream.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the nccl communicator needs a CUDA stream, got a host stream"));
  }
  if (stream.device().index() != handle_->device) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": stream on cuda:", stream.device().index(),
                                                   ", communicator on cuda:", handle_->device));
  }
  return absl::OkStatus();
}

namespace {

// Enqueues one NCCL call through Stream::LaunchCuda (so a capture tags its
// graph nodes as a comm op) and reports an NCCL failure by name.
absl::Status Enqueue(Stream& stream, const char* name, const char* call, int device,
                     absl::FunctionRef<ncclResult_t(cudaStream_t)> fn) {
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(device));
  ncclResult_t result = ncclSuccess;
  absl::Status launched = stream.LaunchCuda(name, OpKind::kComm, [&](void* s) {
    result = fn(static_cast<cudaStream_t>(s));
    // LaunchCuda speaks cudaError_t; the NCCL result is reported below.
    return result == ncclSuccess ? 0 : static_cast<int>(cudaErrorUnknown);
  });
  if (result != ncclSuccess) return NcclStatus(result, call);
  return launched;
}

}  // namespace

absl::Status NcclCommunicator::AllGather(Stream& stream, const Tensor& send, const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kAllGatherName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllGather(ci::kAllGatherName, stream, send, recv, rank_, size_));
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kAllGatherName, "ncclAllGather", handle_->device, [&](cudaStream_t s) {
    return ncclAllGather(send.data(), recv.data(), send.nbytes(), ncclUint8, comm, s);
  });
}

absl::Status NcclCommunicator::AllGatherMany(
    Stream& stream, absl::Span<const std::pair<Tensor, Tensor>> send_recv) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kAllGatherName, stream));
  for (const auto& [send, recv] : send_recv) {
    MLAG_RETURN_IF_ERROR(ci::CheckAllGather(ci::kAllGatherName, stream, send, recv, rank_, size_));
  }
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kAllGatherName, "ncclAllGather (group)", handle_->device,
                 [&](cudaStream_t s) {
                   ncclResult_t r = ncclGroupStart();
                   for (const auto& [send, recv] : send_recv) {
                     if (r != ncclSuccess) break;
                     r = ncclAllGather(send.data(), recv.data(), send.nbytes(), ncclUint8, comm, s);
                   }
                   // The group is closed even after a failed call, so it does
                   // not swallow the caller's next operations.
                   const ncclResult_t ended = ncclGroupEnd();
                   return r != ncclSuccess ? r : ended;
                 });
}

absl::Status NcclCommunicator::ReduceScatter(Stream& stream, const Tensor& send,
                                             const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kReduceScatterName, stream));
  MLAG_RETURN_IF_ERROR(
      ci::CheckReduceScatter(ci::kReduceScatterName, stream, send, recv, rank_, size_));
  ncclComm_t comm = handle_->comm;
  return Enqueue(
      stream, ci::kReduceScatterName, "ncclReduceScatter", handle_->device, [&](cudaStream_t s) {
        return ncclReduceScatter(send.data(), recv.data(), static_cast<size_t>(recv.numel()),
                                 NcclType(recv.dtype()), ncclSum, comm, s);
      });
}

absl::Status NcclCommunicator::AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                                         ReduceOp op) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kAllReduceName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllReduce(ci::kAllReduceName, stream, send, recv));
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kAllReduceName, "ncclAllReduce", handle_->device, [&](cudaStream_t s) {
    return ncclAllReduce(send.data(), recv.data(), static_cast<size_t>(recv.numel()),
                         NcclType(recv.dtype()), NcclOp(op), comm, s);
  });
}

absl::Status NcclCommunicator::Broadcast(Stream& stream, const Tensor& buffer, int root) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kBroadcastName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckBroadcast(ci::kBroadcastName, stream, buffer, root, size_));
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kBroadcastName, "ncclBroadcast", handle_->device, [&](cudaStream_t s) {
    return ncclBroadcast(buffer.data(), buffer.data(), buffer.nbytes(), ncclUint8, root, comm, s);
  });
}

absl::Status NcclCommunicator::Send(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kSendName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kSendName, stream, buffer, peer, size_));
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kSendName, "ncclSend", handle_->device, [&](cudaStream_t s) {
    return ncclSend(buffer.data(), buffer.nbytes(), ncclUint8, peer, comm, s);
  });
}

absl::Status NcclCommunicator::Recv(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(CheckStream(ci::kRecvName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kRecvName, stream, buffer, peer, size_));
  ncclComm_t comm = handle_->comm;
  return Enqueue(stream, ci::kRecvName, "ncclRecv", handle_->device, [&](cudaStream_t s) {
    return ncclRecv(buffer.data(), buffer.nbytes(), ncclUint8, peer, comm, s);
  });
}

absl::Status NcclCommunicator::WaitInternal(absl::string_view op, absl::Duration timeout) {
  return PollUntil(
      timeout,
      [&]() -> absl::StatusOr<bool> {
        const cudaError_t e = cudaStreamQuery(handle_->stream);
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) return CudaStatus(e, "cudaStreamQuery", MLAG_WHERE_);
        MLAG_RETURN_IF_ERROR(Health());
        if (handle_->peer_health) MLAG_RETURN_IF_ERROR(handle_->peer_health());
        return false;
      },
      [&](absl::Duration waited) {
        return PeerTimeoutError(rank_, size_, absl::StrCat("nccl ", op), waited);
      });
}

absl::Status NcclCommunicator::Barrier() { return Barrier(handle_->timeout); }

absl::Status NcclCommunicator::Barrier(absl::Duration timeout) {
  MLAG_RETURN_IF_ERROR(handle_->aborted);
  // A one-element all-reduce every rank must join, then wait for it.
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(handle_->device));
  MLAG_NCCL_CALL(ncclAllReduce, handle_->scalar, handle_->scalar, 1, ncclInt64, ncclSum,
                 handle_->comm, handle_->stream);
  return WaitInternal("barrier", timeout);
}

absl::StatusOr<int64_t> NcclCommunicator::AllReduceScalar(int64_t value, ReduceOp op) {
  MLAG_RETURN_IF_ERROR(handle_->aborted);
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(handle_->device));
  // Pageable host memory: cudaMemcpyAsync stages `value` at the call, and
  // the copy back returns only once `result` holds the data; the wait in
  // between is bounded.
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(handle_->scalar, &value, sizeof(value),
                                            cudaMemcpyHostToDevice, handle_->stream));
  MLAG_NCCL_CALL(ncclAllReduce, handle_->scalar, handle_->scalar, 1, ncclInt64, NcclOp(op),
                 handle_->comm, handle_->stream);
  MLAG_RETURN_IF_ERROR(WaitInternal("all_reduce_scalar", handle_->timeout));
  int64_t result = 0;
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&result, handle_->scalar, sizeof(result),
                                            cudaMemcpyDeviceToHost, handle_->stream));
  return result;
}

absl::Status NcclCommunicator::Health() {
  MLAG_RETURN_IF_ERROR(handle_->aborted);
  ncclResult_t async = ncclSuccess;
  MLAG_NCCL_CALL(ncclCommGetAsyncError, handle_->comm, &async);
  if (async != ncclSuccess) {
    return NcclStatus(async, "a collective (ncclCommGetAsyncError)", handle_->comm);
  }
  return absl::OkStatus();
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  if (handle_->comm != nullptr) {
    ScopedDevice scoped;
    (void)scoped.Enter(handle_->device);
    ncclCommAbort(handle_->comm);  // also ends this rank's kernels of the communicator
    handle_->comm = nullptr;
  }
  if (handle_->aborted.ok()) {
    handle_->aborted = absl::AbortedError(absl::StrCat(
        "nccl rank ", rank_, " of ", size_, ": the communicator was aborted: ", reason.message()));
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(int color, int key) {
  MLAG_RETURN_IF_ERROR(handle_->aborted);
  ScopedDevice scoped;
  MLAG_RETURN_IF_ERROR(scoped.Enter(handle_->device));
  ncclComm_t comm = nullptr;
  // ncclCommSplit orders the new ranks by (key, old rank), as the interface asks.
  MLAG_NCCL_CALL(ncclCommSplit, handle_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm,
                 nullptr);
  if (comm == nullptr) return std::unique_ptr<Communicator>();
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> split,
                        Wrap(comm, handle_->device, handle_->timeout));
  split->SetPeerHealth(handle_->peer_health);
  return split;
}

void NcclCommunicator::SetPeerHealth(std::function<absl::Status()> health) {
  handle_->peer_health = std::move(health);
}

}  // namespace mlag
