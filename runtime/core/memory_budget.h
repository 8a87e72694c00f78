// How much memory this process can still take, and what bounds it: the input
// of the engine's memory plan (runtime/engine/memory_plan.h).
//
// On the host the tightest of:
//   - the kernel's estimate of memory it can hand out without swapping
//     (MemAvailable in /proc/meminfo);
//   - the limit of every cgroup the process is in, less what the cgroup
//     already uses (v2: memory.max and memory.current; v1:
//     memory.limit_in_bytes and memory.usage_in_bytes; page cache the
//     kernel can drop, inactive_file in memory.stat, is not counted as used);
//   - the address-space limit (ulimit -v, RLIMIT_AS) less the address space
//     already mapped (VmSize), which counts reservations no page backs yet.
// On CUDA: cudaMemGetInfo's free memory (Device::AvailableMemory).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlag {

struct MemoryBudget {
  size_t available = 0;  // bytes this process may still allocate
  size_t total = 0;      // the memory of the machine or device (for reports)
  // What bounds `available`, e.g. "MemAvailable", "cgroup /user.slice
  // memory.max 2.0 GB", "ulimit -v 2.0 GB", "cudaMemGetInfo".
  std::string source;
  // The address-space limit bounds it: address space that holds no data
  // counts too (thread stacks, malloc arenas, the alignment of large
  // buffers), and the plan reserves it (memory_plan.h).
  bool address_space_bound = false;
};

// The raw figures a host budget is made from (bytes; nullopt: no such bound).
struct HostMemoryFacts {
  size_t mem_total = 0;
  std::optional<size_t> mem_available;  // MemAvailable (nullopt: a kernel without it)
  size_t mem_free_estimate = 0;         // MemFree + Cached, where MemAvailable is missing
  // The tightest cgroup: its limit, its usage less reclaimable page cache,
  // and its path ("/user.slice/..."), with the version ("v1" or "v2").
  std::optional<size_t> cgroup_limit;
  size_t cgroup_used = 0;
  std::string cgroup_name;
  std::optional<size_t> address_space_limit;  // RLIMIT_AS
  size_t address_space_used = 0;              // VmSize
};

// Reads the facts of this process from `root` ("/" normally; tests pass a
// directory holding proc/meminfo, proc/self/cgroup, proc/self/status and
// sys/fs/cgroup/...). The address-space limit is getrlimit's, and only read
// when `root` is "/". Errors only when proc/meminfo cannot be read.
absl::StatusOr<HostMemoryFacts> ReadHostMemoryFacts(absl::string_view root = "/");

// The budget those facts allow: the tightest bound, named.
MemoryBudget HostBudgetFrom(const HostMemoryFacts& facts);

// ReadHostMemoryFacts("/"), then HostBudgetFrom.
absl::StatusOr<MemoryBudget> HostMemoryBudget();

// "2.0 GB", "512 MB", "7.3 KB", "12 B" (decimal units, as the plan prints).
std::string FormatBytes(double bytes);

}  // namespace mlag
