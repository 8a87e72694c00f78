#include "kernels/linear.h"

#include <array>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/check.h"
#include "kernels/host/linear.h"
#include "mlag_config.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include "kernels/cuda_blas.h"
#endif

namespace mlag {
namespace {

// Per-head weights are f32 (small; kept at full precision at load).
absl::Status CheckWeightF32(const Tensor& weight) {
  if (weight.dtype() == DType::kF32) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("weight: dtype ", DTypeName(weight.dtype()),
                   ", expected f32 (weights are converted at load, never per call)"));
}

// BLAS takes sizes and leading dimensions as int.
absl::Status CheckBlasInt(int64_t v, absl::string_view arg, absl::string_view what) {
  if (v >= 0 && v <= std::numeric_limits<int>::max()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(arg, ": ", what, " ", v, " is outside BLAS's int range"));
}

// With more than one row, the row stride is a BLAS leading dimension: it must
// be at least the row length (rows may be padded, never overlapping).
absl::Status CheckLeadingDim(const Tensor& t, absl::string_view arg, int64_t row_len) {
  if (t.size(0) <= 1) return absl::OkStatus();
  if (t.stride(0) < row_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(arg, ": row stride ", t.stride(0), " is less than the row length ", row_len));
  }
  return CheckBlasInt(t.stride(0), arg, "row stride");
}

// No two elements of the (unit-stride last dim) view `t` share an address:
// with the dimensions of size > 1 sorted by stride, each stride reaches past
// everything the smaller ones span. Outputs written by several heads in
// parallel need this.
absl::Status CheckNoSelfOverlap(const Tensor& t, absl::string_view arg) {
  std::array<std::pair<int64_t, int64_t>, kMaxDims> dims{};  // (stride, size)
  int n = 0;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.size(d) > 1) dims[n++] = {t.stride(d), t.size(d)};
  }
  // Insertion sort: at most kMaxDims entries (std::sort here trips a bogus
  // -Warray-bounds in GCC 12).
  for (int i = 1; i < n; ++i) {
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t span = 1;  // elements covered by the dimensions seen so far
  for (int i = 0; i < n; ++i) {
    if (dims[i].first < span) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg, ": strides [", absl::StrJoin(t.strides(), ", "), "] for shape ",
                       t.ShapeString(), " make elements overlap"));
    }
    span = dims[i].first * (dims[i].second - 1) + span;
  }
  return absl::OkStatus();
}

}  // namespace

LinearWeight LinearWeight::Select(int64_t i) const {
  LinearWeight w(values.Select(0, i), has_scales() ? scales.Select(0, i) : Tensor());
  w.host_row_groups = host_row_groups;
  return w;
}

LinearWeight LinearWeight::SliceRows(int64_t r0, int64_t r1) const {
  const int d = values.ndim() - 2;
  LinearWeight w(values.Slice(d, r0, r1), has_scales() ? scales.Slice(d, r0, r1) : Tensor());
  w.host_row_groups = host_row_groups;
  // Block scales cover whole 128-row blocks: only a slice on their bounds
  // keeps them.
  const int64_t out = values.size(d);
  if (has_block_scales() && r0 % kFp8BlockSize == 0 && (r1 % kFp8BlockSize == 0 || r1 == out)) {
    w.block_scales = block_scales.Slice(0, r0 / kFp8BlockSize, Fp8Blocks(r1));
  }
  return w;
}

absl::Status CheckLinearWeight(const Stream& stream, const LinearWeight& weight,
                               absl::string_view arg, std::initializer_list<int64_t> shape,
                               bool cuda_fp8) {
  const Tensor& v = weight.values;
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, v, arg));
  MLAG_RETURN_IF_ERROR(CheckShape(v, arg, shape));
  MLAG_RETURN_IF_ERROR(CheckContiguous(v, arg));
  if (weight.host_row_groups && stream.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(arg, ": packed in the host GEMM's row groups; CUDA reads row-major weights"));
  }
  if (stream.is_cuda() && !cuda_fp8) return CheckDType(v, arg, {DType::kF32, DType::kBF16});
  MLAG_RETURN_IF_ERROR(CheckDType(v, arg, {DType::kF32, DType::kBF16, DType::kF8E4M3}));
  if (v.dtype() != DType::kF8E4M3) return absl::OkStatus();
  const std::string scales_arg = absl::StrCat(arg, ".scales");
  std::vector<int64_t> scale_shape(v.shape().begin(), v.shape().end());
  scale_shape.back() = Fp8Blocks(scale_shape.back());
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, weight.scales, scales_arg));
  MLAG_RETURN_IF_ERROR(CheckDType(weight.scales, scales_arg, {DType::kF32}));
  if (weight.scales.shape() != absl::Span<const int64_t>(scale_shape)) {
    return absl::InvalidArgumentError(absl::StrCat(scales_arg, ": shape ",
                                                   weight.scales.ShapeString(), ", expected [",
                                                   absl::StrJoin(scale_shape, ", "), "]"));
  }
  MLAG_RETURN_IF_ERROR(CheckContiguous(weight.scales, scales_arg));
  if (!weight.has_block_scales()) return absl::OkStatus();
  const std::string block_arg = absl::StrCat(arg, ".block_scales");
  if (v.ndim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(block_arg, ": set on ", v.ShapeString(),
                                                   "; only [out, in] matrices have them"));
  }
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, weight.block_scales, block_arg));
  MLAG_RETURN_IF_ERROR(CheckDType(weight.block_scales, block_arg, {DType::kF32}));
  MLAG_RETURN_IF_ERROR(
      CheckShape(weight.block_scales, block_arg, {Fp8Blocks(v.size(0)), BlockScaleLd(v.size(1))}));
  return CheckContiguous(weight.block_scales, block_arg);
}

absl::Status PackForLinear(const Device& device, LinearWeight& w) {
  if (device.is_cuda()) return absl::OkStatus();
  const Tensor& v = w.values;
  if (v.ndim() < 2 || !v.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackForLinear: values ", v.ShapeString(), " are not contiguous matrices"));
  }
  const int64_t out = v.size(v.ndim() - 2), in = v.size(v.ndim() - 1);
  const int64_t matrices = out * in == 0 ? 0 : v.numel() / (out * in);
  const size_t matrix_bytes = static_cast<size_t>(out * in) * DTypeSize(v.dtype());
  for (int64_t m = 0; m < matrices; ++m) {
    host::PackGemmRowGroups(static_cast<char*>(v.data()) + m * matrix_bytes, v.dtype(), out, in);
  }
  w.host_row_groups = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> Fp8LinearSupported(const Device& device) {
  if (!device.is_cuda()) return true;
#if MLAG_HAVE_CUDA
  return cuda_blas::Fp8GemmSupported(device.index());
#else
  return false;
#endif
}

absl::Status Linear(Stream& stream, const Tensor& x, const LinearWeight& weight, const Tensor& y) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, y, "y"));
  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckDType(y, "y", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(x, "x", {-1, -1}));
  MLAG_RETURN_IF_ERROR(
      CheckLinearWeight(stream, weight, "weight", {-1, x.size(1)}, /*cuda_fp8=*/true));
  MLAG_RETURN_IF_ERROR(CheckShape(y, "y", {x.size(0), weight.values.size(0)}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(x, "x"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(y, "y"));
  MLAG_RETURN_IF_ERROR(CheckLeadingDim(x, "x", x.size(1)));
  MLAG_RETURN_IF_ERROR(CheckLeadingDim(y, "y", y.size(1)));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(x.size(0), "x", "rows"));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(x.size(1), "x", "row length"));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(weight.values.size(0), "weight", "rows"));
  if (y.data() == x.data() && y.numel() > 0) {
    return absl::InvalidArgumentError("y: must not alias x (cannot work in place)");
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    // cuBLASLt, or the FP8 block-scaled GEMM; see kernels/cuda_blas.h for
    // the warm-up-before-capture rule.
    if (weight.values.dtype() == DType::kF8E4M3) {
      return cuda_blas::LinearFp8(stream, x, weight.values, weight.scales, weight.block_scales, y);
    }
    return cuda_blas::Linear(stream, x, weight.values, y);
#endif
  }
  return stream.LaunchHost("linear", OpKind::kGemm, [x, weight, y] {
    host::Linear(x, weight, y);
    return absl::OkStatus();
  });
}

absl::Status HeadMatmul(Stream& stream, const Tensor& x, const LinearWeight& w, bool transpose_w,
                        const Tensor& out) {
  const Tensor& weight = w.values;
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, x, "x"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, weight, "weight"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out, "out"));
  MLAG_RETURN_IF_ERROR(CheckDType(x, "x", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckWeightF32(weight));
  MLAG_RETURN_IF_ERROR(CheckDType(out, "out", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(x, "x", {-1, -1, -1}));
  if (w.host_row_groups && (stream.is_cuda() || !transpose_w)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight: packed in the host GEMM's row groups; ",
        stream.is_cuda() ? "CUDA reads row-major weights" : "only transpose_w reads them"));
  }
  const int64_t heads = x.size(1);
  const int64_t k = x.size(2);
  if (transpose_w) {
    MLAG_RETURN_IF_ERROR(CheckShape(weight, "weight", {heads, -1, k}));
  } else {
    MLAG_RETURN_IF_ERROR(CheckShape(weight, "weight", {heads, k, -1}));
  }
  const int64_t n = transpose_w ? weight.size(1) : weight.size(2);
  MLAG_RETURN_IF_ERROR(CheckShape(out, "out", {x.size(0), heads, n}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(weight, "weight"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(x, "x"));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(out, "out"));
  MLAG_RETURN_IF_ERROR(CheckLeadingDim(x, "x", k));
  MLAG_RETURN_IF_ERROR(CheckLeadingDim(out, "out", n));
  MLAG_RETURN_IF_ERROR(CheckNoSelfOverlap(out, "out"));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(x.size(0), "x", "rows"));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(k, "x", "head dimension"));
  MLAG_RETURN_IF_ERROR(CheckBlasInt(n, "out", "head dimension"));
  if (out.data() == x.data() && out.numel() > 0) {
    return absl::InvalidArgumentError("out: must not alias x (BLAS cannot work in place)");
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return cuda_blas::HeadMatmul(stream, x, weight, transpose_w, out);
#endif
  }
  return stream.LaunchHost("head_matmul", OpKind::kGemm, [x, w, transpose_w, out] {
    host::HeadMatmul(x, w, transpose_w, out);
    return absl::OkStatus();
  });
}

}  // namespace mlag
