#include "runtime/core/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace mlag {

namespace fs = std::filesystem;

absl::Status ErrnoStatus(int error_number, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  const absl::StatusCode code = absl::ErrnoToStatusCode(error_number);
  // errno 0 (a short write that set none) must still be an error.
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code, message);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "cannot open", path);
  if (!fs::is_regular_file(st)) {
    const char* kind = fs::is_directory(st)                                 ? "a directory"
                       : fs::is_fifo(st)                                    ? "a FIFO"
                       : fs::is_socket(st)                                  ? "a socket"
                       : fs::is_block_file(st) || fs::is_character_file(st) ? "a device"
                                                                            : "not a regular file";
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", kind, "; expected a regular file"));
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "cannot stat", path);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the ", max_bytes, " this file may have"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, "cannot open", path);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(in.gcount()) != size) {
    return absl::DataLossError(absl::StrCat(path, ": read ", in.gcount(), " of ", size, " bytes"));
  }
  return text;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoStatus(errno, "cannot create", path);
  bool ok = true;
  for (absl::string_view piece : pieces) {
    if (ok && !piece.empty()) ok = std::fwrite(piece.data(), 1, piece.size(), f) == piece.size();
  }
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  const int close_errno = errno;
  if (!ok || !closed) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(ok ? close_errno : write_errno, "write failed", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(e, "cannot rename the written file into place", path);
  }
  return absl::OkStatus();
}

}  // namespace mlag
