#include "kernels/host/embedding.h"

#include <algorithm>
#include <cstring>

#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {
constexpr int64_t kChunkElems = 1 << 14;  // elements per parallel work item
}

void GatherRows(const Tensor& indices, const Tensor& table, const Tensor& out) {
  const int64_t num_rows = out.size(0);
  const int64_t dim = out.size(1);
  const int64_t table_rows = table.size(0);
  if (num_rows == 0 || dim == 0) return;

  const DType table_dtype = table.dtype();
  const DType out_dtype = out.dtype();
  const size_t table_esize = DTypeSize(table_dtype);
  const size_t out_esize = DTypeSize(out_dtype);
  const char* table_base = static_cast<const char*>(table.data());
  char* out_base = static_cast<char*>(out.data());
  const bool is_i32 = indices.dtype() == DType::kI32;
  const int64_t index_stride = indices.stride(0);

  const int64_t rows_per_item = std::max<int64_t>(1, kChunkElems / dim);
  const int64_t items = (num_rows + rows_per_item - 1) / rows_per_item;
  ParallelFor(items, [&](int64_t item) {
    const int64_t end = std::min(num_rows, (item + 1) * rows_per_item);
    for (int64_t t = item * rows_per_item; t < end; ++t) {
      const int64_t id = is_i32 ? indices.data_as<const int32_t>()[t * index_stride]
                                : indices.data_as<const int64_t>()[t * index_stride];
      char* dst = out_base + t * out.stride(0) * static_cast<int64_t>(out_esize);
      if (id < 0 || id >= table_rows) {
        // All-zero bits are +0.0 in f32, bf16 and f16 alike.
        std::memset(dst, 0, static_cast<size_t>(dim) * out_esize);
        continue;
      }
      const char* src = table_base + id * table.stride(0) * static_cast<int64_t>(table_esize);
      if (table_dtype == out_dtype) {
        std::memcpy(dst, src, static_cast<size_t>(dim) * out_esize);
      } else {
        for (int64_t i = 0; i < dim; ++i) {
          StoreFromF32(out_dtype, dst, i, LoadAsF32(table_dtype, src, i));
        }
      }
    }
  });
}

}  // namespace mlag::host
