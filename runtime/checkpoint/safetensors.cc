#include "runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/model_config_json.h"
#include "runtime/core/file.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

using json = nlohmann::json;

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";
constexpr const char* kMetadataKey = "__metadata__";
// The reference implementation refuses headers above 100 MB; so do we, so a
// corrupt length cannot make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The safetensors dtypes this runtime reads.
struct DTypeSpelling {
  const char* name;
  DType dtype;
};
constexpr DTypeSpelling kDTypes[] = {
    {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},        {"I32", DType::kI32},
    {"I64", DType::kI64}, {"U8", DType::kU8},     {"F8_E4M3", DType::kF8E4M3},
};
// Valid safetensors dtypes this runtime does not read (yet): Unimplemented
// rather than InvalidArgument, since the file itself is fine.
constexpr const char* kUnsupportedDTypes[] = {
    "BOOL", "I8", "I16",     "U16",     "U32",     "U64",     "F64",
    "C64",  "F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E8M0",
};

// Reads a non-negative JSON integer; false when `v` is anything else.
bool GetNonNegative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// A shard name from an index must be a plain file name inside the directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  for (const DTypeSpelling& s : kDTypes) {
    if (s.dtype == dtype) return s.name;
  }
  return "?";
}

// ---- SafetensorsFile ------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  size_t size = 0;
  MLAG_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &size));
  if (size == 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": empty file, not a safetensors file"));
  }
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) return ErrnoStatus(map_errno, "mmap failed", path);

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;  // unmapped by the destructor on every return below
  file->map_bytes_ = size;
  MLAG_RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

absl::Status SafetensorsFile::ParseHeader() {
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  const size_t size = map_bytes_;
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (header_bytes > size - 8) {
    return absl::DataLossError(absl::StrCat(path_, ": header length ", header_bytes,
                                            " runs past the end of the ", size, "-byte file"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes, "-byte limit"));
  }
  const absl::string_view text(reinterpret_cast<const char*>(base + 8), header_bytes);
  MLAG_ASSIGN_OR_RETURN(json header, ParseJsonStrict(text, absl::StrCat(path_, ": header")));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": header is a JSON ", header.type_name(), ", not an object"));
  }
  const uint8_t* data = base + 8 + header_bytes;
  const uint64_t data_bytes = size - 8 - header_bytes;

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(path_, ": \"__metadata__\" is a JSON ",
                                                       entry.type_name(),
                                                       ", not an object of strings"));
      }
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(path_, ": \"__metadata__\" entry '",
                                                         m.key(), "' is a JSON ",
                                                         m.value().type_name(), ", not a string"));
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "': ", what));
    };
    if (!entry.is_object())
      return bad(absl::StrCat("entry is a JSON ", entry.type_name(), ", not an object"));

    // dtype
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) return bad("missing field \"dtype\"");
    if (!dtype_it->is_string()) return bad("\"dtype\" is not a string");
    const std::string dtype_name = dtype_it->get<std::string>();
    bool found = false;
    DType dtype = DType::kF32;
    for (const DTypeSpelling& s : kDTypes) {
      if (dtype_name == s.name) {
        dtype = s.dtype;
        found = true;
      }
    }
    if (!found) {
      for (const char* unsupported : kUnsupportedDTypes) {
        if (dtype_name == unsupported) {
          std::string supported;
          for (const DTypeSpelling& s : kDTypes) {
            absl::StrAppend(&supported, supported.empty() ? "" : ", ", s.name);
          }
          return absl::UnimplementedError(
              absl::StrCat(path_, ": tensor '", name, "': dtype ", dtype_name,
                           " is not supported (supported: ", supported, ")"));
        }
      }
      return bad(absl::StrCat("unknown dtype \"", dtype_name, "\""));
    }

    // shape
    auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) return bad("missing field \"shape\"");
    if (!shape_it->is_array()) return bad("\"shape\" is not an array");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : *shape_it) {
      uint64_t dim;
      if (!GetNonNegative(d, &dim)) {
        return bad(absl::StrCat("shape ", shape_it->dump(),
                                " has a dim that is not a non-negative integer"));
      }
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat("shape ", shape_it->dump(), " has a dim too large"));
      }
      shape.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(numel, dim, &numel)) overflow = true;
    }
    const uint64_t esize = DTypeSize(dtype);
    uint64_t expected_bytes = 0;
    if (overflow || __builtin_mul_overflow(numel, esize, &expected_bytes)) {
      return bad(absl::StrCat("shape ", shape_it->dump(), " is too large"));
    }

    // data_offsets
    auto off_it = entry.find("data_offsets");
    if (off_it == entry.end()) return bad("missing field \"data_offsets\"");
    uint64_t begin = 0, end = 0;
    if (!off_it->is_array() || off_it->size() != 2 || !GetNonNegative((*off_it)[0], &begin) ||
        !GetNonNegative((*off_it)[1], &end)) {
      return bad(
          absl::StrCat("\"data_offsets\" ", off_it->dump(), " is not two non-negative integers"));
    }
    if (end < begin) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] end before begin"));
    }
    if (end > data_bytes) {
      return absl::DataLossError(absl::StrCat(path_, ": tensor '", name, "': data_offsets [", begin,
                                              ", ", end, "] run past the end of the ", data_bytes,
                                              "-byte data section"));
    }
    if (end - begin != expected_bytes) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin,
                              " bytes but shape ", shape_it->dump(), " of ", dtype_name, " needs ",
                              expected_bytes));
    }

    SafetensorsTensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.nbytes = static_cast<size_t>(expected_bytes);
    t.data = t.nbytes == 0 ? nullptr : data + begin;
    t.file = path_;
    if (begin != end) ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // Overlap: sorted by begin, every non-empty range must start at or after
  // the furthest end of the ranges before it.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t furthest = 0;  // the earlier range reaching furthest
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].end > ranges[furthest].end) furthest = i - 1;
    if (ranges[i].begin < ranges[furthest].end) {
      const SafetensorsTensor& a = tensors_[ranges[furthest].index];
      const SafetensorsTensor& b = tensors_[ranges[i].index];
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": tensors '", a.name, "' [", ranges[furthest].begin, ", ", ranges[furthest].end,
          ") and '", b.name, "' [", ranges[i].begin, ", ", ranges[i].end, ") overlap"));
    }
  }

  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  return absl::OkStatus();
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsTensor& t, absl::string_view n) {
                               return absl::string_view(t.name) < n;
                             });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

// ---- Checkpoint -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    return ErrnoStatus(errno, "cannot open checkpoint directory", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": not a directory (a checkpoint is a directory holding ",
                     kSingleFileName, " or ", kIndexFileName, ")"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  const std::string single_path = absl::StrCat(dir, "/", kSingleFileName);
  const std::string index_path = absl::StrCat(dir, "/", kIndexFileName);

  if (PathExists(single_path)) {
    MLAG_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                          SafetensorsFile::Open(single_path));
    for (const SafetensorsTensor& t : file->tensors()) {
      ckpt->names_.push_back(t.name);
      ckpt->by_name_.push_back(&t);
    }
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  if (!PathExists(index_path)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no checkpoint here (neither ", kSingleFileName,
                                            " nor ", kIndexFileName, ")"));
  }

  MLAG_ASSIGN_OR_RETURN(std::string text, ReadFile(index_path));
  MLAG_ASSIGN_OR_RETURN(json index, ParseJsonStrict(text, index_path));
  if (!index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": is a JSON ", index.type_name(), ", not an object"));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": missing \"weight_map\" object {tensor: file}"));
  }
  const json& weight_map = *map_it;

  // Open each shard once, in order of first mention.
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", it.key(),
                                                     "' is mapped to a JSON ",
                                                     it.value().type_name(), ", not a file name"));
    }
    const std::string shard = it.value().get<std::string>();
    if (shards.count(shard) != 0) continue;
    if (!IsPlainFileName(shard)) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", it.key(),
                                                     "' is mapped to '", shard,
                                                     "', which is not a file name inside ", dir));
    }
    const std::string shard_path = absl::StrCat(dir, "/", shard);
    if (!PathExists(shard_path)) {
      return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", it.key(),
                                              "' is mapped to shard '", shard,
                                              "', which does not exist"));
    }
    MLAG_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(shard_path));
    shards[shard] = file.get();
    ckpt->files_.push_back(std::move(file));
  }

  // Every mapped tensor is in its shard ...
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    const std::string shard = it.value().get<std::string>();
    const SafetensorsTensor* t = shards[shard]->Find(it.key());
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", it.key(),
                                              "' is mapped to shard '", shard,
                                              "', which does not hold it"));
    }
    ckpt->names_.push_back(it.key());  // weight_map iterates sorted by key
    ckpt->by_name_.push_back(t);
  }
  // ... and every tensor of a shard is mapped to that shard.
  for (const auto& [shard, file] : shards) {
    for (const SafetensorsTensor& t : file->tensors()) {
      auto mapped = weight_map.find(t.name);
      if (mapped == weight_map.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->path(), ": tensor '", t.name, "' is in shard '", shard,
                         "' but not in the weight_map of ", index_path));
      }
      if (mapped->get<std::string>() != shard) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->path(), ": tensor '", t.name, "' is in shard '", shard, "' but ",
                         index_path, " maps it to '", mapped->get<std::string>(), "'"));
      }
    }
  }
  return ckpt;
}

const SafetensorsTensor* Checkpoint::Find(absl::string_view name) const {
  auto it = std::lower_bound(
      names_.begin(), names_.end(), name,
      [](const std::string& a, absl::string_view b) { return absl::string_view(a) < b; });
  if (it == names_.end() || *it != name) return nullptr;
  return by_name_[static_cast<size_t>(it - names_.begin())];
}

// ---- SafetensorsWriter ----------------------------------------------------------

absl::Status SafetensorsWriter::Add(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape, const void* data) {
  if (name.empty() || name == kMetadataKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("SafetensorsWriter: invalid tensor name '", name, "'"));
  }
  if (entries_.count(name) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("SafetensorsWriter: tensor '", name, "' added twice"));
  }
  uint64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SafetensorsWriter: tensor '", name, "': bad dim ", d));
    }
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SafetensorsWriter: tensor '", name, "': null data for ", bytes, " bytes"));
  }
  Entry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = shape;
  const uint8_t* src = static_cast<const uint8_t*>(data);
  if (bytes > 0) e.bytes.assign(src, src + bytes);
  entries_.emplace(name, std::move(e));
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

absl::Status SafetensorsWriter::WriteEntries(const std::vector<const Entry*>& entries,
                                             const std::string& path) const {
  // Data order: element size descending, then name; back to back.
  std::vector<const Entry*> order = entries;
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const size_t sa = DTypeSize(a->dtype), sb = DTypeSize(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  json header = json::object();
  json meta = json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata_) meta[k] = v;
  header[kMetadataKey] = meta;
  uint64_t offset = 0;
  for (const Entry* e : order) {
    json t = json::object();
    t["dtype"] = std::string(SafetensorsDTypeName(e->dtype));
    t["shape"] = e->shape;
    t["data_offsets"] = {offset, offset + e->bytes.size()};
    header[e->name] = std::move(t);
    offset += e->bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  char length[8];
  for (int i = 0; i < 8; ++i) {
    length[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }
  std::vector<absl::string_view> pieces = {absl::string_view(length, 8), text};
  for (const Entry* e : order) {
    pieces.emplace_back(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
  }
  return WriteFileAtomically(path, pieces);
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  std::vector<const Entry*> all;
  for (const auto& [name, e] : entries_) all.push_back(&e);
  return WriteEntries(all, path);
}

absl::Status SafetensorsWriter::WriteSharded(const std::string& dir, size_t max_shard_bytes) const {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create directory", dir);
  }
  // Greedy in name order; a shard always takes at least one tensor.
  std::vector<std::vector<const Entry*>> shards;
  size_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const auto& [name, e] : entries_) {
    if (shards.empty() ||
        (!shards.back().empty() && shard_bytes + e.bytes.size() > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&e);
    shard_bytes += e.bytes.size();
    total_bytes += e.bytes.size();
  }
  if (shards.empty()) shards.emplace_back();

  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char file_name[64];
    std::snprintf(file_name, sizeof(file_name), "model-%05zu-of-%05zu.safetensors", i + 1,
                  shards.size());
    MLAG_RETURN_IF_ERROR(WriteEntries(shards[i], absl::StrCat(dir, "/", file_name)));
    for (const Entry* e : shards[i]) weight_map[e->name] = file_name;
  }
  json index = json::object();
  index["metadata"] = {{"total_size", total_bytes}};
  index["weight_map"] = std::move(weight_map);
  const std::string text = index.dump(2) + "\n";
  return WriteFileAtomically(absl::StrCat(dir, "/", kIndexFileName), {text});
}

}  // namespace mlag
