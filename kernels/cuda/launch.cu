// MLAG_LAUNCH_PDL's switch (cuda_api.cuh): programmatic dependent launch on
// devices that have it (sm_90 and later), unless MLAG_PDL=0.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

bool PdlEnabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("MLAG_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  if (!allowed) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  // Per device: 0 not asked yet, 1 has it, 2 does not.
  constexpr int kCached = 64;
  static std::atomic<int> cached[kCached];
  int known = device >= 0 && device < kCached ? cached[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    int major = 0;
    const bool has =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9;
    known = has ? 1 : 2;
    if (device >= 0 && device < kCached) cached[device].store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

}  // namespace mlag::cuda
