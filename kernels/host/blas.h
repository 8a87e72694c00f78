// OpenBLAS in a process whose host kernels parallelise with OpenMP.
//
// Two thread pools on the same cores fight: OpenMP workers spin-wait while
// OpenBLAS's pthreads compute, and the reverse. So BLAS runs single-threaded
// and the host kernels split every BLAS call over the OpenMP pool themselves
// (output columns for Linear, heads for HeadMatmul, experts for MoeExperts).
// Splitting an output dimension never changes the order of a dot product, so
// results do not depend on the thread count.
#pragma once

namespace mlag::host {

// Makes OpenBLAS single-threaded, once per process. Cheap to call per launch.
void UseSerialBlas();

}  // namespace mlag::host
