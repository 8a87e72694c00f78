#include "kernels/cuda/fp8_gemm.cuh"
#include "kernels/cuda/warp_ops.cuh"

namespace mlag::cuda {
namespace {

constexpr int kQuantThreads = 128;  // one thread per column of a 128-column block
static_assert(kQuantThreads == kFp8GemmBlockK, "one thread per column of a block");

// GEMM tiles: 4 warps, each 16 output features (the mma's M) by
// kGemmTokenTiles x 8 rows of x (its N): x is the narrow operand in decode.
constexpr int kGemmWarps = 4;
constexpr int kGemmThreads = 32 * kGemmWarps;
constexpr int kGemmTokenTiles = 4;
constexpr int64_t kGemmFeatures = 16 * kGemmWarps;
constexpr int64_t kGemmTokens = 8 * kGemmTokenTiles;
constexpr int64_t kMmaK = 32;

__host__ __device__ inline int64_t ScaleBlocks(int64_t cols) {
  return (cols + kFp8GemmBlockK - 1) / kFp8GemmBlockK;
}

// grid (column blocks, min(rows, 65535)), rows strided by gridDim.y; one
// thread per column.
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeFp8RowsKernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* qx,
                          int64_t pitch, float* sx, int64_t scale_blocks) {
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
    if (threadIdx.x == 0) sx[row * scale_blocks + blockIdx.x] = s;
    __syncthreads();  // amax is rewritten by the next row
  }
}

// Four consecutive bytes of a row from column k, zeros past `len`; a word
// load when the row's bytes allow it.
__device__ __forceinline__ uint32_t LoadBytes4(const uint8_t* row, int64_t k, int64_t len,
                                               bool word_aligned) {
  if (word_aligned && k + 4 <= len) return *reinterpret_cast<const uint32_t*>(row + k);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    if (k + i < len) v |= static_cast<uint32_t>(row[k + i]) << (8 * i);
  }
  return v;
}

// grid (ceil(out / kGemmFeatures), ceil(rows / kGemmTokens)). Warp w owns
// features [f0, f0 + 16) and the block's tokens; lane (g, tig) holds
// features f0 + g and f0 + g + 8 for tokens 2 tig, 2 tig + 1 of each tile.
__global__ void __launch_bounds__(kGemmThreads)
    Fp8BlockGemmKernel(const uint8_t* qx, int64_t pitch, const float* sx, const uint8_t* w,
                       const float* sw, int64_t rows, int64_t out, int64_t k, float* y,
                       int64_t ldy) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kGemmFeatures + warp * 16;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kGemmTokens;
  const int64_t scale_blocks = ScaleBlocks(k);
  const int64_t f_lo = f0 + g, f_hi = f0 + g + 8;
  const uint8_t* w_lo = f_lo < out ? w + f_lo * k : nullptr;
  const uint8_t* w_hi = f_hi < out ? w + f_hi * k : nullptr;
  const bool w_words = k % 4 == 0;
  float acc[kGemmTokenTiles][4] = {};
  for (int64_t kb = 0; kb < scale_blocks; ++kb) {
    float part[kGemmTokenTiles][4] = {};
    for (int64_t k0 = kb * kFp8GemmBlockK; k0 < (kb + 1) * kFp8GemmBlockK && k0 < k; k0 += kMmaK) {
      const int64_t ka = k0 + 4 * tig, kc = ka + 16;
      uint32_t a[4];
      a[0] = w_lo != nullptr ? LoadBytes4(w_lo, ka, k, w_words) : 0u;
      a[1] = w_hi != nullptr ? LoadBytes4(w_hi, ka, k, w_words) : 0u;
      a[2] = w_lo != nullptr ? LoadBytes4(w_lo, kc, k, w_words) : 0u;
      a[3] = w_hi != nullptr ? LoadBytes4(w_hi, kc, k, w_words) : 0u;
      for (int nt = 0; nt < kGemmTokenTiles; ++nt) {
        const int64_t t = t0 + nt * 8 + g;
        const uint8_t* xrow = t < rows ? qx + t * pitch : nullptr;
        const uint32_t b0 = xrow != nullptr ? LoadBytes4(xrow, ka, pitch, true) : 0u;
        const uint32_t b1 = xrow != nullptr ? LoadBytes4(xrow, kc, pitch, true) : 0u;
        MmaE4M3(part[nt], a, b0, b1);
      }
    }
    const float sw_lo = f_lo < out ? sw[f_lo * scale_blocks + kb] : 0.0f;
    const float sw_hi = f_hi < out ? sw[f_hi * scale_blocks + kb] : 0.0f;
    for (int nt = 0; nt < kGemmTokenTiles; ++nt) {
      const int64_t ta = t0 + nt * 8 + 2 * tig, tb = ta + 1;
      const float sx_a = ta < rows ? sx[ta * scale_blocks + kb] : 0.0f;
      const float sx_b = tb < rows ? sx[tb * scale_blocks + kb] : 0.0f;
      acc[nt][0] += part[nt][0] * (sw_lo * sx_a);
      acc[nt][1] += part[nt][1] * (sw_lo * sx_b);
      acc[nt][2] += part[nt][2] * (sw_hi * sx_a);
      acc[nt][3] += part[nt][3] * (sw_hi * sx_b);
    }
  }
  for (int nt = 0; nt < kGemmTokenTiles; ++nt) {
    const int64_t ta = t0 + nt * 8 + 2 * tig, tb = ta + 1;
    if (f_lo < out) {
      if (ta < rows) y[ta * ldy + f_lo] = acc[nt][0];
      if (tb < rows) y[tb * ldy + f_lo] = acc[nt][1];
    }
    if (f_hi < out) {
      if (ta < rows) y[ta * ldy + f_hi] = acc[nt][2];
      if (tb < rows) y[tb * ldy + f_hi] = acc[nt][3];
    }
  }
}

}  // namespace

size_t Fp8QuantizedBytes(int64_t rows, int64_t cols) {
  const size_t scales = static_cast<size_t>(rows * ScaleBlocks(cols)) * sizeof(float);
  return (scales + 255) / 256 * 256 + static_cast<size_t>(rows * Fp8QuantizedPitch(cols));
}

cudaError_t Fp8BlockGemmSupported(int device, bool* supported) {
  *supported = false;
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  // The kernel's code must be built for sm_89 or newer too (a build for an
  // older target only would JIT PTX that traps).
  cudaFuncAttributes built{};
  err = cudaFuncGetAttributes(&built, Fp8BlockGemmKernel);
  if (err != cudaSuccess) return err;
  *supported = major * 10 + minor >= 89 && built.binaryVersion >= 89 && built.ptxVersion >= 89;
  return cudaSuccess;
}

cudaError_t LaunchQuantizeFp8Rows(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                  uint8_t* qx, float* sx, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ScaleBlocks(cols) > 0x7fffffff) return cudaErrorInvalidValue;  // grid x
  const dim3 grid(static_cast<unsigned>(ScaleBlocks(cols)),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  MLAG_LAUNCH(QuantizeFp8RowsKernel, grid, kQuantThreads, 0, stream)
  (x, rows, cols, ld, qx, Fp8QuantizedPitch(cols), sx, ScaleBlocks(cols));
  return cudaGetLastError();
}

cudaError_t LaunchFp8BlockGemm(const uint8_t* qx, const float* sx, const uint8_t* w,
                               const float* sw, int64_t rows, int64_t out, int64_t k, float* y,
                               int64_t ldy, cudaStream_t stream) {
  if (rows <= 0 || out <= 0) return cudaSuccess;
  const int64_t grid_y = (rows + kGemmTokens - 1) / kGemmTokens;
  if (grid_y > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((out + kGemmFeatures - 1) / kGemmFeatures),
                  static_cast<unsigned>(grid_y));
  MLAG_LAUNCH(Fp8BlockGemmKernel, grid, kGemmThreads, 0, stream)
  (qx, Fp8QuantizedPitch(k), sx, w, sw, rows, out, k, y, ldy);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
