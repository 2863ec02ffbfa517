// The host-emulated device (device.h, MakeEmulatedDevice; how it works is in
// emulated_device.h).
//
// Ownership: the device, its buffers, streams and events share one
// DeviceState, so each may outlive the others. A Region (the two mappings of
// one allocation) is held by the table of allocations and by every stream op
// that is using it, so freeing memory under running work (a caller's bug) is
// reported, never a crash of the worker.
#include "device/emulated_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/posix_file.h"
#include "device/stream_checks.h"
#include "kernels/bitmask_kernel.h"
#include "kernels/convert.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/convert.h"

namespace tensorlift {
namespace {

constexpr uint64_t kDeviceAlign = 256;
constexpr int kDlpackExtDev = 12;  // kDLExtDev.

uint64_t RoundUp(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

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

// The kernel's boot id: what makes two processes' emulated devices the same
// "GPU" (handover needs one host anyway).
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.empty() ? "unknown" : id;
}

double NowMicros() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Worker memory faulted in once, when the device is made
// (EmulatedDeviceOptions::prefault_bytes), that allocations are carved from
// (best fit, page granular, neighbours merged when given back): a GPU's
// memory exists before a load, while fresh host memory costs a page fault
// and the zeroing of every page (in a VM, the host's first touch too), which
// would dominate a load here. Allocations that do not fit get fresh memory.
class Arena {
 public:
  static Result<std::shared_ptr<Arena>> Create(uint64_t bytes) {
    bytes = RoundUp(bytes, kHugePageAlign);
    std::shared_ptr<Arena> arena(new (std::nothrow) Arena());
    if (!arena) return ResourceExhaustedError("out of memory");
    TL_ASSIGN_OR_RETURN(arena->base_, MapHugePageMemory(bytes));
    arena->size_ = bytes;
    std::memset(arena->base_, 0, bytes);  // Faulted in now, not during a load.
    arena->free_[0] = bytes;
    return arena;
  }
  ~Arena() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` (page aligned) of the arena, or null when no free range fits.
  std::byte* Take(uint64_t bytes) {
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
  void Give(std::byte* p, uint64_t bytes) {
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

 private:
  Arena() = default;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // Offset -> length of each free range.
};

// One allocation: an address range reserved PROT_NONE (the device address: a
// host access faults) and anonymous read/write memory of the same size for
// the workers, in transparent huge pages where the kernel allows (2 MiB
// aligned, MADV_HUGEPAGE): a GPU's fresh memory costs no page faults, and
// 4 KiB faults on this memory would cost as much as the copies into it. Both
// mappings are unmapped on destruction.
//
// Exported (Share) or imported allocations are a memfd instead, mapped
// shared at the worker address, so that two processes (or two devices of
// one) see the same bytes: what CUDA IPC gives two processes on one GPU. An
// exported allocation that is freed is detached first (fresh memory at its
// worker address, which is then poisoned): importers keep the bytes.
class Region {
 public:
  // From `arena` when it has room (may be null).
  static Result<std::shared_ptr<Region>> Create(uint64_t bytes, std::shared_ptr<Arena> arena) {
    TL_ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Reserve(bytes));
    if (arena) region->worker_ = arena->Take(region->mapped_);
    if (region->worker_ != nullptr) {
      region->arena_ = std::move(arena);
    } else {
      TL_ASSIGN_OR_RETURN(region->worker_, MapHugePageMemory(region->mapped_));
    }
    return region;
  }

  // The memory of memfd `fd` (taken, closed on failure too), exported by
  // Share in this or another process, holding at least `bytes`.
  static Result<std::shared_ptr<Region>> Import(int fd, uint64_t bytes) {
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

  ~Region() {
    if (device_ != nullptr) ::munmap(device_, mapped_);
    if (worker_ != nullptr && arena_) {
      Detach();  // The arena gets private memory back, never the shared pages.
      arena_->Give(worker_, mapped_);
    } else if (worker_ != nullptr) {
      ::munmap(worker_, mapped_);
    }
    if (memfd_ >= 0) ::close(memfd_);
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* device() const { return device_; }
  std::byte* worker() const { return worker_; }
  uint64_t size() const { return size_; }
  uint64_t mapped() const { return mapped_; }
  bool imported() const { return imported_; }
  // The worker address of device address `p` inside this region.
  std::byte* ToWorker(const std::byte* p) const { return worker_ + (p - device_); }

  // A new descriptor of this allocation's memfd (the caller's), sealed
  // against shrinking and growing. The first call moves the bytes into a
  // memfd mapped at the same worker address (no stream op may be running on
  // the region then).
  Result<int> Share() {
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

  // Gives an exported allocation fresh private memory at its worker address
  // (importers keep the shared bytes); true when the worker memory is this
  // process's own (never shared, or detached), so that it may be poisoned.
  bool Detach() {
    std::lock_guard<std::mutex> lock(share_mu_);
    if (imported_) return false;
    if (memfd_ < 0 || detached_) return true;
    void* p = ::mmap(worker_, mapped_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    detached_ = p != MAP_FAILED;
    return detached_;
  }

 private:
  Region() = default;

  // A region of `bytes` with its PROT_NONE device address reserved.
  static Result<std::shared_ptr<Region>> Reserve(uint64_t bytes) {
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

  std::byte* device_ = nullptr;
  std::byte* worker_ = nullptr;
  std::shared_ptr<Arena> arena_;  // Where worker_ came from, if not fresh.
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;
  std::mutex share_mu_;  // Guards the three below.
  int memfd_ = -1;       // Exported or imported: the shared memory at worker_.
  bool imported_ = false;
  bool detached_ = false;  // Exported, then given private memory again.
};

// A range translated to the worker mapping; `hold` keeps it mapped.
struct Translated {
  std::byte* ptr = nullptr;
  std::shared_ptr<Region> hold;
};

// The state shared by a device and everything it made.
// Thread safety: every member function may be called from any thread.
class DeviceState {
 public:
  // `arena`: pre-faulted worker memory, or null.
  DeviceState(const EmulatedDeviceOptions& options, uint64_t quarantine_bytes,
              std::shared_ptr<Arena> arena)
      : arena_(std::move(arena)),
        memory_bytes_(options.memory_bytes),
        quarantine_limit_(quarantine_bytes),
        copy_bytes_per_second_(options.copy_bytes_per_second),
        copy_latency_seconds_(options.copy_latency_seconds),
        discard_copies_(options.discard_copies),
        identity_(options.id.empty() ? "emulated:0@" + BootId() : options.id) {}

  const std::string& identity() const { return identity_; }

  double copy_bytes_per_second() const { return copy_bytes_per_second_; }
  // Pre-faulted worker memory (null when none was asked for or it failed).
  const std::shared_ptr<Arena>& arena() const { return arena_; }
  double copy_latency_seconds() const { return copy_latency_seconds_; }
  // Host-to-device copies move no bytes (EmulatedDeviceOptions).
  bool discard_copies() const { return discard_copies_; }
  uint64_t memory_bytes() const { return memory_bytes_; }

  // When a host-to-device copy of `bytes` that started at `start` completes
  // in the GPU's copy model: after the per-copy latency, its bytes take the
  // bus at the bandwidth once the copies before it (from any stream) are
  // through. The bus is the device's: two streams overlap their latencies,
  // not their bandwidth.
  std::chrono::steady_clock::time_point CopyDone(std::chrono::steady_clock::time_point start,
                                                 uint64_t bytes) {
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

  // Reserves `accounted` bytes of device memory.
  Status Reserve(uint64_t bytes, uint64_t accounted) {
    std::lock_guard lock(mu_);
    if (accounted > memory_bytes_ - live_bytes_) {
      return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory: " + std::to_string(live_bytes_) +
                                    " of " + std::to_string(memory_bytes_) + " bytes in use");
    }
    live_bytes_ += accounted;
    return Status::Ok();
  }

  void Unreserve(uint64_t accounted) {
    std::lock_guard lock(mu_);
    live_bytes_ -= accounted;
  }

  void AddLive(std::shared_ptr<Region> region) {
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

  // Called when the last owner drops a device buffer: poisons the region and
  // quarantines it (or unmaps it, when it is larger than the quarantine).
  // Imported memory is another process's: never poisoned, unmapped when the
  // last stream op holding it is done.
  void Free(const std::shared_ptr<Region>& region, uint64_t accounted) {
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
    std::memset(region->worker(), static_cast<int>(kEmulatedPoison), region->mapped());
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

  // Translates device range [p, p + bytes) for a stream op: it must lie inside
  // one live allocation. `what` names the operand in messages.
  Result<Translated> Translate(const std::byte* p, uint64_t bytes, const char* what,
                               bool allow_freed = false) {
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

  // Checks that host range [p, p + bytes) is not device memory (which would
  // fault on the worker).
  Status CheckHost(const std::byte* p, uint64_t bytes, const char* what) {
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

  void AddPinned(uint64_t bytes) {
    std::lock_guard lock(mu_);
    ++pinned_count_;
    pinned_bytes_ += bytes;
  }
  void RemovePinned(uint64_t bytes) {
    std::lock_guard lock(mu_);
    --pinned_count_;
    pinned_bytes_ -= bytes;
  }

  uint64_t FreeBytes() {
    std::lock_guard lock(mu_);
    return memory_bytes_ - live_bytes_;
  }

  EmulatedDeviceCounts Counts() {
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

 private:
  struct Entry {
    std::shared_ptr<Region> region;
    bool freed = false;
  };

  // The allocation whose mapping holds `p`, or null.
  const Entry* FindLocked(const std::byte* p) const {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = regions_.upper_bound(addr);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (addr - it->first >= it->second.region->mapped()) return nullptr;
    return &it->second;
  }

  const std::shared_ptr<Arena> arena_;
  const uint64_t memory_bytes_;
  const uint64_t quarantine_limit_;
  const double copy_bytes_per_second_;
  std::mutex bus_mu_;
  std::chrono::steady_clock::time_point bus_free_;  // Guarded by bus_mu_.
  const double copy_latency_seconds_;
  const bool discard_copies_;
  const std::string identity_;

  std::mutex mu_;
  std::map<uintptr_t, Entry> regions_;              // Live and quarantined, by device address.
  std::deque<std::shared_ptr<Region>> quarantine_;  // Oldest first.
  uint64_t live_bytes_ = 0;
  uint64_t live_count_ = 0;
  uint64_t quarantined_bytes_ = 0;
  uint64_t pinned_count_ = 0;
  uint64_t pinned_bytes_ = 0;
  uint64_t imported_count_ = 0;
  uint64_t imported_bytes_ = 0;
};

// Device memory: data() is a device address.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(std::shared_ptr<DeviceState> state, std::shared_ptr<Region> region,
               uint64_t accounted)
      : state_(std::move(state)), region_(std::move(region)), accounted_(accounted) {
    data_ = region_->device();
    size_ = region_->size();
  }
  ~DeviceBuffer() override { state_->Free(region_, accounted_); }
  std::byte* host_mapping() const override { return region_->worker(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

 private:
  std::shared_ptr<DeviceState> state_;
  std::shared_ptr<Region> region_;
  uint64_t accounted_;
};

// "Pinned" memory: an ordinary private anonymous mapping, counted.
class PinnedBuffer final : public Buffer {
 public:
  static Result<std::shared_ptr<Buffer>> Allocate(std::shared_ptr<DeviceState> state,
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
  ~PinnedBuffer() override {
    ::munmap(data_, mapped_);
    state_->RemovePinned(size_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

 private:
  PinnedBuffer(std::shared_ptr<DeviceState> state, std::byte* data, uint64_t bytes, uint64_t mapped)
      : state_(std::move(state)), mapped_(mapped) {
    data_ = data;
    size_ = bytes;
  }
  std::shared_ptr<DeviceState> state_;
  uint64_t mapped_;
};

// What an event knows; shared with the stream ops that complete it.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // Generation of the last Record().
  uint64_t completed = 0;  // Highest generation completed.
  double completed_at = 0;
  Status status;
};

class EmulatedEvent final : public DeviceEvent {
 public:
  EmulatedEvent() : state_(std::make_shared<EventState>()) {}

  Status Synchronize() override {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->completed >= state_->recorded; });
    return state_->status;
  }
  bool Done() override {
    std::lock_guard lock(state_->mu);
    return state_->completed >= state_->recorded;
  }
  double CompletedAtMicros() override {
    std::lock_guard lock(state_->mu);
    return state_->completed_at;
  }

  // Starts a new generation; returns it and the state to complete.
  std::pair<uint64_t, std::shared_ptr<EventState>> NewRecord() {
    std::lock_guard lock(state_->mu);
    return {++state_->recorded, state_};
  }

 private:
  std::shared_ptr<EventState> state_;
};

// One unit of stream work.
struct Op {
  enum class Kind { kToDevice, kOnDevice, kToHost, kConvert, kDecodeBitmask, kRecord };
  Kind kind = Kind::kRecord;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  uint64_t dst_bytes = 0;
  uint64_t src_bytes = 0;
  Dtype to = Dtype::kU8;
  Dtype from = Dtype::kU8;
  uint64_t count = 0;  // Elements to convert; non-zeros to decode.
  uint64_t generation = 0;
  std::shared_ptr<EventState> event = nullptr;
  // DecodeBitmask: src is the values (src_bytes), dst the output (dst_bytes).
  const uint8_t* bitmask = nullptr;
  const int64_t* row_offsets = nullptr;
  sparse::BitmaskShape shape = {};
};

// Bytes of `count` elements of `dtype`; false when they overflow or do not
// fill whole bytes.
bool RangeBytes(Dtype dtype, uint64_t count, uint64_t* out) {
  uint64_t bits = 0;
  if (!CheckedMul(count, static_cast<uint64_t>(DtypeBits(dtype)), &bits) || bits % 8 != 0)
    return false;
  *out = bits / 8;
  return true;
}

class EmulatedStream final : public DeviceStream {
 public:
  explicit EmulatedStream(std::shared_ptr<DeviceState> device)
      : device_(std::move(device)), worker_([this] { Work(); }) {}

  ~EmulatedStream() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // The worker finishes what was enqueued first.
  }
  EmulatedStream(const EmulatedStream&) = delete;
  EmulatedStream& operator=(const EmulatedStream&) = delete;

  Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToDevice", dst, src, bytes));
    return Enqueue(Op{.kind = Op::Kind::kToDevice,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = bytes,
                      .src_bytes = bytes});
  }

  Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyOnDevice", dst, src, bytes));
    if (Overlap(dst, bytes, src, bytes)) {
      return InvalidArgumentError("CopyOnDevice: destination " + RangeText(dst, bytes) +
                                  " overlaps source " + RangeText(src, bytes));
    }
    return Enqueue(Op{.kind = Op::Kind::kOnDevice,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = bytes,
                      .src_bytes = bytes});
  }

  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToHost", dst, src, bytes));
    return Enqueue(Op{
        .kind = Op::Kind::kToHost, .dst = dst, .src = src, .dst_bytes = bytes, .src_bytes = bytes});
  }

  Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                 uint64_t count) override {
    if (dst == nullptr || src == nullptr) return InvalidArgumentError("Convert: null address");
    if (count == 0) return InvalidArgumentError("Convert: zero elements");
    if (!convert::ConversionSupported(from, to)) {
      return InvalidArgumentError("Convert: no conversion from " + std::string(DtypeName(from)) +
                                  " to " + std::string(DtypeName(to)));
    }
    uint64_t dst_bytes = 0;
    uint64_t src_bytes = 0;
    uint64_t end = 0;
    if (!RangeBytes(to, count, &dst_bytes) || !RangeBytes(from, count, &src_bytes) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(dst), dst_bytes, &end) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(src), src_bytes, &end)) {
      return InvalidArgumentError("Convert: " + std::to_string(count) + " " +
                                  std::string(DtypeName(from)) +
                                  " elements are not whole bytes or wrap around the address space");
    }
    if (Overlap(dst, dst_bytes, src, src_bytes)) {
      return InvalidArgumentError("Convert: destination " + RangeText(dst, dst_bytes) +
                                  " overlaps source " + RangeText(src, src_bytes));
    }
    return Enqueue(Op{.kind = Op::Kind::kConvert,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = dst_bytes,
                      .src_bytes = src_bytes,
                      .to = to,
                      .from = from,
                      .count = count});
  }

  Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                       const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                       uint64_t cols, uint32_t elem_bytes) override {
    TL_ASSIGN_OR_RETURN(
        DecodeBitmaskBytes bytes,
        CheckDecodeBitmaskArgs(dst, values, nnz, bitmask, row_offsets, rows, cols, elem_bytes));
    return Enqueue(Op{.kind = Op::Kind::kDecodeBitmask,
                      .dst = dst,
                      .src = values,
                      .dst_bytes = bytes.dst,
                      .src_bytes = bytes.values,
                      .count = nnz,
                      .bitmask = bitmask,
                      .row_offsets = row_offsets,
                      .shape = {.rows = rows, .cols = cols, .elem_bytes = elem_bytes}});
  }

  Status Record(DeviceEvent& event) override {
    auto* emulated = dynamic_cast<EmulatedEvent*>(&event);
    if (emulated == nullptr) {
      return InvalidArgumentError("Record: the event is not from the emulated device");
    }
    auto [generation, state] = emulated->NewRecord();
    return Enqueue(
        Op{.kind = Op::Kind::kRecord, .generation = generation, .event = std::move(state)});
  }

  Status Synchronize() override {
    std::unique_lock lock(mu_);
    const uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
    return error_;
  }

 private:
  Status Enqueue(Op op) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(op));
      ++enqueued_;
    }
    work_cv_.notify_one();
    return Status::Ok();
  }

  // The worker thread: runs the ops in order until stopped and drained.
  void Work() {
    Status sticky;  // The worker's copy of error_.
    for (;;) {
      Op op;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      if (op.kind == Op::Kind::kRecord) {
        Complete(op, sticky);
      } else if (sticky.ok()) {
        sticky = Run(op);
      }
      {
        std::lock_guard lock(mu_);
        if (error_.ok()) error_ = sticky;
        ++finished_;
      }
      done_cv_.notify_all();
    }
  }

  static void Complete(const Op& op, const Status& status) {
    EventState& event = *op.event;
    {
      std::lock_guard lock(event.mu);
      if (op.generation > event.completed) {
        event.completed = op.generation;
        event.completed_at = NowMicros();
        event.status = status;
      }
    }
    event.cv.notify_all();
  }

  Status Run(const Op& op) {
    switch (op.kind) {
      case Op::Kind::kToDevice: {
        const auto start = std::chrono::steady_clock::now();
        TL_RETURN_IF_ERROR(device_->CheckHost(op.src, op.src_bytes, "source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "CopyToDevice destination"));
        if (!device_->discard_copies()) std::memcpy(dst.ptr, op.src, op.dst_bytes);
        // The GPU's copy model (CopyDone; the memcpy above counts toward it).
        std::this_thread::sleep_until(device_->CopyDone(start, op.dst_bytes));
        return Status::Ok();
      }
      case Op::Kind::kOnDevice: {
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "CopyOnDevice source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "CopyOnDevice destination"));
        std::memcpy(dst.ptr, src.ptr, op.dst_bytes);
        return Status::Ok();
      }
      case Op::Kind::kToHost: {
        TL_RETURN_IF_ERROR(device_->CheckHost(op.dst, op.dst_bytes, "destination"));
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "CopyToHost source"));
        std::memcpy(op.dst, src.ptr, op.src_bytes);
        return Status::Ok();
      }
      case Op::Kind::kConvert: {
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "Convert source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "Convert destination"));
        return ConvertOnHost(dst.ptr, op.to, src.ptr, op.from, op.count);
      }
      case Op::Kind::kDecodeBitmask:
        return RunDecodeBitmask(op);
      case Op::Kind::kRecord:
        break;
    }
    return InternalError("emulated stream: unknown op");
  }

  // Runs the CUDA kernel's code (kernels/bitmask_kernel.h) with the warp
  // emulated, row by row. An encoding that was not validated, which the GPU
  // would decode out of bounds, fails the stream here instead.
  Status RunDecodeBitmask(const Op& op) {
    const sparse::BitmaskShape& shape = op.shape;
    TL_ASSIGN_OR_RETURN(Translated mask,
                        device_->Translate(reinterpret_cast<const std::byte*>(op.bitmask),
                                           shape.mask_bytes(), "DecodeBitmask bitmask"));
    TL_ASSIGN_OR_RETURN(
        Translated offsets,
        device_->Translate(reinterpret_cast<const std::byte*>(op.row_offsets),
                           shape.rows * sizeof(int64_t), "DecodeBitmask row_offsets"));
    Translated values;
    if (op.count > 0) {
      TL_ASSIGN_OR_RETURN(values, device_->Translate(op.src, op.src_bytes, "DecodeBitmask values"));
    }
    TL_ASSIGN_OR_RETURN(Translated dst,
                        device_->Translate(op.dst, op.dst_bytes, "DecodeBitmask destination"));
    const auto* bitmask = reinterpret_cast<const uint8_t*>(mask.ptr);
    const auto* row_offsets = reinterpret_cast<const int64_t*>(offsets.ptr);
    if (Status s = sparse::Validate(bitmask, row_offsets, shape, op.count); !s.ok()) {
      return s.WithContext("DecodeBitmask (an encoding not validated on the host)");
    }
    switch (shape.elem_bytes) {
      case 1:
        DecodeRowsEmulated<1>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      case 2:
        DecodeRowsEmulated<2>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      case 4:
        DecodeRowsEmulated<4>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      default:
        DecodeRowsEmulated<8>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
    }
    return Status::Ok();
  }

  template <uint32_t W>
  static void DecodeRowsEmulated(const std::byte* values, const uint8_t* bitmask,
                                 const int64_t* row_offsets, const sparse::BitmaskShape& shape,
                                 std::byte* dst) {
    const uint64_t mrow = shape.mask_row_bytes();
    for (uint64_t r = 0; r < shape.rows; ++r) {
      sparse::kernel::DecodeRowEmulated<W>(bitmask + r * mrow, shape.cols,
                                           values + static_cast<uint64_t>(row_offsets[r]) * W,
                                           dst + r * shape.cols * W);
    }
  }

  std::shared_ptr<DeviceState> device_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // The worker waits for ops or stopping_.
  std::condition_variable done_cv_;  // Synchronize() waits for finished_.
  std::deque<Op> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  Status error_;        // The first error; sticky.
  std::thread worker_;  // Last: started once the members above exist.
};

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(std::shared_ptr<DeviceState> state) : state_(std::move(state)) {}

  DeviceType kind() const override { return DeviceType::kEmulated; }
  int ordinal() const override { return 0; }
  std::string name() const override { return "emulated:0"; }
  int dlpack_device_type() const override { return kDlpackExtDev; }

  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override {
    if (bytes > state_->memory_bytes()) {
      return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory: the device has " +
                                    std::to_string(state_->memory_bytes()));
    }
    const uint64_t accounted = RoundUp(bytes, kDeviceAlign);
    TL_RETURN_IF_ERROR(state_->Reserve(bytes, accounted));
    Result<std::shared_ptr<Region>> region = Region::Create(bytes, state_->arena());
    if (!region.ok()) {
      state_->Unreserve(accounted);
      return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory: " + region.status().message());
    }
    std::shared_ptr<Buffer> buffer(new (std::nothrow) DeviceBuffer(state_, *region, accounted));
    if (!buffer) {
      state_->Unreserve(accounted);
      return ResourceExhaustedError("out of memory");
    }
    // Registered last: from here the buffer's destructor frees it.
    state_->AddLive(std::move(*region));
    return buffer;
  }

  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return PinnedBuffer::Allocate(state_, bytes);
  }

  Result<std::unique_ptr<DeviceStream>> CreateStream() override {
    std::unique_ptr<DeviceStream> stream(new (std::nothrow) EmulatedStream(state_));
    if (!stream) return ResourceExhaustedError("out of memory");
    return stream;
  }

  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    std::unique_ptr<DeviceEvent> event(new (std::nothrow) EmulatedEvent());
    if (!event) return ResourceExhaustedError("out of memory");
    return event;
  }

  Result<uint64_t> FreeMemory() override { return state_->FreeBytes(); }

  Result<std::byte*> HostMapping(const std::byte* p, uint64_t bytes) override {
    TL_ASSIGN_OR_RETURN(Translated t, state_->Translate(p, bytes, "emulated:0: memory"));
    return t.ptr;
  }

  std::string identity() const override { return state_->identity(); }

  Result<ExportedMemory> Export(const Buffer& buffer) override {
    TL_ASSIGN_OR_RETURN(Translated t,
                        state_->Translate(buffer.data(), buffer.size(), "emulated:0: Export"));
    if (t.hold->device() != buffer.data() || t.hold->size() != buffer.size()) {
      return InvalidArgumentError("emulated:0: Export " + RangeText(buffer.data(), buffer.size()) +
                                  " is not a whole allocation " +
                                  RangeText(t.hold->device(), t.hold->size()));
    }
    ExportedMemory out;
    TL_ASSIGN_OR_RETURN(out.fd, t.hold->Share());
    out.device_id = state_->identity();
    out.bytes = buffer.size();
    out.pid = ::getpid();
    return out;
  }

  Result<std::shared_ptr<Buffer>> Import(ExportedMemory memory) override {
    if (memory.device_id != state_->identity()) {
      return InvalidArgumentError("emulated:0: memory of device '" + memory.device_id +
                                  "' cannot be mapped here: this device is '" + state_->identity() +
                                  "'");
    }
    if (memory.fd < 0) return InvalidArgumentError("emulated:0: imported memory has no memfd");
    TL_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                        Region::Import(std::exchange(memory.fd, -1), memory.bytes));
    std::shared_ptr<Buffer> buffer(new (std::nothrow) DeviceBuffer(state_, region, 0));
    if (!buffer) return ResourceExhaustedError("out of memory");
    state_->AddLive(std::move(region));
    return buffer;
  }

  DeviceState& state() { return *state_; }

 private:
  std::shared_ptr<DeviceState> state_;
};

}  // namespace

std::shared_ptr<Device> MakeEmulatedDeviceWithQuarantine(const EmulatedDeviceOptions& options,
                                                         uint64_t quarantine_bytes) {
  std::shared_ptr<Arena> arena;
  if (options.prefault_bytes > 0) {
    // Without it, allocations get fresh memory: slower, not wrong.
    Result<std::shared_ptr<Arena>> made =
        Arena::Create(std::min(options.prefault_bytes, options.memory_bytes));
    if (made.ok()) arena = std::move(made).value();
  }
  return std::make_shared<EmulatedDevice>(
      std::make_shared<DeviceState>(options, quarantine_bytes, std::move(arena)));
}

std::shared_ptr<Device> MakeEmulatedDevice(const EmulatedDeviceOptions& options) {
  return MakeEmulatedDeviceWithQuarantine(options, kEmulatedQuarantineBytes);
}

Result<EmulatedDeviceCounts> GetEmulatedDeviceCounts(Device& device) {
  auto* emulated = dynamic_cast<EmulatedDevice*>(&device);
  if (emulated == nullptr)
    return InvalidArgumentError(device.name() + " is not an emulated device");
  return emulated->state().Counts();
}

Status PeekEmulatedDevice(Device& device, std::byte* dst, const std::byte* src, uint64_t bytes) {
  auto* emulated = dynamic_cast<EmulatedDevice*>(&device);
  if (emulated == nullptr)
    return InvalidArgumentError(device.name() + " is not an emulated device");
  if (dst == nullptr || src == nullptr || bytes == 0) {
    return InvalidArgumentError("PeekEmulatedDevice: null address or zero bytes");
  }
  TL_ASSIGN_OR_RETURN(Translated from,
                      emulated->state().Translate(src, bytes, "peek source", true));
  std::memcpy(dst, from.ptr, bytes);
  return Status::Ok();
}

}  // namespace tensorlift
