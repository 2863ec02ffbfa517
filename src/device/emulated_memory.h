// The memory of the host-emulated device (private to device/; how it works
// is in emulated_device.h): worker memory faulted in ahead (Arena), one
// allocation's two mappings (Region), the state a device shares with its
// buffers, streams and events (DeviceState: the table of allocations, the
// quarantine, the copy model), and the device's and pinned buffers.
//
// Ownership: the device, its buffers, streams and events share one
// DeviceState, so each may outlive the others. A Region is held by the table
// of allocations and by every stream op that is using it, so freeing memory
// under running work (a caller's bug) is reported, never a crash of the
// worker.
#ifndef TENSORLIFT_DEVICE_EMULATED_MEMORY_H_
#define TENSORLIFT_DEVICE_EMULATED_MEMORY_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "device/device.h"
#include "device/emulated_counts.h"
#include "tensorlift/status.h"

namespace tensorlift::emulated {

inline uint64_t RoundUp(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

// "[0x7f..., +N bytes)".
std::string RangeText(const void* p, uint64_t bytes);

// Worker memory faulted in once, when the device is made
// (EmulatedDeviceOptions::prefault_bytes), that allocations are carved from
// (best fit, page granular, neighbours merged when given back): a GPU's
// memory exists before a load, while fresh host memory costs a page fault
// and the zeroing of every page (in a VM, the host's first touch too), which
// would dominate a load here. Allocations that do not fit get fresh memory.
class Arena {
 public:
  static Result<std::shared_ptr<Arena>> Create(uint64_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` (page aligned) of the arena, or null when no free range fits.
  std::byte* Take(uint64_t bytes);
  void Give(std::byte* p, uint64_t bytes);

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
  static Result<std::shared_ptr<Region>> Create(uint64_t bytes, std::shared_ptr<Arena> arena);

  // The memory of memfd `fd` (taken, closed on failure too), exported by
  // Share in this or another process, holding at least `bytes`.
  static Result<std::shared_ptr<Region>> Import(int fd, uint64_t bytes);

  ~Region();
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
  Result<int> Share();

  // Gives an exported allocation fresh private memory at its worker address
  // (importers keep the shared bytes); true when the worker memory is this
  // process's own (never shared, or detached), so that it may be poisoned.
  bool Detach();

 private:
  Region() = default;

  // A region of `bytes` with its PROT_NONE device address reserved.
  static Result<std::shared_ptr<Region>> Reserve(uint64_t bytes);

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
              std::shared_ptr<Arena> arena);

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
                                                 uint64_t bytes);

  // Reserves `accounted` bytes of device memory.
  Status Reserve(uint64_t bytes, uint64_t accounted);

  void Unreserve(uint64_t accounted) {
    std::lock_guard lock(mu_);
    live_bytes_ -= accounted;
  }

  void AddLive(std::shared_ptr<Region> region);

  // Called when the last owner drops a device buffer: poisons the region and
  // quarantines it (or unmaps it, when it is larger than the quarantine).
  // Imported memory is another process's: never poisoned, unmapped when the
  // last stream op holding it is done.
  void Free(const std::shared_ptr<Region>& region, uint64_t accounted);

  // Translates device range [p, p + bytes) for a stream op: it must lie inside
  // one live allocation. `what` names the operand in messages.
  Result<Translated> Translate(const std::byte* p, uint64_t bytes, const char* what,
                               bool allow_freed = false);

  // Checks that host range [p, p + bytes) is not device memory (which would
  // fault on the worker).
  Status CheckHost(const std::byte* p, uint64_t bytes, const char* what);

  void AddPinned(uint64_t bytes);
  void RemovePinned(uint64_t bytes);

  uint64_t FreeBytes() {
    std::lock_guard lock(mu_);
    return memory_bytes_ - live_bytes_;
  }

  EmulatedDeviceCounts Counts();

 private:
  struct Entry {
    std::shared_ptr<Region> region;
    bool freed = false;
  };

  // The allocation whose mapping holds `p`, or null.
  const Entry* FindLocked(const std::byte* p) const;

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
                                                  uint64_t bytes);
  ~PinnedBuffer() override;
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

}  // namespace tensorlift::emulated

#endif  // TENSORLIFT_DEVICE_EMULATED_MEMORY_H_
