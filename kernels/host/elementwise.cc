#include "kernels/host/elementwise.h"

#include <cstring>

#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {
constexpr int64_t kChunk = 1 << 14;  // elements per parallel work item
}

void Fill(const Tensor& t, double value) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kI32: {
      int32_t v = static_cast<int32_t>(value);
      int32_t* p = t.data_as<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::kI64: {
      int64_t v = static_cast<int64_t>(value);
      int64_t* p = t.data_as<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::kU8:
      std::memset(t.data(), static_cast<int>(value), n);
      return;
    default: {
      float v = static_cast<float>(value);
      ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t c) {
        int64_t end = std::min(n, (c + 1) * kChunk);
        for (int64_t i = c * kChunk; i < end; ++i) StoreFromF32(t.dtype(), t.data(), i, v);
      });
    }
  }
}

void Scale(const Tensor& x, float alpha, const Tensor& y) {
  const int64_t n = x.numel();
  ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t c) {
    int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) {
      StoreFromF32(y.dtype(), y.data(), i, alpha * LoadAsF32(x.dtype(), x.data(), i));
    }
  });
}

void Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = a.numel();
  ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t c) {
    int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) {
      float v = LoadAsF32(a.dtype(), a.data(), i) + LoadAsF32(b.dtype(), b.data(), i);
      StoreFromF32(out.dtype(), out.data(), i, v);
    }
  });
}

void Copy2D(const Tensor& src, const Tensor& dst) {
  const size_t esize = DTypeSize(src.dtype());
  if (src.ndim() <= 1) {
    std::memmove(dst.data(), src.data(), src.numel() * esize);
    return;
  }
  const int64_t rows = src.size(0);
  const size_t row_bytes = static_cast<size_t>(src.size(1)) * esize;
  for (int64_t r = 0; r < rows; ++r) {
    std::memmove(static_cast<char*>(dst.data()) + r * dst.stride(0) * esize,
                 static_cast<const char*>(src.data()) + r * src.stride(0) * esize, row_bytes);
  }
}

}  // namespace mlag::host
