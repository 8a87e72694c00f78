#include "runtime/core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/device.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

TEST(TensorTest, ContiguousStrides) {
  std::vector<float> mem(2 * 3 * 4);
  Tensor t(mem.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.ShapeString(), "[2, 3, 4] f32");
}

TEST(TensorTest, SliceAndSelectAddressTheRightElements) {
  std::vector<float> mem(4 * 8);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<float>(i);
  Tensor x(mem.data(), DType::kF32, {4, 8});

  Tensor cols = x.Slice(1, 2, 6);
  EXPECT_EQ(cols.size(0), 4);
  EXPECT_EQ(cols.size(1), 4);
  EXPECT_EQ(cols.stride(0), 8);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(*static_cast<float*>(cols.ElementPtr({3, 1})), 3 * 8 + 2 + 1);

  Tensor row2 = x.Select(0, 2);
  EXPECT_EQ(row2.ndim(), 1);
  EXPECT_EQ(row2.size(0), 8);
  EXPECT_EQ(row2.data_as<float>()[5], 2 * 8 + 5);

  Tensor col5 = x.Select(1, 5);
  EXPECT_EQ(col5.ndim(), 1);
  EXPECT_EQ(col5.stride(0), 8);
  EXPECT_EQ(*static_cast<float*>(col5.ElementPtr({3})), 3 * 8 + 5);

  Tensor rows = x.Slice(0, 1, 3);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.data_as<float>()[0], 8);
}

TEST(TensorTest, StridedViewAndReshape) {
  std::vector<uint16_t> mem(64);
  Tensor s = Tensor::Strided(mem.data(), DType::kBF16, {3, 5}, {16, 1});
  EXPECT_EQ(s.stride(0), 16);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_FALSE(s.Reshape({15}).ok());

  Tensor c(mem.data(), DType::kBF16, {4, 16});
  auto r = c.Reshape({2, 2, 16});
  ASSERT_OK(r);
  EXPECT_EQ(r->stride(0), 32);
  EXPECT_FALSE(c.Reshape({5, 13}).ok());
}

TEST(DeviceTest, AutoNeverFailsAndSaysWhy) {
  auto device = Device::Create("auto");
  ASSERT_OK(device);
  EXPECT_FALSE((*device)->selection_reason().empty());
  if (Device::CudaDeviceCount() == 0) {
    EXPECT_EQ((*device)->kind(), DeviceKind::kHost);
    EXPECT_NE((*device)->selection_reason().find("host"), std::string::npos);
  }
}

TEST(DeviceTest, BadSpecAndMissingCudaAreErrors) {
  EXPECT_EQ(Device::Create("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  if (Device::CudaDeviceCount() == 0) {
    auto cuda = Device::Create("cuda");
    EXPECT_FALSE(cuda.ok());
    EXPECT_NE(cuda.status().message().find("cuda"), std::string::npos);
  }
}

TEST(DeviceTest, HostAllocationIsAlignedAndWorkspaceBumps) {
  auto device = Device::Create("host").value();
  Buffer b = device->Allocate(1000).value();
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(b.bytes(), 1000u);

  Workspace ws(device->Allocate(4096).value());
  Tensor a = ws.Allocate(DType::kF32, {10}).value();
  Tensor c = ws.Allocate(DType::kF32, {10}).value();
  EXPECT_EQ(static_cast<char*>(c.data()) - static_cast<char*>(a.data()), 64);
  EXPECT_EQ(ws.Allocate(DType::kF32, {2000}).status().code(), absl::StatusCode::kResourceExhausted);
  ws.Reset();
  EXPECT_EQ(ws.Allocate(DType::kF32, {10}).value().data(), a.data());
  EXPECT_EQ(ws.high_water(), 128u);
}

// Large host buffers (weights) come on fresh pages the kernel can back with
// 2 MiB huge pages, even where malloc would hand back heap pages that an
// earlier block faulted in as 4 KiB pages: weights on those streamed at half
// the rate of their neighbours.
TEST(DeviceTest, LargeHostBuffersGetFreshPagesOnHugePages) {
  constexpr size_t kMiB = size_t{1} << 20;
  // What the system gives a fresh, advised mapping: the most to expect.
  const size_t control_bytes = 8 * kMiB;
  void* control_map = mmap(nullptr, control_bytes + 2 * kMiB, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(control_map, MAP_FAILED);
  char* control = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(control_map) + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB));
  madvise(control, control_bytes, MADV_HUGEPAGE);
  std::memset(control, 1, control_bytes);
  const double control_share = Device::HostHugePageShare(control, control_bytes);
  munmap(control_map, control_bytes + 2 * kMiB);
  if (control_share < 1.0) {
    GTEST_SKIP() << "a fresh advised mapping got " << 100 * control_share
                 << "% huge pages here (transparent huge pages off or used up)";
  }

  // glibc: freeing a block it mapped (24 MiB) raises its mmap threshold past
  // that size, so a 16 MiB block then comes from the heap; touched and freed,
  // its 4 KiB pages stay there for the next block of that size.
  for (size_t bytes : {24 * kMiB, 16 * kMiB}) {
    void* block = std::malloc(bytes);
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, bytes);
    std::free(block);
  }
  auto device = Device::Create("host").value();
  for (size_t bytes : {2 * kMiB, 3 * kMiB + 5, 11 * kMiB}) {
    Buffer b = device->Allocate(bytes).value();
    ASSERT_EQ(b.bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (2 * kMiB), 0u) << bytes;
    std::memset(b.data(), 2, bytes);
    EXPECT_GE(Device::HostHugePageShare(b.data(), bytes), 0.99) << bytes << " bytes";

    Buffer z = device->AllocateZeroed(bytes).value();
    const char* p = static_cast<const char*>(z.data());
    EXPECT_TRUE(p[0] == 0 && p[bytes / 2] == 0 && p[bytes - 1] == 0) << bytes;
  }
}

}  // namespace
}  // namespace mlag
