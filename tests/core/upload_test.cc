// Uploader: chunked, asynchronous host-to-device copies. Compiled twice, as
// graph_test.cc: "host" into the unit tests, "cuda" into the gpu suite.
#include "runtime/core/upload.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/device.h"
#include "tests/status_matchers.h"

#ifndef MLAG_TEST_DEVICE
#define MLAG_TEST_DEVICE "host"
#endif

namespace mlag {
namespace {

class UploaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(MLAG_TEST_DEVICE) == "cuda" && Device::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    device_ = Device::Create(MLAG_TEST_DEVICE).value();
  }
  std::unique_ptr<Device> device_;
};

// Sources of every size around the chunk size, each overwritten as soon as
// Copy returns (the contract: the source may be reused then), land intact
// once Finish returns, through a ring of two small chunks that is reused many
// times over.
TEST_F(UploaderTest, EverySizeLandsIntactAndSourcesAreFreeOnReturn) {
  constexpr size_t kChunk = 4096;
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, 3 * kChunk + 17, 100003, 0, 7};
  std::mt19937 rng(20261205);
  std::vector<std::vector<uint8_t>> expected;
  std::vector<Buffer> destinations;
  Uploader uploader(device_.get(), kChunk, /*chunks=*/2);
  std::vector<uint8_t> source;
  size_t total = 0;
  for (size_t n : sizes) {
    source.resize(n);
    for (uint8_t& b : source) b = static_cast<uint8_t>(rng());
    expected.push_back(source);
    destinations.push_back(device_->Allocate(n).value());
    ASSERT_OK(uploader.Copy(destinations.back().data(), source.data(), n));
    for (uint8_t& b : source) b = static_cast<uint8_t>(~b);  // reused at once
    total += n;
  }
  ASSERT_OK(uploader.Finish());
  EXPECT_EQ(uploader.bytes_copied(), total);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> back(sizes[i]);
    ASSERT_OK(device_->CopyToHost(back.data(), destinations[i].data(), sizes[i]));
    EXPECT_EQ(back, expected[i]) << "upload " << i << " of " << sizes[i] << " bytes";
  }
  // Copies may go on after a Finish.
  std::vector<uint8_t> more(5000, 0x5a);
  Buffer last = device_->Allocate(more.size()).value();
  ASSERT_OK(uploader.Copy(last.data(), more.data(), more.size()));
  ASSERT_OK(uploader.Finish());
  std::vector<uint8_t> back(more.size());
  ASSERT_OK(device_->CopyToHost(back.data(), last.data(), back.size()));
  EXPECT_EQ(back, more);
}

}  // namespace
}  // namespace mlag
