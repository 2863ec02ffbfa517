// Faulting host memory in ahead of its use, on helper threads: fresh memory
// about to be written by reads, and the page tables of file mappings about to
// be read (docs/loading.md, "Memory"). Used by the loader and peer loading.
#ifndef TENSORLIFT_DEVICE_POPULATE_H_
#define TENSORLIFT_DEVICE_POPULATE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace tensorlift {

// The number of fault threads for a requested count: the request when not 0
// (negative: none), else the CPU count, at least 2 and at most 4.
int FaultThreadCount(int requested);

// Faults memory regions in on helper threads, ahead of the reads that will
// fill them, 32 MiB at a time and in order (the threads take the steps in
// turn). Advisory: on kernels without MADV_POPULATE_WRITE/READ (5.14) it stops
// at once and the pages come in by faults on first touch. Fewer than 64 MiB in
// all, or no threads: nothing.
//
// Its threads are all started before any of them populates: a thread's start
// maps its stack, which waits for the mmap lock that a populate step holds
// (tens of ms each on the 2-CPU machine measured, during which no read was
// submitted; CHANGELOG.md, 2026-11-26).
class PopulateAhead {
 public:
  struct Region {
    std::byte* base;
    uint64_t bytes;
    // false: fresh memory about to be written (MADV_POPULATE_WRITE), skipped once
    // StopFresh is called; true: views of the page cache (MADV_POPULATE_READ), which
    // Finish waits for.
    bool read = false;
  };
  PopulateAhead(const std::vector<Region>& regions, int threads);
  ~PopulateAhead();  // Stops everything, then joins.
  // The reads are done: the fresh-memory steps not yet taken are skipped.
  void StopFresh() { stop_fresh_ = true; }
  // Waits until every step not skipped is done (or a madvise failed: the pages
  // then come in by faults on first touch, as without populating).
  void Finish();
  PopulateAhead(const PopulateAhead&) = delete;
  PopulateAhead& operator=(const PopulateAhead&) = delete;

 private:
  struct Step {
    std::byte* base;
    uint64_t size;
    bool read;
  };
  static constexpr uint64_t kStep = 32ull << 20;
  std::vector<Step> steps_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> go_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_fresh_{false};
  std::atomic<bool> failed_read_{false}, failed_write_{false};
  std::vector<std::thread> threads_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_POPULATE_H_
