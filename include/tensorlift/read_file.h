// Whole files read in order at the disk's speed (public API): for callers that
// need every byte of a file once, front to back (hashing it, copying it), not
// a checkpoint's tensors.
//
//   tensorlift::ReadFile(path, [&](const std::byte* data, size_t n) {
//     hasher.Update(data, n);
//     return tensorlift::Status::Ok();
//   });
//
// A thread of its own reads the next piece while the caller consumes the
// last one (two buffers of piece_bytes). In auto mode a file mostly out of the
// page cache is read with O_DIRECT where its filesystem takes it (the bytes
// come from the disk without filling the page cache), a cached one with
// buffered reads and readahead, as a load decides (docs/loading.md).
#ifndef TENSORLIFT_READ_FILE_H_
#define TENSORLIFT_READ_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tensorlift/loader.h"  // IoMode
#include "tensorlift/status.h"

namespace tensorlift {

struct ReadFileOptions {
  // kAuto: direct when under half of the file is in the page cache (and it
  // is at least one piece), else buffered; kBuffered; kDirect (buffered where
  // the filesystem refuses O_DIRECT, as a load does). kMmap is refused.
  IoMode mode = IoMode::kAuto;
  uint64_t piece_bytes = 8ull << 20;  // Rounded up to 4 KiB; at most 1 GiB.
};

struct ReadFileReport {
  uint64_t bytes = 0;               // Handed to `consume`: the file's size.
  IoMode mode = IoMode::kBuffered;  // The mode used (never kAuto).
};

// Reads `path` front to back, handing each piece to `consume` in order, on
// the calling thread; a consume that fails stops the read and its status is
// returned. The same read verdict as a load's: a file that ends before the
// size it had when opened is an IOError ("short read ... the file was
// truncated"), every error naming the path. Not for directories or devices.
Result<ReadFileReport> ReadFile(
    const std::string& path, const std::function<Status(const std::byte* data, size_t n)>& consume,
    const ReadFileOptions& options = {});

}  // namespace tensorlift

#endif  // TENSORLIFT_READ_FILE_H_
