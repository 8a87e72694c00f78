// The one peer-fault error: its form, how it is recognised, and the step
// a caller adds.
#include "runtime/core/peer_fault.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mlag {
namespace {

TEST(PeerFaultTest, NamesTheWaitingRankTheOpTheWaitAndThePeersWhereKnown) {
  absl::Status s = PeerTimeoutError(0, 4, "mpi all_gather", absl::Milliseconds(3001), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "peer dead or hung: rank 0 of 4 waited 3.001s in mpi all_gather");

  s = PeerTimeoutError(2, 3, "local recv", absl::Seconds(2), {1});
  EXPECT_EQ(s.message(), "peer dead or hung: rank 2 of 3 waited 2s in local recv for rank 1");

  s = PeerTimeoutError(5, 8, "local barrier", absl::Milliseconds(500), {0, 3, 7});
  EXPECT_EQ(s.message(),
            "peer dead or hung: rank 5 of 8 waited 500ms in local barrier for ranks 0, 3, 7");

  // An unknown rank is left out rather than printed as -1.
  s = PeerTimeoutError(-1, 0, "the step's collectives", absl::Seconds(60), {});
  EXPECT_EQ(s.message(), "peer dead or hung: waited 1m in the step's collectives");
}

TEST(PeerFaultTest, IsRecognisedThroughContextButNotByCodeAlone) {
  const absl::Status s = PeerTimeoutError(1, 2, "nccl barrier", absl::Seconds(1), {});
  EXPECT_TRUE(IsPeerTimeout(s));
  EXPECT_TRUE(IsPeerTimeout(absl::DeadlineExceededError(absl::StrCat("rank 1: ", s.message()))));
  EXPECT_FALSE(IsPeerTimeout(absl::DeadlineExceededError("the stream's work did not finish")));
  // Passed on by an abort: another code, so not this rank's own timeout.
  EXPECT_FALSE(IsPeerTimeout(absl::AbortedError(absl::StrCat("aborted: ", s.message()))));
  EXPECT_FALSE(IsPeerTimeout(absl::OkStatus()));
}

TEST(PeerFaultTest, AtStepAppendsWhereAndKeepsTheCode) {
  const absl::Status s = PeerTimeoutError(3, 4, "mpi all_reduce", absl::Seconds(3), {});
  const absl::Status at = AtStep(s, "step 12");
  EXPECT_EQ(at.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(at.message(), "peer dead or hung: rank 3 of 4 waited 3s in mpi all_reduce, at step 12");
  EXPECT_TRUE(IsPeerTimeout(at));
  EXPECT_TRUE(AtStep(absl::OkStatus(), "step 1").ok());
  EXPECT_EQ(AtStep(absl::InternalError("x"), "start-up"), absl::InternalError("x, at start-up"));
}

}  // namespace
}  // namespace mlag
