// Pinned staging memory kept from one load to the next (pinned_pool.h).
#include "load/pinned_pool.h"

#include <utility>

#include "tensorlift/loader.h"

namespace tensorlift {

PinnedPool& PinnedPool::Get() {
  static PinnedPool* const pool = new PinnedPool;
  return *pool;
}

Result<std::shared_ptr<Buffer>> PinnedPool::Take(const std::shared_ptr<Device>& device,
                                                 uint64_t bytes) {
  std::vector<Entry> dropped;  // Freed outside the lock.
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropExpired(dropped);
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->device.lock() == device && it->buffer->size() >= bytes &&
          (best == entries_.end() || it->buffer->size() < best->buffer->size())) {
        best = it;
      }
    }
    if (best != entries_.end()) {
      std::shared_ptr<Buffer> buffer = std::move(best->buffer);
      entries_.erase(best);
      return buffer;
    }
  }
  return device->AllocatePinned(bytes);
}

void PinnedPool::Give(const std::shared_ptr<Device>& device, std::shared_ptr<Buffer> buffer) {
  std::vector<Entry> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  DropExpired(dropped);
  entries_.push_back({device, std::move(buffer)});
  for (;;) {
    auto smallest = entries_.end();
    int kept = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->device.lock() != device) continue;
      ++kept;
      if (smallest == entries_.end() || it->buffer->size() < smallest->buffer->size()) {
        smallest = it;
      }
    }
    if (kept <= kKept) break;
    dropped.push_back(std::move(*smallest));
    entries_.erase(smallest);
  }
}

uint64_t PinnedPool::Release() {
  std::vector<Entry> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  dropped.swap(entries_);
  uint64_t bytes = 0;
  for (const Entry& e : dropped) bytes += e.buffer->size();
  return bytes;
}

void PinnedPool::DropExpired(std::vector<Entry>& dropped) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->device.expired()) {
      dropped.push_back(std::move(*it));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t ReleasePinnedStaging() { return PinnedPool::Get().Release(); }

}  // namespace tensorlift
