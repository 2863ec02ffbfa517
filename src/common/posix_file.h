// Move-only RAII over a POSIX file descriptor, and errno converted to a Status
// in one place. Reads are in io/ (io/read_op.h: ReadExactlyAt, the engines).
//
// Thread safety: Close and move are not thread safe.
#ifndef TENSORLIFT_COMMON_POSIX_FILE_H_
#define TENSORLIFT_COMMON_POSIX_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorlift/safetensors.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Converts errno `err` from operation `what` into a Status with the matching
// code (ENOENT -> NotFound, EACCES/EPERM -> PermissionDenied, else IOError).
Status PosixError(std::string_view what, int err);

class PosixFile {
 public:
  PosixFile() = default;
  ~PosixFile();
  PosixFile(PosixFile&& other) noexcept;
  PosixFile& operator=(PosixFile&& other) noexcept;
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  // Opens `path` read-only (plus `extra_flags`). Errors do not repeat the path:
  // the caller adds it once.
  static Result<PosixFile> OpenForRead(const std::string& path, int extra_flags = 0);

  // Takes ownership of an open descriptor.
  static PosixFile Adopt(int fd) { return PosixFile(fd); }

  int fd() const { return fd_; }
  // The size from fstat.
  Result<uint64_t> Size() const;
  // Device, inode, size and modification time from fstat.
  Result<FileIdentity> Identity() const;

 private:
  explicit PosixFile(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMON_POSIX_FILE_H_
