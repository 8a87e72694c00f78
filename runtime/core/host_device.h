// MLAG_HD: marks a function as callable from host code and from CUDA device
// code (__host__ __device__ under nvcc, plain inline elsewhere).
//
// Headers that use it hold per-element math both backends share (dtype
// conversion here in runtime/core/scalar_types.h; rope, softmax merging,
// routing comparisons and sampling in kernels/common/). They include only the
// C++ standard library, so nvcc and g++ both compile them and the host tests
// cover the exact arithmetic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define MLAG_HD __host__ __device__ __forceinline__
#else
#define MLAG_HD inline
#endif
