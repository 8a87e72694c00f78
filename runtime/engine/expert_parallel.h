// Expert parallelism across ranks: data-parallel attention (each rank has its
// own requests, KV cache and prefix cache), expert-parallel MoE (each rank
// holds a share of the routed experts), lockstep steps, and live
// reconfiguration of the group from N to M ranks.
//
// The largest world is launched once; the active group is a Split of it, so
// scaling down and back up are both re-splits. A reconfiguration runs at a
// step boundary, on every rank of the world:
//   checksum      KV checksum of the live pages (in use or prefix-cached,
//                 and the null block) on every surviving rank
//   save_metadata save the static attention metadata, fill it with dummies
//   split         world.Split: ranks [0, M) form the new group
//   migrate       move routed experts to their new owners over the world
//                 (unchanged experts stay; local copies where possible)
//   requeue       a leaving rank's unfinished requests go to the new group's
//                 ranks, which recompute their KV and keep their tokens
//   recapture     drop every graph, capture again with dummy runs (lockstep)
//   restore       restore the saved metadata
//   verify        checksum the same pages again: kv_pages_unchanged when
//                 every surviving rank's live pages are bit-for-bit what
//                 they were
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/expert_placement.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/expert_group.h"

namespace mlag {

struct ReconfigureAt {
  int step = 0;  // before driver step `step` (0-based)
  int size = 0;  // new group size, in [1, world]
};

// A fault injected into one rank, to test how the others end: at driver
// step `step`, rank `rank` fails (its step returns an error) or hangs (stops
// for `hang`, then goes on and finds its group aborted).
struct EpFault {
  enum class Kind { kNone, kFail, kHang };
  Kind kind = Kind::kNone;
  int rank = -1;
  int step = -1;
  absl::Duration hang = absl::ZeroDuration();
};

struct EpOptions {
  int world = 1;                           // ranks launched: the largest group
  std::vector<ReconfigureAt> reconfigure;  // in step order
  // How long a rank waits for its peers in any collective before it decides
  // that one is dead or hung, aborts the group and fails with a
  // PeerTimeoutError (runtime/core/peer_fault.h). On a device it bounds the
  // wait for a whole step's work, the rank's own included.
  absl::Duration peer_timeout = absl::Seconds(60);
  // How long a rank that has loaded its model waits for the others to load
  // theirs (the start-up rendezvous, before the first collective).
  absl::Duration startup_timeout = absl::Minutes(10);
  std::vector<EpFault> faults;  // injected, for tests
};

// Parses "STEP:SIZE".
absl::StatusOr<ReconfigureAt> ParseReconfigureAt(absl::string_view text);

// Parses "fail:RANK:STEP" or "hang:RANK:STEP:SECONDS".
absl::StatusOr<EpFault> ParseEpFault(absl::string_view text);

// How the ranks of an expert-parallel run are made.
//   local  thread ranks in this process, on the host (local communicators);
//   nccl   thread ranks in this process, rank r on CUDA device r (NCCL for
//          data, local communicators for control);
//   mpi    this process is one rank of an mpirun job: on the host, MPI for
//          everything; on a CUDA device, NCCL created over MPI for data and
//          MPI for control.
enum class EpBackend { kLocal, kNccl, kMpi };
absl::StatusOr<EpBackend> ParseEpBackend(absl::string_view name);  // "local", "nccl", "mpi"
absl::string_view EpBackendName(EpBackend backend);

struct ReconfigurationReport {
  int step = 0, from = 0, to = 0;
  std::vector<std::pair<std::string, double>> seconds;  // phase -> seconds, in order
  bool kv_pages_unchanged = false;
  // Prefix-cache hits summed over the world when the reconfiguration began.
  int64_t prefix_hit_tokens_before = 0;
};

struct EpRunResult {
  std::string device;                   // this rank's device
  std::vector<RequestResult> requests;  // by id
  std::vector<ReconfigurationReport> reconfigurations;
  int64_t driver_steps = 0;
  // Summed over ranks.
  int64_t engine_steps = 0, eager_steps = 0, dummy_steps = 0, preemptions = 0;
  std::map<int, int64_t> graph_replays;
  int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
  double capture_seconds = 0.0;  // the initial capture, slowest rank
};

// How a run that failed on one rank ends on every rank:
//   - a rank whose own step failed (an injected failure, an allocation, an
//     NCCL error) aborts its communicators with that error, so the peers
//     fail at once with it (Aborted, the error passed on) instead of
//     waiting for a timeout;
//   - a rank that waited longer than the peer timeout reports the one
//     classified peer fault (PeerTimeoutError, DeadlineExceeded), whichever
//     timer saw it, naming itself, the peer where known and the step. It
//     first waits up to kPeerReportGrace for a peer's own error to arrive
//     (a peer that failed first, but later than this rank began waiting);
//     one that arrives is what the rank ends with. Over MPI a peer's error
//     arrives as that peer's MPI_Abort, which ends this process during the
//     grace.
// So a run with a dead or hung peer ends within peer_timeout +
// kPeerReportGrace of the fault, plus the time an abort takes to travel
// (microseconds for thread ranks, an mpirun teardown over MPI).
inline constexpr absl::Duration kPeerReportGrace = absl::Seconds(1);

// One rank of an expert-parallel world.
class EpRank {
 public:
  // Builds this rank's engine (its share of the experts under the even
  // placement over the whole world) and captures its graphs in lockstep with
  // the other ranks. `world` carries the data (MoE collectives, expert
  // migration: device buffers); `control` (nullptr: `world`) carries the
  // host-side exchanges (moved requests, gathered results) and must have the
  // same ranks. With NCCL, `control` is the MPI world or a local group. Both
  // must outlive the EpRank.
  static absl::StatusOr<std::unique_ptr<EpRank>> Create(Communicator* world,
                                                        const EngineOptions& options,
                                                        const EpOptions& ep,
                                                        Communicator* control = nullptr);

  // Runs `requests` (request i, with id i, on rank i % world) to completion
  // in lockstep with every other rank, applying the reconfigurations of the
  // EpOptions. Every rank returns the same gathered result. A failure after
  // the requests are admitted (a step, a reconfiguration, the final
  // exchange) aborts this rank's communicators (Communicator::Abort), so
  // the peers fail at once with that reason instead of waiting in their
  // next collective.
  absl::StatusOr<EpRunResult> Run(const std::vector<RequestSpec>& requests);

  // Reconfigures the active group to `new_size` ranks (collective over the
  // world). `step` is recorded in the report.
  absl::StatusOr<ReconfigurationReport> Reconfigure(int step, int new_size);

  Engine& engine() { return *engine_; }
  const ExpertPlacement& placement() const { return placement_; }

 private:
  EpRank() = default;
  // Create's part after the checks: the host stream, the group, the engine.
  absl::Status Start(const EngineOptions& options);
  // Start's part after the group exists: placement and engine.
  absl::Status BuildEngine(const EngineOptions& options);
  // Run after validation: admits this rank's requests, steps to the end and
  // gathers the results.
  absl::StatusOr<EpRunResult> Drive(const std::vector<RequestSpec>& requests, EpRunResult result);
  // Aborts the active group, the control and the world communicators.
  void AbortGroups(const absl::Status& reason);
  // What this rank ends with after `failure`: a peer's own error when
  // `failure` is a peer timeout and a peer's error arrives within
  // kPeerReportGrace (see above), else `failure`.
  absl::Status PreferPeerReport(absl::Status failure);
  // The injected fault of this rank at driver step `step`, if any.
  absl::Status InjectFault(int64_t step);
  // Every rank's `mine`, on every rank (control-plane exchange over host memory).
  absl::StatusOr<std::vector<std::vector<int64_t>>> ExchangeAll(const std::vector<int64_t>& mine);

  Communicator* world_ = nullptr;
  Communicator* control_ = nullptr;
  EpOptions ep_;
  int active_ = 0;
  ExpertPlacement placement_;
  std::unique_ptr<Device> host_device_;
  std::unique_ptr<Stream> host_stream_;  // control-plane collectives
  // Declared in this order so that the group is released before the engine
  // whose graphs it drops first.
  std::unique_ptr<Engine> engine_;
  ExpertGroup group_;                            // empty while this rank is outside the group
  std::unique_ptr<Communicator> pending_group_;  // the next group, during a reconfiguration
};

// Runs `requests` over `ep.world` ranks made by `backend` (see EpBackend),
// on the devices options.device asks for, which must suit the backend:
// local takes host (or auto, as host); nccl takes cuda (or auto) and needs
// ep.world CUDA devices; mpi takes host, cuda:N, or cuda / auto (the
// process's local rank's GPU, when there are GPUs). A device the backend
// cannot use is InvalidArgument, never ignored. Every rank returns the same
// gathered result; `rank`, when given, receives this process's rank (0 for
// thread ranks).
// `rank_status`, when given, receives how every thread rank ended (this
// process's rank alone for mpi).
absl::StatusOr<EpRunResult> RunExpertParallel(const EngineOptions& options, const EpOptions& ep,
                                              EpBackend backend,
                                              const std::vector<RequestSpec>& requests,
                                              int* rank = nullptr,
                                              std::vector<absl::Status>* rank_status = nullptr);

// Runs `ep.world` thread ranks of the local backend in this process.
absl::StatusOr<EpRunResult> RunLocalExpertParallel(
    const EngineOptions& options, const EpOptions& ep, const std::vector<RequestSpec>& requests,
    std::vector<absl::Status>* rank_status = nullptr);

// Runs one thread rank per communicator in this process: rank r uses
// `worlds[r]` for data, `controls[r]` for control (empty: the worlds) and
// device `devices[r]` ("host", "cuda:1", ...). For several GPUs in one
// process: NCCL worlds from NcclCommunicator::InitAll, local controls.
// `rank_status`, when given, receives how every rank ended.
absl::StatusOr<EpRunResult> RunThreadedExpertParallel(
    const EngineOptions& options, const EpOptions& ep, const std::vector<RequestSpec>& requests,
    const std::vector<Communicator*>& worlds, const std::vector<Communicator*>& controls,
    const std::vector<std::string>& devices, std::vector<absl::Status>* rank_status = nullptr);

}  // namespace mlag
