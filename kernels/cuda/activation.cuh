// CUDA launcher behind kernels/activation.h. CUDA and the standard library
// only. Enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i], silu(z) =
// z / (1 + e^-z), in f32, rounded once to out's dtype (as host::SiluAndMul;
// expf may differ from the host's by an ulp or two).
//   gate_up: [rows, 2 inter], rows `in_row_stride` elements apart;
//   out: [rows, inter], rows `out_row_stride` elements apart.
// Floating dtypes: f32, bf16, f16.
cudaError_t LaunchSiluAndMul(const void* gate_up, DType in_dtype, int64_t in_row_stride, void* out,
                             DType out_dtype, int64_t out_row_stride, int64_t rows, int64_t inter,
                             cudaStream_t stream);

}  // namespace mlag::cuda
