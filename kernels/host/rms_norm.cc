#include "kernels/host/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

constexpr int64_t kChunkElems = 1 << 14;  // elements per parallel work item

void* RowPtr(const Tensor& t, int64_t row) {
  return static_cast<char*>(t.data()) +
         row * t.stride(0) * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// Row `row` of `t` as f32: the row itself when `t` is f32, else converted into
// `scratch` (dim floats).
const float* RowAsF32(const Tensor& t, int64_t row, int64_t dim, float* scratch) {
  void* p = RowPtr(t, row);
  if (t.dtype() == DType::kF32) return static_cast<const float*>(p);
  ConvertToF32(t.dtype(), p, scratch, static_cast<size_t>(dim));
  return scratch;
}

// `v` rounded to the precision of `dtype` (f32 passes through).
inline float RoundTo(DType dtype, float v) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(v));
    case DType::kF16:
      return F16ToF32(F32ToF16(v));
    default:
      return v;
  }
}

// The weight as f32: its own storage when f32, else converted into `storage`.
const float* WeightAsF32(const Tensor& weight, std::vector<float>* storage) {
  if (weight.dtype() == DType::kF32) return weight.data_as<const float>();
  storage->resize(static_cast<size_t>(weight.size(0)));
  ConvertToF32(weight.dtype(), weight.data(), storage->data(), storage->size());
  return storage->data();
}

// Writes y_row = w * round_to(norm_dtype, v * rsqrt(mean(v^2) + eps)).
// `v` may alias y_row (when both are f32): element i is read before it is
// written. `scratch` holds dim floats and must not alias `v`.
void NormalizeRow(const float* v, int64_t dim, DType norm_dtype, const float* w, float eps,
                  DType y_dtype, void* y_row, float* scratch) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(v[i]) * v[i];
  const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(dim));
  const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
  float* dst = y_dtype == DType::kF32 ? static_cast<float*>(y_row) : scratch;
  if (norm_dtype == DType::kF32) {
    for (int64_t i = 0; i < dim; ++i) dst[i] = w[i] * (v[i] * inv_rms);
  } else {
    for (int64_t i = 0; i < dim; ++i) dst[i] = w[i] * RoundTo(norm_dtype, v[i] * inv_rms);
  }
  if (y_dtype != DType::kF32) ConvertFromF32(scratch, y_dtype, y_row, static_cast<size_t>(dim));
}

// Runs fn(row, scratch) over all rows, in parallel chunks of rows; each chunk
// gets its own scratch of `scratch_floats` floats.
template <typename Fn>
void ForEachRow(int64_t rows, int64_t dim, int64_t scratch_floats, Fn&& fn) {
  const int64_t rows_per_item = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(dim, 1));
  const int64_t items = (rows + rows_per_item - 1) / rows_per_item;
  ParallelFor(items, [&](int64_t item) {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats));
    const int64_t end = std::min(rows, (item + 1) * rows_per_item);
    for (int64_t r = item * rows_per_item; r < end; ++r) fn(r, scratch.data());
  });
}

}  // namespace

void RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t dim = x.size(1);
  if (rows == 0 || dim == 0) return;
  std::vector<float> w_storage;
  const float* w = WeightAsF32(weight, &w_storage);
  ForEachRow(rows, dim, 2 * dim, [&](int64_t r, float* scratch) {
    const float* v = RowAsF32(x, r, dim, scratch);
    NormalizeRow(v, dim, x.dtype(), w, eps, y.dtype(), RowPtr(y, r), scratch + dim);
  });
}

void AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t dim = x.size(1);
  if (rows == 0 || dim == 0) return;
  std::vector<float> w_storage;
  const float* w = WeightAsF32(weight, &w_storage);
  const DType res_dtype = residual.dtype();
  // scratch: [0, dim) x row, [dim, 2 dim) residual row, [2 dim, 3 dim) the
  // sum, [3 dim, 4 dim) the output row.
  ForEachRow(rows, dim, 4 * dim, [&](int64_t r, float* scratch) {
    const float* xv = RowAsF32(x, r, dim, scratch);
    const float* rv = RowAsF32(residual, r, dim, scratch + dim);
    float* sum = scratch + 2 * dim;
    for (int64_t i = 0; i < dim; ++i) sum[i] = RoundTo(res_dtype, rv[i] + xv[i]);
    // The row of x is fully read before y (which may alias x) is written.
    ConvertFromF32(sum, res_dtype, RowPtr(residual, r), static_cast<size_t>(dim));
    NormalizeRow(sum, dim, res_dtype, w, eps, y.dtype(), RowPtr(y, r), scratch + 3 * dim);
  });
}

}  // namespace mlag::host
