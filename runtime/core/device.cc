#include "runtime/core/device.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {
namespace {

constexpr size_t kHostAlignment = 64;
// Host buffers of at least kHugePageMinBytes (one huge page) come from a
// fresh mapping, aligned to, sized in and advised onto transparent huge
// pages (Device::Allocate). From one page on, not four: the `small` model's
// 2.25 MiB bf16 kv_a_proj weights, on 4 KiB heap pages, took 0.43 ms a step
// (4 layers, Zen 4, 2 threads) and 0.21 ms on huge pages.
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugePageMinBytes = size_t{2} << 20;

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// cudaGetDeviceCount, with its error kept for the selection message.
int QueryCudaDevices(std::string* why_none) {
#if MLAG_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none) {
      *why_none = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    }
    cudaGetLastError();  // clear the sticky error for later callers
    return 0;
  }
  if (count == 0 && why_none) *why_none = "cudaGetDeviceCount found 0 devices";
  return count;
#else
  if (why_none) *why_none = "built without CUDA";
  return 0;
#endif
}

unsigned HostThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace

// ---- Buffer ---------------------------------------------------------------------

Buffer::~Buffer() { Release(); }

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    kind_ = other.kind_;
    pinned_ = other.pinned_;
    cuda_index_ = other.cuda_index_;
    mapping_ = other.mapping_;
    mapping_bytes_ = other.mapping_bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.mapping_ = nullptr;
    other.mapping_bytes_ = 0;
  }
  return *this;
}

void Buffer::Release() {
  if (data_ == nullptr) return;
  if (pinned_) {
#if MLAG_HAVE_CUDA
    cudaFreeHost(data_);
#endif
  } else if (mapping_ != nullptr) {
    munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
    mapping_bytes_ = 0;
  } else if (kind_ == DeviceKind::kHost) {
    std::free(data_);
  } else {
#if MLAG_HAVE_CUDA
    // Destructors must not fail: a cudaFree error here can only be reported
    // by the next checked CUDA call.
    cudaFree(data_);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::AsTensor(DType dtype, absl::Span<const int64_t> shape) const {
  Tensor t(data_, dtype, shape, kind_);
  return t.nbytes() <= bytes_ ? t : Tensor();
}

// ---- Device ---------------------------------------------------------------------

int Device::CudaDeviceCount() { return QueryCudaDevices(nullptr); }

absl::StatusOr<std::unique_ptr<Device>> Device::Create(absl::string_view spec) {
  std::unique_ptr<Device> device;
  if (spec == "host") {
    device.reset(new Device(DeviceKind::kHost, 0));
    device->selection_reason_ = "host requested";
  } else if (spec == "auto" || spec == "cuda" || absl::StartsWith(spec, "cuda:")) {
    std::string why_none;
    int count = QueryCudaDevices(&why_none);
    if (spec == "auto") {
      if (count > 0) {
        device.reset(new Device(DeviceKind::kCuda, 0));
        device->selection_reason_ = absl::StrCat("auto: ", count, " CUDA device(s), using cuda:0");
      } else {
        device.reset(new Device(DeviceKind::kHost, 0));
        device->selection_reason_ =
            absl::StrCat("auto: no CUDA device (", why_none, "), using host");
      }
    } else {
      int index = 0;
      if (spec.size() > 5 && !absl::SimpleAtoi(spec.substr(5), &index)) {
        return absl::InvalidArgumentError(absl::StrCat("bad device '", spec, "'"));
      }
      if (count == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("device '", spec, "' requested but no CUDA device is usable: ", why_none));
      }
      if (index < 0 || index >= count) {
        return absl::InvalidArgumentError(
            absl::StrCat("device '", spec, "': only ", count, " CUDA device(s)"));
      }
      device.reset(new Device(DeviceKind::kCuda, index));
      device->selection_reason_ = absl::StrCat(spec, " requested");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device '", spec, "' (expected auto, host, cuda or cuda:N)"));
  }

  if (device->kind_ == DeviceKind::kHost) {
    device->name_ = absl::StrCat("host (", HostThreads(), " threads)");
  } else {
#if MLAG_HAVE_CUDA
    cudaDeviceProp prop;
    MLAG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device->index_));
    device->name_ = absl::StrCat("cuda:", device->index_, " (", prop.name, ")");
#endif
  }
  return device;
}

absl::StatusOr<size_t> Device::MemoryBytes() const {
  if (kind_ == DeviceKind::kHost) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return absl::InternalError("sysconf: physical memory unknown");
    return static_cast<size_t>(pages) * static_cast<size_t>(page);
  }
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  size_t free_bytes = 0, total_bytes = 0;
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes;
#else
  return absl::InternalError("CUDA is not built in");
#endif
}

size_t Device::HostMappingOverhead(size_t bytes) {
  // MapHostPages: rounded up to a huge page, and one more to align on one.
  return bytes >= kHugePageMinBytes ? 2 * kHugePageBytes : 0;
}

size_t Device::HostThreadAddressSpace() {
  rlimit stack{};
  const size_t stack_bytes = getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY
                                 ? static_cast<size_t>(stack.rlim_cur)
                                 : size_t{8} << 20;
  return stack_bytes + (size_t{64} << 20);
}

int Device::HostThreadCount() { return static_cast<int>(HostThreads()); }

absl::StatusOr<MemoryBudget> Device::AvailableMemory() const {
  if (kind_ == DeviceKind::kHost) return HostMemoryBudget();
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  MemoryBudget budget;
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&budget.available, &budget.total));
  budget.source = "cudaMemGetInfo";
  return budget;
#else
  return absl::InternalError("CUDA is not built in");
#endif
}

absl::Status Device::MakeCurrent() const {
#if MLAG_HAVE_CUDA
  if (kind_ == DeviceKind::kCuda) MLAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(index_));
#endif
  return absl::OkStatus();
}

absl::Status Device::RefuseAllocationDuringCapture(size_t bytes) const {
  if (active_captures_.load() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("allocation of ", bytes, " bytes on ", name_,
                   " during graph capture: graphs may only use memory that exists before capture"));
}

absl::StatusOr<Buffer> Device::MapHostPages(size_t bytes) {
  // One huge page more than asked, so the buffer can start on a huge-page
  // boundary (mmap only promises 4 KiB alignment).
  const size_t size = AlignUp(bytes, kHugePageBytes) + kHugePageBytes;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  Buffer buf;
  buf.kind_ = DeviceKind::kHost;
  buf.mapping_ = p;
  buf.mapping_bytes_ = size;
  const uintptr_t start = AlignUp(reinterpret_cast<uintptr_t>(p), kHugePageBytes);
  buf.data_ = reinterpret_cast<void*>(start);
  buf.bytes_ = bytes;
  // Advice only: where the kernel has no huge page free, first touch falls
  // back to 4 KiB pages (HostHugePageShare says what a buffer got).
  madvise(buf.data_, AlignUp(bytes, kHugePageBytes), MADV_HUGEPAGE);
  return buf;
}

absl::StatusOr<Buffer> Device::Allocate(size_t bytes) {
  MLAG_RETURN_IF_ERROR(RefuseAllocationDuringCapture(bytes));
  if (bytes == 0) {
    Buffer empty;
    empty.kind_ = kind_;
    return empty;
  }
  if (kind_ == DeviceKind::kHost) {
    // Large buffers (weights, the KV pool) on 2 MiB pages where the kernel
    // offers them: a decode step streams gigabytes, and 4 KiB pages would
    // cost a TLB miss every 4 KiB, stop the hardware prefetchers at every
    // 4 KiB boundary and fault once per page at first touch. They come
    // from a fresh mapping, never from malloc: glibc serves blocks below
    // its mmap threshold (which grows to 32 MiB as large blocks are freed)
    // from its heap, whose pages earlier blocks already faulted in as
    // 4 KiB pages, and advice does not turn those into huge pages. The
    // `small` model's 11 MiB bf16 shared-expert down projections came that
    // way, on no huge page at all, and streamed at half the rate of their
    // neighbours (Zen 4, 2 threads: 0.40 ms against 0.23 ms on a fresh
    // mapping).
    if (bytes >= kHugePageMinBytes) return MapHostPages(bytes);
    void* p = std::aligned_alloc(kHostAlignment, AlignUp(bytes, kHostAlignment));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    Buffer buf;
    buf.data_ = p;
    buf.bytes_ = bytes;
    return buf;
  }
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  void* p = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  Buffer buf;
  buf.kind_ = kind_;
  buf.data_ = p;
  buf.bytes_ = bytes;
  buf.cuda_index_ = index_;
  return buf;
#else
  return absl::FailedPreconditionError("CUDA allocation in a build without CUDA");
#endif
}

absl::StatusOr<Buffer> Device::AllocateZeroed(size_t bytes) {
  MLAG_ASSIGN_OR_RETURN(Buffer buf, Allocate(bytes));
  // A fresh mapping's pages are zero already (and stay untouched until
  // first used).
  if (buf.mapping_ == nullptr) MLAG_RETURN_IF_ERROR(Zero(buf.data(), buf.bytes()));
  return buf;
}

double Device::HostHugePageShare(const void* data, size_t bytes) {
  // smaps lists each mapping as a "start-end perms ..." line followed by
  // "Key: value kB" lines; AnonHugePages counts the mapping's anonymous
  // memory on huge pages, which the buffer is assumed to hold evenly where it
  // covers only part of a mapping.
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps || bytes == 0) return 0.0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data), hi = lo + bytes;
  double huge_bytes = 0.0;
  uintptr_t start = 0, end = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long a = 0, b = 0, kib = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      start = static_cast<uintptr_t>(a), end = static_cast<uintptr_t>(b);
    } else if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kib) == 1 && end > start) {
      const uintptr_t overlap_lo = std::max(lo, start), overlap_hi = std::min(hi, end);
      if (overlap_hi > overlap_lo) {
        huge_bytes += static_cast<double>(kib) * 1024.0 *
                      static_cast<double>(overlap_hi - overlap_lo) /
                      static_cast<double>(end - start);
      }
    }
  }
  return std::min(1.0, huge_bytes / static_cast<double>(bytes));
}

absl::StatusOr<Buffer> Device::AllocatePinned(size_t bytes) {
  if (kind_ == DeviceKind::kHost) {
    return Allocate(bytes);  // host memory is all the host device needs
  }
#if MLAG_HAVE_CUDA
  if (active_captures_.load() > 0) {
    return absl::FailedPreconditionError("pinned allocation during a graph capture");
  }
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  Buffer buf;
  if (bytes == 0) return buf;
  void* p = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes));
  buf.data_ = p;
  buf.bytes_ = bytes;
  buf.pinned_ = true;
  return buf;
#else
  return absl::FailedPreconditionError("CUDA allocation in a build without CUDA");
#endif
}

absl::Status Device::CopyToHost(void* host_dst, const void* device_src, size_t bytes) const {
  if (bytes == 0) return absl::OkStatus();
  if (kind_ == DeviceKind::kHost) {
    std::memcpy(host_dst, device_src, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  // Work queued on the project's (non-blocking) streams is not ordered with
  // the legacy stream cudaMemcpy uses: finish it first.
  MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("CUDA copy in a build without CUDA");
#endif
}

absl::Status Device::Zero(void* device_dst, size_t bytes) const {
  if (bytes == 0) return absl::OkStatus();
  if (kind_ == DeviceKind::kHost) {
    std::memset(device_dst, 0, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemset(device_dst, 0, bytes));
  // As CopyFromHost: streams launched after this call see the zeros.
  MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("CUDA memset in a build without CUDA");
#endif
}

absl::Status Device::CopyFromHost(void* device_dst, const void* host_src, size_t bytes) const {
  if (bytes == 0) return absl::OkStatus();
  if (kind_ == DeviceKind::kHost) {
    std::memcpy(device_dst, host_src, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(MakeCurrent());
  MLAG_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA lands, and the
  // project's streams do not synchronise with the legacy default stream:
  // wait, so that any stream launched after this call sees the data.
  MLAG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("CUDA copy in a build without CUDA");
#endif
}

// ---- Workspace ------------------------------------------------------------------

absl::StatusOr<Tensor> Workspace::Allocate(DType dtype, absl::Span<const int64_t> shape) {
  Tensor probe(nullptr, dtype, shape, buffer_.device());
  size_t bytes = AlignUp(probe.nbytes(), kHostAlignment);
  if (used_ + bytes > buffer_.bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("workspace full: need ", bytes,
                                                     " more bytes for ", probe.ShapeString(), ", ",
                                                     used_, " of ", buffer_.bytes(), " in use"));
  }
  Tensor t(static_cast<char*>(buffer_.data()) + used_, dtype, shape, buffer_.device());
  used_ += bytes;
  if (used_ > high_water_) high_water_ = used_;
  return t;
}

}  // namespace mlag
