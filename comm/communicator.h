// Communicators: the ranks of an expert-parallel group and the collectives
// they run together.
//
// Data collectives are launched on a Stream like any other op, so inside a
// capture they become graph nodes of kind comm (named by the caller's
// NodeScope, e.g. layers.3.moe.dispatch). Every rank must launch the same
// collectives in the same order with the same sizes, and replay captured
// graphs in lockstep. Buffers live on the stream's device.
//
// Backends:
//   local  thread ranks in one process over shared memory (tests, single
//          process runs): LocalCommunicator::CreateGroup(n)
//   mpi    one process per rank, host buffers, started by mpirun
//   nccl   GPUs; its unique id is broadcast over MPI (or ncclCommInitAll in one
//          process); ncclCommSplit re-splits
//
// The largest world is created once; an active expert-parallel group is a
// Split of it, so scaling down and back up are both re-splits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

enum class ReduceOp { kSum, kMax, kMin };

// "sum", "max" or "min": for messages and logs.
inline const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi" or "nccl".
  virtual absl::string_view backend() const = 0;

  // recv = concat over ranks of send, in rank order. send: any contiguous
  // tensor; recv: contiguous, size() times as many elements, same dtype.
  virtual absl::Status AllGather(Stream& stream, const Tensor& send, const Tensor& recv) = 0;

  // Several all-gathers issued as one (e.g. the MoE dispatch's tokens, expert
  // ids and weights): nccl issues them in one NCCL group, the host backends
  // one after another. Each pair is (send, recv) as for AllGather.
  virtual absl::Status AllGatherMany(Stream& stream,
                                     absl::Span<const std::pair<Tensor, Tensor>> send_recv) {
    for (const auto& [send, recv] : send_recv) {
      absl::Status s = AllGather(stream, send, recv);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // recv = this rank's slice of the element-wise sum over ranks of send.
  // send: contiguous, size() * recv.numel() elements (rank r's slice is
  // elements [r * n, (r + 1) * n)); f32.
  virtual absl::Status ReduceScatter(Stream& stream, const Tensor& send, const Tensor& recv) = 0;

  // recv = element-wise op over ranks of send (f32, i32 or i64; may alias).
  virtual absl::Status AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                                 ReduceOp op) = 0;

  // buffer = root's buffer on every rank.
  virtual absl::Status Broadcast(Stream& stream, const Tensor& buffer, int root) = 0;

  // Point-to-point: Send to `peer`, which must post the matching Recv.
  virtual absl::Status Send(Stream& stream, const Tensor& buffer, int peer) = 0;
  virtual absl::Status Recv(Stream& stream, const Tensor& buffer, int peer) = 0;

  // Blocks until every rank has called it (host-side; no stream), waiting
  // at most the communicator's timeout for the others.
  virtual absl::Status Barrier() = 0;
  // The same with its own bound on the wait: for a rendezvous whose ranks
  // arrive far apart, such as the end of model loading, which varies across
  // ranks by much more than a step. A rank that waits longer gets a
  // PeerTimeoutError.
  virtual absl::Status Barrier(absl::Duration timeout) = 0;

  // Host-side all-reduce of one integer, for control decisions such as the
  // padded batch size of a step (no stream, no graph node).
  virtual absl::StatusOr<int64_t> AllReduceScalar(int64_t value, ReduceOp op) = 0;

  // OK unless the communicator failed asynchronously (nccl: an error
  // reported by ncclCommGetAsyncError; local: the group was aborted):
  // polled by whoever waits on work that uses it (a stream watchdog), so a
  // failed peer surfaces at once.
  virtual absl::Status Health() { return absl::OkStatus(); }

  // A function whose error also ends this communicator's host-side waits
  // (and those of the groups split from it later), as a peer's failure:
  // for a backend that a peer's abort cannot reach, the health of another
  // channel that it does reach (an expert-parallel run's control group).
  // Must outlive the communicator. The default ignores it: the local
  // group's abort wakes its waits, and MPI's abort ends the process.
  virtual void SetPeerHealth(std::function<absl::Status()> health) { (void)health; }

  // Makes the group's collectives fail with an Aborted error carrying
  // `reason`, on every rank: those waiting now and all later ones. For a
  // rank whose step failed after its peers entered a collective, so that
  // the group fails together instead of waiting out a timeout (or forever).
  //   local  every rank of the group wakes at once;
  //   mpi    MPI cannot wake a blocked peer: MPI_Abort ends every process of
  //          the job, after printing `reason`;
  //   nccl   ncclCommAbort of this rank's communicator, whose later calls
  //          fail; peers learn through their control communicator (a peer
  //          already inside an NCCL kernel is not woken).
  // Groups split from this one are separate: abort each one in use.
  virtual void Abort(const absl::Status& reason) = 0;

  // Collective over this communicator: ranks passing the same color >= 0
  // form a new communicator, ordered by (key, old rank). A rank passing a
  // negative color gets nullptr (it joins no group). The new communicator
  // is independent of this one, which stays valid.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
};

}  // namespace mlag
