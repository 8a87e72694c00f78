// Reading and writing checkpoints in the safetensors format.
//
// A safetensors file is: an 8-byte little-endian header length N; N bytes of
// JSON, {name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {str: str} (optional)}; then the data, with offsets relative
// to its start. A checkpoint directory holds either one model.safetensors or
// shards named by model.safetensors.index.json ({"weight_map": {tensor: file}}).
//
// Files are memory-mapped read-only; a SafetensorsTensor points into the
// mapping and is valid while its SafetensorsFile (or Checkpoint) lives. Every
// malformed file is an error naming the file (and the tensor where there is
// one), never a crash. A file truncated or rewritten by another process while
// mapped can still fault on access (SIGBUS): the mapping does not copy.
//
// Example:
//   MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
//   const SafetensorsTensor* w = ckpt->Find("model.norm.weight");
//   if (w == nullptr) return absl::NotFoundError("model.norm.weight");
//   // w->dtype, w->shape, w->data (w->nbytes bytes)
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/dtype.h"

namespace mlag {

// One tensor of a safetensors file: a view of the mapped file.
struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) tensor
  // Row-major, contiguous, little-endian. Aligned to the element size when the
  // writer ordered tensors as the reference implementation (and
  // SafetensorsWriter) do, but a foreign file may misalign it: read through
  // memcpy when unsure. nullptr exactly when nbytes == 0.
  const void* data;
  size_t nbytes;     // numel * DTypeSize(dtype)
  std::string file;  // path of the file holding it

  int64_t numel() const;
};

// "F32", "BF16", "F16", "I32", "I64", "U8", "F8_E4M3": the safetensors spelling.
absl::string_view SafetensorsDTypeName(DType dtype);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  // Maps `path` (read-only, MAP_PRIVATE) and validates the whole header:
  // NotFound for a missing file; DataLoss for an empty or truncated file
  // (shorter than 8 bytes, header or data_offsets past the end); Unimplemented
  // for a safetensors dtype this runtime does not read (F8_E5M2, F64, ...);
  // InvalidArgument for any other malformed header (not JSON, not an object,
  // missing or mistyped fields, negative dims, byte size != numel * dtype size,
  // overlapping ranges, duplicate names).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;
  // The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  // Validates the mapped header and fills tensors_ and metadata_.
  absl::Status ParseHeader();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: one model.safetensors, or
// model.safetensors.index.json and the shards it names.
class Checkpoint {
 public:
  // Opens `dir`. When both model.safetensors and the index exist, the single
  // file is used, as transformers does. With an index: every mapped tensor
  // must be in the shard it is mapped to (NotFound naming tensor and shard),
  // every tensor of a named shard must be mapped to that shard
  // (InvalidArgument naming both), a shard that does not exist is NotFound
  // naming it and a tensor mapped to it, and shard names must be plain file
  // names inside `dir`. NotFound when `dir` holds neither file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;
  // Every tensor name, sorted.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  // The opened files (one, or the shards in index order of first mention).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> names_;                 // sorted
  std::vector<const SafetensorsTensor*> by_name_;  // parallel to names_
};

// Builds safetensors files from host arrays.
//
// Add() copies the bytes, so the caller's array may go away at once. Write()
// produces the layout the reference implementation does: the header lists
// tensors sorted by name plus "__metadata__" ({"format": "pt"} and anything
// from SetMetadata), padded with spaces to a multiple of 8 bytes so the data
// starts 8-byte aligned; the data holds tensors back to back with no gaps
// (the reference reader rejects gaps), ordered by element size, largest first,
// then by name, so every tensor starts aligned to its element size.
//
// Example:
//   SafetensorsWriter w;
//   MLAG_RETURN_IF_ERROR(w.Add("model.norm.weight", DType::kBF16, {2048}, norm));
//   MLAG_RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));
class SafetensorsWriter {
 public:
  // Adds a contiguous row-major tensor of numel(shape) * DTypeSize(dtype)
  // bytes read from `data` (which may be null when that is 0). AlreadyExists
  // for a repeated name; InvalidArgument for a negative dim, an empty name or
  // the reserved name "__metadata__".
  absl::Status Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   const void* data);
  // Adds a "__metadata__" entry (besides "format": "pt").
  void SetMetadata(const std::string& key, const std::string& value);

  // Writes every tensor to the file `path`. An existing file is replaced
  // atomically (written beside it, then renamed), so an open
  // SafetensorsFile of the old file keeps valid data.
  absl::Status Write(const std::string& path) const;

  // Writes a sharded checkpoint into `dir` (created if missing, one level):
  // tensors in name order filled greedily into shards of at most
  // `max_shard_bytes` of data each (a larger tensor gets a shard of its own),
  // named model-00001-of-0000n.safetensors, plus model.safetensors.index.json
  // with {"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}.
  absl::Status WriteSharded(const std::string& dir, size_t max_shard_bytes) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  // Writes `entries` (in any order; the data order is chosen inside) to `path`.
  absl::Status WriteEntries(const std::vector<const Entry*>& entries,
                            const std::string& path) const;

  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mlag
