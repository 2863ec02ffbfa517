// Disk faults for tests (docs/security.md, "Disk faults"). tensorlift's own
// reads and writes of files go through these, which pass straight through to
// the system unless faults are armed, by TENSORLIFT_IO_FAULTS in the
// environment (read at the first call):
//
//   RULE[,RULE...]   RULE = OP:KIND[@N]
//   OP     read (pread, and io_uring's reads) | write (write, pwrite)
//   KIND   eio     the call fails with EIO
//          enospc  the call fails with ENOSPC (writes)
//          short   the call moves at most half of what it was asked (at least 1 byte)
//   @N     only the Nth such call after arming (1-based); without it, every call.
//
// e.g. "read:short" (every read short), "read:eio@3", "write:enospc@2".
// Not covered: memory-mapped reads (a failed page-in is SIGBUS, for any
// mmap user), cuFile's and the kernel's O_DIRECT paths other than these calls.
#ifndef TENSORLIFT_IO_FAULTS_H_
#define TENSORLIFT_IO_FAULTS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "tensorlift/status.h"

namespace tensorlift::io {

ssize_t Pread(int fd, void* buf, size_t n, off_t offset);
ssize_t Write(int fd, const void* buf, size_t n);
ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset);

// For a read the kernel did on its own (an io_uring completion): `res` (bytes
// or a negative errno) as the armed faults make it, for a read of `n` bytes.
int ReadResult(int fd, int res, size_t n);

}  // namespace tensorlift::io

#endif  // TENSORLIFT_IO_FAULTS_H_
