// Portability macro for math shared by host kernels and CUDA kernels.
//
// Headers under kernels/common/ hold per-element math that both backends use
// (dtype conversion, rope, softmax merging, routing comparisons). They include
// only the C++ standard library, so nvcc and g++ both compile them and the host
// tests cover the exact arithmetic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define MLAG_HD __host__ __device__ __forceinline__
#else
#define MLAG_HD inline
#endif
