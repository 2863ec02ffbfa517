// Pinned staging memory kept from one load to the next, for the staged
// pipeline onto a device (device_pipeline.h): a load's slots go back to the
// pool, and the next load onto the same device takes them instead of pinning
// new memory. ReleasePinnedStaging (include/tensorlift/loader.h) empties it.
#ifndef TENSORLIFT_LOAD_PINNED_POOL_H_
#define TENSORLIFT_LOAD_PINNED_POOL_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "device/device.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Pinned staging memory kept from one load to the next (ReleasePinnedStaging,
// loader.h). Never destroyed: at exit the process's end frees it, while a
// static destructor could run after the CUDA runtime is gone. Thread-safe.
class PinnedPool {
 public:
  static PinnedPool& Get();

  // The smallest kept buffer of `device` of at least `bytes` (a slot's), else
  // a new one.
  Result<std::shared_ptr<Buffer>> Take(const std::shared_ptr<Device>& device, uint64_t bytes);

  // Keeps `buffer` (a slot) for `device`'s next load; frees the smallest
  // beyond kKept.
  void Give(const std::shared_ptr<Device>& device, std::shared_ptr<Buffer> buffer);

  // Frees every kept buffer; returns their bytes.
  uint64_t Release();

 private:
  static constexpr int kKept = 64;  // Buffers (slots) kept a device: as many as a load takes.
  struct Entry {
    std::weak_ptr<Device> device;
    std::shared_ptr<Buffer> buffer;
  };
  // Moves the buffers of devices that are gone to `dropped`.
  void DropExpired(std::vector<Entry>& dropped);
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_PINNED_POOL_H_
