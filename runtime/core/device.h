// Devices, owning buffers and the activation workspace.
//
// A Device is where tensors live and kernels run: the host (CPU) or one CUDA
// GPU. Device::Create("auto") picks CUDA when cudaGetDeviceCount finds a device
// and the host otherwise; having no GPU is never an error for "auto", and
// selection_reason() says what was picked and why.
//
// Allocation is refused while any stream of the device is capturing a graph,
// as CUDA refuses cudaMalloc in a global-mode capture: a graph may only touch
// memory that existed when it was captured.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/memory_budget.h"
#include "runtime/core/tensor.h"

namespace mlag {

class Device;

// Owns one allocation of a Device. Move-only; frees on destruction.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  DeviceKind device() const { return kind_; }
  // A contiguous view of the start of the buffer. The view must fit.
  Tensor AsTensor(DType dtype, absl::Span<const int64_t> shape) const;
  Tensor AsTensor(DType dtype, std::initializer_list<int64_t> shape) const {
    return AsTensor(dtype, absl::Span<const int64_t>(shape.begin(), shape.size()));
  }

 private:
  friend class Device;
  void Release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  DeviceKind kind_ = DeviceKind::kHost;
  bool pinned_ = false;  // page-locked host memory (cudaMallocHost)
  // Host memory from mmap (Device::MapHostPages): the mapping to unmap.
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  int cuda_index_ = -1;
};

class Device {
 public:
  // `spec` is "auto", "host", "cuda" or "cuda:N".
  static absl::StatusOr<std::unique_ptr<Device>> Create(absl::string_view spec);

  // The number of CUDA devices; 0 when CUDA is not built in, when there is no
  // driver, or when cudaGetDeviceCount fails for any other reason.
  static int CudaDeviceCount();

  DeviceKind kind() const { return kind_; }
  int index() const { return index_; }
  bool is_cuda() const { return kind_ == DeviceKind::kCuda; }
  // "host (2 threads)" or "cuda:0 (NVIDIA H200)".
  const std::string& name() const { return name_; }
  // Why this device was chosen, e.g. "auto: no CUDA device (...), using host".
  const std::string& selection_reason() const { return selection_reason_; }

  // The device's memory in bytes: physical memory on the host, the GPU's
  // total memory on CUDA. For plausibility checks before large allocations.
  absl::StatusOr<size_t> MemoryBytes() const;

  // The memory this process can still allocate on this device, and what
  // bounds it: the host's budget (runtime/core/memory_budget.h), or
  // cudaMemGetInfo's free memory on CUDA. What the memory plan divides.
  absl::StatusOr<MemoryBudget> AvailableMemory() const;

  // Address space a host allocation of `bytes` (Allocate or AllocateZeroed)
  // maps beyond `bytes`: a large buffer's rounding to and alignment on huge
  // pages. What an address-space limit (ulimit -v) counts and RSS does not.
  static size_t HostMappingOverhead(size_t bytes);
  // Address space each host thread may take besides its data: its stack
  // (RLIMIT_STACK, 8 MiB when unlimited) and a malloc arena (64 MiB).
  static size_t HostThreadAddressSpace();
  // The host's hardware threads (at least 1).
  static int HostThreadCount();

  // Allocates `bytes` (64-byte aligned on the host). Zero bytes gives an empty
  // buffer. Fails with FailedPrecondition during a graph capture on this device.
  // Host buffers of 4 MiB or more come straight from the kernel (a fresh
  // anonymous mapping, never pages malloc touched before), aligned on and
  // advised onto 2 MiB transparent huge pages.
  absl::StatusOr<Buffer> Allocate(size_t bytes);

  // Allocate, zero-filled. Large host buffers' fresh pages are zero already
  // and are touched only when first used, so a large KV pool costs no
  // start-up time and no memory for the blocks no request reaches. On CUDA:
  // Allocate, then Zero.
  absl::StatusOr<Buffer> AllocateZeroed(size_t bytes);

  // The share (0 to 1) of host memory [data, data + bytes) that Linux holds
  // on transparent huge pages, from /proc/self/smaps: advice (MADV_HUGEPAGE)
  // is not a promise, and a system whose huge pages are used up or disabled
  // falls back to 4 KiB pages, which stream slower and unevenly. Counts
  // touched pages only. 0 where smaps cannot be read.
  static double HostHugePageShare(const void* data, size_t bytes);

  // Host memory for staging copies to and from this device: page-locked on
  // CUDA (so Stream::CopyFromHost / CopyToHost run asynchronously from it),
  // ordinary memory on the host. Its Buffer reports DeviceKind::kHost.
  absl::StatusOr<Buffer> AllocatePinned(size_t bytes);

  // Synchronous copies between host memory and this device's memory. On CUDA
  // they wait for the whole device, so they are ordered with work on every
  // stream: for set-up and diagnostics. Per-step transfers go through a
  // stream (Stream::CopyFromHost / CopyToHost) from pinned memory.
  absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) const;
  absl::Status CopyFromHost(void* device_dst, const void* host_src, size_t bytes) const;
  // Zero-fills `bytes` of this device's memory, synchronously like the copies
  // above, without a host buffer of that size.
  absl::Status Zero(void* device_dst, size_t bytes) const;
  // Makes this device current for the calling thread (CUDA); no-op on host.
  absl::Status MakeCurrent() const;

  // Captures in flight on streams of this device (maintained by Stream).
  void AddCapture(int delta) { active_captures_ += delta; }

 private:
  Device(DeviceKind kind, int index) : kind_(kind), index_(index) {}
  // FailedPrecondition naming the allocation while a capture is in flight.
  absl::Status RefuseAllocationDuringCapture(size_t bytes) const;
  // A host buffer of `bytes` on a fresh anonymous mapping (zero-filled),
  // aligned on and advised onto huge pages.
  static absl::StatusOr<Buffer> MapHostPages(size_t bytes);

  DeviceKind kind_;
  int index_;
  std::string name_;
  std::string selection_reason_;
  std::atomic<int> active_captures_{0};
};

// A bump allocator over one Buffer, for activations. Every forward resets it
// and allocates in the same order, so a graph captured once sees the same
// addresses at every replay. Allocating from a workspace during capture is
// allowed: it hands out memory that already exists.
class Workspace {
 public:
  Workspace() = default;
  explicit Workspace(Buffer buffer) : buffer_(std::move(buffer)) {}

  // A fresh tensor of `shape`, 64-byte aligned. ResourceExhausted when full.
  absl::StatusOr<Tensor> Allocate(DType dtype, absl::Span<const int64_t> shape);
  absl::StatusOr<Tensor> Allocate(DType dtype, std::initializer_list<int64_t> shape) {
    return Allocate(dtype, absl::Span<const int64_t>(shape.begin(), shape.size()));
  }
  void Reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.bytes(); }
  // The most bytes ever in use at once: used to size a workspace after a
  // trial run.
  size_t high_water() const { return high_water_; }

 private:
  Buffer buffer_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace mlag
