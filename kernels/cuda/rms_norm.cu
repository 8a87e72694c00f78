// RMSNorm and residual-add + RMSNorm (kernels/rms_norm.h), one block per row.
//
// Pass 1 reads the row (adding x into residual and storing the rounded sum
// first, for AddRmsNorm) and accumulates the sum of squares in double; after
// the block reduction, pass 2 re-reads the row and writes y. Each thread
// touches the same elements in both passes, so it re-reads its own residual
// stores, and y may alias x: every element of x is read by the thread that
// later writes it, in pass 1 or just before in pass 2.
#include "kernels/cuda/rms_norm.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535 * 16;

using BlockReduceF64 = cub::BlockReduce<double, kThreads>;

// `v` rounded to the precision of `dtype` (f32 passes through).
__device__ __forceinline__ float RoundTo(DType dtype, float v) {
  if (dtype == DType::kBF16) return Bf16ToF32(F32ToBf16(v));
  if (dtype == DType::kF16) return F16ToF32(F32ToF16(v));
  return v;
}

// `in` is the normalised tensor: x for RmsNorm; residual for AddRmsNorm
// (kAdd), where x is first added into it and the sum stored through
// `in_store` (the same memory as `in`).
template <bool kAdd>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const void* x, DType x_dtype, int64_t x_row_stride, const void* in,
                  void* in_store, DType in_dtype, int64_t in_row_stride, const void* weight,
                  DType weight_dtype, void* y, DType y_dtype, int64_t y_row_stride, int64_t rows,
                  int64_t dim, float eps) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  __shared__ typename BlockReduceF64::TempStorage reduce;
  __shared__ float inv_rms_shared;
  const int64_t tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t in_row = r * in_row_stride;
    const int64_t y_row = r * y_row_stride;
    double sum_sq = 0.0;
    for (int64_t i = tid; i < dim; i += kThreads) {
      float v = LoadAsF32(in_dtype, in, in_row + i);
      if (kAdd) {
        v = RoundTo(in_dtype, __fadd_rn(v, LoadAsF32(x_dtype, x, r * x_row_stride + i)));
        StoreFromF32(in_dtype, in_store, in_row + i, v);
      }
      // The product of two f32 values is exact in double, so fusing it into
      // the add changes nothing.
      sum_sq += static_cast<double>(v) * static_cast<double>(v);
    }
    sum_sq = BlockReduceF64(reduce).Sum(sum_sq);
    if (tid == 0) {
      const float mean_sq = __double2float_rn(__ddiv_rn(sum_sq, static_cast<double>(dim)));
      inv_rms_shared = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_sq, eps)));
    }
    __syncthreads();
    const float inv_rms = inv_rms_shared;
    // AddRmsNorm re-reads the sums through the pointer it stored them with.
    const void* row_src = kAdd ? static_cast<const void*>(in_store) : in;
    for (int64_t i = tid; i < dim; i += kThreads) {
      const float v = LoadAsF32(in_dtype, row_src, in_row + i);
      const float normed = RoundTo(in_dtype, __fmul_rn(v, inv_rms));
      StoreFromF32(y_dtype, y, y_row + i, __fmul_rn(LoadAsF32(weight_dtype, weight, i), normed));
    }
    __syncthreads();  // `reduce` and inv_rms_shared are reused by the next row
  }
}

int Blocks(int64_t rows) { return static_cast<int>(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

cudaError_t LaunchRmsNorm(const void* x, DType x_dtype, int64_t x_row_stride, const void* weight,
                          DType weight_dtype, void* y, DType y_dtype, int64_t y_row_stride,
                          int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  MLAG_LAUNCH_PDL(RmsNormKernel<false>, Blocks(rows), kThreads, 0, stream)
  (nullptr, DType::kF32, 0, x, nullptr, x_dtype, x_row_stride, weight, weight_dtype, y, y_dtype,
   y_row_stride, rows, dim, eps);
  return cudaGetLastError();
}

cudaError_t LaunchAddRmsNorm(const void* x, DType x_dtype, int64_t x_row_stride, void* residual,
                             DType residual_dtype, int64_t residual_row_stride, const void* weight,
                             DType weight_dtype, void* y, DType y_dtype, int64_t y_row_stride,
                             int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  MLAG_LAUNCH_PDL(RmsNormKernel<true>, Blocks(rows), kThreads, 0, stream)
  (x, x_dtype, x_row_stride, residual, residual, residual_dtype, residual_row_stride, weight,
   weight_dtype, y, y_dtype, y_row_stride, rows, dim, eps);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
