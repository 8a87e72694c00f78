#include <algorithm>

#include "kernels/cuda/fp8_gemm.cuh"
#include "kernels/cuda/tc_gemm.cuh"

namespace mlag::cuda {
namespace {

constexpr int kQuantThreads = 128;  // one thread per column of a 128-column block
static_assert(kQuantThreads == kFp8GemmBlockK, "one thread per column of a block");

__host__ __device__ inline int64_t ScaleBlocks(int64_t cols) {
  return (cols + kFp8GemmBlockK - 1) / kFp8GemmBlockK;
}

// grid (column blocks, min(rows, 65535)), rows strided by gridDim.y; one
// thread per column.
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeFp8RowsKernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* qx,
                          int64_t pitch, float* sx, int64_t sx_row_stride,
                          int64_t sx_block_stride) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  __shared__ float amax[kQuantThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFp8GemmBlockK + threadIdx.x;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float v = c < cols ? x[row * ld + c] : 0.0f;
    amax[threadIdx.x] = fabsf(v);
    __syncthreads();
    for (int half = kQuantThreads / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.x) < half) {
        // As std::max(a, b): keeps a unless a < b.
        const float a = amax[threadIdx.x], b = amax[threadIdx.x + half];
        amax[threadIdx.x] = a < b ? b : a;
      }
      __syncthreads();
    }
    const float m = amax[0];
    const float s = m > 0.0f ? m / 448.0f : 1.0f;
    if (c < cols) {
      qx[row * pitch + c] = F32ToF8E4M3(v / s);
    } else if (c < pitch) {
      qx[row * pitch + c] = 0;
    }
    if (threadIdx.x == 0) sx[row * sx_row_stride + blockIdx.x * sx_block_stride] = s;
    __syncthreads();  // amax is rewritten by the next row
  }
}

// Row-tile height of the dense GEMM: the smallest of 8, 16, 32, 64 holding
// the rows (x's rows are the mma's N).
int64_t DenseTileRows(int64_t rows) {
  return rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
}

// K blocks (of 128) a split takes at least: 4 fill a BT = 8 ring.
constexpr int64_t kMinSplitBlocks = 4;

constexpr int kSumThreads = 256;

// y[r][f] = sum over z, in z order, of part[z][r][f].
__global__ void __launch_bounds__(kSumThreads)
    SumSplitsKernel(const float* __restrict__ part, int splits, int64_t rows, int64_t out,
                    float* __restrict__ y, int64_t ldy) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t n = rows * out;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = part[idx];
    for (int z = 1; z < splits; ++z) acc += part[z * n + idx];
    const int64_t r = idx / out;
    y[r * ldy + (idx - r * out)] = acc;
  }
}

}  // namespace

size_t Fp8QuantizedBytes(int64_t rows, int64_t cols) {
  const size_t scales = static_cast<size_t>(rows * ScaleBlocks(cols)) * sizeof(float);
  return (scales + 255) / 256 * 256 + static_cast<size_t>(rows * Fp8QuantizedPitch(cols));
}

cudaError_t Fp8BlockGemmSupported(int device, bool* supported) {
  return tc_gemm::TcGemmSupported(device, 89, supported);
}

cudaError_t LaunchQuantizeFp8Rows(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                  uint8_t* qx, float* sx, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ScaleBlocks(cols) > 0x7fffffff) return cudaErrorInvalidValue;  // grid x
  const dim3 grid(static_cast<unsigned>(ScaleBlocks(cols)),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  MLAG_LAUNCH_PDL(QuantizeFp8RowsKernel, grid, kQuantThreads, 0, stream)
  (x, rows, cols, ld, qx, Fp8QuantizedPitch(cols), sx, ScaleBlocks(cols), 1);
  return cudaGetLastError();
}

cudaError_t LaunchQuantizeFp8RowsVec128(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                        uint8_t* qx, float* sx, int64_t sx_ld,
                                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ScaleBlocks(cols) > 0x7fffffff || sx_ld < rows) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ScaleBlocks(cols)),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  MLAG_LAUNCH_PDL(QuantizeFp8RowsKernel, grid, kQuantThreads, 0, stream)
  (x, rows, cols, ld, qx, Fp8QuantizedPitch(cols), sx, 1, sx_ld);
  return cudaGetLastError();
}

int Fp8GemmSplits(int64_t rows, int64_t out, int64_t k, int sm_count) {
  if (rows <= 0 || out <= 0 || k <= 0) return 1;
  const int64_t ctas = (rows + DenseTileRows(rows) - 1) / DenseTileRows(rows) *
                       ((out + tc_gemm::kTcRows - 1) / tc_gemm::kTcRows);
  const int64_t want = 2 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1);
  if (ctas >= want) return 1;
  const int64_t by_k = ScaleBlocks(k) / kMinSplitBlocks;
  const int64_t splits = std::min<int64_t>({(want + ctas - 1) / ctas, by_k, kFp8GemmMaxSplits});
  return splits > 1 ? static_cast<int>(splits) : 1;
}

size_t Fp8GemmPartialBytes(int64_t rows, int64_t out, int splits) {
  if (splits <= 1 || rows <= 0 || out <= 0) return 0;
  return static_cast<size_t>(splits) * static_cast<size_t>(rows * out) * sizeof(float);
}

cudaError_t LaunchFp8BlockGemm(const uint8_t* qx, const float* sx, const uint8_t* w,
                               const float* sw, int64_t rows, int64_t out, int64_t k, float* y,
                               int64_t ldy, int splits, float* partials, cudaStream_t stream) {
  if (rows <= 0 || out <= 0) return cudaSuccess;
  // The grouped tensor-core GEMM (kernels/cuda/tc_gemm.cuh) on one dense
  // slot: row tiles of 8-64 rows of x on gridDim.x, 64 weight rows a CTA on
  // y, K slices on z.
  const int64_t tile_rows = DenseTileRows(rows);
  const int64_t tiles = (rows + tile_rows - 1) / tile_rows;
  if (rows > 0x7fffffff - 64 || out > int64_t{65535} * tc_gemm::kTcRows || k > 0x7fffffff ||
      splits < 1 || splits > kFp8GemmMaxSplits || (splits > 1 && partials == nullptr)) {
    return cudaErrorInvalidValue;
  }
  tc_gemm::TcGemmArgs p{};
  p.a = qx;
  p.a_pitch = Fp8QuantizedPitch(k);
  p.a_scales = sx;
  p.b = w;
  p.b_scales = sw;
  p.n = static_cast<int>(out);
  p.k = static_cast<int>(k);
  p.c = y;
  p.ldc = ldy;
  p.dense_rows = static_cast<int>(rows);
  if (splits > 1) {
    const int64_t blocks = ScaleBlocks(k);
    p.split_stages = static_cast<int>((blocks + splits - 1) / splits);
    splits = static_cast<int>((blocks + p.split_stages - 1) / p.split_stages);  // none empty
    p.c = partials;
    p.ldc = out;
    p.c_split_stride = rows * out;
  }
  cudaError_t err = tc_gemm::LaunchTcGemm<uint8_t, false>(static_cast<int>(tile_rows), p,
                                                          static_cast<int>(tiles), stream, splits);
  if (err != cudaSuccess || splits == 1) return err;
  const int64_t n = rows * out;
  const int64_t grid = std::min<int64_t>((n + kSumThreads - 1) / kSumThreads, 65535 * 8);
  MLAG_LAUNCH_PDL(SumSplitsKernel, static_cast<unsigned>(grid), kSumThreads, 0, stream)
  (partials, splits, rows, out, y, ldy);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
