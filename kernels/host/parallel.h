// Host parallelism. Every host kernel parallelises through these loops, which
// run on the host backend's own thread pool (kernels/host/thread_pool.h):
// idle workers spin briefly and then sleep, and chunks are claimed rather than
// assigned, so a busy machine slows a loop down instead of stalling it.
// OpenBLAS is single-threaded: its calls are split over these loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/host/thread_pool.h"

namespace mlag::host {
namespace internal {

template <typename Fn>
void InvokeIndex(void* fn, int64_t i) {
  (*static_cast<std::remove_reference_t<Fn>*>(fn))(i);
}

// Chunks per thread in ParallelFor: a few, so that threads which start late
// or run slow (another process on the core) leave work for the others.
constexpr int64_t kChunksPerThread = 4;

}  // namespace internal

// Runs fn(i) for i in [0, n), spread over the pool when n is at least
// `min_parallel`. fn must be safe to run concurrently for distinct i, and
// what fn(i) computes must not depend on which thread runs it.
template <typename Fn>
void ParallelFor(int64_t n, Fn&& fn, int64_t min_parallel = 2) {
  const int threads = NumThreads();
  if (n < std::max<int64_t>(min_parallel, 2) || threads < 2 || InParallelLoop()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t chunks = std::min<int64_t>(n, threads * internal::kChunksPerThread);
  internal::RunParallel(n, (n + chunks - 1) / chunks, &internal::InvokeIndex<Fn>,
                        const_cast<void*>(static_cast<const void*>(&fn)));
}

// Like ParallelFor, one index at a time, for uneven work items.
template <typename Fn>
void ParallelForDynamic(int64_t n, Fn&& fn) {
  if (n < 2 || NumThreads() < 2 || InParallelLoop()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  internal::RunParallel(n, 1, &internal::InvokeIndex<Fn>,
                        const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace mlag::host
