// Plain reads of byte ranges (pread.h).
#include "io/pread.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/posix_file.h"
#include "io/faults.h"

namespace tensorlift {

Status ReadExactlyAt(int fd, uint64_t offset, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = io::Pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return PosixError("read at offset " + std::to_string(offset + done), errno);
    }
    if (r == 0) {
      return OutOfRangeError("unexpected end of file at offset " + std::to_string(offset + done) +
                             " (wanted " + std::to_string(n) + " bytes at offset " +
                             std::to_string(offset) + ")");
    }
    done += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status ReadAtLeast(int fd, std::byte* dest, uint64_t offset, uint64_t length, uint64_t min_read) {
  uint64_t got = 0;
  while (got < length) {
    const ssize_t n = io::Pread(fd, dest + got, length - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return PosixError(
          "read of " + std::to_string(length) + " bytes at offset " + std::to_string(offset),
          errno);
    }
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  if (got < min_read) return ShortReadError(got, min_read, offset);
  return Status::Ok();
}

Status ShortReadError(uint64_t got, uint64_t wanted, uint64_t offset) {
  return IOError("short read: " + std::to_string(got) + " of " + std::to_string(wanted) +
                 " bytes at offset " + std::to_string(offset) +
                 " (the file was truncated during the load)");
}

}  // namespace tensorlift
