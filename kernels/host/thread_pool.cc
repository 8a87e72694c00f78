#include "kernels/host/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mlag::host {
namespace {

using Clock = std::chrono::steady_clock;

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spin iterations between two looks at the clock.
constexpr int kSpinsPerClockRead = 64;

std::atomic<int64_t> g_worker_spin_us{100};

int DefaultNumThreads() {
  if (const char* env = std::getenv("MLAG_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

int ProcessDefaultThreads() {
  static const int n = DefaultNumThreads();
  return n;
}

// One parallel loop. Shared by the caller and the workers that pick it up, so
// a worker that arrives after the loop has ended still reads valid counters
// (and finds nothing left to claim); fn is only called for claimed indices,
// and the caller waits for those, so ctx outlives every call.
struct Loop {
  int64_t n = 0;
  int64_t chunk = 1;
  void (*invoke)(void*, int64_t) = nullptr;
  void* ctx = nullptr;
  std::atomic<int64_t> next{0};  // first index not yet claimed
  std::atomic<int64_t> done{0};  // indices run to completion

  void Drain() {
    for (;;) {
      const int64_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) return;
      const int64_t end = std::min(n, begin + chunk);
      for (int64_t i = begin; i < end; ++i) invoke(ctx, i);
      done.fetch_add(end - begin, std::memory_order_release);
    }
  }
};

thread_local bool t_in_parallel_loop = false;
thread_local int t_num_threads = 0;  // 0: the process default

class Pool {
 public:
  explicit Pool(int workers) {
    threads_.reserve(workers);
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { WorkerMain(); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  void Run(int64_t n, int64_t chunk, void (*invoke)(void*, int64_t), void* ctx) {
    auto loop = std::make_shared<Loop>();
    loop->n = n;
    loop->chunk = chunk;
    loop->invoke = invoke;
    loop->ctx = ctx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      loop_ = loop;
      generation_.fetch_add(1, std::memory_order_release);
      if (sleeping_ > 0) wake_.notify_all();
    }
    t_in_parallel_loop = true;
    loop->Drain();
    // Only chunks other threads are running remain: spin for them, then give
    // the core away (the thread running one may be waiting for it).
    const Clock::time_point spin_until = Clock::now() + WorkerSpin();
    bool yielding = false;
    int spins = 0;
    while (loop->done.load(std::memory_order_acquire) < n) {
      if (yielding) {
        std::this_thread::yield();
        continue;
      }
      CpuRelax();
      if (++spins == kSpinsPerClockRead) {
        spins = 0;
        yielding = Clock::now() >= spin_until;
      }
    }
    t_in_parallel_loop = false;
  }

 private:
  void WorkerMain() {
    t_in_parallel_loop = true;
    uint64_t seen = 0;
    for (;;) {
      if (!WaitForLoop(&seen)) return;
      std::shared_ptr<Loop> loop;
      {
        std::lock_guard<std::mutex> lock(mu_);
        loop = loop_;
      }
      if (loop != nullptr) loop->Drain();
    }
  }

  // Waits until generation_ moves past *seen: spinning for WorkerSpin(),
  // then asleep. Returns false when the pool is stopping.
  bool WaitForLoop(uint64_t* seen) {
    const Clock::time_point spin_until = Clock::now() + WorkerSpin();
    int spins = 0;
    for (;;) {
      const uint64_t g = generation_.load(std::memory_order_acquire);
      if (g != *seen) {
        *seen = g;
        break;
      }
      if (++spins < kSpinsPerClockRead) {
        CpuRelax();
        continue;
      }
      spins = 0;
      if (Clock::now() < spin_until) continue;
      std::unique_lock<std::mutex> lock(mu_);
      ++sleeping_;
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != *seen; });
      --sleeping_;
    }
    std::lock_guard<std::mutex> lock(mu_);
    return !stop_;
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::shared_ptr<Loop> loop_;  // the latest loop; guarded by mu_
  int sleeping_ = 0;            // workers blocked on wake_; guarded by mu_
  bool stop_ = false;           // guarded by mu_
  // Bumped (under mu_) for each new loop and to stop: what idle workers watch.
  std::atomic<uint64_t> generation_{0};
  std::vector<std::thread> threads_;
};

// The calling thread's pool, created on its first parallel loop and joined
// when the thread exits.
thread_local std::unique_ptr<Pool> t_pool;

}  // namespace

int NumThreads() { return t_num_threads > 0 ? t_num_threads : ProcessDefaultThreads(); }

void SetNumThreads(int n) { t_num_threads = n > 0 ? n : 0; }

void SetWorkerSpin(std::chrono::microseconds spin) {
  g_worker_spin_us.store(std::max<int64_t>(0, spin.count()), std::memory_order_relaxed);
}

std::chrono::microseconds WorkerSpin() {
  return std::chrono::microseconds(g_worker_spin_us.load(std::memory_order_relaxed));
}

bool InParallelLoop() { return t_in_parallel_loop; }

namespace internal {

void RunParallel(int64_t n, int64_t chunk, void (*invoke)(void*, int64_t), void* ctx) {
  const int workers = NumThreads() - 1;
  if (t_pool == nullptr || t_pool->workers() != workers) {
    t_pool.reset();
    t_pool = std::make_unique<Pool>(workers);
  }
  t_pool->Run(n, chunk, invoke, ctx);
}

}  // namespace internal
}  // namespace mlag::host
