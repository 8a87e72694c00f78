#include "kernels/host/linear.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kernels/host/blas.h"
#include "kernels/host/parallel.h"
#include "kernels/host/small_gemm.h"

namespace mlag::host {
namespace {

// Output columns per parallel work item of Linear: a multiple of the sgemm
// micro-kernel width, large enough that each item streams a good slab of W.
constexpr int64_t kLinearColumnChunk = 64;
// Up to this many rows, HeadMatmul uses matrix-vector products (Linear:
// one row; then SmallRowsGemmNT up to kSmallGemmMaxRows).
constexpr int64_t kSmallRowsGemv = 2;
// Below this many multiply-adds a Linear runs on one thread.
constexpr double kLinearSerialWork = 1 << 16;

// Sizes were checked to fit BLAS's int by the caller.
int BlasInt(int64_t v) { return static_cast<int>(v); }

// Zeros the [rows, cols] row-major view at `p` with row stride `ld`.
void ZeroRows(float* p, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::memset(p + r * ld, 0, cols * sizeof(float));
}

}  // namespace

void Linear(const Tensor& x, const Tensor& weight, const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t in = x.size(1);
  const int64_t out = weight.size(0);
  if (rows == 0 || out == 0) return;
  float* y_data = y.data_as<float>();
  if (in == 0) {  // an empty sum; BLAS is not asked about k == 0
    ZeroRows(y_data, rows, out, y.stride(0));
    return;
  }
  const float* x_data = x.data_as<const float>();
  const float* w = weight.data_as<const float>();
  // beta == 0: BLAS defines y as write-only then, so stale contents (even
  // NaN) never leak into the result; the NaN-poisoned tests hold it to that.
  UseSerialBlas();
  // Columns [c0, c0 + n) of y from rows [c0, c0 + n) of W.
  auto columns = [&](int64_t c0, int64_t n) {
    const float* w_rows = w + c0 * in;
    if (rows == 1) {
      // One row: a matrix-vector product streams W once (sgemm would first
      // pack all of W, tripling the memory traffic of a decode step).
      cblas_sgemv(CblasRowMajor, CblasNoTrans, BlasInt(n), BlasInt(in), 1.0f, w_rows, BlasInt(in),
                  x_data, 1, 0.0f, y_data + c0, 1);
      return;
    }
    if (rows <= kSmallGemmMaxRows) {
      // A decode batch: stream W once for all rows (small_gemm.h).
      SmallRowsGemmNT(rows, n, in, x_data, x.stride(0), w_rows, in, y_data + c0, y.stride(0));
      return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BlasInt(rows), BlasInt(n), BlasInt(in),
                1.0f, x_data, BlasInt(x.stride(0)), w_rows, BlasInt(in), 0.0f, y_data + c0,
                BlasInt(y.stride(0)));
  };
  const double work =
      static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
  const int64_t chunks = (out + kLinearColumnChunk - 1) / kLinearColumnChunk;
  if (work <= kLinearSerialWork || chunks < 2) {
    columns(0, out);
    return;
  }
  // One contiguous block of columns per thread keeps each BLAS call large.
  const int64_t parts = std::min<int64_t>(chunks, NumThreads());
  ParallelFor(parts, [&](int64_t p) {
    const int64_t c0 = chunks * p / parts * kLinearColumnChunk;
    const int64_t c1 = std::min(out, chunks * (p + 1) / parts * kLinearColumnChunk);
    if (c1 > c0) columns(c0, c1 - c0);
  });
}

void HeadMatmul(const Tensor& x, const Tensor& weight, bool transpose_w, const Tensor& out) {
  const int64_t rows = x.size(0);
  const int64_t heads = x.size(1);
  const int64_t k = x.size(2);
  const int64_t n = out.size(2);
  if (rows == 0 || heads == 0 || n == 0) return;
  // A single row's stride is never used; BLAS still wants ld >= row length.
  const int64_t lda = rows > 1 ? x.stride(0) : k;
  const int64_t ldc = rows > 1 ? out.stride(0) : n;
  const float* x_data = x.data_as<const float>();
  const float* w_data = weight.data_as<const float>();
  float* out_data = out.data_as<float>();

  auto one_head = [&](int64_t h) {
    float* c = out_data + h * out.stride(1);
    if (k == 0) {
      ZeroRows(c, rows, n, ldc);
      return;
    }
    const float* a = x_data + h * x.stride(1);
    const float* b = w_data + h * k * n;
    if (rows <= kSmallRowsGemv) {
      // W[h] is [K, N] (y = W^T x) or [N, K] (y = W x).
      for (int64_t r = 0; r < rows; ++r) {
        if (transpose_w) {
          cblas_sgemv(CblasRowMajor, CblasNoTrans, BlasInt(n), BlasInt(k), 1.0f, b, BlasInt(k),
                      a + r * lda, 1, 0.0f, c + r * ldc, 1);
        } else {
          cblas_sgemv(CblasRowMajor, CblasTrans, BlasInt(k), BlasInt(n), 1.0f, b, BlasInt(n),
                      a + r * lda, 1, 0.0f, c + r * ldc, 1);
        }
      }
      return;
    }
    // W[h] is [K, N] (x @ W) or [N, K] (x @ W^T); both contiguous.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_w ? CblasTrans : CblasNoTrans, BlasInt(rows),
                BlasInt(n), BlasInt(k), 1.0f, a, BlasInt(lda), b, BlasInt(transpose_w ? k : n),
                0.0f, c, BlasInt(ldc));
  };
  UseSerialBlas();
  ParallelFor(heads, one_head);
}

}  // namespace mlag::host
