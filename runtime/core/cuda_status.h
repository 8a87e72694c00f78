// Turning CUDA runtime, cuBLAS and NCCL return codes into absl::Status.
// Used from .cc files only (never from .cu/.cuh, which stay free of Abseil).
#pragma once

#include "absl/status/status.h"

namespace mlag {

// Status for a cudaError_t (passed as int so this header needs no CUDA).
// OK for 0; otherwise Internal naming `call`, `where` and the CUDA message.
absl::Status CudaStatus(int cuda_error, const char* call, const char* where);

}  // namespace mlag

#define MLAG_STRINGIFY_INNER_(x) #x
#define MLAG_STRINGIFY_(x) MLAG_STRINGIFY_INNER_(x)
#define MLAG_WHERE_ __FILE__ ":" MLAG_STRINGIFY_(__LINE__)

// Evaluates a CUDA runtime call and returns a Status naming it on failure.
#define MLAG_CUDA_RETURN_IF_ERROR(call) \
  MLAG_RETURN_IF_ERROR(::mlag::CudaStatus(static_cast<int>(call), #call, MLAG_WHERE_))
