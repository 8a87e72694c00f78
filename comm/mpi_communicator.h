// The mpi backend: one process per rank, host buffers, started by mpirun.
// Built only when an MPI library is found (mlag_config.h: MLAG_HAVE_MPI).
//
// World() initialises MPI on first use (MPI_THREAD_FUNNELED: make every MPI
// call, i.e. every use of these communicators, from the thread that called
// World()) and returns a communicator over a duplicate of MPI_COMM_WORLD, so
// the library's messages never mix with the application's. MPI is finalised
// by Finalize() or, if World() initialised it, at process exit.
//
// Data collectives are host ops of kind comm, so they can be captured into a
// host graph and replayed (every rank replays in lockstep); a captured graph
// keeps the communicator's MPI_Comm alive (until MPI is finalised). Every MPI
// call is checked: a failure returns Internal naming the call and
// MPI_Error_string's text (the communicators use MPI_ERRORS_RETURN). Every
// wait for peers is bounded by the world's timeout.
//
// Example:
//   MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, MpiCommunicator::World());
//   MLAG_ASSIGN_OR_RETURN(int64_t padded, world->AllReduceScalar(n, ReduceOp::kMax));
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace mlag {

class MpiCommunicator final : public Communicator {
 public:
  // All ranks of the mpirun job, as a new communicator (collective: every
  // rank calls it). Initialises MPI when nobody has yet. Every operation
  // waits for its peers at most `timeout` (then DeadlineExceeded naming it:
  // a peer is dead or hung); communicators split from it inherit it.
  static absl::StatusOr<std::unique_ptr<Communicator>> World(
      absl::Duration timeout = absl::Seconds(60));

  // Finalises MPI if it is initialised and not yet finalised. Destroy every
  // MpiCommunicator first. After this no communicator can be created again.
  static absl::Status Finalize();

  // This process's rank among the world's processes on its node (those
  // that share memory with it): how a rank picks its GPU. Collective over
  // the world; needs World() first.
  static absl::StatusOr<int> LocalRank();

  // True when the process looks started by mpirun / a PMI launcher
  // (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set).
  static bool LaunchedByMpirun();

  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "mpi"; }

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

 private:
  struct Handle;  // the MPI_Comm (kept out of this header, so it needs no mpi.h)

  MpiCommunicator(std::shared_ptr<Handle> handle, int rank, int size);

  // Shared with the closures of captured graphs.
  std::shared_ptr<Handle> handle_;
  int rank_;
  int size_;
};

}  // namespace mlag
