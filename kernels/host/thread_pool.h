// The host backend's worker threads.
//
// Every host kernel parallelises through ParallelFor (kernels/host/parallel.h),
// which runs here. Two properties matter on a machine shared with other work:
//
// - Idle workers spin for a short while (WorkerSpin(), 100 us by default) and
//   then sleep on a condition variable, so a quiet engine leaves the cores to
//   other processes instead of burning them between steps.
// - Work is claimed, never assigned: the calling thread and the workers take
//   chunks of the index range from one atomic counter, and the caller runs
//   chunks itself. A worker that the OS has descheduled (a busy machine) or
//   that is still waking up delays nothing: the others take its share. The
//   caller only ever waits for chunks already being run.
//
// Which thread runs an index never changes what fn(i) computes (each index is
// independent), so results do not depend on the thread count or on timing.
//
// Each thread that calls ParallelFor owns its own pool, sized by
// SetNumThreads on that thread (expert-parallel rank threads split the cores
// this way). Calls from inside a parallel loop run serially.
#pragma once

#include <chrono>
#include <cstdint>

namespace mlag::host {

// Threads a parallel loop started on the calling thread uses, the caller
// included. The default is the number of CPUs this process may run on
// (sched_getaffinity), or MLAG_NUM_THREADS when that is set to a positive
// integer.
int NumThreads();

// Sets NumThreads() for loops started on the calling thread; n < 1 restores
// the default. Workers are created on the next parallel loop.
void SetNumThreads(int n);

// How long an idle worker spins, looking for the next loop, before it sleeps.
// Process-wide; takes effect the next time a worker goes idle. Zero makes
// workers sleep at once (what OMP_WAIT_POLICY=passive did for OpenMP).
void SetWorkerSpin(std::chrono::microseconds spin);
std::chrono::microseconds WorkerSpin();

// True on pool workers, and on a thread while it runs a parallel loop.
bool InParallelLoop();

namespace internal {

// Calls invoke(ctx, i) for every i in [0, n), in chunks of `chunk` indices
// claimed by the calling thread and its pool's workers. Returns when all
// have run. Requires n >= 1, chunk >= 1 and NumThreads() > 1.
void RunParallel(int64_t n, int64_t chunk, void (*invoke)(void* ctx, int64_t i), void* ctx);

}  // namespace internal
}  // namespace mlag::host
