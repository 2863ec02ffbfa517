#include "common/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tensorlift {

Status PosixError(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return NotFoundError(std::move(msg));
    case EACCES:
    case EPERM:
      return PermissionDeniedError(std::move(msg));
    case ENOMEM:
      return ResourceExhaustedError(std::move(msg));
    default:
      return IOError(std::move(msg));
  }
}

PosixFile::~PosixFile() {
  if (fd_ >= 0) ::close(fd_);
}

PosixFile::PosixFile(PosixFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

PosixFile& PosixFile::operator=(PosixFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Result<PosixFile> PosixFile::OpenForRead(const std::string& path, int extra_flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError("cannot open", errno);
  PosixFile file(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("fstat", errno);
  if (S_ISDIR(st.st_mode)) return InvalidArgumentError("is a directory, not a file");
  return file;
}

Result<uint64_t> PosixFile::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return PosixError("fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

Result<FileIdentity> PosixFile::Identity() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return PosixError("fstat", errno);
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<uint64_t>(st.st_size),
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

}  // namespace tensorlift
