#include "device/populate.h"

#include <sys/mman.h>

#include <algorithm>

#include "device/host_buffer.h"

namespace tensorlift {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14.
#endif

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14.
#endif

PopulateAhead::PopulateAhead(const std::vector<Region>& regions, int threads) {
  uint64_t total = 0;
  for (const Region& r : regions) {
    const uint64_t size = r.bytes / kPageAlign * kPageAlign;
    for (uint64_t off = 0; off < size; off += kStep) {
      steps_.push_back({r.base + off, std::min(kStep, size - off), r.read});
    }
    total += size;
  }
  if (total < (64ull << 20) || threads <= 0) return;
  threads = std::min<int>(threads, static_cast<int>(steps_.size()));
  for (int t = 0; t < threads; ++t) {
    threads_.emplace_back([this] {
      go_.wait(false, std::memory_order_acquire);
      for (;;) {
        if (stop_.load(std::memory_order_relaxed)) return;
        const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
        if (i >= steps_.size()) return;
        const Step& s = steps_[i];
        // A kernel without the advice fails it at once: the other steps of its kind are skipped.
        std::atomic<bool>& failed = s.read ? failed_read_ : failed_write_;
        if ((!s.read && stop_fresh_.load(std::memory_order_relaxed)) ||
            failed.load(std::memory_order_relaxed)) {
          continue;
        }
        if (::madvise(s.base, s.size, s.read ? MADV_POPULATE_READ : MADV_POPULATE_WRITE) != 0)
          failed = true;
      }
    });
  }
  go_.store(true, std::memory_order_release);
  go_.notify_all();
}

PopulateAhead::~PopulateAhead() {
  stop_ = true;
  go_.store(true, std::memory_order_release);
  go_.notify_all();
  Finish();
}

void PopulateAhead::Finish() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

// Fresh memory's first touch scales with threads on the machines measured
// (docs/performance-load.md): 2 threads fault it in 2x as fast as one.
int FaultThreadCount(int requested) {
  if (requested != 0) return requested;
  const unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(n, 2, 4));
}

}  // namespace tensorlift
