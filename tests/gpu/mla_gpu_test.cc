// What MLA attention does on a CUDA device beyond its numerical cases (those
// run on every backend in tests/ops/cases_mla.cc): a decode workspace made
// for other shapes or fewer sequences is refused before anything launches.
// Compiled always; every test skips itself without a CUDA device.
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_attention.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

// A zero-filled tensor on `device` (every block id 0 and every seq_len 0 is
// valid, so a call that were not refused would read nothing out of bounds).
struct DeviceTensor {
  Buffer buffer;
  Tensor t;
};

DeviceTensor Zeros(Device& device, DType dtype, std::initializer_list<int64_t> shape) {
  DeviceTensor d;
  const Tensor probe(nullptr, dtype, shape);
  d.buffer = device.Allocate(probe.nbytes()).value();
  const std::vector<uint8_t> zeros(probe.nbytes(), 0);
  EXPECT_OK(device.CopyFromHost(d.buffer.data(), zeros.data(), zeros.size()));
  d.t = d.buffer.AsTensor(dtype, shape);
  return d;
}

TEST(MlaGpuTest, DecodeRejectsMismatchedWorkspace) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Device> device, Device::Create("cuda"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, Stream::Create(device.get()));
  const int64_t batch = 3, heads = 4, rkv = 64, dr = 16, block_size = 16, max_blocks = 2;
  DeviceTensor q_latent = Zeros(*device, DType::kF32, {batch, heads, rkv});
  DeviceTensor q_pe = Zeros(*device, DType::kF32, {batch, heads, dr});
  DeviceTensor cache = Zeros(*device, DType::kF32, {4, block_size, rkv + dr});
  DeviceTensor block_table = Zeros(*device, DType::kI32, {batch, max_blocks});
  DeviceTensor seq_lens = Zeros(*device, DType::kI32, {batch});
  DeviceTensor out = Zeros(*device, DType::kF32, {batch, heads, rkv});
  DeviceTensor lse = Zeros(*device, DType::kF32, {batch, heads});
  auto decode = [&](const MlaDecodeWorkspace& ws) {
    return MlaDecode(*stream, q_latent.t, q_pe.t, cache.t, block_table.t, seq_lens.t, 0.1f, out.t,
                     lse.t, &ws);
  };
  ASSERT_OK_AND_ASSIGN(MlaDecodeWorkspace fits,
                       MlaDecodeWorkspace::Create(*device, batch, heads, rkv));
  EXPECT_OK(decode(fits));
  ASSERT_OK_AND_ASSIGN(MlaDecodeWorkspace small,
                       MlaDecodeWorkspace::Create(*device, batch - 1, heads, rkv));
  EXPECT_EQ(decode(small).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(MlaDecodeWorkspace other_heads,
                       MlaDecodeWorkspace::Create(*device, 8, heads + 1, rkv));
  EXPECT_EQ(decode(other_heads).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(MlaDecodeWorkspace other_rkv,
                       MlaDecodeWorkspace::Create(*device, 8, heads, rkv + 8));
  EXPECT_EQ(decode(other_rkv).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(stream->Synchronize());
}

}  // namespace
}  // namespace mlag
