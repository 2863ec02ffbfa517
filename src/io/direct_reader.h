// Reads of file bytes straight into device memory (GPUDirect Storage): the GPU
// pipeline's alternative to pinned staging. OpenCuFileReader gives the cuFile
// one (io/cufile.h); tests give their own.
#ifndef TENSORLIFT_IO_DIRECT_READER_H_
#define TENSORLIFT_IO_DIRECT_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "tensorlift/status.h"

namespace tensorlift {

class DirectReader {
 public:
  virtual ~DirectReader() = default;
  // Prepares file number `file` (open as `fd`, which stays the caller's and
  // open while the reader reads it) for Read(). A failure means: not this
  // way for this load (the pipeline falls back to staging).
  virtual Status AddFile(uint32_t file, int fd) = 0;
  // Registers a device buffer the reads will land in (optional; faster).
  virtual Status AddBuffer(std::byte* device_base, uint64_t bytes) = 0;
  // Reads `bytes` at `file_offset` of file `file` into device memory
  // `device_base` + `offset`; all of them or an error. Thread-safe.
  virtual Status Read(uint32_t file, std::byte* device_base, uint64_t offset, uint64_t bytes,
                      uint64_t file_offset) = 0;
  // The bytes a block of its reads should have (0: the pipeline's staging
  // size): a reader with no staging slot behind it and a cost per block (a
  // peer pull's gets and checks) takes larger ones.
  virtual uint64_t BlockBytes() const { return 0; }
  // One Read's arguments.
  struct Request {
    std::byte* device_base = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t file_offset = 0;
  };
  // Every read of `file` in `reads` (a block's: a reader that checks what
  // lands by larger units sees them together). The default: Read each.
  virtual Status ReadBatch(uint32_t file, std::span<const Request> reads) {
    for (const Request& r : reads) {
      TL_RETURN_IF_ERROR(Read(file, r.device_base, r.offset, r.bytes, r.file_offset));
    }
    return Status::Ok();
  }
};

// A DirectReader through cuFile (CuFileDriver) for files numbered 0 to
// `files` - 1. Fails as CuFileDriver::Open does: Unimplemented when GDS
// support was not built, Unavailable when cuFile cannot be used here, and
// Unavailable when the nvidia-fs module is not loaded (`nvidia_fs`, its
// /proc directory, is missing), where cuFile would fall back to its slow
// compatibility mode.
Result<std::unique_ptr<DirectReader>> OpenCuFileReader(
    size_t files, const char* nvidia_fs = "/proc/driver/nvidia-fs");

}  // namespace tensorlift

#endif  // TENSORLIFT_IO_DIRECT_READER_H_
