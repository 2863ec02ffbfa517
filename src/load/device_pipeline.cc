// The staged pipeline: GPU loads (and loads that convert dtypes). Per file:
// choose the mode, plan (device_plan.h); then one pipeline over all files'
// blocks: R reader threads (StagingReaders: by default one per CPU, 4 to 16,
// with 2R slots; N - 1 for staging_buffers N) each take the next block in load
// order and any free pinned slot, so that R reads are in flight whatever
// order they finish in; the loading thread enqueues each block's copies (and conversions) on
// one of two streams as soon as its read completes (out of order) and records
// the slot's event; a slot goes back to the readers when its event is done
// (queried, or waited for only when no slot is free). Device memory is
// planned and checked against the free memory before anything is allocated
// or read. Each pinned slot is taken by the reader that first reads into it,
// from a per-process pool (PinnedPool), so that a second load pays no pinned
// allocation, else allocated then (pinning overlaps the other reads).
#include "load/device_pipeline.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/checked_math.h"
#include "device/device.h"
#include "io/direct_reader.h"
#include "io/page_cache.h"
#include "io/read_op.h"
#include "load/checkpoint_builder.h"
#include "load/device_plan.h"
#include "load/file_job.h"
#include "load/owners.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

using Clock = std::chrono::steady_clock;

double NowMicros() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

struct DeviceFileJob : OpenedFile {
  DeviceFilePlan plan;
  std::shared_ptr<Buffer> buffer;  // On the device.
  // Partly in the page cache (auto): each block is read through the page
  // cache when it is cached, with O_DIRECT otherwise (ReadBlock decides).
  bool per_block = false;
};

// Auto's per-block reads (DeviceFileJob::per_block) for a file with between
// these fractions of its wanted bytes in the page cache; below, every block is
// read with O_DIRECT; above, through the page cache.
constexpr double kPerBlockBelow = 0.02;
constexpr double kPerBlockAbove = 0.98;

// The most a block read through the page cache takes (staging_bytes is the
// most for O_DIRECT reads): small enough that the block is still in the CPU's
// cache when it is copied out of its slot. On this project's 2-CPU VM, 2.14 GB
// from the page cache onto the emulated device: 0.22 s with 4 MiB (and 2 MiB)
// blocks, 0.29 s with 16 MiB.
constexpr uint64_t kCachedBlockBytes = 4ull << 20;

struct BlockRef {
  uint32_t file = 0;
  uint32_t block = 0;
};

// Fails for options the pipeline does not take: staging_buffers outside
// [0, 64], or a dtype it does not convert to.
Status CheckOptions(const LoadOptions& options) {
  if (options.staging_buffers < 0 || options.staging_buffers > 64) {
    return InvalidArgumentError(
        "staging_buffers must be between 1 and 64 (or 0: by CPU count), not " +
        std::to_string(options.staging_buffers));
  }
  if (options.dtype && *options.dtype != Dtype::kF32 && *options.dtype != Dtype::kF16 &&
      *options.dtype != Dtype::kBF16) {
    return InvalidArgumentError("cannot convert to " + std::string(DtypeName(*options.dtype)) +
                                " (the targets are F32, F16 and BF16)");
  }
  return Status::Ok();
}

// Pinned staging memory kept from one load to the next (ReleasePinnedStaging,
// loader.h). Never destroyed: at exit the process's end frees it, while a
// static destructor could run after the CUDA runtime is gone.
class PinnedPool {
 public:
  static PinnedPool& Get() {
    static PinnedPool* const pool = new PinnedPool;
    return *pool;
  }

  // The smallest kept buffer of `device` of at least `bytes` (a slot's), else
  // a new one.
  Result<std::shared_ptr<Buffer>> Take(const std::shared_ptr<Device>& device, uint64_t bytes) {
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

  // Keeps `buffer` (a slot) for `device`'s next load; frees the smallest
  // beyond kKept.
  void Give(const std::shared_ptr<Device>& device, std::shared_ptr<Buffer> buffer) {
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

  uint64_t Release() {
    std::vector<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(entries_);
    uint64_t bytes = 0;
    for (const Entry& e : dropped) bytes += e.buffer->size();
    return bytes;
  }

 private:
  static constexpr int kKept = 64;  // Buffers (slots) kept a device: as many as a load takes.
  struct Entry {
    std::weak_ptr<Device> device;
    std::shared_ptr<Buffer> buffer;
  };
  // Moves the buffers of devices that are gone to `dropped`.
  void DropExpired(std::vector<Entry>& dropped) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->device.expired()) {
        dropped.push_back(std::move(*it));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace

int StagingSlots(const LoadOptions& options) {
  if (options.staging_buffers > 0) return options.staging_buffers;
  const unsigned cpus = std::thread::hardware_concurrency();
  return 2 * static_cast<int>(std::clamp<unsigned>(cpus == 0 ? 4 : cpus, 4, 16));
}

int StagingReaders(const LoadOptions& options, int slots) {
  if (options.staging_buffers > 0) return std::max(1, slots - 1);
  return std::max(1, slots / 2);
}

uint64_t ReleasePinnedStaging() { return PinnedPool::Get().Release(); }

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
  DevicePipeline(const Checkpoint& ckpt, const LoadOptions& options,
                 const std::shared_ptr<Device>& device, DeviceType type, PipelineTrace* trace)
      : ckpt_(ckpt),
        options_(options),
        device_(device),
        type_(type),
        trace_(trace),
        slots_(StagingSlots(options)),
        readers_(StagingReaders(options, slots_)) {}
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
  // Selects the tensors, opens and plans every file (device_plan.h), and sums
  // what the load needs.
  Status PlanFiles();
  // With `allow_gds`, opens the direct reader (cuFile, or the trace's) and
  // gives it every file; says in the files' reports how they are read, or
  // why not straight to the device (`gds_note`, or what failed).
  void OpenDirectReader(bool allow_gds, const std::string& gds_note);
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

  // PlanFiles, OpenDirectReader, CheckFreeMemory.
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

Result<LoadedCheckpoint> DevicePipeline::Run(const Checkpoint& ckpt, const LoadOptions& options,
                                             const std::shared_ptr<Device>& device, DeviceType type,
                                             PipelineTrace* trace, bool allow_gds,
                                             const std::string& gds_note,
                                             std::string* gds_failure) {
  const auto t0 = Clock::now();
  TL_RETURN_IF_ERROR(CheckOptions(options));
  DevicePipeline p(ckpt, options, device, type, trace);
  TL_RETURN_IF_ERROR(p.PlanFiles());
  p.OpenDirectReader(allow_gds, gds_note);
  TL_RETURN_IF_ERROR(p.CheckFreeMemory());
  TL_RETURN_IF_ERROR(p.Allocate());
  ProgressReporter reporter(options.progress, p.tensor_bytes_);
  TL_ASSIGN_OR_RETURN(const uint64_t bytes_done, p.Transfer(reporter, gds_failure));
  TL_RETURN_IF_ERROR(p.CheckFilesUnchanged());
  reporter.Report(bytes_done, true);
  return p.BuildResult(t0);
}

Status DevicePipeline::PlanFiles() {
  selected_ = SelectTensors(ckpt_, options_.filter, jobs_);
  uint64_t largest_read = 0;
  const IoMode mode = options_.mode == IoMode::kMmap ? IoMode::kBuffered : options_.mode;
  for (auto& job : jobs_) {
    if (job.wanted.empty()) continue;
    Status st = OpenForLoad(job, mode);
    if (!st.ok()) return st.WithContext(job.shard->path);
    if (options_.mode == IoMode::kMmap) {
      job.report.reason = "mmap: read through the page cache into staging buffers";
    }
    if (options_.mode == IoMode::kAuto && job.resident > kPerBlockBelow &&
        job.resident < kPerBlockAbove) {
      // Partly cached: the cached blocks through the page cache, the others
      // with O_DIRECT, planned for O_DIRECT (aligned reads suit both).
      bool direct_open = job.direct.fd() >= 0;
      if (!direct_open) {
        Result<bool> opened = OpenDirect(job);
        if (!opened.ok()) return opened.status().WithContext(job.shard->path);
        direct_open = *opened;
      }
      if (direct_open) {
        job.per_block = true;
        job.report.mode = IoMode::kDirect;
        // The cached blocks' reads must not read ahead into the others: the
        // kernel's readahead would fetch them a window at a time, slower than
        // the O_DIRECT reads in flight (advice only: nothing fails without it).
        (void)::posix_fadvise(job.buffered.fd(), 0, 0, POSIX_FADV_RANDOM);
      }
    }
    const bool direct = job.report.mode == IoMode::kDirect;
    // Reads out of the page cache in smaller blocks: a block is still in the
    // CPU's cache when it is copied out of its slot.
    const uint64_t block =
        direct ? options_.staging_bytes : std::min(options_.staging_bytes, kCachedBlockBytes);
    job.plan = PlanDeviceFile(job.shard->header, job.wanted, options_.dtype, direct, block);
    for (const DeviceBlock& b : job.plan.blocks)
      largest_read = std::max(largest_read, b.read_length);
    job.report.bytes = job.plan.tensor_bytes;
    job.report.tensors = static_cast<uint32_t>(job.wanted.size());
    job.report.realigned = job.plan.realigned;
    job.report.realigned_bytes = job.plan.realigned_bytes;
    job.report.converted = job.plan.converted;
    mem_.device_bytes += job.plan.device_bytes;
    scratch_slot_ = std::max(scratch_slot_, job.plan.scratch_bytes);
    tensor_bytes_ += job.plan.tensor_bytes;
  }
  scratch_slot_ = AlignUp(scratch_slot_, kDeviceAlign);
  // A slot as large as the largest read: a load from the page cache (blocks
  // of 4 MiB) pins a quarter of what O_DIRECT blocks of 16 MiB need, which a
  // process's first load pays for (2.14 GB from the page cache, this VM, the
  // first load of 3 processes each way: 0.18-0.31 s with 16 MiB slots,
  // 0.15-0.19 s with 4 MiB).
  slot_bytes_ = std::min(StagingSlotBytes(options_.staging_bytes),
                         std::max(kDirectAlign, AlignUp(largest_read, kDirectAlign)));
  return Status::Ok();
}

void DevicePipeline::OpenDirectReader(bool allow_gds, const std::string& gds_note) {
  gds_reason_ = gds_note;
  if (allow_gds) {
    Result<std::unique_ptr<DirectReader>> opened = trace_ && trace_->open_direct_reader
                                                       ? trace_->open_direct_reader()
                                                       : OpenCuFileReader(jobs_.size());
    if (opened.ok()) {
      gds_ = std::move(opened).value();
      for (uint32_t f = 0; f < jobs_.size() && gds_; ++f) {
        if (jobs_[f].wanted.empty()) continue;
        const int fd = jobs_[f].direct.fd() >= 0 ? jobs_[f].direct.fd() : jobs_[f].buffered.fd();
        Status st = gds_->AddFile(f, fd);
        if (!st.ok()) {
          gds_reason_ = "GDS refused " + jobs_[f].shard->path + ": " + st.message();
          gds_.reset();
        }
      }
    } else {
      gds_reason_ = "GDS unavailable: " + opened.status().message();
    }
  }
  for (auto& job : jobs_) {
    if (job.wanted.empty()) continue;
    job.report.gds = gds_ != nullptr;
    const std::string how = gds_                  ? "read straight to the device (GDS)"
                            : gds_reason_.empty() ? ""
                                                  : gds_reason_ + "; pinned staging instead";
    if (!how.empty()) job.report.reason += (job.report.reason.empty() ? "" : "; ") + how;
  }
}

Status DevicePipeline::CheckFreeMemory() {
  mem_.scratch_bytes = scratch_slot_ * static_cast<uint64_t>(slots_);
  mem_.pinned_bytes = gds_ ? 0 : slot_bytes_ * static_cast<uint64_t>(slots_);
  TL_ASSIGN_OR_RETURN(uint64_t free_bytes, device_->FreeMemory());
  const uint64_t need = mem_.device_bytes + mem_.scratch_bytes;
  if (need > free_bytes) {
    return ResourceExhaustedError(
        "the load needs " + std::to_string(need) + " bytes of memory on " + device_->name() +
        " (tensors " + std::to_string(mem_.device_bytes) + ", conversion slots " +
        std::to_string(mem_.scratch_bytes) + ") but " + std::to_string(free_bytes) + " are free");
  }
  return Status::Ok();
}

Status DevicePipeline::Allocate() {
  for (uint32_t f = 0; f < jobs_.size(); ++f) {
    auto& job = jobs_[f];
    if (job.wanted.empty()) continue;
    Result<std::shared_ptr<Buffer>> buf = device_->Allocate(job.plan.device_bytes);
    if (!buf.ok()) return buf.status().WithContext(job.shard->path);
    job.buffer = std::move(buf).value();
    for (uint32_t b = 0; b < job.plan.blocks.size(); ++b) blocks_.push_back({f, b});
  }
  read_cached_.assign(blocks_.size(), 0);
  if (mem_.scratch_bytes > 0) {
    TL_ASSIGN_OR_RETURN(scratch_, device_->Allocate(mem_.scratch_bytes));
  }
  if (mem_.pinned_bytes > 0) slot_memory_.resize(slots_);
  if (gds_) {
    // Registration only makes the reads faster; they work without it.
    for (auto& job : jobs_) {
      if (job.buffer) gds_->AddBuffer(job.buffer->data(), job.buffer->size()).IgnoreError();
    }
    if (scratch_) gds_->AddBuffer(scratch_->data(), scratch_->size()).IgnoreError();
  }
  streams_.resize(slots_ >= 3 ? 2 : 1);
  for (auto& s : streams_) {
    TL_ASSIGN_OR_RETURN(s, device_->CreateStream());
  }
  events_.resize(slots_);
  for (auto& e : events_) {
    TL_ASSIGN_OR_RETURN(e, device_->CreateEvent());
  }
  if (trace_) trace_->blocks.assign(blocks_.size(), {});
  return Status::Ok();
}

Result<uint64_t> DevicePipeline::Transfer(ProgressReporter& reporter, std::string* gds_failure) {
  const int64_t nblocks = static_cast<int64_t>(blocks_.size());
  free_slots_.clear();
  for (int slot = slots_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  std::vector<std::thread> readers;
  // Fewer readers than slots: a read that completes finds a spare slot free
  // while its own is copied from (StagingReaders).
  const int nreaders = static_cast<int>(std::min<int64_t>(readers_, nblocks));
  for (int r = 0; r < nreaders; ++r) readers.emplace_back(&DevicePipeline::ReadBlocks, this);
  const uint64_t bytes_done = CopyBlocks(reporter);
  for (auto& t : readers) t.join();
  // The streams may still use the buffers: finish them before they can go.
  Status synced = Status::Ok();
  for (auto& s : streams_) {
    Status st = s->Synchronize();
    if (synced.ok()) synced = std::move(st);
  }
  if (failed_) {
    if (gds_failed_ && gds_failure) *gds_failure = error_.message();
    return error_;
  }
  if (!synced.ok()) return synced;
  if (trace_) {
    for (const SlotBlock& c : copying_) {
      trace_->blocks[c.block].copied_us = events_[c.slot]->CompletedAtMicros();
    }
  }
  return bytes_done;
}

void DevicePipeline::ReadBlocks() {
  const int64_t nblocks = static_cast<int64_t>(blocks_.size());
  for (;;) {
    SlotBlock b;
    bool took_the_last = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return failed_ || next_block_ >= nblocks || !free_slots_.empty(); });
      if (failed_ || next_block_ >= nblocks) return;
      b = {next_block_++, free_slots_.back()};
      free_slots_.pop_back();
      took_the_last = free_slots_.empty();
    }
    // The loading thread waits for copies to free slots only when none is
    // free: tell it when that happens.
    if (took_the_last) cv_.notify_all();
    Status st = ReadBlock(b.block, b.slot);
    if (!st.ok()) return Fail(st.WithContext(jobs_[blocks_[b.block].file].shard->path));
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_.push_back(b);
    }
    cv_.notify_all();
  }
}

bool DevicePipeline::Recycle(bool wait) {
  if (wait && !copying_.empty()) {
    Status st = events_[copying_.front().slot]->Synchronize();
    if (!st.ok()) {
      Fail(std::move(st));
      return false;
    }
  }
  // Every done slot, in whatever order the streams finished them.
  std::vector<int> freed;
  for (auto it = copying_.begin(); it != copying_.end();) {
    if (!events_[it->slot]->Done()) {
      ++it;
      continue;
    }
    Status st = events_[it->slot]->Synchronize();  // Done: returns at once, with its error.
    if (!st.ok()) {
      Fail(std::move(st));
      return false;
    }
    if (trace_) trace_->blocks[it->block].copied_us = events_[it->slot]->CompletedAtMicros();
    freed.push_back(it->slot);
    it = copying_.erase(it);
  }
  if (!freed.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_slots_.insert(free_slots_.end(), freed.begin(), freed.end());
    }
    cv_.notify_all();
  }
  return true;
}

Status DevicePipeline::ReadBlock(int64_t k, int slot) {
  const DeviceFileJob& job = jobs_[blocks_[k].file];
  const DeviceBlock& b = job.plan.blocks[blocks_[k].block];
  const double start = trace_ ? NowMicros() : 0;
  if (trace_ && trace_->before_read) TL_RETURN_IF_ERROR(trace_->before_read(k));
  if (gds_) {
    TL_RETURN_IF_ERROR(ReadDirect(blocks_[k].file, b, slot));
  } else {
    bool cached = job.report.mode != IoMode::kDirect;
    if (job.per_block) {
      // A failure to tell only costs the page cache's help.
      Result<double> resident = ResidentFraction(job.buffered.fd(), b.read_offset, b.min_read);
      cached = resident.ok() && *resident >= 0.5;
    }
    const int fd = cached ? job.buffered.fd() : job.direct.fd();
    TL_ASSIGN_OR_RETURN(std::byte* const into, SlotMemory(slot));
    TL_RETURN_IF_ERROR(ReadAtLeast(fd, into, b.read_offset, b.read_length, b.min_read));
    read_cached_[k] = cached;
  }
  if (trace_) {
    trace_->blocks[k].cached = read_cached_[k];
    trace_->blocks[k].read_start_us = start;
    trace_->blocks[k].read_end_us = NowMicros();
    trace_->blocks[k].slot = slot;
  }
  return Status::Ok();
}

Result<std::byte*> DevicePipeline::SlotMemory(int slot) {
  std::shared_ptr<Buffer>& mem = slot_memory_[slot];
  if (!mem) {
    TL_ASSIGN_OR_RETURN(mem, type_ == DeviceType::kCpu
                                 ? device_->AllocatePinned(slot_bytes_)
                                 : PinnedPool::Get().Take(device_, slot_bytes_));
  }
  return mem->data();
}

Status DevicePipeline::ReadDirect(uint32_t file, const DeviceBlock& block, int slot) {
  for (const BlockCopy& c : block.copies) {
    std::byte* base = c.convert ? scratch_->data() : jobs_[file].buffer->data();
    const uint64_t offset = c.convert ? slot * scratch_slot_ + c.scratch_offset : c.dst_offset;
    Status st = gds_->Read(file, base, offset, c.bytes, block.read_offset + c.slot_offset);
    if (!st.ok()) {
      gds_failed_ = true;
      return st;
    }
  }
  return Status::Ok();
}

uint64_t DevicePipeline::CopyBlocks(ProgressReporter& reporter) {
  uint64_t bytes_done = 0;
  const int64_t nblocks = static_cast<int64_t>(blocks_.size());
  int64_t enqueued = 0;
  std::vector<SlotBlock> batch;
  while (enqueued < nblocks) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A block read, or every slot taken while some copy may free one.
      cv_.wait(lock, [&] {
        return failed_ || !read_.empty() || (free_slots_.empty() && !copying_.empty());
      });
      if (failed_) break;
      batch.swap(read_);
    }
    for (const SlotBlock& b : batch) {
      uint64_t done = 0;
      Status st = EnqueueCopies(b.block, b.slot, &done);
      if (!st.ok()) {
        Fail(st.WithContext(jobs_[blocks_[b.block].file].shard->path));
        return bytes_done;
      }
      if (trace_) {
        trace_->blocks[b.block].enqueued = enqueued;
        trace_->blocks[b.block].stream = static_cast<int>(b.slot % streams_.size());
      }
      ++enqueued;
      bytes_done += done;
      copying_.push_back(b);
    }
    const bool waited_for_a_slot = batch.empty();
    batch.clear();
    if (!Recycle(waited_for_a_slot)) break;
    reporter.Report(bytes_done, false);
  }
  return bytes_done;
}

Status DevicePipeline::EnqueueCopies(int64_t k, int slot, uint64_t* bytes) {
  const DeviceFileJob& job = jobs_[blocks_[k].file];
  const DeviceBlock& b = job.plan.blocks[blocks_[k].block];
  DeviceStream& stream = *streams_[slot % streams_.size()];
  // Read into by now (ReadBlock), unless the reads go straight to the device.
  const std::byte* src = slot_memory_.empty() ? nullptr : slot_memory_[slot]->data();
  std::byte* dst = job.buffer->data();
  std::byte* tmp = scratch_ ? scratch_->data() + slot * scratch_slot_ : nullptr;
  for (const BlockCopy& c : b.copies) {
    // With GDS the bytes are already where they go (or in the conversion slot).
    if (!gds_) {
      std::byte* to = c.convert ? tmp + c.scratch_offset : dst + c.dst_offset;
      TL_RETURN_IF_ERROR(stream.CopyToDevice(to, src + c.slot_offset, c.bytes));
    }
    if (c.convert) {
      TL_RETURN_IF_ERROR(
          stream.Convert(dst + c.dst_offset, c.to, tmp + c.scratch_offset, c.from, c.count));
    }
    *bytes += c.bytes;
  }
  return stream.Record(*events_[slot]);
}

void DevicePipeline::Fail(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) {
    failed_ = true;
    error_ = std::move(st);
  }
  cv_.notify_all();
}

Status DevicePipeline::CheckFilesUnchanged() const {
  for (const auto& job : jobs_) {
    if (job.wanted.empty()) continue;
    Status st = CheckUnchanged(job);
    if (!st.ok()) return st.WithContext(job.shard->path);
  }
  return Status::Ok();
}

Result<LoadedCheckpoint> DevicePipeline::BuildResult(Clock::time_point t0) {
  CheckpointBuilder out;
  out.device_plan() = mem_;
  out.set_device(device_);
  out.Reserve(selected_.size());
  // Each file's tensor plans, by index in its header.
  std::vector<std::vector<const DeviceTensorPlan*>> placed(jobs_.size());
  for (size_t s = 0; s < jobs_.size(); ++s) {
    placed[s].assign(ckpt_.shards()[s].header.tensors().size(), nullptr);
    for (const auto& pt : jobs_[s].plan.tensors) placed[s][pt.index] = &pt;
  }
  for (auto loc : selected_) {
    const DeviceFileJob& job = jobs_[loc.shard];
    const TensorInfo& info = ckpt_.info(loc);
    const DeviceTensorPlan* pt = placed[loc.shard][loc.index];
    LoadedTensor t = MakeTensor(info, pt->dtype, job.buffer->data() + pt->offset, pt->bytes);
    t.device = type_;
    t.device_index = device_->ordinal();
    out.Add(std::move(t), job.buffer);
  }
  // Per-block files: how many bytes each way.
  std::vector<uint64_t> cached_bytes(jobs_.size(), 0);
  for (size_t k = 0; k < blocks_.size(); ++k) {
    if (read_cached_[k]) {
      cached_bytes[blocks_[k].file] +=
          jobs_[blocks_[k].file].plan.blocks[blocks_[k].block].min_read;
    }
  }
  for (size_t f = 0; f < jobs_.size(); ++f) {
    auto& job = jobs_[f];
    if (job.wanted.empty()) continue;
    job.report.engine = IoEngine::kThreads;
    if (job.per_block) {
      uint64_t total = 0;
      for (const DeviceBlock& b : job.plan.blocks) total += b.min_read;
      job.report.reason += ": per block, the cached ones through the page cache (" +
                           std::to_string(cached_bytes[f]) + " of " + std::to_string(total) +
                           " bytes), the rest with O_DIRECT";
    }
    out.files().push_back(std::move(job.report));
  }
  return std::move(out).Finish(std::chrono::duration<double>(Clock::now() - t0).count());
}

Result<LoadedCheckpoint> LoadThroughDevice(const Checkpoint& checkpoint, const LoadOptions& options,
                                           const std::shared_ptr<Device>& device,
                                           PipelineTrace* trace) {
  const DeviceType type = device->kind();
  // GDS only for CUDA devices (or a test's reader), and only when asked.
  const bool allow_gds =
      options.gds && (device->kind() == DeviceType::kCuda || (trace && trace->open_direct_reader));
  std::string gds_failure;
  auto got =
      DevicePipeline::Run(checkpoint, options, device, type, trace, allow_gds, "", &gds_failure);
  if (got.ok() || gds_failure.empty()) return got;
  // A GDS read failed: everything of that attempt is freed; load again
  // through pinned staging at once, saying why.
  if (trace) trace->blocks.clear();
  return DevicePipeline::Run(checkpoint, options, device, type, trace, false,
                             "GDS failed during the load (" + gds_failure + ")", nullptr);
}

}  // namespace tensorlift
