#include "device/host_buffer.h"

#include <sys/mman.h>

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
    // base pages (docs/performance.md).
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
  if (data_ == nullptr) return;
  if (mapped_) {
    ::munmap(data_, capacity_);
  } else {
    std::free(data_);
  }
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
