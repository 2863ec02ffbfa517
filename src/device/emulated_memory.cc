// The memory of the host-emulated device (see emulated_memory.h).
#include "device/emulated_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

#include "common/posix_file.h"
#include "device/host_buffer.h"

namespace tensorlift::emulated {
namespace {

// The kernel's boot id: what makes two processes' emulated devices the same
// "GPU" (handover needs one host anyway).
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.empty() ? "unknown" : id;
}

}  // namespace

// "[0x7f..., +N bytes)".
std::string RangeText(const void* p, uint64_t bytes) {
  // snprintf rather than operator+: g++ 12 at -O3 warns (-Wrestrict) inside
  // std::string's concatenation here.
  char text[64];
  std::snprintf(text, sizeof(text), "[%#llx, +%llu bytes)",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)),
                static_cast<unsigned long long>(bytes));
  return text;
}

Result<std::shared_ptr<Arena>> Arena::Create(uint64_t bytes) {
  bytes = RoundUp(bytes, kHugePageAlign);
  std::shared_ptr<Arena> arena(new (std::nothrow) Arena());
  if (!arena) return ResourceExhaustedError("out of memory");
  TL_ASSIGN_OR_RETURN(arena->base_, MapHugePageMemory(bytes));
  arena->size_ = bytes;
  std::memset(arena->base_, 0, bytes);  // Faulted in now, not during a load.
  arena->free_[0] = bytes;
  return arena;
}

Arena::~Arena() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

std::byte* Arena::Take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) return nullptr;
  const uint64_t offset = best->first, length = best->second;
  free_.erase(best);
  if (length > bytes) free_[offset + bytes] = length - bytes;
  return base_ + offset;
}

void Arena::Give(std::byte* p, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t offset = static_cast<uint64_t>(p - base_);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_[offset] = bytes;
}

Result<std::shared_ptr<Region>> Region::Create(uint64_t bytes, std::shared_ptr<Arena> arena) {
  TL_ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Reserve(bytes));
  if (arena) region->worker_ = arena->Take(region->mapped_);
  if (region->worker_ != nullptr) {
    region->arena_ = std::move(arena);
  } else {
    TL_ASSIGN_OR_RETURN(region->worker_, MapHugePageMemory(region->mapped_));
  }
  return region;
}

Result<std::shared_ptr<Region>> Region::Import(int fd, uint64_t bytes) {
  Result<std::shared_ptr<Region>> made = Reserve(bytes);
  if (!made.ok()) {
    ::close(fd);
    return made.status();
  }
  std::shared_ptr<Region> region = std::move(made).value();
  region->memfd_ = fd;
  region->imported_ = true;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return PermissionDeniedError(
        "emulated:0: imported memory is not a memfd sealed against "
        "shrinking and growing");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return PosixError("fstat of imported memory", errno);
  if (static_cast<uint64_t>(st.st_size) < region->mapped_) {
    return CorruptionError("emulated:0: imported memory holds " + std::to_string(st.st_size) +
                           " bytes, " + std::to_string(region->mapped_) + " expected");
  }
  void* worker = ::mmap(nullptr, region->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (worker == MAP_FAILED) return PosixError("mmap of imported memory", errno);
  region->worker_ = static_cast<std::byte*>(worker);
  return region;
}

Region::~Region() {
  if (device_ != nullptr) ::munmap(device_, mapped_);
  if (worker_ != nullptr && arena_) {
    Detach();  // The arena gets private memory back, never the shared pages.
    arena_->Give(worker_, mapped_);
  } else if (worker_ != nullptr) {
    ::munmap(worker_, mapped_);
  }
  if (memfd_ >= 0) ::close(memfd_);
}

Result<int> Region::Share() {
  std::lock_guard<std::mutex> lock(share_mu_);
  if (memfd_ < 0) {
    const int fd = ::memfd_create("tensorlift-emulated", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return PosixError("memfd_create", errno);
    void* copy = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(mapped_)) == 0) {
      copy = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (copy == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return PosixError("emulated:0: shared memory of " + std::to_string(mapped_) + " bytes", e);
    }
    std::memcpy(copy, worker_, mapped_);
    // The shared mapping replaces the private one at the same address.
    if (::mremap(copy, mapped_, mapped_, MREMAP_MAYMOVE | MREMAP_FIXED, worker_) == MAP_FAILED) {
      const int e = errno;
      ::munmap(copy, mapped_);
      ::close(fd);
      return PosixError("mremap", e);
    }
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      // The mapping is shared now: keep the memfd, refuse to export it.
      memfd_ = fd;
      return PosixError("fcntl(F_ADD_SEALS)", errno);
    }
    memfd_ = fd;
  }
  const int dup = ::fcntl(memfd_, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return PosixError("dup", errno);
  return dup;
}

bool Region::Detach() {
  std::lock_guard<std::mutex> lock(share_mu_);
  if (imported_) return false;
  if (memfd_ < 0 || detached_) return true;
  void* p = ::mmap(worker_, mapped_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  detached_ = p != MAP_FAILED;
  return detached_;
}

Result<std::shared_ptr<Region>> Region::Reserve(uint64_t bytes) {
  const uint64_t mapped = RoundUp(bytes == 0 ? 1 : bytes, kPageAlign);
  if (mapped < bytes) return ResourceExhaustedError("size overflows");
  std::shared_ptr<Region> region(new (std::nothrow) Region());
  if (!region) return ResourceExhaustedError("out of memory");
  region->size_ = bytes;
  region->mapped_ = mapped;
  void* device =
      ::mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (device == MAP_FAILED) return PosixError("mmap", errno);
  region->device_ = static_cast<std::byte*>(device);
  return region;
}

DeviceState::DeviceState(const EmulatedDeviceOptions& options, uint64_t quarantine_bytes,
                         std::shared_ptr<Arena> arena)
    : arena_(std::move(arena)),
      memory_bytes_(options.memory_bytes),
      quarantine_limit_(quarantine_bytes),
      copy_bytes_per_second_(options.copy_bytes_per_second),
      copy_latency_seconds_(options.copy_latency_seconds),
      discard_copies_(options.discard_copies),
      identity_(options.id.empty() ? "emulated:0@" + BootId() : options.id) {}

std::chrono::steady_clock::time_point DeviceState::CopyDone(
    std::chrono::steady_clock::time_point start, uint64_t bytes) {
  using Duration = std::chrono::steady_clock::duration;
  const auto ready = start + std::chrono::duration_cast<Duration>(
                                 std::chrono::duration<double>(copy_latency_seconds_));
  if (copy_bytes_per_second_ <= 0) return ready;
  std::lock_guard lock(bus_mu_);
  const auto begin = std::max(ready, bus_free_);
  bus_free_ = begin + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                          static_cast<double>(bytes) / copy_bytes_per_second_));
  return bus_free_;
}

Status DeviceState::Reserve(uint64_t bytes, uint64_t accounted) {
  std::lock_guard lock(mu_);
  if (accounted > memory_bytes_ - live_bytes_) {
    return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                  " bytes of device memory: " + std::to_string(live_bytes_) +
                                  " of " + std::to_string(memory_bytes_) + " bytes in use");
  }
  live_bytes_ += accounted;
  return Status::Ok();
}

void DeviceState::AddLive(std::shared_ptr<Region> region) {
  std::lock_guard lock(mu_);
  if (region->imported()) {
    ++imported_count_;
    imported_bytes_ += region->size();
  } else {
    ++live_count_;
  }
  const auto key = reinterpret_cast<uintptr_t>(region->device());
  regions_[key] = Entry{std::move(region), false};
}

void DeviceState::Free(const std::shared_ptr<Region>& region, uint64_t accounted) {
  const auto key = reinterpret_cast<uintptr_t>(region->device());
  if (region->imported()) {
    std::lock_guard lock(mu_);
    --imported_count_;
    imported_bytes_ -= region->size();
    regions_.erase(key);
    return;
  }
  // Exported memory is detached first: importers keep its bytes.
  const bool quarantine = region->mapped() <= quarantine_limit_ && region->Detach();
  {
    std::lock_guard lock(mu_);
    live_bytes_ -= accounted;
    --live_count_;
    auto it = regions_.find(key);
    if (it != regions_.end()) {
      if (quarantine) {
        it->second.freed = true;
      } else {
        regions_.erase(it);
      }
    }
  }
  if (!quarantine) return;
  // Freed memory reads as poison, so that a stale read shows. With copies
  // discarded (a benchmark's diagnostic) the device's bytes mean nothing, and
  // poisoning would fault in every page at the free: a benchmark's peak RSS
  // would count the device memory of a checkpoint freed at exit.
  if (!discard_copies_) {
    std::memset(region->worker(), static_cast<int>(kEmulatedPoison), region->mapped());
  }
  std::vector<std::shared_ptr<Region>> evicted;  // Unmapped outside the lock.
  std::lock_guard lock(mu_);
  quarantine_.push_back(region);
  quarantined_bytes_ += region->mapped();
  while (quarantined_bytes_ > quarantine_limit_) {
    std::shared_ptr<Region> oldest = std::move(quarantine_.front());
    quarantine_.pop_front();
    quarantined_bytes_ -= oldest->mapped();
    regions_.erase(reinterpret_cast<uintptr_t>(oldest->device()));
    evicted.push_back(std::move(oldest));
  }
}

Result<Translated> DeviceState::Translate(const std::byte* p, uint64_t bytes, const char* what,
                                          bool allow_freed) {
  std::lock_guard lock(mu_);
  const Entry* entry = FindLocked(p);
  const std::string range = std::string(what) + " " + RangeText(p, bytes);
  if (entry == nullptr) {
    return InvalidArgumentError("illegal address: " + range + " is not device memory");
  }
  const Region& region = *entry->region;
  const uint64_t offset = static_cast<uint64_t>(p - region.device());
  if (offset > region.size() || bytes > region.size() - offset) {
    return InvalidArgumentError("illegal address: " + range + " runs past the end of " +
                                (entry->freed ? "freed " : "") + "allocation " +
                                RangeText(region.device(), region.size()));
  }
  if (entry->freed && !allow_freed) {
    return InvalidArgumentError("use after free: " + range + " is inside freed allocation " +
                                RangeText(region.device(), region.size()));
  }
  return Translated{region.ToWorker(p), entry->region};
}

Status DeviceState::CheckHost(const std::byte* p, uint64_t bytes, const char* what) {
  std::lock_guard lock(mu_);
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;  // No overflow: checked at enqueue.
  auto it = regions_.lower_bound(end);
  if (it == regions_.begin()) return Status::Ok();
  --it;  // The last region starting before the end of the range.
  const Region& region = *it->second.region;
  if (reinterpret_cast<uintptr_t>(region.device()) + region.mapped() <=
      reinterpret_cast<uintptr_t>(p)) {
    return Status::Ok();
  }
  return InvalidArgumentError("illegal address: host " + std::string(what) + " " +
                              RangeText(p, bytes) + " overlaps device allocation " +
                              RangeText(region.device(), region.size()));
}

void DeviceState::AddPinned(uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++pinned_count_;
  pinned_bytes_ += bytes;
}

void DeviceState::RemovePinned(uint64_t bytes) {
  std::lock_guard lock(mu_);
  --pinned_count_;
  pinned_bytes_ -= bytes;
}

EmulatedDeviceCounts DeviceState::Counts() {
  std::lock_guard lock(mu_);
  EmulatedDeviceCounts counts;
  counts.live_allocations = live_count_;
  counts.live_bytes = live_bytes_;
  counts.quarantined_allocations = quarantine_.size();
  counts.quarantined_bytes = quarantined_bytes_;
  counts.pinned_allocations = pinned_count_;
  counts.pinned_bytes = pinned_bytes_;
  counts.imported_allocations = imported_count_;
  counts.imported_bytes = imported_bytes_;
  return counts;
}

const DeviceState::Entry* DeviceState::FindLocked(const std::byte* p) const {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return nullptr;
  --it;
  if (addr - it->first >= it->second.region->mapped()) return nullptr;
  return &it->second;
}

Result<std::shared_ptr<Buffer>> PinnedBuffer::Allocate(std::shared_ptr<DeviceState> state,
                                                       uint64_t bytes) {
  const uint64_t mapped = RoundUp(bytes == 0 ? 1 : bytes, kPageAlign);
  if (mapped < bytes) return ResourceExhaustedError("size overflows");
  // In transparent huge pages, as the CUDA device's pinned memory is: an
  // O_DIRECT read into them moves in fewer, larger pieces.
  Result<std::byte*> p = MapHugePageMemory(mapped);
  if (!p.ok()) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(bytes) +
                                  " bytes of pinned memory: " + p.status().message());
  }
  // Resident from the allocation, as cudaHostAlloc's page-locked memory is:
  // its cost is the allocation's, not that of the first read into it.
  std::memset(*p, 0, mapped);
  std::shared_ptr<Buffer> buffer(new (std::nothrow) PinnedBuffer(state, *p, bytes, mapped));
  if (!buffer) {
    ::munmap(*p, mapped);
    return ResourceExhaustedError("out of memory");
  }
  state->AddPinned(bytes);
  return buffer;
}

PinnedBuffer::~PinnedBuffer() {
  ::munmap(data_, mapped_);
  state_->RemovePinned(size_);
}

}  // namespace tensorlift::emulated
