// Linear layers: y = x W^T, and the per-head matmuls of MLA weight absorption.
#pragma once

#include "absl/status/status.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// y[t, :] = W x[t, :]  (y = x W^T), no bias.
//   x: f32 [T, in], row-major (rows may be strided);
//   weight: [out, in] contiguous — f32 on the host (bf16/f16 checkpoints are
//     converted once at load, never per call);
//   y: f32 [T, out], row-major (rows may be strided).
// Host: T == 1 runs as a matrix-vector product (sgemv), larger T as sgemm.
// CUDA: one cuBLASLt matmul (f32, f32 accumulation). Its algorithm is chosen
// on the shape's first EAGER launch on the stream and cached; capturing a
// shape that never ran eagerly on the stream fails with FailedPrecondition
// (see kernels/cuda_blas.h). A launch of kind gemm.
absl::Status Linear(Stream& stream, const Tensor& x, const Tensor& weight, const Tensor& y);

// Batched per-head matmul for MLA weight absorption. For every token t and
// head h:
//   transpose_w == false:  out[t,h,:] = x[t,h,:] @ W[h]       W: [H, K, N]
//   transpose_w == true:   out[t,h,:] = W[h] @ x[t,h,:]       W: [H, N, K]
//   x: f32 [T, H, K] (last dim unit-stride, other strides free);
//   weight: f32 contiguous as above; out: f32 [T, H, N] (last dim unit-stride).
// q_nope [T,H,dn] -> q_latent [T,H,Rkv] uses W_UK [H, dn, Rkv] untransposed;
// latent output [T,H,Rkv] -> v [T,H,dv] uses W_UV [H, dv, Rkv] transposed.
// CUDA: one strided-batched cuBLASLt matmul over the heads, with the same
// warm-up-before-capture rule as Linear.
absl::Status HeadMatmul(Stream& stream, const Tensor& x, const Tensor& weight, bool transpose_w,
                        const Tensor& out);

}  // namespace mlag
