// Compiling a stretch of a file for a wider x86 ISA than the baseline, so
// that one binary carries a copy of a kernel per ISA and picks one at run
// time (kernels/host/gemm.cc, attention_softmax.cc):
//
//   MLAG_HOST_TARGET_BEGIN("avx2,fma")
//   namespace avx2 { ... }
//   MLAG_HOST_TARGET_END
//
// GCC: push_options and a target pragma; clang: a target attribute pushed
// onto every function. Only for x86 (the caller guards the stretch).
#pragma once

#define MLAG_HOST_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define MLAG_HOST_TARGET_BEGIN(isa) \
  MLAG_HOST_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define MLAG_HOST_TARGET_END MLAG_HOST_PRAGMA(clang attribute pop)
#else
#define MLAG_HOST_TARGET_BEGIN(isa) \
  MLAG_HOST_PRAGMA(GCC push_options) MLAG_HOST_PRAGMA(GCC target(isa))
#define MLAG_HOST_TARGET_END MLAG_HOST_PRAGMA(GCC pop_options)
#endif
