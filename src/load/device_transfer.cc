// The staged pipeline's transfer (DevicePipeline::Transfer, device_pipeline_steps.h):
// R reader threads each take the next block in load order and any free
// pinned slot and read it; the loading thread enqueues each block's copies
// (and conversions) as soon as its read completes and gives a slot back to the
// readers when its event is done.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/clock.h"
#include "format/store_reads.h"
#include "io/page_cache.h"
#include "io/pread.h"
#include "load/device_pipeline.h"
#include "load/device_pipeline_steps.h"

namespace tensorlift {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

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
  } else if (job.store) {
    TL_ASSIGN_OR_RETURN(std::byte* const into, SlotMemory(slot));
    TL_RETURN_IF_ERROR(ReadFromStore(*job.store, job.shard->path, b.read_offset, b.min_read, into));
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
  std::vector<DirectReader::Request> reads;
  reads.reserve(block.copies.size());
  for (const BlockCopy& c : block.copies) {
    std::byte* base = c.convert ? scratch_->data() : jobs_[file].buffer->data();
    const uint64_t offset = c.convert ? slot * scratch_slot_ + c.scratch_offset : c.dst_offset;
    reads.push_back({base, offset, c.bytes, block.read_offset + c.slot_offset});
  }
  Status st = gds_->ReadBatch(file, reads);
  if (!st.ok()) gds_failed_ = true;
  return st;
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

}  // namespace tensorlift
