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
#include <string>

#include "tensorlift/status.h"

namespace tensorlift {

inline constexpr uint64_t kPageAlign = 4096;
inline constexpr uint64_t kHugePageAlign = 2ull << 20;  // A transparent huge page.

// `bytes` (a multiple of 4 KiB) of anonymous read/write memory, not yet
// faulted in; from 2 MiB up, 2 MiB aligned and advised into transparent huge
// pages (MADV_HUGEPAGE; 4 KiB pages where the kernel has them off). What
// staging memory is made of: an O_DIRECT read into huge pages moves in a few
// large pieces, into 4 KiB pages in many small ones (measured on this
// project's VM: a cold read of 2.14 GB took 0.91 s into 4 KiB pages against
// 0.70 s into huge pages, 3 reads of 16 MiB in flight). Freed with
// munmap(p, bytes).
Result<std::byte*> MapHugePageMemory(uint64_t bytes);

class Buffer {
 public:
  virtual ~Buffer() = default;
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Device memory that the host also reaches at another address (the
  // emulated device's, whose device addresses are PROT_NONE): that address
  // of data(). Null for host memory and for a GPU's, which a transport
  // reaches only through the device's own API (UCX: its CUDA support).
  virtual std::byte* host_mapping() const { return nullptr; }

 protected:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

class HostBuffer final : public Buffer {
 public:
  // A zero-byte request gets a valid, aligned, empty buffer.
  static Result<std::shared_ptr<HostBuffer>> Allocate(uint64_t bytes);
  static Result<std::unique_ptr<HostBuffer>> AllocateOwned(uint64_t bytes);
  ~HostBuffer() override;

  // Reuse (ArenaPool): makes the buffer `bytes` long, keeping its contents and
  // the pages already faulted in; grows a mapping in place or by moving it
  // (mremap), a small buffer by a new allocation.
  Status Resize(uint64_t bytes);
  // Bytes from the start already faulted in (written once): a reused buffer
  // needs no page faults there.
  uint64_t touched() const { return touched_; }
  uint64_t capacity() const { return capacity_; }
  void set_touched(uint64_t bytes) { touched_ = bytes; }

  // Shared memory (docs/remote.md, "Same-host handover"): `bytes` of a new
  // memfd named `name`, mapped shared and read/write until Seal(). Such a
  // buffer cannot Resize.
  static Result<std::shared_ptr<HostBuffer>> AllocateShared(uint64_t bytes,
                                                            const std::string& name);
  // Makes shared memory read-only for good, for this process and any other:
  // the mapping turns read-only at the same address (tensors over it stay
  // valid), and the memfd is sealed against writes, shrinking and growing, so
  // that a process it is handed to can trust that it never changes and never
  // shrinks under its mapping. kInvalidArgument for memory that is not
  // shared; a second call does nothing.
  Status Seal();
  // Sealed shared memory's read-only descriptor, mapped at data() from
  // offset 0 (owned by the buffer: dup it to keep it); -1 for other memory
  // and for copy-on-write mappings of shared memory.
  int shared_fd() const { return shared_fd_; }
  // Maps sealed shared memory another process handed over. Takes `fd` (closed
  // on failure too). Checks that it is sealed against writes, shrinking and
  // growing and holds at least `bytes`: kPermissionDenied / kCorruption
  // otherwise. Read-only (a write faults), or with `copy_on_write` writable,
  // each page written becoming this process's own copy (the sender's memory
  // never changes).
  static Result<std::shared_ptr<HostBuffer>> MapShared(int fd, uint64_t bytes, bool copy_on_write);

 private:
  HostBuffer() = default;
  bool mapped_ = false;
  int memfd_ = -1;         // The writable memfd, until sealed.
  int shared_fd_ = -1;     // Read-only descriptor of sealed shared memory.
  uint64_t capacity_ = 0;  // Bytes mapped (or allocated), a multiple of 4 KiB.
  uint64_t touched_ = 0;
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
