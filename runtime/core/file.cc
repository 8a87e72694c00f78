#include "runtime/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace mlag {

absl::Status ErrnoStatus(int error_number, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  const absl::StatusCode code = absl::ErrnoToStatusCode(error_number);
  // errno 0 (a short write that set none) must still be an error.
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code, message);
}

absl::StatusOr<int> OpenRegularFile(const std::string& path, size_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
  // for ever. The type is then checked on the open descriptor itself, so the
  // file cannot be swapped between the check and the read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return ErrnoStatus(e, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)                          ? "a directory"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                       : S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode) ? "a device"
                                                                    : "not a regular file";
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", kind, "; expected a regular file"));
  }
  // Regular files never block; reads go back to blocking mode regardless.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<size_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  size_t size = 0;
  MLAG_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &size));
  if (size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the ", max_bytes, " this file may have"));
  }
  std::string text(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, text.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      if (n < 0) return ErrnoStatus(e, "cannot read", path);
      return absl::DataLossError(absl::StrCat(path, ": read ", got, " of ", size, " bytes"));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
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
