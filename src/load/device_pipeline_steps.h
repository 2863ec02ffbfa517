// The staged pipeline's steps and state (DevicePipeline), shared by the files
// that define them: device_pipeline.cc (planning, memory, the result) and
// device_transfer.cc (the reader threads and the copies). Private to load/:
// the entry point is device_pipeline.h's LoadThroughDevice.
#ifndef TENSORLIFT_LOAD_DEVICE_PIPELINE_STEPS_H_
#define TENSORLIFT_LOAD_DEVICE_PIPELINE_STEPS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/direct_reader.h"
#include "load/device_plan.h"
#include "load/file_job.h"
#include "load/pinned_pool.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

struct PipelineTrace;  // device_pipeline.h

// One load through the pipeline: Run makes one and takes it through the steps
// below, in order. The members are declared in the order the steps make them,
// so that they are freed in the reverse order when Run returns, on any path.
// The references are Run's arguments.
class DevicePipeline {
 public:
  // With `allow_gds`, reads go straight to the device when a direct reader
  // opens; a failure of one of its reads fails the load and sets
  // *gds_failure (the caller then runs it again without).
  static Result<LoadedCheckpoint> Run(const Checkpoint& ckpt, const LoadOptions& options,
                                      const std::shared_ptr<Device>& device, DeviceType type,
                                      PipelineTrace* trace, bool allow_gds,
                                      const std::string& gds_note, std::string* gds_failure);

 private:
  using Clock = std::chrono::steady_clock;

  struct DeviceFileJob : OpenedFile {
    DeviceFilePlan plan;
    std::shared_ptr<Buffer> buffer;  // On the device.
    // Partly in the page cache (auto): each block is read through the page
    // cache when it is cached, with O_DIRECT otherwise (ReadBlock decides).
    bool per_block = false;
  };

  struct BlockRef {
    uint32_t file = 0;
    uint32_t block = 0;
  };

  DevicePipeline(const Checkpoint& ckpt, const LoadOptions& options,
                 const std::shared_ptr<Device>& device, DeviceType type, PipelineTrace* trace);
  // The pinned slots go back to the pool: every copy from them is done by now
  // (Transfer finishes the stream on every path).
  ~DevicePipeline() {
    // A host load's device is made for that load alone: nothing to keep.
    if (type_ == DeviceType::kCpu) return;
    for (auto& slot : slot_memory_) {
      if (slot) PinnedPool::Get().Give(device_, std::move(slot));
    }
  }

  // The steps of Run.
  // With `allow_gds`, opens the direct reader (cuFile, the store's, or the
  // trace's), before the plan: its blocks may be larger (BlockBytes).
  void OpenDirectReader(bool allow_gds, const std::string& gds_note);
  // Selects the tensors, opens and plans every file (device_plan.h), and sums
  // what the load needs.
  Status PlanFiles();
  // Gives the direct reader every file; says in the files' reports how they
  // are read, or why not straight to the device (the note given to
  // OpenDirectReader, or what failed).
  Status AttachDirectReader();
  // The memory plan; fails when the device has less free memory than it.
  Status CheckFreeMemory();
  // The files' device buffers, the conversion and staging slots, the stream
  // and the slots' events.
  Status Allocate();
  // Reads and copies every block; returns the bytes copied, once the stream
  // has finished with every buffer.
  Result<uint64_t> Transfer(ProgressReporter& reporter, std::string* gds_failure);
  // Fails when a file changed during the load.
  Status CheckFilesUnchanged() const;
  // The tensors, each owned by its file's device buffer.
  Result<LoadedCheckpoint> BuildResult(Clock::time_point t0);

  // Transfer's reader threads: each takes the next block in load order and a
  // free slot, reads it and hands it to the loading thread, until every
  // block was taken or the load failed.
  void ReadBlocks();
  // The loading thread's: gives back to the readers the slots whose copies
  // completed (on either stream, in any order); with `wait`, first waits for
  // the oldest.
  // False when a copy failed (the load has failed then).
  bool Recycle(bool wait);
  // Block `k` into the staging slot `slot`, or straight to the device.
  Status ReadBlock(int64_t k, int slot);
  // The pinned memory of `slot` (a reader's: the one reading into it).
  Result<std::byte*> SlotMemory(int slot);
  // The bytes of `block`'s copies straight to their place on the device (the
  // file's buffer, or the conversion slot `slot`); a failure sets gds_failed_.
  Status ReadDirect(uint32_t file, const DeviceBlock& block, int slot);
  // Transfer's loading thread: enqueues each block's copies as soon as it is
  // read, in the order the reads complete; returns the bytes they copy.
  uint64_t CopyBlocks(ProgressReporter& reporter);
  // Enqueues the copies (and conversions) of block `k` out of `slot` and
  // records the slot's event; adds the bytes they copy to *bytes.
  Status EnqueueCopies(int64_t k, int slot, uint64_t* bytes);
  // Records the load's first error and wakes every thread.
  void Fail(Status st);

  const Checkpoint& ckpt_;
  const LoadOptions& options_;
  const std::shared_ptr<Device>& device_;
  const DeviceType type_;
  PipelineTrace* const trace_;
  const int slots_;    // Staging (and conversion) slots.
  const int readers_;  // Reader threads (StagingReaders).

  // OpenDirectReader, PlanFiles, AttachDirectReader, CheckFreeMemory.
  std::vector<DeviceFileJob> jobs_;  // By file number.
  std::vector<Checkpoint::Location> selected_;
  uint64_t slot_bytes_ = 0;    // A staging slot: the largest read's bytes, at most staging's.
  uint64_t scratch_slot_ = 0;  // A conversion slot.
  uint64_t tensor_bytes_ = 0;  // Read from the files.
  DeviceMemoryPlan mem_;
  std::string gds_reason_;  // Why not straight to the device.

  // Allocate.
  std::vector<BlockRef> blocks_;  // Every file's blocks, in load order.
  // By block: read through the page cache (written by the block's reader,
  // read once the readers are joined).
  std::vector<uint8_t> read_cached_;
  std::shared_ptr<Buffer> scratch_;
  // Each slot's pinned memory, taken (from the pool, else allocated) by the
  // reader that first reads into the slot: pinning it overlaps the other
  // readers' reads, and a load uses only the slots it needs.
  std::vector<std::shared_ptr<Buffer>> slot_memory_;
  std::atomic<bool> gds_failed_{false};
  // Two streams when there are three slots or more: slot s copies on
  // streams_[s % 2], so that one copy's start-up overlaps another's bytes.
  std::vector<std::unique_ptr<DeviceStream>> streams_;
  std::vector<std::unique_ptr<DeviceEvent>> events_;  // By slot.
  // Set by OpenDirectReader (null: through pinned staging). Declared after
  // the buffers it registers so that it is destroyed first: cuFile
  // deregisters them before they are freed.
  std::unique_ptr<DirectReader> gds_;

  // Transfer: between the reader threads and the loading thread, guarded by
  // mu_ (cv_ wakes both: a slot freed, a block read, a failure).
  struct SlotBlock {
    int64_t block;
    int slot;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_slots_;  // Neither read into nor copied from.
  int64_t next_block_ = 0;       // The next block a reader takes.
  std::vector<SlotBlock> read_;  // Read, copies not yet enqueued.
  Status error_;                 // The first error.
  bool failed_ = false;
  // The loading thread's own: blocks whose copies were enqueued and whose
  // slot's event is not yet seen done, in the order they were enqueued.
  std::deque<SlotBlock> copying_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_DEVICE_PIPELINE_STEPS_H_
