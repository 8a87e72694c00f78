#include "runtime/core/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "mlag_config.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {

absl::Status CudaStatus(int cuda_error, const char* call, const char* where) {
  if (cuda_error == 0) return absl::OkStatus();
#if MLAG_HAVE_CUDA
  const char* name = cudaGetErrorName(static_cast<cudaError_t>(cuda_error));
  const char* text = cudaGetErrorString(static_cast<cudaError_t>(cuda_error));
#else
  const char* name = "cudaError";
  const char* text = "CUDA is not built in";
#endif
  return absl::InternalError(
      absl::StrCat(call, " failed with ", name, " (", cuda_error, "): ", text, " at ", where));
}

}  // namespace mlag
