// OpenBLAS in a process whose host kernels parallelise on their own pool
// (kernels/host/thread_pool.h).
//
// Two thread pools on the same cores fight: one's workers spin while the
// other's compute, and the reverse. So BLAS runs single-threaded and the host
// kernels split every BLAS call over the host pool themselves
// (output columns for Linear, heads for HeadMatmul, experts for MoeExperts).
// Splitting an output dimension never changes the order of a dot product, so
// results do not depend on the thread count.
#pragma once

namespace mlag::host {

// Makes OpenBLAS single-threaded, once per process. Cheap to call per launch.
void UseSerialBlas();

}  // namespace mlag::host
