#include "comm/mpi_communicator.h"

#include <cstdio>
#include <string>

// The C API only: the deprecated C++ bindings are not used and do not
// compile cleanly with -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/check.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/poll.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

namespace ci = comm_internal;

absl::Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return absl::InternalError(absl::StrCat(call, " failed with MPI error ", code, ": ",
                                          absl::string_view(text, static_cast<size_t>(length))));
}

// Calls an MPI function and returns a Status naming it on failure.
#define MLAG_MPI_CALL(fn, ...) MLAG_RETURN_IF_ERROR(MpiStatus(fn(__VA_ARGS__), #fn))

// Waits for a nonblocking MPI operation for at most `timeout` (PollUntil):
// every blocking call of this backend is a nonblocking one and this wait,
// so a dead or hung peer becomes a PeerTimeoutError naming the rank, the
// operation and, for point-to-point operations, the peer (`peer` >= 0)
// instead of a hang. The operation stays pending after a timeout: the
// communicator is then unusable (abort it), and the buffers the operation
// uses must outlive it (they belong to the caller or the Handle).
absl::Status WaitFor(MPI_Request* request, MPI_Status* status, absl::string_view op, int rank,
                     int size, int peer, absl::Duration timeout) {
  return PollUntil(
      timeout,
      [&]() -> absl::StatusOr<bool> {
        int done = 0;
        MLAG_MPI_CALL(MPI_Test, request, &done, status);
        return done != 0;
      },
      [&](absl::Duration waited) {
        return PeerTimeoutError(rank, size, absl::StrCat("mpi ", op), waited,
                                peer >= 0 ? std::vector<int>{peer} : std::vector<int>{});
      });
}

// Finalises MPI at exit when World() initialised it and Finalize() was not
// called.
struct AutoFinalize {
  bool armed = false;
  ~AutoFinalize() {
    if (armed) (void)MpiCommunicator::Finalize();
  }
};
AutoFinalize& Finalizer() {
  static AutoFinalize finalizer;
  return finalizer;
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    default:
      return MPI_FLOAT;  // f32; the other dtypes are rejected at launch
  }
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int.
absl::Status CheckCount(absl::string_view op, size_t count) {
  if (count <= static_cast<size_t>(INT_MAX)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", count, " elements exceed MPI's int count limit"));
}

}  // namespace

struct MpiCommunicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 0;
  absl::Duration timeout = absl::Seconds(60);
  // Buffers of operations that timed out: MPI may still write them until
  // the job is aborted, so they live as long as the communicator.
  std::vector<std::shared_ptr<void>> abandoned;
  // Waits for `request` of operation `op` within the timeout. On a timeout
  // `buffers` (what the operation reads or writes that this communicator
  // owns) is kept in `abandoned`. `peer`: the other rank of a send or a
  // recv (-1 for a collective). `bound`: the wait's own limit (zero: the
  // communicator's timeout).
  absl::Status Wait(MPI_Request* request, absl::string_view op, MPI_Status* status = nullptr,
                    std::shared_ptr<void> buffers = nullptr, int peer = -1,
                    absl::Duration bound = absl::ZeroDuration()) {
    MPI_Status ignored;
    absl::Status done = WaitFor(request, status != nullptr ? status : &ignored, op, rank, size,
                                peer, bound > absl::ZeroDuration() ? bound : timeout);
    if (!done.ok() && buffers != nullptr) abandoned.push_back(std::move(buffers));
    return done;
  }
  ~Handle() {
    // MPI_Comm_free after MPI_Finalize is erroneous: then there is nothing to free.
    if (comm != MPI_COMM_NULL && !MpiFinalized()) MPI_Comm_free(&comm);
  }
};

MpiCommunicator::MpiCommunicator(std::shared_ptr<Handle> handle, int rank, int size)
    : handle_(std::move(handle)), rank_(rank), size_(size) {}

MpiCommunicator::~MpiCommunicator() = default;

bool MpiCommunicator::LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::World(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("MpiCommunicator::World: the timeout must be positive");
  }
  int initialized = 0;
  MLAG_MPI_CALL(MPI_Initialized, &initialized);
  if (MpiFinalized()) {
    return absl::FailedPreconditionError("MpiCommunicator::World: MPI is already finalised");
  }
  if (!initialized) {
    int provided = 0;
    MLAG_MPI_CALL(MPI_Init_thread, nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    Finalizer().armed = true;
    // MPI is ours: report errors on the world instead of aborting the job.
    MLAG_MPI_CALL(MPI_Comm_set_errhandler, MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  auto handle = std::make_shared<Handle>();
  MLAG_MPI_CALL(MPI_Comm_dup, MPI_COMM_WORLD, &handle->comm);
  MLAG_MPI_CALL(MPI_Comm_set_errhandler, handle->comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MLAG_MPI_CALL(MPI_Comm_rank, handle->comm, &rank);
  MLAG_MPI_CALL(MPI_Comm_size, handle->comm, &size);
  handle->rank = rank;
  handle->size = size;
  handle->timeout = timeout;
  return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(handle), rank, size));
}

absl::StatusOr<int> MpiCommunicator::LocalRank() {
  MPI_Comm node = MPI_COMM_NULL;
  MLAG_MPI_CALL(MPI_Comm_split_type, MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0;
  absl::Status ranked = MpiStatus(MPI_Comm_rank(node, &rank), "MPI_Comm_rank");
  MPI_Comm_free(&node);
  MLAG_RETURN_IF_ERROR(ranked);
  return rank;
}

absl::Status MpiCommunicator::Finalize() {
  Finalizer().armed = false;
  int initialized = 0;
  MLAG_MPI_CALL(MPI_Initialized, &initialized);
  if (!initialized || MpiFinalized()) return absl::OkStatus();
  MLAG_RETURN_IF_ERROR(MpiStatus(MPI_Finalize(), "MPI_Finalize"));
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGather(Stream& stream, const Tensor& send, const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kAllGatherName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllGather(ci::kAllGatherName, stream, send, recv, rank_, size_));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kAllGatherName, send.nbytes()));
  // In place when send is this rank's slot of recv (MPI forbids aliasing otherwise).
  const bool in_place = send.nbytes() > 0 && ci::Overlaps(send, recv);
  return stream.LaunchHost(ci::kAllGatherName, OpKind::kComm,
                           [handle = handle_, send, recv, in_place]() -> absl::Status {
                             const int bytes = static_cast<int>(send.nbytes());
                             MPI_Request request;
                             MLAG_MPI_CALL(MPI_Iallgather, in_place ? MPI_IN_PLACE : send.data(),
                                           bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE,
                                           handle->comm, &request);
                             return handle->Wait(&request, ci::kAllGatherName);
                           });
}

absl::Status MpiCommunicator::ReduceScatter(Stream& stream, const Tensor& send,
                                            const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kReduceScatterName, stream));
  MLAG_RETURN_IF_ERROR(
      ci::CheckReduceScatter(ci::kReduceScatterName, stream, send, recv, rank_, size_));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kReduceScatterName, static_cast<size_t>(recv.numel())));
  // MPI's in-place reduce-scatter takes its input from recv, which here is
  // only this rank's slice: when recv lies inside send, reduce into scratch.
  std::shared_ptr<std::vector<unsigned char>> scratch;
  if (ci::Overlaps(send, recv)) {
    scratch = std::make_shared<std::vector<unsigned char>>(recv.nbytes());
  }
  return stream.LaunchHost(
      ci::kReduceScatterName, OpKind::kComm,
      [handle = handle_, send, recv, scratch]() -> absl::Status {
        void* out = scratch ? static_cast<void*>(scratch->data()) : recv.data();
        MPI_Request request;
        MLAG_MPI_CALL(MPI_Ireduce_scatter_block, send.data(), out, static_cast<int>(recv.numel()),
                      MpiType(recv.dtype()), MPI_SUM, handle->comm, &request);
        MLAG_RETURN_IF_ERROR(handle->Wait(&request, ci::kReduceScatterName, nullptr, scratch));
        if (scratch) std::memcpy(recv.data(), out, recv.nbytes());
        return absl::OkStatus();
      });
}

absl::Status MpiCommunicator::AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                                        ReduceOp op) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kAllReduceName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllReduce(ci::kAllReduceName, stream, send, recv));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kAllReduceName, static_cast<size_t>(recv.numel())));
  const bool in_place = send.data() == recv.data();
  return stream.LaunchHost(ci::kAllReduceName, OpKind::kComm,
                           [handle = handle_, send, recv, op, in_place]() -> absl::Status {
                             MPI_Request request;
                             MLAG_MPI_CALL(MPI_Iallreduce, in_place ? MPI_IN_PLACE : send.data(),
                                           recv.data(), static_cast<int>(recv.numel()),
                                           MpiType(recv.dtype()), MpiOp(op), handle->comm,
                                           &request);
                             return handle->Wait(&request, ci::kAllReduceName);
                           });
}

absl::Status MpiCommunicator::Broadcast(Stream& stream, const Tensor& buffer, int root) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kBroadcastName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckBroadcast(ci::kBroadcastName, stream, buffer, root, size_));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kBroadcastName, buffer.nbytes()));
  return stream.LaunchHost(
      ci::kBroadcastName, OpKind::kComm, [handle = handle_, buffer, root]() -> absl::Status {
        MPI_Request request;
        MLAG_MPI_CALL(MPI_Ibcast, buffer.data(), static_cast<int>(buffer.nbytes()), MPI_BYTE, root,
                      handle->comm, &request);
        return handle->Wait(&request, ci::kBroadcastName);
      });
}

namespace {
constexpr int kPointToPointTag = 0;  // the communicator is private: one tag is enough
}  // namespace

absl::Status MpiCommunicator::Send(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kSendName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kSendName, stream, buffer, peer, size_));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kSendName, buffer.nbytes()));
  return stream.LaunchHost(
      ci::kSendName, OpKind::kComm, [handle = handle_, buffer, peer]() -> absl::Status {
        MPI_Request request;
        MLAG_MPI_CALL(MPI_Isend, buffer.data(), static_cast<int>(buffer.nbytes()), MPI_BYTE, peer,
                      kPointToPointTag, handle->comm, &request);
        return handle->Wait(&request, ci::kSendName, nullptr, nullptr, peer);
      });
}

absl::Status MpiCommunicator::Recv(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("mpi", ci::kRecvName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kRecvName, stream, buffer, peer, size_));
  MLAG_RETURN_IF_ERROR(CheckCount(ci::kRecvName, buffer.nbytes()));
  return stream.LaunchHost(
      ci::kRecvName, OpKind::kComm, [handle = handle_, buffer, peer]() -> absl::Status {
        MPI_Status status;
        MPI_Request request;
        MLAG_MPI_CALL(MPI_Irecv, buffer.data(), static_cast<int>(buffer.nbytes()), MPI_BYTE, peer,
                      kPointToPointTag, handle->comm, &request);
        MLAG_RETURN_IF_ERROR(handle->Wait(&request, ci::kRecvName, &status, nullptr, peer));
        int received = 0;
        MLAG_MPI_CALL(MPI_Get_count, &status, MPI_BYTE, &received);
        if (static_cast<size_t>(received) != buffer.nbytes()) {
          return absl::InvalidArgumentError(absl::StrCat("mpi recv from rank ", peer, ": got ",
                                                         received, " bytes, expected ",
                                                         buffer.nbytes()));
        }
        return absl::OkStatus();
      });
}

absl::Status MpiCommunicator::Barrier() { return Barrier(handle_->timeout); }

absl::Status MpiCommunicator::Barrier(absl::Duration timeout) {
  MPI_Request request;
  MLAG_MPI_CALL(MPI_Ibarrier, handle_->comm, &request);
  return handle_->Wait(&request, "barrier", nullptr, nullptr, -1, timeout);
}

absl::StatusOr<int64_t> MpiCommunicator::AllReduceScalar(int64_t value, ReduceOp op) {
  // {value, result} on the heap: they must outlive a timed-out operation.
  auto scalars = std::make_shared<std::array<int64_t, 2>>(std::array<int64_t, 2>{value, 0});
  MPI_Request request;
  MLAG_MPI_CALL(MPI_Iallreduce, &(*scalars)[0], &(*scalars)[1], 1, MPI_INT64_T, MpiOp(op),
                handle_->comm, &request);
  MLAG_RETURN_IF_ERROR(handle_->Wait(&request, "all_reduce_scalar", nullptr, scalars));
  return (*scalars)[1];
}

void MpiCommunicator::Abort(const absl::Status& reason) {
  // Peers blocked in MPI calls cannot be woken: end the whole job.
  std::fprintf(stderr, "mpi rank %d of %d: aborting the job: %s\n", rank_, size_,
               std::string(reason.message()).c_str());
  std::fflush(stderr);
  MPI_Abort(handle_->comm, 1);
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Split(int color, int key) {
  auto handle = std::make_shared<Handle>();
  // MPI_Comm_split orders the new ranks by (key, old rank), as the interface asks.
  MLAG_MPI_CALL(MPI_Comm_split, handle_->comm, color < 0 ? MPI_UNDEFINED : color, key,
                &handle->comm);
  if (handle->comm == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
  MLAG_MPI_CALL(MPI_Comm_set_errhandler, handle->comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MLAG_MPI_CALL(MPI_Comm_rank, handle->comm, &rank);
  MLAG_MPI_CALL(MPI_Comm_size, handle->comm, &size);
  handle->rank = rank;
  handle->size = size;
  handle->timeout = handle_->timeout;
  return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(handle), rank, size));
}

}  // namespace mlag
