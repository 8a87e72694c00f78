// The host thread pool (kernels/host/thread_pool.h): every index runs once,
// nested loops run serially, work is claimed rather than assigned (a blocked
// thread does not hold up the rest), and idle workers go to sleep.
#include "kernels/host/thread_pool.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

// Restores the calling thread's thread count and the worker spin on exit.
class ThreadPoolTest : public ::testing::Test {
 protected:
  void TearDown() override {
    SetNumThreads(0);
    SetWorkerSpin(spin_);
  }
  const std::chrono::microseconds spin_ = WorkerSpin();
};

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

TEST_F(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    SetNumThreads(threads);
    EXPECT_EQ(NumThreads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
      std::vector<std::atomic<int>> dyn(n);
      ParallelForDynamic(n, [&](int64_t i) { dyn[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(dyn[i].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST_F(ThreadPoolTest, NestedLoopsRunOnTheThreadThatReachesThem) {
  SetNumThreads(4);
  std::vector<std::atomic<int>> hits(16 * 16);
  ParallelFor(16, [&](int64_t i) {
    EXPECT_TRUE(InParallelLoop());
    const std::thread::id outer = std::this_thread::get_id();
    ParallelFor(16, [&](int64_t j) {
      EXPECT_EQ(std::this_thread::get_id(), outer);
      hits[i * 16 + j].fetch_add(1);
    });
  });
  EXPECT_FALSE(InParallelLoop());
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// Index 0 blocks until every other index has run. With indices handed out
// in fixed shares, the thread holding index 0 would also own others and the
// loop would never end; with claiming, the other thread takes them all.
TEST_F(ThreadPoolTest, ABlockedThreadLeavesItsShareToTheOthers) {
  SetNumThreads(2);
  for (int64_t n : {2, 9, 100}) {
    std::atomic<int64_t> others{0};
    ParallelForDynamic(n, [&](int64_t i) {
      if (i == 0) {
        while (others.load() < n - 1) std::this_thread::yield();
      } else {
        others.fetch_add(1);
      }
    });
    EXPECT_EQ(others.load(), n - 1);
  }
}

// After a loop, the workers spin for WorkerSpin() and then sleep: an idle
// process with a live pool burns (almost) no CPU.
TEST_F(ThreadPoolTest, IdleWorkersSleep) {
  SetNumThreads(4);
  SetWorkerSpin(std::chrono::microseconds(1000));
  std::atomic<int64_t> sum{0};
  ParallelFor(64, [&](int64_t i) { sum.fetch_add(i); });
  ASSERT_EQ(sum.load(), 64 * 63 / 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin
  const double cpu0 = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double idle_cpu = ProcessCpuSeconds() - cpu0;
  // Three spinning workers would use about 0.9 CPU-seconds here.
  EXPECT_LT(idle_cpu, 0.05);
  // And they wake for the next loop.
  std::vector<std::atomic<int>> hits(100);
  ParallelFor(100, [&](int64_t i) { hits[i].fetch_add(1); });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// Each calling thread has its own pool and thread count (how expert-parallel
// rank threads share the cores).
TEST_F(ThreadPoolTest, ThreadsKeepTheirOwnCount) {
  SetNumThreads(3);
  std::atomic<int> seen_in_thread{0};
  std::thread t([&] {
    SetNumThreads(2);
    seen_in_thread = NumThreads();
    std::vector<std::atomic<int>> hits(50);
    ParallelFor(50, [&](int64_t i) { hits[i].fetch_add(1); });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  });
  t.join();
  EXPECT_EQ(seen_in_thread.load(), 2);
  EXPECT_EQ(NumThreads(), 3);
}

}  // namespace
}  // namespace mlag::host
