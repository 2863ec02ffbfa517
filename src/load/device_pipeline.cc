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
#include <chrono>
#include <thread>

#include "common/checked_math.h"
#include "device/device.h"
#include "io/direct_reader.h"
#include "io/pread.h"
#include "load/checkpoint_builder.h"
#include "load/device_pipeline_steps.h"
#include "load/device_plan.h"
#include "load/file_job.h"
#include "load/owners.h"

namespace tensorlift {
namespace {

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

DevicePipeline::DevicePipeline(const Checkpoint& ckpt, const LoadOptions& options,
                               const std::shared_ptr<Device>& device, DeviceType type,
                               PipelineTrace* trace)
    : ckpt_(ckpt),
      options_(options),
      device_(device),
      type_(type),
      trace_(trace),
      slots_(StagingSlots(options)),
      readers_(StagingReaders(options, slots_)) {}

Result<LoadedCheckpoint> DevicePipeline::Run(const Checkpoint& ckpt, const LoadOptions& options,
                                             const std::shared_ptr<Device>& device, DeviceType type,
                                             PipelineTrace* trace, bool allow_gds,
                                             const std::string& gds_note,
                                             std::string* gds_failure) {
  const auto t0 = Clock::now();
  TL_RETURN_IF_ERROR(CheckOptions(options));
  DevicePipeline p(ckpt, options, device, type, trace);
  p.OpenDirectReader(allow_gds, gds_note);
  TL_RETURN_IF_ERROR(p.PlanFiles());
  TL_RETURN_IF_ERROR(p.AttachDirectReader());
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
  TL_RETURN_IF_ERROR(SliceTensors(options_, jobs_));
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
    // CPU's cache when it is copied out of its slot. A store's reads (a
    // bucket's ranged GETs) are whole slots: fewer, larger requests.
    // A reader straight into the device may want larger blocks (there is no
    // staging slot to fill).
    const uint64_t block =
        gds_ && gds_->BlockBytes() > 0 ? std::max(options_.staging_bytes, gds_->BlockBytes())
        : direct || job.store          ? options_.staging_bytes
                                       : std::min(options_.staging_bytes, kCachedBlockBytes);
    // A store that reads local files with O_DIRECT: blocks placed for it.
    const bool place_direct = direct || (job.store && job.store->WantsFileAlignment());
    job.plan = PlanDeviceFile(job.shard->header, job.wanted, options_.dtype, place_direct, block,
                              job.slices);
    job.report.reason += SliceNote(job, options_);
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
  // A store's files: its own reader into device memory, when it has one.
  const std::shared_ptr<CheckpointStore>& store = ckpt_.store();
  const std::string what = store ? "straight to the device" : "GDS";
  if (allow_gds) {
    const size_t files = ckpt_.shards().size();
    Result<std::unique_ptr<DirectReader>> opened = trace_ && trace_->open_direct_reader
                                                       ? trace_->open_direct_reader()
                                                   : store ? store->MakeDirectReader(device_, files)
                                                           : OpenCuFileReader(files);
    if (opened.ok()) {
      gds_ = std::move(opened).value();
    } else if (!store || opened.status().code() != StatusCode::kUnimplemented) {
      // (A store without such a reader has nothing to say.)
      gds_reason_ = what + " unavailable: " + opened.status().message();
    }
  }
}

Status DevicePipeline::AttachDirectReader() {
  const std::string what = ckpt_.store() ? "straight to the device" : "GDS";
  for (uint32_t f = 0; f < jobs_.size() && gds_; ++f) {
    if (jobs_[f].wanted.empty()) continue;
    const int fd = jobs_[f].direct.fd() >= 0 ? jobs_[f].direct.fd() : jobs_[f].buffered.fd();
    Status st = gds_->AddFile(f, fd);
    if (!st.ok()) {
      if (gds_->BlockBytes() > 0) {
        // Its blocks are planned larger than a staging slot.
        return InternalError("a reader straight to the device refused " + jobs_[f].shard->path +
                             " after the plan counted on it: " + st.message());
      }
      gds_reason_ = what + " refused " + jobs_[f].shard->path + ": " + st.message();
      gds_.reset();
    }
  }
  for (auto& job : jobs_) {
    if (job.wanted.empty()) continue;
    job.report.gds = gds_ != nullptr;
    const std::string how = gds_                  ? "read straight to the device (" + what + ")"
                            : gds_reason_.empty() ? ""
                                                  : gds_reason_ + "; pinned staging instead";
    if (!how.empty()) job.report.reason += (job.report.reason.empty() ? "" : "; ") + how;
  }
  return Status::Ok();
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
  const auto placed = IndexPlanned(jobs_);
  for (auto loc : selected_) {
    const DeviceFileJob& job = jobs_[loc.shard];
    const TensorInfo& info = ckpt_.info(loc);
    const DeviceTensorPlan* pt = placed.plan(loc);
    LoadedTensor t =
        MakeTensor(info, pt->dtype, job.buffer->data() + pt->offset, pt->bytes, placed.slice(loc));
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
  // GDS only for CUDA devices (or a test's reader) and only when asked; a
  // store's files through the store's own reader into device memory when it
  // has one (MakeDirectReader), whatever the device.
  const bool allow_gds =
      options.gds && (checkpoint.store() || device->kind() == DeviceType::kCuda ||
                      (trace && trace->open_direct_reader));
  std::string gds_failure;
  auto got =
      DevicePipeline::Run(checkpoint, options, device, type, trace, allow_gds, "", &gds_failure);
  // A store's reader failing is the store's failure (its bytes, its source):
  // reading them again through staging would ask the same source again.
  if (got.ok() || gds_failure.empty() || checkpoint.store()) return got;
  // A GDS read failed: everything of that attempt is freed; load again
  // through pinned staging at once, saying why.
  if (trace) trace->blocks.clear();
  return DevicePipeline::Run(checkpoint, options, device, type, trace, false,
                             "GDS failed during the load (" + gds_failure + ")", nullptr);
}

}  // namespace tensorlift
