// The one error for a peer that does not answer in time.
//
// Several timers watch the same fault: the stream watchdog (a step's device
// work waits in a collective), the local group's barriers, MPI's polled
// nonblocking operations and NCCL's host-side waits. Whichever fires first,
// the rank reports the fault in one form, so that an operator's script (and
// a test) matches one thing whatever the timing:
//
//   code     DeadlineExceeded
//   message  "peer dead or hung: rank R of N waited T in OP[ for rank(s) P]"
//            then, where the caller knows it, ", at step S" (AtStep).
//
// R is the rank that saw it (in the group it waited in); P names the ranks
// it waited for when the backend knows them (the local group, a send or a
// recv), and is left out when it does not (an MPI or NCCL collective, the
// watchdog); T is how long it actually waited.
//
// Example:
//   return PeerTimeoutError(0, 4, "mpi all_gather", waited);
//   // "peer dead or hung: rank 0 of 4 waited 3.0001s in mpi all_gather"
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mlag {

// What every peer-timeout message starts with.
inline constexpr absl::string_view kPeerFaultPrefix = "peer dead or hung: ";

// DeadlineExceeded in the form above: `rank` (< 0: unknown, left out) of a
// group of `size` waited `waited` in `op` ("mpi all_gather", "the step's
// collectives", ...) for `peers`, where known (empty: unknown).
absl::Status PeerTimeoutError(int rank, int size, absl::string_view op, absl::Duration waited,
                              const std::vector<int>& peers = {});

// True for a status made by PeerTimeoutError, also once a caller has put
// context before its message ("rank 0: peer dead or hung: ...").
bool IsPeerTimeout(const absl::Status& status);

// `status` with ", at <where>" appended to its message (code unchanged):
// AtStep(s, "step 3"), AtStep(s, "start-up"). OK stays OK.
absl::Status AtStep(const absl::Status& status, absl::string_view where);

}  // namespace mlag
