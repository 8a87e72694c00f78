// The choice of CUDA decode attention kernel, shared by kernels/mla_attention.h
// and the CUDA launchers (kernels/cuda/mla_attention.cuh). Standard library
// only, so .cu files include it.
#pragma once

namespace mlag {

// The CUDA decode attention kernel (the host has one kernel and ignores this).
//   kAuto         kTensorCore where it applies, else kF32.
//   kF32          f32 FMA on the CUDA cores; any cache dtype, Rkv <= 512 and
//                 Rkv + dr <= 576; the reference the others are tested against.
//   kTensorCore   bf16 tensor cores (compute capability >= 8.0), bf16 cache
//                 only, (Rkv + dr) % 16 == 0, Rkv % 8 == 0. Cache rows are used
//                 as stored; q is carried as two bf16 parts (hi + lo, 16
//                 significant bits); the probabilities are rounded to bf16
//                 (relative error <= 2^-9 per weight, the softmax sum taken
//                 over the rounded weights); f32 accumulation.
//   kTensorCoreBf16Q  as kTensorCore with q rounded to bf16 once: half the
//                 score products, scores accurate to about 3 significant digits.
enum class MlaDecodeKernel : int { kAuto, kF32, kTensorCore, kTensorCoreBf16Q };

}  // namespace mlag
