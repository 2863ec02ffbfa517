// One file of a load, opened and checked: shared by the host loader and the
// GPU pipeline.
#ifndef TENSORLIFT_LOAD_FILE_JOB_H_
#define TENSORLIFT_LOAD_FILE_JOB_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/posix_file.h"
#include "format/tp_layout.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

struct OpenedFile {
  const Checkpoint::Shard* shard = nullptr;
  // The store it is read through (Checkpoint::store()); null: a local file.
  CheckpointStore* store = nullptr;
  std::vector<uint32_t> wanted;  // Indices into shard->header.tensors(), increasing.
  // LoadOptions::parallel: wanted tensor i's slice for this rank at [i]
  // (whole() when the layout does not split it); empty when nothing is sliced.
  std::vector<TensorSlice> slices;
  PosixFile buffered;
  PosixFile direct;  // Open when report.mode is kDirect.
  FileIdentity identity;
  double resident = -1;  // kAuto: the fraction of the wanted bytes in the page cache.
  FileReport report;     // path, mode (never kAuto) and reason filled in.
};

// A store's file (file.store set): nothing to open; read as buffered, the
// store saying how in the report. Otherwise:
// Opens the file for reading, checks it is the one whose header was read
// (size, identity), and decides the mode: `mode`, or for kAuto, when at least
// half of the wanted bytes are in the page cache, kMmap if `cached_views` (the
// tensors view the page cache, no copy) and buffered otherwise, and direct
// when less is cached; direct falls back to buffered on filesystems without
// O_DIRECT. kMmap is kept as is (the caller maps).
// With `misaligned_views`, auto views a cached file whatever the alignment of
// its tensors (else it reads one with many misaligned bytes instead).
Status OpenForLoad(OpenedFile& file, IoMode mode, bool cached_views = false,
                   bool misaligned_views = false);

// Opens file.direct with O_DIRECT; false (and nothing open) when the
// filesystem has no O_DIRECT (tmpfs, some FUSE).
Result<bool> OpenDirect(OpenedFile& file);

// Fails when the file changed (size, mtime, identity) since OpenForLoad
// (a store's files: the store checks its own reads).
Status CheckUnchanged(const OpenedFile& file);

// One job per shard of `ckpt` (Job derives from OpenedFile), each with the
// tensors of its file that pass `filter`, in file order; returns the selected
// tensors in the checkpoint's (name) order.
template <typename Job>
std::vector<Checkpoint::Location> SelectTensors(const Checkpoint& ckpt, const TensorFilter& filter,
                                                std::vector<Job>& jobs) {
  jobs.resize(ckpt.shards().size());
  for (size_t s = 0; s < jobs.size(); ++s) {
    jobs[s].shard = &ckpt.shards()[s];
    jobs[s].store = ckpt.store().get();
  }
  std::vector<Checkpoint::Location> selected;
  for (auto loc : ckpt.tensors()) {
    if (!filter.Matches(ckpt.info(loc).name)) continue;
    selected.push_back(loc);
    jobs[loc.shard].wanted.push_back(loc.index);
  }
  for (auto& job : jobs) std::sort(job.wanted.begin(), job.wanted.end());
  return selected;
}

// Fills each job's slices for options.parallel (LoadOptions::layout parsed
// here); nothing when parallel.size is 1.
template <typename Job>
Status SliceTensors(const LoadOptions& options, std::vector<Job>& jobs) {
  if (options.parallel.size <= 1) return Status::Ok();
  TL_ASSIGN_OR_RETURN(const ParallelLayout layout, ParallelLayout::Parse(options.layout));
  for (auto& job : jobs) {
    job.slices.clear();
    for (uint32_t i : job.wanted) {
      Result<TensorSlice> slice = SliceFor(job.shard->header.tensors()[i], layout,
                                           options.parallel.rank, options.parallel.size);
      if (!slice.ok()) return slice.status().WithContext(job.shard->path);
      job.slices.push_back(std::move(slice).value());
    }
  }
  return Status::Ok();
}

// Wanted tensor i's slice (SliceTensors), or null when it is loaded whole.
inline const TensorSlice* SliceOf(const OpenedFile& job, size_t i) {
  return job.slices.empty() || job.slices[i].whole() ? nullptr : &job.slices[i];
}
// Each file's planned tensors by index in its header (null: not loaded) and
// their slices (null: whole), from jobs whose plan.tensors lists one per
// wanted tensor, in its order.
template <typename Planned>
struct PlannedIndex {
  std::vector<std::vector<const Planned*>> plans;
  std::vector<std::vector<const TensorSlice*>> slices;
  const Planned* plan(Checkpoint::Location loc) const { return plans[loc.shard][loc.index]; }
  const TensorSlice* slice(Checkpoint::Location loc) const { return slices[loc.shard][loc.index]; }
};
template <typename Job>
auto IndexPlanned(const std::vector<Job>& jobs) {
  using Planned = typename decltype(Job::plan.tensors)::value_type;
  PlannedIndex<Planned> index;
  index.plans.resize(jobs.size());
  index.slices.resize(jobs.size());
  for (size_t s = 0; s < jobs.size(); ++s) {
    index.plans[s].assign(jobs[s].shard->header.tensors().size(), nullptr);
    index.slices[s].assign(index.plans[s].size(), nullptr);
    const auto& planned = jobs[s].plan.tensors;
    for (size_t k = 0; k < planned.size(); ++k) {
      index.plans[s][planned[k].index] = &planned[k];
      index.slices[s][planned[k].index] = SliceOf(jobs[s], k);
    }
  }
  return index;
}
// "; N slice(s) for rank R of S" for a report's reason; "" when nothing is sliced.
std::string SliceNote(const OpenedFile& job, const LoadOptions& options);

// A tensor's view: name, dtype, shape (the slice's, when given), row-major
// strides, bytes.
LoadedTensor MakeTensor(const TensorInfo& info, Dtype dtype, void* data, uint64_t nbytes,
                        const TensorSlice* slice = nullptr);

// Calls LoadOptions::progress at most every 100 ms, and once at the end.
class ProgressReporter {
 public:
  ProgressReporter(const ProgressCallback& callback, uint64_t total)
      : callback_(callback),
        total_(total),
        start_(std::chrono::steady_clock::now()),
        last_(start_) {}
  // `done` bytes so far; from one thread at a time.
  void Report(uint64_t done, bool final_call);

 private:
  const ProgressCallback& callback_;
  uint64_t total_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_FILE_JOB_H_
