// The failure test every expert-parallel backend runs: rank 1 fails
// ("fail:1:5") and rank 2 hangs ("hang:2:5:S") at step 5, for longer than
// the peer timeout (2 s and 3 s on the host, 4 s and 6 s on emulated CUDA).
#pragma once

#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace mlag::testing {

// Every rank must end with an error that names what happened: rank 1 its
// own failure; the others rank 1's failure passed on, or (a rank that
// waited on the hung one first) its own DeadlineExceeded. The whole run,
// start-up included, must take well under the default 60 s peer timeout,
// so the 2 s timeout and the abort are what ended it. Prints each rank's
// status.
inline void ExpectEveryRankEndsNamed(const std::vector<absl::Status>& ranks, absl::Duration took) {
  ASSERT_EQ(ranks.size(), 4u);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::printf("  rank %zu: %s\n", r, ranks[r].ToString().c_str());
  }
  EXPECT_THAT(ranks[1], StatusIs(absl::StatusCode::kInternal,
                                 ::testing::HasSubstr("injected failure at step 5")));
  for (int r : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_FALSE(ranks[r].ok());
    const bool named = absl::StrContains(ranks[r].message(), "injected failure at step 5") ||
                       ranks[r].code() == absl::StatusCode::kDeadlineExceeded;
    EXPECT_TRUE(named) << ranks[r];
  }
  EXPECT_LT(took, absl::Seconds(30));
}

}  // namespace mlag::testing
