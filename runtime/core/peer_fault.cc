#include "runtime/core/peer_fault.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlag {

absl::Status PeerTimeoutError(int rank, int size, absl::string_view op, absl::Duration waited,
                              const std::vector<int>& peers) {
  std::string message(kPeerFaultPrefix);
  if (rank >= 0) absl::StrAppend(&message, "rank ", rank, " of ", size, " ");
  absl::StrAppend(&message, "waited ", absl::FormatDuration(waited), " in ", op);
  if (peers.size() == 1) {
    absl::StrAppend(&message, " for rank ", peers[0]);
  } else if (!peers.empty()) {
    absl::StrAppend(&message, " for ranks ", absl::StrJoin(peers, ", "));
  }
  return absl::DeadlineExceededError(message);
}

bool IsPeerTimeout(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDeadlineExceeded &&
         absl::StrContains(status.message(), kPeerFaultPrefix);
}

absl::Status AtStep(const absl::Status& status, absl::string_view where) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), ", at ", where));
}

}  // namespace mlag
