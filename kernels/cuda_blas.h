// Per-stream CUDA context for kernels/: cuBLASLt matmuls with a cache of
// chosen algorithms, and a persistent device scratch buffer. Built only when
// CUDA is on (kernels/meson.build); callers guard with MLAG_HAVE_CUDA.
//
// Contexts. Each Stream that runs a CUDA matmul (or asks for scratch) gets
// one context, created lazily on its first eager use: a cublasLt handle, a
// fixed kWorkspaceBytes cuBLASLt workspace, an algorithm cache and the
// scratch buffer. The context is one of the stream's attachments
// (Stream::attachment) and is released with the stream, so it belongs to
// whoever owns the stream (the model runner, for the model's matmuls).
//
// Graph capture. Choosing an algorithm (cublasLtMatmulAlgoGetHeuristic) and
// allocating memory happen only in EAGER launches. During a capture
// (stream.capturing()) a matmul whose shape -- (m, n, k), leading dimensions,
// transposes, batch count and strides, pointer alignments -- has no cached
// algorithm fails with FailedPrecondition naming the shape, and scratch
// cannot grow. The model runner always runs every batch size eagerly (a
// warm-up) before capturing it, with the same buffers, so the captured launches
// find their algorithms and scratch in place.
//
// Sharing. The cuBLASLt workspace and the scratch buffer belong to the
// stream: eager launches on it and graphs captured on it all use them, which
// is safe because they run in stream order. Replay such graphs on the stream
// they were captured on (or strictly ordered with it), never concurrently
// with it.
//
// Numerics: f32 operands, f32 output, CUBLAS_COMPUTE_32F (no TF32), alpha 1,
// beta 0 (the output is write-only: stale contents, even NaN, never leak in).
// A Linear with bf16 weights rounds x to bf16 (in the scratch buffer) and
// multiplies bf16 by bf16 with f32 accumulation and output. One with fp8
// weights quantizes x per row and 128-column block to e4m3 (scratch) and
// multiplies e4m3 by e4m3 with Hopper's block scaling (see LinearFp8).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag::cuda_blas {

// cuBLASLt workspace per context (32 MiB, what cuBLAS recommends for Hopper).
// Fixed for the context's life, so captured matmuls keep a valid pointer.
inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// y = x W^T (see kernels/linear.h), validated by kernels/linear.cc: x and y
// f32 row-major with valid leading dimensions, W [out, in] contiguous in f32
// or bf16, all sizes within int.
absl::Status Linear(Stream& stream, const Tensor& x, const Tensor& weight, const Tensor& y);

// y = x W^T with W in e4m3 and per-row 128-column block scales (a
// LinearWeight, validated by kernels/linear.cc): x is quantized per row and
// 128-column block into the stream's scratch first, then multiplied by
// cuBLASLt's block-scaled FP8 matmul (W's `block_scales` as BLK128x128, x's
// as VEC128) where the weight has block scales (LinearWeight), in is a
// multiple of 16 and the library has an algorithm for it (sm_90); else by
// the tensor-core GEMM of kernels/cuda/fp8_gemm.cuh with the per-row
// `scales`. Both accumulate each 128-wide K block in f32 and add the scaled
// blocks in f32. `block_scales` may be an unset Tensor. FailedPrecondition
// where Fp8GemmSupported is false.
absl::Status LinearFp8(Stream& stream, const Tensor& x, const Tensor& weight, const Tensor& scales,
                       const Tensor& block_scales, const Tensor& y);

// Whether CUDA device `device` runs LinearFp8 (sm_89 or later, and this
// build has code for it).
absl::StatusOr<bool> Fp8GemmSupported(int device);

// Strided-batched matmul over heads (see kernels/linear.h), validated by
// kernels/linear.cc. One cublasLtMatmul with batch count H.
absl::Status HeadMatmul(Stream& stream, const Tensor& x, const Tensor& weight, bool transpose_w,
                        const Tensor& out);

// The multiply-add rate of one square matmul (n x n x n, A and B in `ab`,
// kF32, kBF16 or kF8E4M3, f32 output) through the cuBLASLt path Linear
// takes, in FLOP/s: the median of `reps` event-timed launches after one
// untimed. The ceiling `mlag bench --profile` holds each node of that dtype
// against: the tensor cores' for bf16 and e4m3 (LinearFp8's block-scaled
// form; Unimplemented where cuBLASLt has none, sm_90 only), the FMA units'
// for f32 (Linear's f32 matmuls use no TF32). Eager only; allocates 2 n^2
// elements of `ab`, n^2 f32 and, for e4m3, the scales.
absl::StatusOr<double> MeasureMatmulFlops(Stream& stream, DType ab, int64_t n, int reps);

// A device buffer of at least `bytes` that persists with the stream's
// context, for kernels whose scratch the caller did not provide (MoeExperts).
// Launches on one stream run in order, so every user of the stream shares it.
// It grows only in eager mode (geometrically); the buffer it replaces is kept
// alive until the context is released, because graphs captured earlier still
// point into it. During a capture a request larger than the current buffer
// fails with FailedPrecondition naming `user` and the sizes. `bytes` == 0
// gives nullptr.
absl::StatusOr<void*> Scratch(Stream& stream, size_t bytes, absl::string_view user);

// Algorithms cached for `stream` (0 without a context), for tests.
size_t CachedAlgorithmCount(const Stream& stream);

// LinearFp8 calls on `stream` that went to cuBLASLt (0 without a context),
// for tests: that a case meant for that path took it.
size_t CublasLtFp8Matmuls(const Stream& stream);

}  // namespace mlag::cuda_blas
