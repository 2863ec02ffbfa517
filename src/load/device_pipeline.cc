// The staged pipeline: GPU loads (and loads that convert dtypes). Per file:
// choose the mode, plan (device_plan.h), then, for all files' blocks in
// order, N reader threads read block k into pinned slot k mod N while the
// loading thread enqueues the copies (and conversions) of the blocks already
// read on one stream and records the slot's event; a reader waits for that
// event before it reads into the slot again. Device memory is planned and
// checked against the free memory before anything is allocated or read.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "device/device.h"
#include "io/direct_reader.h"
#include "io/read_op.h"
#include "load/checkpoint_builder.h"
#include "load/device_plan.h"
#include "load/file_job.h"
#include "load/loader_internal.h"
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
};

struct BlockRef {
  uint32_t file = 0;
  uint32_t block = 0;
};

}  // namespace

class DevicePipeline {
 public:
  // With `allow_gds`, reads go straight to the device when a direct reader
  // opens; a failure of one of its reads fails the load and sets
  // *gds_failure (the caller then runs it again without).
  static Result<LoadedCheckpoint> Run(const Checkpoint& ckpt, const LoadOptions& options,
                                      const std::shared_ptr<Device>& device, DeviceType type,
                                      PipelineTrace* trace, bool allow_gds, const std::string& gds_note,
                                      std::string* gds_failure);
};

Result<LoadedCheckpoint> DevicePipeline::Run(const Checkpoint& ckpt, const LoadOptions& options,
                                             const std::shared_ptr<Device>& device, DeviceType type,
                                             PipelineTrace* trace, bool allow_gds, const std::string& gds_note,
                                             std::string* gds_failure) {
  const auto t0 = Clock::now();
  if (options.staging_buffers < 1 || options.staging_buffers > 64) {
    return InvalidArgumentError("staging_buffers must be between 1 and 64, not " +
                                std::to_string(options.staging_buffers));
  }
  if (options.dtype && *options.dtype != Dtype::kF32 && *options.dtype != Dtype::kF16 &&
      *options.dtype != Dtype::kBF16) {
    return InvalidArgumentError("cannot convert to " + std::string(DtypeName(*options.dtype)) +
                                " (the targets are F32, F16 and BF16)");
  }

  std::vector<DeviceFileJob> jobs;
  const std::vector<Checkpoint::Location> selected = SelectTensors(ckpt, options.filter, jobs);

  // Open and plan every file; the memory plan.
  const int slots = options.staging_buffers;
  const uint64_t slot_bytes = StagingSlotBytes(options.staging_bytes);
  DeviceMemoryPlan mem;
  uint64_t scratch_slot = 0, tensor_bytes = 0;
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    const IoMode mode = options.mode == IoMode::kMmap ? IoMode::kBuffered : options.mode;
    Status st = OpenForLoad(job, mode);
    if (!st.ok()) return st.WithContext(job.shard->path);
    if (options.mode == IoMode::kMmap) {
      job.report.reason = "mmap: read through the page cache into staging buffers";
    }
    job.plan = PlanDeviceFile(job.shard->header, job.wanted, options.dtype, job.report.mode == IoMode::kDirect,
                              options.staging_bytes);
    job.report.bytes = job.plan.tensor_bytes;
    job.report.tensors = static_cast<uint32_t>(job.wanted.size());
    job.report.realigned = job.plan.realigned;
    job.report.converted = job.plan.converted;
    mem.device_bytes += job.plan.device_bytes;
    scratch_slot = std::max(scratch_slot, job.plan.scratch_bytes);
    tensor_bytes += job.plan.tensor_bytes;
  }
  scratch_slot = (scratch_slot + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;

  // GPUDirect Storage, or why not.
  std::unique_ptr<DirectReader> gds;
  std::string gds_reason = gds_note;
  if (allow_gds) {
    Result<std::unique_ptr<DirectReader>> opened = trace && trace->open_direct_reader
                                                       ? trace->open_direct_reader()
                                                       : OpenCuFileReader(jobs.size());
    if (opened.ok()) {
      gds = std::move(opened).value();
      for (uint32_t f = 0; f < jobs.size() && gds; ++f) {
        if (jobs[f].wanted.empty()) continue;
        const int fd = jobs[f].direct.fd() >= 0 ? jobs[f].direct.fd() : jobs[f].buffered.fd();
        Status st = gds->AddFile(f, fd);
        if (!st.ok()) {
          gds_reason = "GDS refused " + jobs[f].shard->path + ": " + st.message();
          gds.reset();
        }
      }
    } else {
      gds_reason = "GDS unavailable: " + opened.status().message();
    }
  }
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    job.report.gds = gds != nullptr;
    const std::string how = gds ? "read straight to the device (GDS)" : gds_reason.empty() ? "" : gds_reason + "; pinned staging instead";
    if (!how.empty()) job.report.reason += (job.report.reason.empty() ? "" : "; ") + how;
  }

  mem.scratch_bytes = scratch_slot * static_cast<uint64_t>(slots);
  mem.pinned_bytes = gds ? 0 : slot_bytes * static_cast<uint64_t>(slots);
  {
    TL_ASSIGN_OR_RETURN(uint64_t free_bytes, device->FreeMemory());
    const uint64_t need = mem.device_bytes + mem.scratch_bytes;
    if (need > free_bytes) {
      return ResourceExhaustedError("the load needs " + std::to_string(need) + " bytes of memory on " +
                                    device->name() + " (tensors " + std::to_string(mem.device_bytes) +
                                    ", conversion slots " + std::to_string(mem.scratch_bytes) + ") but " +
                                    std::to_string(free_bytes) + " are free");
    }
  }

  // Memory, stream, events. Everything below is freed on any return.
  std::vector<BlockRef> blocks;
  for (uint32_t f = 0; f < jobs.size(); ++f) {
    auto& job = jobs[f];
    if (job.wanted.empty()) continue;
    Result<std::shared_ptr<Buffer>> buf = device->Allocate(job.plan.device_bytes);
    if (!buf.ok()) return buf.status().WithContext(job.shard->path);
    job.buffer = std::move(buf).value();
    for (uint32_t b = 0; b < job.plan.blocks.size(); ++b) blocks.push_back({f, b});
  }
  std::shared_ptr<Buffer> scratch;
  if (mem.scratch_bytes > 0) {
    TL_ASSIGN_OR_RETURN(scratch, device->Allocate(mem.scratch_bytes));
  }
  std::shared_ptr<Buffer> pinned;
  if (mem.pinned_bytes > 0) {
    TL_ASSIGN_OR_RETURN(pinned, device->AllocatePinned(mem.pinned_bytes));
  }
  if (gds) {
    // Registration only makes the reads faster; they work without it.
    for (auto& job : jobs) {
      if (job.buffer) gds->AddBuffer(job.buffer->data(), job.buffer->size()).IgnoreError();
    }
    if (scratch) gds->AddBuffer(scratch->data(), scratch->size()).IgnoreError();
  }
  std::atomic<bool> gds_failed{false};
  TL_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream, device->CreateStream());
  std::vector<std::unique_ptr<DeviceEvent>> events(slots);
  for (auto& e : events) {
    TL_ASSIGN_OR_RETURN(e, device->CreateEvent());
  }
  if (trace) trace->blocks.assign(blocks.size(), {});

  // The pipeline.
  const int64_t nblocks = static_cast<int64_t>(blocks.size());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> ready(slots, -1);     // Block read into the slot.
  std::vector<int64_t> enqueued(slots, -1);  // Block whose copies were enqueued from it.
  Status error;                              // The first error; guarded by mu.
  bool failed = false;
  auto fail = [&](Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) {
      failed = true;
      error = std::move(st);
    }
    cv.notify_all();
  };
  auto reader = [&](int slot) {
    for (int64_t k = slot; k < nblocks; k += slots) {
      if (k >= slots) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return failed || enqueued[slot] == k - slots; });
        if (failed) return;
        lock.unlock();
        Status st = events[slot]->Synchronize();
        if (!st.ok()) return fail(std::move(st));
        if (trace) trace->blocks[k - slots].copied_us = events[slot]->CompletedAtMicros();
      }
      const DeviceFileJob& job = jobs[blocks[k].file];
      const DeviceBlock& b = job.plan.blocks[blocks[k].block];
      const int fd = job.report.mode == IoMode::kDirect ? job.direct.fd() : job.buffered.fd();
      const double start = trace ? NowMicros() : 0;
      if (trace && trace->before_read) {
        Status hook = trace->before_read(k);
        if (!hook.ok()) return fail(hook.WithContext(job.shard->path));
      }
      Status st;
      if (gds) {
        for (const BlockCopy& c : b.copies) {
          const uint64_t file_offset = b.read_offset + c.slot_offset;
          st = c.convert ? gds->Read(blocks[k].file, scratch->data(), slot * scratch_slot + c.scratch_offset, c.bytes,
                                     file_offset)
                         : gds->Read(blocks[k].file, job.buffer->data(), c.dst_offset, c.bytes, file_offset);
          if (!st.ok()) {
            gds_failed = true;
            break;
          }
        }
      } else {
        st = ReadAtLeast(fd, pinned->data() + slot * slot_bytes, b.read_offset, b.read_length,
                         b.min_read);
      }
      if (!st.ok()) return fail(st.WithContext(job.shard->path));
      if (trace) {
        trace->blocks[k].read_start_us = start;
        trace->blocks[k].read_end_us = NowMicros();
      }
      std::lock_guard<std::mutex> lock(mu);
      ready[slot] = k;
      cv.notify_all();
    }
  };

  uint64_t bytes_done = 0;  // Main thread only.
  ProgressReporter reporter(options.progress, tensor_bytes);

  std::vector<std::thread> readers;
  const int nreaders = static_cast<int>(std::min<int64_t>(slots, nblocks));
  for (int r = 0; r < nreaders; ++r) readers.emplace_back(reader, r);
  for (int64_t k = 0; k < nblocks; ++k) {
    const int slot = static_cast<int>(k % slots);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return failed || ready[slot] == k; });
      if (failed) break;
    }
    const DeviceFileJob& job = jobs[blocks[k].file];
    const DeviceBlock& b = job.plan.blocks[blocks[k].block];
    const std::byte* src = pinned ? pinned->data() + slot * slot_bytes : nullptr;
    std::byte* dst = job.buffer->data();
    std::byte* tmp = scratch ? scratch->data() + slot * scratch_slot : nullptr;
    Status st;
    uint64_t done = 0;
    for (const BlockCopy& c : b.copies) {
      if (!c.convert) {
        if (!gds) st = stream->CopyToDevice(dst + c.dst_offset, src + c.slot_offset, c.bytes);
      } else {
        if (!gds) st = stream->CopyToDevice(tmp + c.scratch_offset, src + c.slot_offset, c.bytes);
        if (st.ok()) st = stream->Convert(dst + c.dst_offset, c.to, tmp + c.scratch_offset, c.from, c.count);
      }
      if (!st.ok()) break;
      done += c.bytes;
    }
    if (st.ok()) st = stream->Record(*events[slot]);
    if (!st.ok()) {
      fail(st.WithContext(job.shard->path));
      break;
    }
    bytes_done += done;
    {
      std::lock_guard<std::mutex> lock(mu);
      enqueued[slot] = k;
      cv.notify_all();
    }
    reporter.Report(bytes_done, false);
  }
  for (auto& t : readers) t.join();
  // The stream may still use the buffers: finish it before they can go.
  Status synced = stream->Synchronize();
  if (failed) {
    if (gds_failed && gds_failure) *gds_failure = error.message();
    return error;
  }
  if (!synced.ok()) return synced;
  if (trace) {
    for (int64_t k = std::max<int64_t>(0, nblocks - slots); k < nblocks; ++k) {
      trace->blocks[k].copied_us = events[k % slots]->CompletedAtMicros();
    }
  }
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    Status st = CheckUnchanged(job);
    if (!st.ok()) return st.WithContext(job.shard->path);
  }
  reporter.Report(bytes_done, true);

  // The result.
  CheckpointBuilder out;
  out.device_plan() = mem;
  out.set_device(device);
  out.Reserve(selected.size());
  std::vector<std::vector<const DeviceTensorPlan*>> placed(jobs.size());
  for (size_t s = 0; s < jobs.size(); ++s) {
    placed[s].assign(ckpt.shards()[s].header.tensors().size(), nullptr);
    for (const auto& pt : jobs[s].plan.tensors) placed[s][pt.index] = &pt;
  }
  for (auto loc : selected) {
    const DeviceFileJob& job = jobs[loc.shard];
    const TensorInfo& info = ckpt.info(loc);
    const DeviceTensorPlan* pt = placed[loc.shard][loc.index];
    LoadedTensor t = MakeTensor(info, pt->dtype, job.buffer->data() + pt->offset, pt->bytes);
    t.device = type;
    t.device_index = device->ordinal();
    out.Add(std::move(t), job.buffer);
  }
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    job.report.engine = IoEngine::kThreads;
    out.files().push_back(std::move(job.report));
  }
  return std::move(out).Finish(std::chrono::duration<double>(Clock::now() - t0).count());
}

Result<LoadedCheckpoint> LoadThroughDevice(const Checkpoint& checkpoint, const LoadOptions& options,
                                           const std::shared_ptr<Device>& device, PipelineTrace* trace) {
  const DeviceType type = device->kind();
  // GDS only for CUDA devices (or a test's reader), and only when asked.
  const bool allow_gds =
      options.gds && (device->kind() == DeviceType::kCuda || (trace && trace->open_direct_reader));
  std::string gds_failure;
  auto got = DevicePipeline::Run(checkpoint, options, device, type, trace, allow_gds, "", &gds_failure);
  if (got.ok() || gds_failure.empty()) return got;
  // A GDS read failed: everything of that attempt is freed; load again
  // through pinned staging at once, saying why.
  if (trace) trace->blocks.clear();
  return DevicePipeline::Run(checkpoint, options, device, type, trace, false,
                             "GDS failed during the load (" + gds_failure + ")", nullptr);
}

}  // namespace tensorlift
