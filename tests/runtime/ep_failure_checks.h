// The failure test every expert-parallel backend runs: rank 1 fails
// ("fail:1:5") and rank 2 hangs ("hang:2:5:S") at step 5 (a 2 s peer
// timeout and a 3 s hang on the host; 10 s and 6 s on emulated CUDA, whose
// timeout must clear a loaded machine's slowest healthy step).
#pragma once

#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/core/peer_fault.h"
#include "tests/status_matchers.h"

namespace mlag::testing {

// True for a rank's ending that classifies a peer fault: the peer-timeout
// error itself, or another rank's, passed on by its abort.
inline bool NamesAPeerFault(const absl::Status& status) {
  return IsPeerTimeout(status) || (status.code() == absl::StatusCode::kAborted &&
                                   absl::StrContains(status.message(), kPeerFaultPrefix));
}

// Every rank must end with an error that names what happened: rank 1 its
// own failure; the others rank 1's failure passed on, or (a rank that
// waited on the hung one first) the classified peer fault. Whichever rank
// saw what first, the run reports the cause: rank 1's failure. `took`, the
// whole run with its start-up, must stay under `bound`: what ends it is the
// abort and the hung rank's return, not a default 60 s timeout. Prints each
// rank's status.
template <typename Run>
void ExpectEveryRankEndsNamed(const Run& run, const std::vector<absl::Status>& ranks,
                              absl::Duration took, absl::Duration bound) {
  ASSERT_EQ(ranks.size(), 4u);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::printf("  rank %zu: %s\n", r, ranks[r].ToString().c_str());
  }
  std::printf("  run: %s after %s\n", ToStatus(run).ToString().c_str(),
              absl::FormatDuration(took).c_str());
  EXPECT_THAT(run, StatusIs(absl::StatusCode::kInternal,
                            ::testing::HasSubstr("rank 1: injected failure at step 5")));
  EXPECT_THAT(ranks[1], StatusIs(absl::StatusCode::kInternal,
                                 ::testing::HasSubstr("injected failure at step 5")));
  for (int r : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_FALSE(ranks[r].ok());
    const bool named = absl::StrContains(ranks[r].message(), "injected failure at step 5") ||
                       NamesAPeerFault(ranks[r]);
    EXPECT_TRUE(named) << ranks[r];
  }
  EXPECT_LT(took, bound);
}

}  // namespace mlag::testing
