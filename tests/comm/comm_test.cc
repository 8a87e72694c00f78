// The local communicator: thread ranks of one process, each with its own host
// device and stream. The shared collective checks (collective_checks.h, also
// run over MPI by mpi_comm_test) on groups of 1 to 4 ranks, plus what only
// the local backend promises: rank-order (timing-independent) reductions,
// argument checks, mismatched collectives and deadlines instead of hangs.
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/local_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/core/device.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/stream.h"
#include "tests/comm/collective_checks.h"

namespace mlag {
namespace {

using comm_checks::CheckLog;
using comm_checks::View;
using ::testing::HasSubstr;

using RankBody = std::function<void(Communicator&, Stream&, CheckLog&)>;

// Runs `body` for every communicator on its own thread, with its own host
// device and stream, and returns each rank's log.
std::vector<CheckLog> RunRanks(const std::vector<std::unique_ptr<Communicator>>& comms,
                               const RankBody& body) {
  std::vector<CheckLog> logs(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Device>> device = Device::Create("host");
      if (!logs[r].ExpectOk(device.status(), "Device::Create")) return;
      absl::StatusOr<std::unique_ptr<Stream>> stream = Stream::Create(device->get());
      if (!logs[r].ExpectOk(stream.status(), "Stream::Create")) return;
      body(*comms[r], **stream, logs[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  return logs;
}

void ExpectAllPassed(const std::vector<CheckLog>& logs) {
  for (size_t r = 0; r < logs.size(); ++r) {
    EXPECT_TRUE(logs[r].failures.empty())
        << "rank " << r << ":\n  " << absl::StrJoin(logs[r].failures, "\n  ");
    EXPECT_GT(logs[r].passed, 0) << "rank " << r << " checked nothing";
  }
}

// A group whose ranks give up after 20 s, so a broken test fails instead of
// hanging for the default minute.
std::vector<std::unique_ptr<Communicator>> Group(int size) {
  return LocalCommunicator::CreateGroup(size, absl::Seconds(20));
}

class LocalCommTest : public ::testing::TestWithParam<int> {
 protected:
  void Run(const RankBody& body) {
    std::vector<std::unique_ptr<Communicator>> comms = Group(GetParam());
    ASSERT_EQ(comms.size(), static_cast<size_t>(GetParam()));
    ExpectAllPassed(RunRanks(comms, body));
  }
};

TEST_P(LocalCommTest, RanksAndBackend) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(GetParam());
  for (int r = 0; r < GetParam(); ++r) {
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), GetParam());
    EXPECT_EQ(comms[r]->backend(), "local");
  }
}

TEST_P(LocalCommTest, AllGather) {
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::CheckAllGather(c, s, log); });
}

TEST_P(LocalCommTest, ReduceScatter) {
  Run([](Communicator& c, Stream& s, CheckLog& log) {
    comm_checks::CheckReduceScatter(c, s, log);
  });
}

TEST_P(LocalCommTest, AllReduce) {
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::CheckAllReduce(c, s, log); });
}

TEST_P(LocalCommTest, Broadcast) {
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::CheckBroadcast(c, s, log); });
}

TEST_P(LocalCommTest, SendRecvRing) {
  if (GetParam() < 2) GTEST_SKIP() << "a ring needs two ranks";
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::CheckSendRecvRing(c, s, log); });
}

TEST_P(LocalCommTest, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  const int size = GetParam();
  Run([&](Communicator& c, Stream&, CheckLog& log) {
    for (int round = 0; round < 20; ++round) {
      if (c.rank() == round % size) std::this_thread::sleep_for(std::chrono::microseconds(300));
      arrived.fetch_add(1);
      if (!log.ExpectOk(c.Barrier(), "barrier")) return;
      const int seen = arrived.load();
      log.Expect(seen >= (round + 1) * size,
                 absl::StrCat("round ", round, ": left the barrier with ", seen, " arrivals"));
    }
  });
}

TEST_P(LocalCommTest, AllReduceScalar) {
  Run([](Communicator& c, Stream&, CheckLog& log) { comm_checks::CheckAllReduceScalar(c, log); });
}

TEST_P(LocalCommTest, CaptureAndReplay100Times) {
  Run([](Communicator& c, Stream& s, CheckLog& log) {
    comm_checks::CheckGraphReplay(c, s, log, 100);
  });
}

TEST_P(LocalCommTest, Split) {
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::CheckSplit(c, s, log); });
}

TEST_P(LocalCommTest, AllChecksInOneSequence) {
  Run([](Communicator& c, Stream& s, CheckLog& log) { comm_checks::RunAll(c, s, log, 10); });
}

// Reductions add in rank order on every rank: on random floats (where the
// order changes the rounding) every rank gets the rank-order sum bit for bit,
// whichever rank arrives first.
TEST_P(LocalCommTest, ReductionsAreInRankOrderWhateverTheTiming) {
  const int size = GetParam();
  const int64_t n = 301;
  // Uniform in [-1000, 1000) times 10^(i % 7 - 3): magnitudes that round.
  auto input = [](int rank, int round, int64_t i) {
    const uint64_t h =
        comm_checks::Mix((static_cast<uint64_t>(rank) << 48) ^
                         (static_cast<uint64_t>(round) << 32) ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) / static_cast<float>(1 << 24);
    return (u * 2e3f - 1e3f) * std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);
  };
  Run([&](Communicator& c, Stream& s, CheckLog& log) {
    std::mt19937 jitter(static_cast<uint32_t>(c.rank() + 1));
    for (int round = 0; round < 10; ++round) {
      std::vector<float> send(size * n), all_reduced(size * n), scattered(n);
      for (int64_t i = 0; i < size * n; ++i) send[i] = input(c.rank(), round, i);
      std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 400));
      if (!log.ExpectOk(c.AllReduce(s, View(send), View(all_reduced), ReduceOp::kSum),
                        "all_reduce")) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 400));
      if (!log.ExpectOk(c.ReduceScatter(s, View(send), View(scattered)), "reduce_scatter")) {
        return;
      }
      std::vector<float> want(size * n);
      for (int64_t i = 0; i < size * n; ++i) {
        float acc = input(0, round, i);
        for (int p = 1; p < size; ++p) acc += input(p, round, i);
        want[i] = acc;
      }
      comm_checks::ExpectEqual(log, absl::StrCat("all_reduce round ", round), all_reduced, want);
      std::vector<float> want_slice(want.begin() + c.rank() * n, want.begin() + (c.rank() + 1) * n);
      comm_checks::ExpectEqual(log, absl::StrCat("reduce_scatter round ", round), scattered,
                               want_slice);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "_ranks");
                         });

// ---- What every rank sees when the ranks disagree ----------------------------

struct LocalStream {
  std::unique_ptr<Device> device = Device::Create("host").value();
  std::unique_ptr<Stream> stream = Stream::Create(device.get()).value();
};

TEST(LocalCommunicatorTest, EmptyGroupForSizeBelowOne) {
  EXPECT_TRUE(LocalCommunicator::CreateGroup(0).empty());
  EXPECT_TRUE(LocalCommunicator::CreateGroup(-3).empty());
}

// Bad arguments are rejected before any exchange, so one rank alone sees them.
TEST(LocalCommunicatorTest, RejectsBadArguments) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(2);
  Communicator& c = *comms[0];
  LocalStream ls;
  Stream& stream = *ls.stream;
  std::vector<float> a(8), b(8), c16(16);
  std::vector<uint16_t> half(8);
  Tensor bf16(half.data(), DType::kBF16, {8});
  auto invalid = [](const absl::Status& st) {
    return st.code() == absl::StatusCode::kInvalidArgument;
  };

  EXPECT_TRUE(invalid(c.AllGather(stream, View(a), View(b)))) << "recv must be size * send";
  EXPECT_TRUE(invalid(c.ReduceScatter(stream, View(a), View(b)))) << "send must be size * recv";
  EXPECT_TRUE(invalid(c.AllReduce(stream, View(a), View(c16), ReduceOp::kSum)));
  EXPECT_TRUE(invalid(c.AllReduce(stream, bf16, bf16, ReduceOp::kSum))) << "bf16 is not reducible";
  EXPECT_TRUE(invalid(c.AllReduce(stream, View(c16, 0, 8), View(c16, 4, 8), ReduceOp::kSum)))
      << "partial overlap";
  EXPECT_TRUE(invalid(c.AllGather(stream, View(c16, 4, 8), View(c16))))
      << "overlap other than rank 0's slot";
  EXPECT_TRUE(invalid(c.Broadcast(stream, View(a), 2)));
  EXPECT_TRUE(invalid(c.Broadcast(stream, View(a), -1)));
  EXPECT_TRUE(invalid(c.Send(stream, View(a), 2)));
  EXPECT_TRUE(invalid(c.Recv(stream, View(a), -1)));
  EXPECT_TRUE(invalid(c.Send(stream, View(a), 0))) << "no send to self";
  std::vector<float> wide(16);
  Tensor strided = Tensor::Strided(wide.data(), DType::kF32, {8}, {2});
  EXPECT_TRUE(invalid(c.AllReduce(stream, strided, View(b), ReduceOp::kSum))) << "not contiguous";
  absl::Status st = c.AllGather(stream, View(a), View(b));
  EXPECT_THAT(std::string(st.message()), HasSubstr("all_gather"));
}

TEST(LocalCommunicatorTest, InPlaceAllGatherAtThisRanksSlotIsAccepted) {
  // Rank 0's slot of recv is its first 8 elements: in place, accepted (and
  // run by the shared checks); rank 1's slot would not be.
  std::vector<std::unique_ptr<Communicator>> comms = Group(2);
  std::vector<float> recv(16);
  LocalStream ls;
  EXPECT_EQ(comms[1]->AllGather(*ls.stream, View(recv, 0, 8), View(recv)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalCommunicatorTest, MismatchedCollectivesFailOnEveryRank) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(2);
  std::vector<absl::Status> first(2), second(2);
  RunRanks(comms, [&](Communicator& c, Stream& s, CheckLog&) {
    std::vector<float> x(4, 1.0f);
    if (c.rank() == 0) {
      first[0] = c.AllReduce(s, View(x), View(x), ReduceOp::kSum);
    } else {
      first[1] = c.Barrier();
    }
    // Same op, different sizes.
    std::vector<float> y(4 + c.rank(), 1.0f);
    second[c.rank()] = c.AllReduce(s, View(y), View(y), ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[r].code(), absl::StatusCode::kInvalidArgument) << first[r];
    EXPECT_THAT(std::string(first[r].message()), HasSubstr("different collectives"));
    EXPECT_THAT(std::string(first[r].message()), HasSubstr("rank 1: barrier"));
    EXPECT_EQ(second[r].code(), absl::StatusCode::kInvalidArgument) << second[r];
    EXPECT_THAT(std::string(second[r].message()), HasSubstr("16 bytes"));
  }
  // The group is still usable.
  ExpectAllPassed(RunRanks(comms, [](Communicator& c, Stream&, CheckLog& log) {
    comm_checks::CheckAllReduceScalar(c, log);
  }));
}

// A missing peer gives the one peer-fault error (runtime/core/peer_fault.h):
// it names the waiting rank, the op and the rank that never came. The
// timeout (500 ms) is far above a healthy wait of two thread ranks on a
// loaded machine, which the second half takes.
TEST(LocalCommunicatorTest, MissingPeerGivesThePeerFaultNamingTheOpAndThePeer) {
  std::vector<std::unique_ptr<Communicator>> comms =
      LocalCommunicator::CreateGroup(2, absl::Milliseconds(500));
  LocalStream ls;
  std::vector<float> x(4, 1.0f);
  const auto expect_peer_fault = [](const absl::Status& s, const std::string& form) {
    EXPECT_TRUE(IsPeerTimeout(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::MatchesRegex(form)) << s;
  };

  expect_peer_fault(comms[0]->Barrier(),
                    "peer dead or hung: rank 0 of 2 waited [0-9.]+m?s in local barrier for rank 1");
  expect_peer_fault(
      comms[0]->AllReduce(*ls.stream, View(x), View(x), ReduceOp::kMax),
      "peer dead or hung: rank 0 of 2 waited [0-9.]+m?s in local all_reduce for rank 1");
  expect_peer_fault(comms[1]->Send(*ls.stream, View(x), 0),
                    "peer dead or hung: rank 1 of 2 waited [0-9.]+m?s in local send for rank 0");
  expect_peer_fault(comms[1]->Recv(*ls.stream, View(x), 0),
                    "peer dead or hung: rank 1 of 2 waited [0-9.]+m?s in local recv for rank 0");
  absl::StatusOr<std::unique_ptr<Communicator>> sub = comms[0]->Split(0, 0);
  expect_peer_fault(sub.status(),
                    "peer dead or hung: rank 0 of 2 waited [0-9.]+m?s in local split for rank 1");

  // A rank that timed out withdrew: with both ranks present everything works.
  ExpectAllPassed(RunRanks(comms, [](Communicator& c, Stream& st, CheckLog& log) {
    comm_checks::CheckBarrier(c, log);
    comm_checks::CheckSendRecvRing(c, st, log);
  }));
}

// Barrier(timeout) waits its own bound, not the group's: a rank arriving
// long after the group's 50 ms timeout still meets the others, and one that
// never comes is reported once that bound has passed.
TEST(LocalCommunicatorTest, BarrierWithItsOwnTimeoutOutwaitsTheGroupTimeout) {
  std::vector<std::unique_ptr<Communicator>> comms =
      LocalCommunicator::CreateGroup(2, absl::Milliseconds(50));
  ExpectAllPassed(RunRanks(comms, [](Communicator& c, Stream&, CheckLog& log) {
    if (c.rank() == 1) absl::SleepFor(absl::Milliseconds(300));  // six group timeouts late
    log.ExpectOk(c.Barrier(absl::Seconds(60)), "the late rank is met");
  }));
  const absl::Time start = absl::Now();
  const absl::Status alone = comms[0]->Barrier(absl::Milliseconds(400));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_TRUE(IsPeerTimeout(alone)) << alone;
  EXPECT_THAT(std::string(alone.message()), HasSubstr("in local barrier for rank 1"));
}

// Health() is OK until a rank aborts the group, then carries the reason:
// what a rank waiting outside the group's collectives (a stream watchdog)
// polls to learn of a peer's failure at once.
TEST(LocalCommunicatorTest, HealthCarriesAnAbortsReason) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(3);
  for (auto& c : comms) EXPECT_TRUE(c->Health().ok()) << c->Health();
  comms[1]->Abort(absl::InternalError("rank 1: injected failure"));
  for (auto& c : comms) {
    const absl::Status h = c->Health();
    EXPECT_EQ(h.code(), absl::StatusCode::kAborted) << h;
    EXPECT_THAT(std::string(h.message()), HasSubstr("rank 1: injected failure"));
  }
}

// A rank that fails aborts the group: peers waiting in a collective (or a
// Recv) wake at once with Aborted carrying its reason, well before the
// group's 20 s timeout, and every later collective on any rank fails alike.
TEST(LocalCommunicatorTest, AbortWakesWaitingRanksAtOnce) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(4);
  const absl::Time start = absl::Now();
  std::vector<CheckLog> logs = RunRanks(comms, [](Communicator& c, Stream& st, CheckLog& log) {
    std::vector<float> x(8, 1.0f), all(32, 0.0f);
    if (c.rank() == 0) {
      absl::SleepFor(absl::Milliseconds(100));  // let the peers block first
      c.Abort(absl::ResourceExhaustedError("rank 0 ran out of memory"));
      return;
    }
    absl::Status s = c.rank() == 3 ? c.Recv(st, View(x), 0) : c.AllGather(st, View(x), View(all));
    log.Expect(s.code() == absl::StatusCode::kAborted, "the waiting rank is aborted");
    log.Expect(absl::StrContains(s.message(), "rank 0 ran out of memory"),
               "the abort carries its reason");
    s = c.Barrier();
    log.Expect(s.code() == absl::StatusCode::kAborted, "later collectives fail too");
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (size_t r = 1; r < logs.size(); ++r) {
    EXPECT_TRUE(logs[r].failures.empty())
        << "rank " << r << ":\n  " << absl::StrJoin(logs[r].failures, "\n  ");
    EXPECT_EQ(logs[r].passed, 5) << "rank " << r;  // device, stream and three checks
  }
  absl::StatusOr<int64_t> after = comms[0]->AllReduceScalar(1, ReduceOp::kSum);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kAborted) << after.status();
}

TEST(LocalCommunicatorTest, SendRecvSizeMismatchFailsOnBothSides) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(2);
  std::vector<absl::Status> status(2);
  RunRanks(comms, [&](Communicator& c, Stream& s, CheckLog&) {
    std::vector<float> x(8 - 4 * c.rank(), 1.0f);
    status[c.rank()] = c.rank() == 0 ? c.Send(s, View(x), 1) : c.Recv(s, View(x), 0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("32 bytes"));
  }
}

TEST(LocalCommunicatorTest, SubgroupsRunConcurrentlyAndOutliveTheParent) {
  std::vector<std::unique_ptr<Communicator>> comms = Group(4);
  std::vector<std::unique_ptr<Communicator>> subs(4);
  RunRanks(comms, [&](Communicator& c, Stream&, CheckLog& log) {
    absl::StatusOr<std::unique_ptr<Communicator>> sub = c.Split(c.rank() / 2, 0);
    if (log.ExpectOk(sub.status(), "split")) subs[c.rank()] = std::move(sub).value();
  });
  comms.clear();  // the subgroups own their shared state
  ExpectAllPassed(RunRanks(subs, [](Communicator& c, Stream& s, CheckLog& log) {
    log.Expect(c.size() == 2, "pairs");
    comm_checks::RunAll(c, s, log, 5);
  }));
}

}  // namespace
}  // namespace mlag
