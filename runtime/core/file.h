// Whole-file reads and atomic writes: the one way the project reads and
// writes files (checkpoints, config.json, prompt files, test data).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlag {

// The largest file ReadFile reads unless told otherwise (JSON and text
// inputs are far smaller; a larger one is a mistake or an attack).
inline constexpr size_t kDefaultMaxFileBytes = size_t{256} << 20;

// The contents of the regular file at `path`. NotFound when it does not
// exist; InvalidArgument for a directory, FIFO, socket or device (reading
// one could block for ever or never end) and for a file above `max_bytes`;
// the errno's code for other failures. Every message names the path.
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     size_t max_bytes = kDefaultMaxFileBytes);

// Opens `path` for reading if it is a regular file, without blocking on a
// FIFO: the descriptor (the caller closes it) and the file's size in
// `size`. Errors as ReadFile's.
absl::StatusOr<int> OpenRegularFile(const std::string& path, size_t* size);

// Writes the concatenation of `pieces` to `path` through a temporary file in
// the same directory and a rename, so a reader never sees a half-written
// file and one that has the old file mapped keeps its bytes. On failure the
// old file (if any) is untouched and the temporary is removed.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces);

// A Status for a failed system call on `path`, with the code errno implies
// (NotFound for ENOENT): "<path>: <what>: <strerror>".
absl::Status ErrnoStatus(int error_number, absl::string_view what, absl::string_view path);

}  // namespace mlag
