#include "runtime/core/memory_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mlag {
namespace {

// /proc and /sys files report a size of 0: read them to the end.
std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of `key` in a "Key:   123 kB" file (/proc/meminfo,
// /proc/self/status), in bytes.
std::optional<size_t> KilobyteField(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kb = absl::ConsumeSuffix(&line, "kB");
    uint64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &n)) return std::nullopt;
    return static_cast<size_t>(kb ? n * 1024 : n);
  }
  return std::nullopt;
}

// A cgroup file holding one number ("max", or a v1 "unlimited" near 2^63,
// is no limit).
std::optional<size_t> CgroupNumber(const std::string& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return std::nullopt;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &n)) return std::nullopt;
  if (n >= (uint64_t{1} << 60)) return std::nullopt;
  return static_cast<size_t>(n);
}

// `key`'s value in a cgroup memory.stat file ("inactive_file 1234").
size_t StatField(const std::string& path, absl::string_view key) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> kv = absl::StrSplit(line, ' ');
    uint64_t n = 0;
    if (kv.size() == 2 && kv[0] == key && absl::SimpleAtoi(kv[1], &n)) return n;
  }
  return 0;
}

// Every cgroup of the process and its ancestors bounds it: the one with the
// least room left. `mount` is the hierarchy's mount point, `path` the
// process's cgroup within it; the files are memory.max / memory.current (v2)
// or memory.limit_in_bytes / memory.usage_in_bytes (v1). A path that does not
// exist under the mount (a container that sees the host's path) is tried
// from the mount itself, the container's own cgroup.
void TightestCgroup(const std::string& mount, std::string path, bool v2, HostMemoryFacts* facts) {
  const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
  const char* inactive_key = v2 ? "inactive_file" : "total_inactive_file";
  while (true) {
    const std::string dir = absl::StrCat(mount, path == "/" ? "" : path);
    const std::optional<size_t> limit = CgroupNumber(absl::StrCat(dir, "/", limit_file));
    if (limit) {
      const size_t usage = CgroupNumber(absl::StrCat(dir, "/", usage_file)).value_or(0);
      const size_t inactive = StatField(absl::StrCat(dir, "/memory.stat"), inactive_key);
      const size_t used = usage - std::min(usage, inactive);
      const size_t room = *limit - std::min(*limit, used);
      if (!facts->cgroup_limit ||
          room < *facts->cgroup_limit - std::min(*facts->cgroup_limit, facts->cgroup_used)) {
        facts->cgroup_limit = *limit;
        facts->cgroup_used = used;
        facts->cgroup_name = absl::StrCat(path, " (", v2 ? "v2" : "v1", ")");
      }
    }
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

}  // namespace

absl::StatusOr<HostMemoryFacts> ReadHostMemoryFacts(absl::string_view root_view) {
  std::string root(root_view);
  if (!root.empty() && root.back() == '/') root.pop_back();
  HostMemoryFacts facts;
  const std::optional<std::string> meminfo = ReadSmallFile(root + "/proc/meminfo");
  if (!meminfo) {
    return absl::UnavailableError(absl::StrCat(root, "/proc/meminfo: cannot be read, so the ",
                                               "memory this process may use is unknown"));
  }
  facts.mem_total = KilobyteField(*meminfo, "MemTotal").value_or(0);
  facts.mem_available = KilobyteField(*meminfo, "MemAvailable");
  facts.mem_free_estimate = KilobyteField(*meminfo, "MemFree").value_or(0) +
                            KilobyteField(*meminfo, "Cached").value_or(0);

  // /proc/self/cgroup: "0::/path" (v2), "N:memory:/path" or
  // "N:cpu,memory:/path" (v1).
  if (const std::optional<std::string> cgroups = ReadSmallFile(root + "/proc/self/cgroup")) {
    for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (parts.size() != 3) continue;
      if (parts[0] == "0" && parts[1].empty()) {
        TightestCgroup(root + "/sys/fs/cgroup", parts[2], /*v2=*/true, &facts);
      } else {
        for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
          if (controller == "memory") {
            TightestCgroup(root + "/sys/fs/cgroup/memory", parts[2], /*v2=*/false, &facts);
          }
        }
      }
    }
  }

  const std::optional<std::string> status = ReadSmallFile(root + "/proc/self/status");
  if (status) facts.address_space_used = KilobyteField(*status, "VmSize").value_or(0);
  if (root.empty()) {
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      facts.address_space_limit = static_cast<size_t>(limit.rlim_cur);
    }
  }
  return facts;
}

MemoryBudget HostBudgetFrom(const HostMemoryFacts& f) {
  MemoryBudget b;
  b.total = f.mem_total;
  if (f.mem_available) {
    b.available = *f.mem_available;
    b.source = "MemAvailable";
  } else {
    b.available = f.mem_free_estimate;
    b.source = "MemFree + Cached";
  }
  if (f.cgroup_limit) {
    const size_t room = *f.cgroup_limit - std::min(*f.cgroup_limit, f.cgroup_used);
    if (room < b.available) {
      b.available = room;
      b.total = *f.cgroup_limit;
      b.source = absl::StrCat("cgroup ", f.cgroup_name, " limit ", FormatBytes(*f.cgroup_limit));
    }
  }
  if (f.address_space_limit) {
    const size_t room =
        *f.address_space_limit - std::min(*f.address_space_limit, f.address_space_used);
    if (room < b.available) {
      b.available = room;
      b.total = *f.address_space_limit;
      b.source = absl::StrCat("ulimit -v ", FormatBytes(*f.address_space_limit));
      b.address_space_bound = true;
    }
  }
  return b;
}

absl::StatusOr<MemoryBudget> HostMemoryBudget() {
  absl::StatusOr<HostMemoryFacts> facts = ReadHostMemoryFacts("/");
  if (!facts.ok()) return facts.status();
  return HostBudgetFrom(*facts);
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.1f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.1f KB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

}  // namespace mlag
