// Host parallelism. Every host kernel parallelises through OpenMP, so there is
// one thread pool for the process (OMP_NUM_THREADS sizes it). OpenBLAS keeps
// its own pool for sgemm.
#pragma once

#include <omp.h>

#include <cstdint>

namespace mlag::host {

inline int NumThreads() { return omp_get_max_threads(); }

// Runs fn(i) for i in [0, n), spread over the pool when n is at least
// `min_parallel`. fn must be safe to run concurrently for distinct i.
template <typename Fn>
void ParallelFor(int64_t n, Fn&& fn, int64_t min_parallel = 2) {
  if (n < min_parallel || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// Like ParallelFor with dynamic scheduling, for uneven work items.
template <typename Fn>
void ParallelForDynamic(int64_t n, Fn&& fn) {
  if (n < 2 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace mlag::host
