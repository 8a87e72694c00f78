// Main for the gpu suite. Without a CUDA device every test skips itself; the
// process then exits 77 so meson reports the suite as SKIP rather than OK.
#include <cstdio>

#include "gtest/gtest.h"
#include "runtime/core/device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  if (rc == 0 && mlag::Device::CudaDeviceCount() == 0) {
    std::printf("gpu suite: no CUDA device, all tests skipped\n");
    return 77;
  }
  return rc;
}
