#include "device/host_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <new>

#include "common/posix_file.h"

namespace tensorlift {
namespace {
constexpr uint64_t kMmapThreshold = 1ull << 20;
}  // namespace

Result<std::byte*> MapHugePageMemory(uint64_t bytes) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (bytes < kHugePageAlign) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return PosixError("mmap", errno);
    return static_cast<std::byte*>(p);
  }
  // Over-map by a huge page, then trim both ends to the aligned range.
  void* raw = ::mmap(nullptr, bytes + kHugePageAlign, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (raw == MAP_FAILED) return PosixError("mmap", errno);
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageAlign - 1) / kHugePageAlign * kHugePageAlign;
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + bytes + kHugePageAlign;
  if (end > aligned + bytes) {
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  }
  auto* p = reinterpret_cast<std::byte*>(aligned);
#ifdef MADV_HUGEPAGE
  ::madvise(p, bytes, MADV_HUGEPAGE);  // Advice only.
#endif
  return p;
}

Result<std::shared_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t bytes) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> buf, AllocateOwned(bytes));
  return std::shared_ptr<HostBuffer>(std::move(buf));
}

Result<std::unique_ptr<HostBuffer>> HostBuffer::AllocateOwned(uint64_t bytes) {
  std::unique_ptr<HostBuffer> buf(new (std::nothrow) HostBuffer());
  if (!buf) return ResourceExhaustedError("out of memory");
  const uint64_t rounded =
      (std::max<uint64_t>(bytes, 1) + kPageAlign - 1) / kPageAlign * kPageAlign;
  if (rounded >= kMmapThreshold) {
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return ResourceExhaustedError(
          "cannot allocate " + std::to_string(bytes) +
          " bytes of host memory: " + PosixError("mmap", errno).message());
    }
    // No MADV_HUGEPAGE: measured on VMs that return freed memory to the host
    // (free page reporting), first touch of huge pages was 2-3x slower than of
    // base pages (docs/performance-load.md, "Caveats of this machine").
    buf->mapped_ = true;
    buf->data_ = static_cast<std::byte*>(p);
  } else {
    void* p = std::aligned_alloc(kPageAlign, rounded);
    if (p == nullptr) {
      return ResourceExhaustedError("cannot allocate " + std::to_string(bytes) +
                                    " bytes of host memory");
    }
    buf->data_ = static_cast<std::byte*>(p);
  }
  buf->size_ = bytes;
  buf->capacity_ = rounded;
  return buf;
}

Status HostBuffer::Resize(uint64_t bytes) {
  if (memfd_ >= 0 || shared_fd_ >= 0)
    return InvalidArgumentError("Resize: shared memory keeps its size");
  const uint64_t rounded =
      (std::max<uint64_t>(bytes, 1) + kPageAlign - 1) / kPageAlign * kPageAlign;
  if (rounded <= capacity_) {
    size_ = bytes;
    touched_ = std::min(touched_, bytes);
    return Status::Ok();
  }
  if (mapped_) {
    void* p = ::mremap(data_, capacity_, rounded, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) {
      return ResourceExhaustedError(
          "cannot grow a buffer to " + std::to_string(bytes) +
          " bytes of host memory: " + PosixError("mremap", errno).message());
    }
    data_ = static_cast<std::byte*>(p);
    capacity_ = rounded;
    size_ = bytes;
    return Status::Ok();
  }
  // A small buffer: a new one (its first touch is cheap).
  TL_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> fresh, AllocateOwned(bytes));
  std::swap(data_, fresh->data_);
  std::swap(mapped_, fresh->mapped_);
  std::swap(capacity_, fresh->capacity_);
  size_ = bytes;
  touched_ = 0;
  return Status::Ok();
}

HostBuffer::~HostBuffer() {
  if (memfd_ >= 0) ::close(memfd_);
  if (shared_fd_ >= 0) ::close(shared_fd_);
  if (data_ == nullptr) return;
  if (mapped_) {
    ::munmap(data_, capacity_);
  } else {
    std::free(data_);
  }
}

namespace {
constexpr int kHandoverSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
}  // namespace

Result<std::shared_ptr<HostBuffer>> HostBuffer::AllocateShared(uint64_t bytes,
                                                               const std::string& name) {
  std::shared_ptr<HostBuffer> buf(new (std::nothrow) HostBuffer());
  if (!buf) return ResourceExhaustedError("out of memory");
  const uint64_t rounded =
      (std::max<uint64_t>(bytes, 1) + kPageAlign - 1) / kPageAlign * kPageAlign;
  const std::string label = "tensorlift:" + name.substr(0, 200);
  buf->memfd_ = ::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (buf->memfd_ < 0) return PosixError("memfd_create", errno);
  if (::ftruncate(buf->memfd_, static_cast<off_t>(rounded)) != 0) {
    return ResourceExhaustedError("cannot size shared memory to " + std::to_string(rounded) +
                                  " bytes: " + PosixError("ftruncate", errno).message());
  }
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, buf->memfd_, 0);
  if (p == MAP_FAILED) return PosixError("mmap of shared memory", errno);
  buf->mapped_ = true;
  buf->data_ = static_cast<std::byte*>(p);
  buf->size_ = bytes;
  buf->capacity_ = rounded;
  return buf;
}

Status HostBuffer::Seal() {
  if (shared_fd_ >= 0) return Status::Ok();
  if (memfd_ < 0) return InvalidArgumentError("Seal: the buffer is not shared memory");
  // A read-only descriptor of the same memory: a shared mapping of it cannot
  // be made writable, so it does not count as a writable mapping, which would
  // make F_SEAL_WRITE fail with EBUSY.
  const std::string self = "/proc/self/fd/" + std::to_string(memfd_);
  const int ro = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) return PosixError("open " + self + " (read-only, to seal shared memory)", errno);
  // Replaces the writable mapping in place: same address, read-only.
  void* p = ::mmap(data_, capacity_, PROT_READ, MAP_SHARED | MAP_FIXED, ro, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(ro);
    return PosixError("mmap (sealing shared memory)", e);
  }
  if (::fcntl(memfd_, F_ADD_SEALS, kHandoverSeals | F_SEAL_SEAL) != 0) {
    const int e = errno;
    ::close(ro);
    return PosixError("fcntl(F_ADD_SEALS)", e);
  }
  ::close(memfd_);
  memfd_ = -1;
  shared_fd_ = ro;
  return Status::Ok();
}

Result<std::shared_ptr<HostBuffer>> HostBuffer::MapShared(int fd, uint64_t bytes,
                                                          bool copy_on_write) {
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } owned{fd};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return PermissionDeniedError("handed-over memory is not sealable shared memory (" +
                                 PosixError("fcntl(F_GET_SEALS)", errno).message() + ")");
  }
  if ((seals & kHandoverSeals) != kHandoverSeals) {
    return PermissionDeniedError(
        "handed-over memory is not sealed against writes, shrinking and growing (seals 0x" +
        std::to_string(seals) + ")");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("fstat of handed-over memory", errno);
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return CorruptionError("handed-over memory holds " + std::to_string(st.st_size) +
                           " bytes, the manifest says " + std::to_string(bytes));
  }
  std::shared_ptr<HostBuffer> buf(new (std::nothrow) HostBuffer());
  if (!buf) return ResourceExhaustedError("out of memory");
  const uint64_t length = std::max<uint64_t>(bytes, 1);
  void* p = ::mmap(nullptr, length, copy_on_write ? PROT_READ | PROT_WRITE : PROT_READ,
                   copy_on_write ? MAP_PRIVATE : MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return PosixError("mmap of handed-over memory", errno);
  buf->mapped_ = true;
  buf->data_ = static_cast<std::byte*>(p);
  buf->size_ = bytes;
  buf->capacity_ = length;
  if (!copy_on_write) std::swap(buf->shared_fd_, owned.fd);
  return buf;
}

Result<std::shared_ptr<FileMapping>> FileMapping::Map(int fd, uint64_t size) {
  std::shared_ptr<FileMapping> m(new (std::nothrow) FileMapping());
  if (!m) return ResourceExhaustedError("out of memory");
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return PosixError("mmap", errno);
    m->data_ = static_cast<std::byte*>(p);
  }
  m->size_ = size;
  return m;
}

FileMapping::~FileMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace tensorlift
