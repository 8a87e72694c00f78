// The local backend: thread ranks of one process exchanging host buffers
// through shared memory. Used by the tests and by single-process runs that
// emulate an expert-parallel group.
//
// Every rank runs on its own thread and uses only its own communicator (and
// its own host Stream). A collective posts this rank's buffer pointers,
// waits at a barrier for the others, reads the peers' buffers directly and
// waits at a second barrier, so no rank reuses a buffer a peer still reads.
// Data collectives are host ops of kind comm: captured into a host graph,
// they re-run the exchange at every replay (all ranks replay in lockstep).
//
// Reductions add in rank order 0..size-1 on every rank, so AllReduce and
// ReduceScatter give bit-identical results on all ranks, whatever the thread
// timing. Ranks that launch different collectives (or different sizes) get
// InvalidArgument on every rank; a rank that waits longer than the group's
// timeout for its peers gets a PeerTimeoutError (runtime/core/peer_fault.h)
// naming the collective and the ranks that did not arrive, instead of
// hanging. Abort wakes every waiting rank of the group at once with an
// Aborted error, and fails every later collective the same way.
//
// Send/Recv are a rendezvous: Send returns once the peer's Recv has copied
// the data (like NCCL), so pair them without cycles (e.g. even ranks send
// first, odd ranks receive first). A rank cannot send to itself.
//
// Example:
//   std::vector<std::unique_ptr<Communicator>> comms = LocalCommunicator::CreateGroup(4);
//   std::vector<std::thread> threads;
//   for (int r = 0; r < 4; ++r) {
//     threads.emplace_back([&, r] {
//       Communicator& comm = *comms[r];
//       ... comm.AllReduce(stream, x, x, ReduceOp::kSum) ...
//     });
//   }
#pragma once

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace mlag {

namespace local_internal {
class LocalGroup;
}  // namespace local_internal

class LocalCommunicator final : public Communicator {
 public:
  // How long a rank waits for its peers before a collective fails.
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(60);

  // One communicator per rank 0..size-1 of a new group (empty when size < 1).
  // Hand communicator r to the thread that runs rank r.
  static std::vector<std::unique_ptr<Communicator>> CreateGroup(int size);
  // As above, with a custom wait limit (also inherited by Split groups).
  static std::vector<std::unique_ptr<Communicator>> CreateGroup(int size, absl::Duration timeout);

  ~LocalCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  absl::string_view backend() const override { return "local"; }

  absl::Status AllGather(Stream& stream, const Tensor& send, const Tensor& recv) override;
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
  void Abort(const absl::Status& reason) override;
  // The Aborted error carrying the abort's reason once any rank aborted the
  // group, so a rank waiting elsewhere (a stream watchdog over NCCL) learns
  // of a peer's failure at once.
  absl::Status Health() override;

 private:
  LocalCommunicator(std::shared_ptr<local_internal::LocalGroup> group, int rank);

  // Shared by the group's ranks and by every graph captured with them, so a
  // replayed closure never outlives the state it exchanges through.
  std::shared_ptr<local_internal::LocalGroup> group_;
  int rank_;
};

}  // namespace mlag
