// Host memory owners. A Buffer is a block of bytes with a virtual destructor,
// held through std::shared_ptr by every tensor (and DLPack export) over it.
//
// HostBuffer: 4 KiB-aligned, from mmap (large) or aligned_alloc (small);
// freed, and returned to the system, when the last owner drops it.
// FileMapping: a private, copy-on-write mapping of a whole file.
#ifndef TENSORLIFT_DEVICE_HOST_BUFFER_H_
#define TENSORLIFT_DEVICE_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensorlift/status.h"

namespace tensorlift {

inline constexpr uint64_t kPageAlign = 4096;

class Buffer {
 public:
  virtual ~Buffer() = default;
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 protected:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

class HostBuffer final : public Buffer {
 public:
  // A zero-byte request gets a valid, aligned, empty buffer.
  static Result<std::shared_ptr<HostBuffer>> Allocate(uint64_t bytes);
  ~HostBuffer() override;

 private:
  HostBuffer() = default;
  bool mapped_ = false;
};

class FileMapping final : public Buffer {
 public:
  // Maps `size` bytes of `fd` (PROT_READ|PROT_WRITE, MAP_PRIVATE: writes stay
  // private). Truncating the file while mapped makes touching the lost pages
  // raise SIGBUS; the loader checks the size before and after.
  static Result<std::shared_ptr<FileMapping>> Map(int fd, uint64_t size);
  ~FileMapping() override;

 private:
  FileMapping() = default;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_HOST_BUFFER_H_
