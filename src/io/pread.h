// The plain reads of byte ranges of a file descriptor, outside the read
// engines (headers, indexes, token files, sparse parts, the GPU pipeline's
// blocks), and the one verdict on a read that came back short.
#ifndef TENSORLIFT_IO_PREAD_H_
#define TENSORLIFT_IO_PREAD_H_

#include <cstddef>
#include <cstdint>

#include "tensorlift/status.h"

namespace tensorlift {

// O_DIRECT alignment used for offsets, lengths and buffer addresses.
inline constexpr uint64_t kDirectAlign = 4096;

// Reads exactly `n` bytes at `offset` of `fd` into `buf` with pread, retrying
// EINTR, EAGAIN and short reads; a premature end of file is an OutOfRange
// error. The read of every byte range outside the engines (headers, indexes,
// token files, the rows a rank reads itself, sparse parts). Thread-safe.
Status ReadExactlyAt(int fd, uint64_t offset, void* buf, size_t n);

// The one verdict on a planned read that came back short, whatever read it
// (the engines, the GPU pipeline's readers, ReadFile, a store's reads): an
// IOError "short read: GOT of WANTED bytes at offset OFFSET (the file was
// truncated during the load)"; the caller prefixes the file.
Status ShortReadError(uint64_t got, uint64_t wanted, uint64_t offset);

// Reads `length` bytes at `offset` of `fd` into `dest` with pread, retrying
// EINTR, EAGAIN and short reads; the read may end early at the end of the
// file (a block that runs past it, e.g. an O_DIRECT block's aligned span), but
// not before `min_read` bytes: fewer is an IOError (the file was truncated
// during the load). Thread-safe (no shared file offset).
Status ReadAtLeast(int fd, std::byte* dest, uint64_t offset, uint64_t length, uint64_t min_read);

}  // namespace tensorlift

#endif  // TENSORLIFT_IO_PREAD_H_
