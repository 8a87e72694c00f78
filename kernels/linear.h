// Linear layers: y = x W^T, and the per-head matmuls of MLA weight absorption.
#pragma once

#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {

// A projection's weights: `values` [.., out, in] contiguous, in
//   - f32;
//   - bf16;
//   - fp8 (e4m3): then `scales` is f32 [.., out, Fp8Blocks(in)] contiguous,
//     one scale per (row, 128-column block), and the weight is
//     Fp8Dequantize(value, scale) (runtime/core/fp8_blocks.h).
// A Tensor converts to an f32 or bf16 LinearWeight.
//
// On the host, `values` may instead hold each [out, in] matrix in the host
// GEMM's packed row groups (host_row_groups; kernels/host/gemm.h): the same
// bytes, rearranged so that the GEMM reads one stream. The host backend's
// model weights are packed once loaded (WeightArena::PackForHost).
struct LinearWeight {
  LinearWeight() = default;
  LinearWeight(Tensor v) : values(std::move(v)) {}  // NOLINT: implicit on purpose
  LinearWeight(Tensor v, Tensor s) : values(std::move(v)), scales(std::move(s)) {}

  DType dtype() const { return values.dtype(); }
  // Whether scales are set (fp8). A default Tensor is 0-d, so numel() == 1.
  bool has_scales() const { return scales.data() != nullptr; }
  // Bytes of values and scales.
  size_t nbytes() const { return values.nbytes() + (has_scales() ? scales.nbytes() : 0); }
  // Entry `i` of the leading dimension (one expert of a stacked set).
  LinearWeight Select(int64_t i) const;
  // Output rows [r0, r1) (the second-to-last dimension). Of packed weights:
  // r0 a multiple of kGemmGroupRows, and r1 too unless it is `out`.
  LinearWeight SliceRows(int64_t r0, int64_t r1) const;

  // Whether block_scales are set.
  bool has_block_scales() const { return block_scales.data() != nullptr; }

  Tensor values;
  Tensor scales;
  // Optional, fp8 [out, in] matrices on CUDA: the same scales once per
  // 128 x 128 block, f32 [Fp8Blocks(out), BlockScaleLd(in)] (the K blocks
  // padded to a multiple of 4 with zeros): cuBLASLt's BLK128x128 layout.
  // Set by the loader from a checkpoint's block scales, so each 128-row
  // block of `scales` repeats its row here; Linear then multiplies through
  // cuBLASLt's block-scaled FP8 where the GPU has it (kernels/cuda_blas.h).
  Tensor block_scales;
  bool host_row_groups = false;  // values packed in the host GEMM's row groups
};

// Leading dimension of LinearWeight::block_scales for `in` columns.
inline int64_t BlockScaleLd(int64_t in) { return (Fp8Blocks(in) + 3) / 4 * 4; }

// Validates `weight` as argument `arg` with values of shape `shape` (-1: any):
// dtype, contiguity and, for fp8, the scales' dtype and shape. CUDA takes f32
// and bf16 weights, and fp8 where the op has an fp8 path (`cuda_fp8`: Linear,
// MoeExperts).
absl::Status CheckLinearWeight(const Stream& stream, const LinearWeight& weight,
                               absl::string_view arg, std::initializer_list<int64_t> shape,
                               bool cuda_fp8 = false);

// Puts a loaded projection in the layout `device`'s Linear reads fastest.
// On the host: packs each [out, in] matrix of `w` in place in the GEMM's row
// groups (whose values must be row-major now, whatever host_row_groups says)
// and sets host_row_groups. On CUDA: nothing.
absl::Status PackForLinear(const Device& device, LinearWeight& w);

// Whether Linear takes fp8 weights on `device`: always on the host; on CUDA
// from sm_89 on, in a build with code for it. Elsewhere the loader
// dequantizes fp8 checkpoints to bf16 (the fallback).
absl::StatusOr<bool> Fp8LinearSupported(const Device& device);

// y[t, :] = W x[t, :]  (y = x W^T), no bias.
//   x: f32 [T, in], row-major (rows may be strided);
//   weight: [out, in], a LinearWeight (f32, bf16 or fp8 on the host);
//   y: f32 [T, out], row-major (rows may be strided).
// Host: kernels/host/gemm.h, weights converted in registers; every output
// element is summed in one order whatever T (batch-invariant).
// CUDA: one cuBLASLt matmul with f32 accumulation: f32 x f32, or for bf16
// weights x rounded to bf16 times bf16; for fp8 weights (sm_89+,
// Fp8LinearSupported) x quantized per row and 128-column block to e4m3 and
// the FP8 block-scaled GEMM of kernels/cuda/fp8_gemm.cuh. Its algorithm is chosen
// on the shape's first EAGER launch on the stream and cached; capturing a
// shape that never ran eagerly on the stream fails with FailedPrecondition
// (see kernels/cuda_blas.h). A launch of kind gemm.
absl::Status Linear(Stream& stream, const Tensor& x, const LinearWeight& weight, const Tensor& y);

// Batched per-head matmul for MLA weight absorption. For every token t and
// head h:
//   transpose_w == false:  out[t,h,:] = x[t,h,:] @ W[h]       W: [H, K, N]
//   transpose_w == true:   out[t,h,:] = W[h] @ x[t,h,:]       W: [H, N, K]
//   x: f32 [T, H, K] (last dim unit-stride, other strides free);
//   weight: f32 contiguous as above; out: f32 [T, H, N] (last dim unit-stride).
// q_nope [T,H,dn] -> q_latent [T,H,Rkv] uses W_UK [H, dn, Rkv] untransposed;
// latent output [T,H,Rkv] -> v [T,H,dv] uses W_UV [H, dv, Rkv] transposed.
// Host: transpose_w runs GemmNT per head (batch-invariant, the layout the
// model uses; the model's W is packed per head, PackForLinear); the other
// layout runs sgemm per head and takes row-major W only.
// CUDA: one strided-batched cuBLASLt matmul over the heads, with the same
// warm-up-before-capture rule as Linear.
absl::Status HeadMatmul(Stream& stream, const Tensor& x, const LinearWeight& weight,
                        bool transpose_w, const Tensor& out);

}  // namespace mlag
