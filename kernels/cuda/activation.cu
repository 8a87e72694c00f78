// SiluAndMul (kernels/activation.h): one thread per output element; the grid
// is 2-D (columns x rows), striding over rows beyond the grid.
#include "kernels/cuda/activation.cuh"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20;

__global__ void __launch_bounds__(kThreads)
    SiluAndMulKernel(const void* gate_up, DType in_dtype, int64_t in_row_stride, void* out,
                     DType out_dtype, int64_t out_row_stride, int64_t rows, int64_t inter) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < inter;
         i += int64_t(gridDim.x) * kThreads) {
      const float gate = LoadAsF32(in_dtype, gate_up, r * in_row_stride + i);
      const float up = LoadAsF32(in_dtype, gate_up, r * in_row_stride + inter + i);
      // z / (1 + e^-z): for very negative z, e^-z overflows to +inf and the
      // result is -0 rather than NaN (as on the host).
      const float silu = __fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)));
      StoreFromF32(out_dtype, out, r * out_row_stride + i, __fmul_rn(silu, up));
    }
  }
}

}  // namespace

cudaError_t LaunchSiluAndMul(const void* gate_up, DType in_dtype, int64_t in_row_stride, void* out,
                             DType out_dtype, int64_t out_row_stride, int64_t rows, int64_t inter,
                             cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  const int64_t gx = (inter + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned int>(gx < kMaxGridX ? gx : kMaxGridX),
                  static_cast<unsigned int>(rows < kMaxGridY ? rows : kMaxGridY));
  MLAG_LAUNCH_PDL(SiluAndMulKernel, grid, kThreads, 0, stream)
  (gate_up, in_dtype, in_row_stride, out, out_dtype, out_row_stride, rows, inter);
  return cudaGetLastError();
}

}  // namespace mlag::cuda
