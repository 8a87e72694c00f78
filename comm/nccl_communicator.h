// The nccl backend: one GPU per rank, device buffers, collectives enqueued on
// the Stream's cudaStream_t. Built only with CUDA and NCCL (mlag_config.h:
// MLAG_HAVE_NCCL).
//
// Creation, one of:
//   Create(rank, size, id, device)   every rank passes the same unique id
//                                    (NewUniqueId() on one rank, shared by any
//                                    means, e.g. a file rendezvous)
//   CreateOverMpi(world, device)     rank 0 makes the id and broadcasts it over
//                                    a host communicator (mpi; local works too
//                                    for thread ranks, one GPU each)
//   InitAll(devices)                 one process driving several GPUs: one
//                                    communicator per device, rank i on
//                                    devices[i]
// The creating calls are collective (they block until every rank joined).
//
// Data collectives go through Stream::LaunchCuda with kind comm, so inside a
// capture they become nodes of the CUDA graph. A graph captured with a
// communicator must not be replayed after the communicator is destroyed.
// Barrier and AllReduceScalar run a one-element all-reduce on an internal
// stream and wait for it, at most the communicator's timeout (Barrier(T):
// T), polling ncclCommGetAsyncError and the peer-health hook
// (SetPeerHealth): a dead or hung peer gives a PeerTimeoutError.
// Split uses ncclCommSplit. Every NCCL and CUDA call is
// checked: a failure returns a Status naming the call and ncclGetErrorString's
// text (InvalidArgument for NCCL's invalid argument / usage, else Internal).
//
// Send and Recv are enqueued one at a time (no ncclGroupStart/End): a send
// waits on the GPU for the peer's matching recv, so pair them without cycles
// (e.g. even ranks send first, odd ranks receive first). AllGatherMany is one
// NCCL group.
//
// The communicator makes its device current for each call and restores the
// caller's current device afterwards. Streams passed to it must be on its
// device.
#pragma once

#include <nccl.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace mlag {

class NcclCommunicator final : public Communicator {
 public:
  // A fresh unique id (ncclGetUniqueId), to hand to every rank's Create.
  static absl::StatusOr<ncclUniqueId> NewUniqueId();

  // Rank `rank` of `size` on CUDA device `device` (ncclCommInitRank).
  // `timeout` bounds the host-side waits (Barrier, AllReduceScalar); split
  // communicators inherit it.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      int rank, int size, const ncclUniqueId& id, int device,
      absl::Duration timeout = absl::Seconds(60));

  // One communicator per entry of `devices` (ncclCommInitAll), rank i on
  // devices[i], for a single process driving several GPUs.
  static absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> InitAll(
      std::vector<int> devices, absl::Duration timeout = absl::Seconds(60));

  // Bootstraps over a host communicator (mpi, or local): rank 0 of `world`
  // calls ncclGetUniqueId, broadcasts it, and every rank joins with its rank
  // and size in `world`, on CUDA device `device`. Collective over `world`.
  static absl::StatusOr<std::unique_ptr<Communicator>> CreateOverMpi(
      Communicator& world, int device, absl::Duration timeout = absl::Seconds(60));

  ~NcclCommunicator() override;

  // The CUDA device this rank runs on, and the NCCL communicator.
  int device() const;
  ncclComm_t native() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "nccl"; }

  absl::Status AllGather(Stream& stream, const Tensor& send, const Tensor& recv) override;
  // One NCCL group of all-gathers: a single graph node when captured.
  absl::Status AllGatherMany(Stream& stream,
                             absl::Span<const std::pair<Tensor, Tensor>> send_recv) override;
  absl::Status ReduceScatter(Stream& stream, const Tensor& send, const Tensor& recv) override;
  absl::Status AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                         ReduceOp op) override;
  absl::Status Broadcast(Stream& stream, const Tensor& buffer, int root) override;
  absl::Status Send(Stream& stream, const Tensor& buffer, int peer) override;
  absl::Status Recv(Stream& stream, const Tensor& buffer, int peer) override;
  absl::Status Barrier() override;
  absl::Status Barrier(absl::Duration timeout) override;
  absl::StatusOr<int64_t> AllReduceScalar(int64_t value, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;
  // An error once ncclCommGetAsyncError reports one (or after Abort).
  absl::Status Health() override;
  void SetPeerHealth(std::function<absl::Status()> health) override;
  void Abort(const absl::Status& reason) override;

 private:
  struct Handle;  // the ncclComm_t, its internal stream and scratch

  NcclCommunicator(std::unique_ptr<Handle> handle, int rank, int size);
  // Takes ownership of `comm` (destroyed on failure too) and builds the
  // communicator around it on `device`.
  static absl::StatusOr<std::unique_ptr<Communicator>> Wrap(ncclComm_t comm, int device,
                                                            absl::Duration timeout);
  // Waits for the handle's internal stream for at most `timeout`, polling
  // the communicator's asynchronous error.
  absl::Status WaitInternal(absl::string_view op, absl::Duration timeout);
  // Checks that `stream` is a CUDA stream on this communicator's device.
  absl::Status CheckStream(absl::string_view op, const Stream& stream) const;

  std::unique_ptr<Handle> handle_;
  int rank_;
  int size_;
};

}  // namespace mlag
