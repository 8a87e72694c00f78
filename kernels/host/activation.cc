#include "kernels/host/activation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

constexpr int64_t kChunkElems = 1 << 14;  // output elements per parallel work item

// silu(z) = z * sigmoid(z), written as z / (1 + e^-z): for very negative z,
// e^-z overflows to +inf and the result is -0 rather than NaN.
inline float Silu(float z) { return z / (1.0f + std::exp(-z)); }

}  // namespace

void SiluAndMul(const Tensor& gate_up, const Tensor& out) {
  const int64_t rows = out.size(0);
  const int64_t inter = out.size(1);
  if (rows == 0 || inter == 0) return;
  const DType in_dtype = gate_up.dtype();
  const DType out_dtype = out.dtype();
  const int64_t in_esize = static_cast<int64_t>(DTypeSize(in_dtype));
  const int64_t out_esize = static_cast<int64_t>(DTypeSize(out_dtype));

  const int64_t rows_per_item = std::max<int64_t>(1, kChunkElems / inter);
  const int64_t items = (rows + rows_per_item - 1) / rows_per_item;
  ParallelFor(items, [&](int64_t item) {
    // [0, 2I) the f32 gate_up row when it is not f32, [2I, 3I) the output row
    // when out is not f32.
    std::vector<float> scratch;
    if (in_dtype != DType::kF32 || out_dtype != DType::kF32) {
      scratch.resize(static_cast<size_t>(3 * inter));
    }
    const int64_t end = std::min(rows, (item + 1) * rows_per_item);
    for (int64_t r = item * rows_per_item; r < end; ++r) {
      const void* in_row =
          static_cast<const char*>(gate_up.data()) + r * gate_up.stride(0) * in_esize;
      void* out_row = static_cast<char*>(out.data()) + r * out.stride(0) * out_esize;
      const float* in = static_cast<const float*>(in_row);
      if (in_dtype != DType::kF32) {
        ConvertToF32(in_dtype, in_row, scratch.data(), static_cast<size_t>(2 * inter));
        in = scratch.data();
      }
      const float* gate = in;
      const float* up = in + inter;
      float* dst =
          out_dtype == DType::kF32 ? static_cast<float*>(out_row) : scratch.data() + 2 * inter;
      for (int64_t i = 0; i < inter; ++i) dst[i] = Silu(gate[i]) * up[i];
      if (out_dtype != DType::kF32) {
        ConvertFromF32(dst, out_dtype, out_row, static_cast<size_t>(inter));
      }
    }
  });
}

}  // namespace mlag::host
