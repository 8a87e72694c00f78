#include "kernels/host/linear.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kernels/host/blas.h"
#include "kernels/host/gemm.h"
#include "kernels/host/parallel.h"
#include "runtime/core/fp8_blocks.h"

namespace mlag::host {
namespace {

// Output columns per parallel work item of Linear: large enough that each
// item streams a good slab of W, a multiple of every GemmNT row group.
constexpr int64_t kLinearColumnChunk = 64;
// Contiguous column blocks per thread: a few, claimed by whichever thread is
// free (kernels/host/thread_pool.h), so a core slowed by other work holds up
// the step by at most one block. Each block still streams its packed
// weights in one run.
constexpr int64_t kLinearPartsPerThread = 4;
// Below this many multiply-adds a Linear runs on one thread.
constexpr double kLinearSerialWork = 1 << 16;

// Sizes were checked to fit BLAS's int by the caller.
int BlasInt(int64_t v) { return static_cast<int>(v); }

// Zeros the [rows, cols] row-major view at `p` with row stride `ld`.
void ZeroRows(float* p, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::memset(p + r * ld, 0, cols * sizeof(float));
}

}  // namespace

GemmWeights WeightsOf(const LinearWeight& weight) {
  const int64_t in = weight.values.size(weight.values.ndim() - 1);
  GemmWeights w;
  w.data = weight.values.data();
  w.dtype = weight.values.dtype();
  w.ld = in;
  if (w.dtype == DType::kF8E4M3) {
    w.scales = weight.scales.data_as<const float>();
    w.scales_ld = Fp8Blocks(in);
  }
  if (weight.host_row_groups) {
    const int64_t out = weight.values.size(weight.values.ndim() - 2);
    w.packed_rows = out / kGemmGroupRows * kGemmGroupRows;
  }
  return w;
}

void Linear(const Tensor& x, const LinearWeight& weight, const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t in = x.size(1);
  const int64_t out = weight.values.size(0);
  if (rows == 0 || out == 0) return;
  float* y_data = y.data_as<float>();
  if (in == 0) {  // an empty sum
    ZeroRows(y_data, rows, out, y.stride(0));
    return;
  }
  const float* x_data = x.data_as<const float>();
  const GemmWeights w = WeightsOf(weight);
  // Columns [c0, c0 + n) of y from rows [c0, c0 + n) of W. y is written
  // without being read, so stale contents (even NaN) never leak in.
  auto columns = [&](int64_t c0, int64_t n) {
    GemmNT(rows, n, in, x_data, x.stride(0), w.FromRow(c0), y_data + c0, y.stride(0));
  };
  const double work =
      static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
  const int64_t chunks = (out + kLinearColumnChunk - 1) / kLinearColumnChunk;
  if (work <= kLinearSerialWork || chunks < 2) {
    columns(0, out);
    return;
  }
  // Contiguous blocks of columns stream W once in all.
  const int64_t parts = std::min<int64_t>(chunks, NumThreads() * kLinearPartsPerThread);
  ParallelFor(parts, [&](int64_t p) {
    const int64_t c0 = chunks * p / parts * kLinearColumnChunk;
    const int64_t c1 = std::min(out, chunks * (p + 1) / parts * kLinearColumnChunk);
    if (c1 > c0) columns(c0, c1 - c0);
  });
}

void HeadMatmul(const Tensor& x, const LinearWeight& weight, bool transpose_w, const Tensor& out) {
  const int64_t rows = x.size(0);
  const int64_t heads = x.size(1);
  const int64_t k = x.size(2);
  const int64_t n = out.size(2);
  if (rows == 0 || heads == 0 || n == 0) return;
  // A single row's stride is never used; BLAS still wants ld >= row length.
  const int64_t lda = rows > 1 ? x.stride(0) : k;
  const int64_t ldc = rows > 1 ? out.stride(0) : n;
  const float* x_data = x.data_as<const float>();
  const float* w_data = weight.values.data_as<const float>();
  float* out_data = out.data_as<float>();

  auto one_head = [&](int64_t h) {
    float* c = out_data + h * out.stride(1);
    if (k == 0) {
      ZeroRows(c, rows, n, ldc);
      return;
    }
    const float* a = x_data + h * x.stride(1);
    const float* b = w_data + h * k * n;
    if (transpose_w) {  // W[h] is [N, K]: y = x W[h]^T
      GemmNT(rows, n, k, a, lda, WeightsOf(weight.Select(h)), c, ldc);
      return;
    }
    // W[h] is [K, N]: y = x W[h].
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BlasInt(rows), BlasInt(n), BlasInt(k),
                1.0f, a, BlasInt(lda), b, BlasInt(n), 0.0f, c, BlasInt(ldc));
  };
  UseSerialBlas();
  ParallelFor(heads, one_head);
}

}  // namespace mlag::host
