// The host path of the loader (host_load.h): per file, choose the mode, plan,
// allocate the arena, then run every read of every file on one engine, check
// that no file changed, and hand out views.
#include "load/host_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "common/checked_math.h"
#include "common/work_queue.h"
#include "device/host_buffer.h"
#include "device/populate.h"
#include "format/store_reads.h"
#include "load/arena_pool.h"
#include "load/checkpoint_builder.h"
#include "load/file_job.h"
#include "load/planner.h"

namespace tensorlift {

namespace {

int DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(n == 0 ? 4 : n, 4, 16));
}

// One file being loaded into host memory.
struct FileJob : OpenedFile {
  FilePlan plan;
  std::shared_ptr<HostBuffer> arena;
  std::shared_ptr<Buffer> mapping;
};

// cached_views: auto may hand out views of the page cache (docs/loading.md, "The auto rule").
Status PlanJob(FileJob& job, const LoadOptions& options, bool cached_views) {
  TL_RETURN_IF_ERROR(OpenForLoad(job, options.mode, cached_views, options.misaligned_views));
  const Header& h = job.shard->header;
  const IoMode mode = job.report.mode;
  // A store that reads local files with O_DIRECT: tensors placed for it.
  const IoMode place = job.store && job.store->WantsFileAlignment() ? IoMode::kDirect : mode;
  job.plan =
      PlanFile(h, job.wanted, place, options.block_size, options.misaligned_views, job.slices);
  job.report.reason += SliceNote(job, options);
  if (job.plan.misaligned_views > 0) {
    job.report.reason += (job.report.reason.empty() ? "" : "; ") +
                         std::to_string(job.plan.misaligned_views) +
                         " of its tensors are misaligned for their dtype (a header of " +
                         std::to_string(h.data_offset() - 8) +
                         " bytes): viewed where they are, as the reference does";
  }
  job.report.bytes = job.plan.tensor_bytes;
  job.report.tensors = static_cast<uint32_t>(job.wanted.size());
  job.report.realigned = job.plan.realigned;
  job.report.realigned_bytes = job.plan.realigned_bytes;

  if (options.shared_memory) {
    TL_ASSIGN_OR_RETURN(job.arena,
                        HostBuffer::AllocateShared(job.plan.arena_bytes, job.shard->path));
  } else {
    TL_ASSIGN_OR_RETURN(auto arena, TakeArena(options.arena_pool, job.plan.arena_bytes));
    job.arena = std::move(arena);
  }
  if (mode == IoMode::kMmap) {
    TL_ASSIGN_OR_RETURN(auto mapping, FileMapping::Map(job.buffered.fd(), h.file_size()));
    job.mapping = std::move(mapping);
  }
  return Status::Ok();
}

}  // namespace

// Engine choice. Measured on this project's machines (docs/loading.md, "Engines"):
// io_uring keeps more O_DIRECT reads in flight than a thread pool of the same
// size, while buffered io_uring reads are punted to io-wq workers and trail a
// plain pread pool. So `auto` uses io_uring for direct reads and threads for
// buffered ones; an explicit choice applies to both.
Result<std::unique_ptr<ReadEngine>> MakeEngine(const LoadOptions& options, bool direct,
                                               std::span<const ReadOp> ops, IoEngine* chosen,
                                               const Checkpoint& ckpt,
                                               std::vector<EngineFile> files) {
  if (ckpt.store()) {
    *chosen = IoEngine::kThreads;  // The store's own transfers.
    std::vector<std::string> paths;
    paths.reserve(ckpt.shards().size());
    for (const Checkpoint::Shard& shard : ckpt.shards()) paths.push_back(shard.path);
    return ckpt.store()->MakeReadEngine(std::move(paths));
  }
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  // A handful of small reads (one tensor of a safe_open, say): starting
  // threads or a ring would cost more than the reads.
  constexpr size_t kInlineOps = 4;
  constexpr uint64_t kInlineBytes = 4ull << 20;
  uint64_t bytes = 0;
  for (const ReadOp& op : ops) bytes += op.length;
  if (options.engine == IoEngine::kAuto && ops.size() <= kInlineOps && bytes <= kInlineBytes) {
    *chosen = IoEngine::kThreads;
    return MakeInlineEngine(std::move(files));
  }
  const IoEngine want = options.engine != IoEngine::kAuto ? options.engine
                        : direct                          ? IoEngine::kUring
                                                          : IoEngine::kThreads;
  if (want == IoEngine::kUring) {
    auto uring = MakeUringEngine(options.queue_depth > 0 ? options.queue_depth : 32, files);
    if (uring.ok()) {
      *chosen = IoEngine::kUring;
      return std::move(uring).value();
    }
    if (options.engine == IoEngine::kUring) return uring.status();
  }
  *chosen = IoEngine::kThreads;
  return MakeThreadPoolEngine(threads, std::move(files));
}

// (host_load.h) LoadOptions::fault_threads resolved.
int FaultThreads(const LoadOptions& options) { return FaultThreadCount(options.fault_threads); }

namespace {

// One host load, cut at its seams: placement (plans, arenas, where each
// tensor is), the read ops, content hashing, delivery to on_tensor, running
// the reads, and the result. Each step runs once, in that order.
class HostLoad {
 public:
  HostLoad(const Checkpoint& ckpt, const LoadOptions& options, const EngineWrapper& wrap,
           const HostLoadHooks* hooks)
      : ckpt_(ckpt), options_(options), wrap_(wrap), hooks_(hooks) {}

  Result<LoadedCheckpoint> Run() {
    const auto t0 = Clock::now();
    if (options_.block_size == 0) return InvalidArgumentError("block_size must be positive");
    TL_RETURN_IF_ERROR(Place());
    BuildReadOps();
    SetUpHashing();
    SetUpDelivery();
    TL_RETURN_IF_ERROR(RunReads());
    return Finish(t0);
  }

 private:
  using Clock = std::chrono::steady_clock;
  // Where each tensor's bytes sit in its file's arena (those read into it).
  struct Span {
    uint64_t begin, end;
    uint32_t tensor;
  };

  // Plans every file, then the result's tensors in name order, each at its
  // place, before any read: on_tensor hands them out as their bytes land.
  Status Place() {
    selected_ = SelectTensors(ckpt_, options_.filter, jobs_);
    TL_RETURN_IF_ERROR(SliceTensors(options_, jobs_));
    for (auto& job : jobs_) {
      if (job.wanted.empty()) continue;
      // Views of the page cache for auto's cached files, unless the caller asked for owned
      // copies or places the tensors itself (hooks: its own buffers, served or broadcast).
      Status st =
          PlanJob(job, options_, !options_.copy && !options_.shared_memory && hooks_ == nullptr);
      if (!st.ok()) return st.WithContext(job.shard->path);
    }
    placed_ = IndexPlanned(jobs_);
    if (hooks_ && hooks_->placed) {
      for (auto loc : selected_) hooks_->placed(loc, Address(loc));
    }
    if (hooks_ && hooks_->arenas) {
      std::vector<std::shared_ptr<const Buffer>> arenas;
      for (const auto& job : jobs_) {
        if (job.arena) arenas.push_back(job.arena);
      }
      hooks_->arenas(std::move(arenas));
    }
    out_.Reserve(selected_.size());
    for (auto loc : selected_) {
      const FileJob& job = jobs_[loc.shard];
      const TensorInfo& info = ckpt_.info(loc);
      const TensorSlice* slice = placed_.slice(loc);
      out_.Add(
          MakeTensor(info, info.dtype, Address(loc), slice ? slice->bytes : info.nbytes(), slice),
          placed_.plan(loc)->in_arena ? job.arena : job.mapping);
    }
    return Status::Ok();
  }

  std::byte* Address(Checkpoint::Location loc) const {
    const FileJob& job = jobs_[loc.shard];
    const PlannedTensor* pt = placed_.plan(loc);
    return pt->in_arena ? job.arena->data() + pt->arena_offset
                        : job.mapping->data() + job.shard->header.data_offset() + pt->begin;
  }

  // Direct and buffered reads go to their own engines (see MakeEngine).
  void BuildReadOps() {
    pending_.reset(new std::atomic<uint64_t>[jobs_.size()]);
    for (size_t s = 0; s < jobs_.size(); ++s) {
      auto& job = jobs_[s];
      pending_[s] = 0;
      if (job.wanted.empty()) continue;
      for (const PlannedRead& r : job.plan.reads) {
        ops_[r.direct].push_back({static_cast<uint32_t>(s), r.file_offset, r.length,
                                  job.arena->data() + r.arena_offset, r.bounce, r.row_bytes,
                                  r.row_stride, read_id_++});
        read_bytes_ += r.length;
        ++pending_[s];
      }
    }
  }

  // The content identity (LoadOptions::content_hash): pieces hashed as reads
  // complete them; views of the page cache are not read, so kAuto skips loads
  // that have any, and kOn hashes them after the reads.
  void SetUpHashing() {
    bool views = false;
    for (auto loc : selected_) views |= !placed_.plan(loc)->in_arena;
    if (options_.content_hash == ContentHashMode::kOn ||
        (options_.content_hash == ContentHashMode::kAuto && !views)) {
      std::vector<TensorContent> contents;
      std::vector<const std::byte*> data;
      contents.reserve(selected_.size());
      data.reserve(selected_.size());
      for (const LoadedTensor& t : out_.tensors()) {
        contents.push_back({t.name, t.dtype, t.shape, t.nbytes, {}});
        data.push_back(static_cast<const std::byte*>(t.data));
      }
      hasher_.emplace(std::move(contents), std::move(data));
    }
    if (!options_.on_tensor && !hasher_) return;
    // Per shard in arena order: which tensors a read fills.
    spans_.resize(jobs_.size());
    for (size_t i = 0; i < selected_.size(); ++i) {
      const PlannedTensor* pt = placed_.plan(selected_[i]);
      const uint64_t n = out_.tensors()[i].nbytes;
      if (pt->in_arena && n > 0) {
        spans_[selected_[i].shard].push_back(
            {pt->arena_offset, pt->arena_offset + n, static_cast<uint32_t>(i)});
      }
    }
    for (auto& sp : spans_) {
      std::sort(sp.begin(), sp.end(),
                [](const Span& a, const Span& b) { return a.begin < b.begin; });
    }
  }

  // Calls f(span, lo, hi) for each tensor span that read `op` overlaps.
  template <typename F>
  void ForSpans(const ReadOp& op, F&& f) const {
    const auto& sp = spans_[op.shard];
    const uint64_t lo = static_cast<uint64_t>(op.dest - jobs_[op.shard].arena->data()),
                   hi = lo + op.length;
    // Tensors in an arena do not overlap: the first that ends after lo, then on.
    auto it =
        std::partition_point(sp.begin(), sp.end(), [&](const Span& t) { return t.end <= lo; });
    for (; it != sp.end() && it->begin < hi; ++it) f(*it, lo, hi);
  }

  // on_tensor: which tensors each read fills, and how many reads each tensor waits for.
  void SetUpDelivery() {
    if (!options_.on_tensor) return;
    read_tensors_.resize(read_id_);
    waiting_.reset(new std::atomic<uint32_t>[selected_.size()]);
    for (size_t i = 0; i < selected_.size(); ++i) waiting_[i] = 0;
    for (const auto& list : ops_) {
      for (const ReadOp& op : list) {
        ForSpans(op, [&](const Span& t, uint64_t, uint64_t) {
          read_tensors_[op.id].push_back(t.tensor);
          ++waiting_[t.tensor];
        });
      }
    }
    // Handed out from a thread of their own, in the order they are ready.
    deliverer_.emplace(
        [this](size_t& i) {
          return options_.on_tensor(StreamedTensor(out_.tensors()[i], out_.owners()[i]));
        },
        WorkQueue<size_t>::Options{.skip_after_error = true});
    for (size_t i = 0; i < selected_.size(); ++i) {
      if (waiting_[i] == 0) deliverer_->Push(i);  // Views, and tensors with no bytes.
    }
  }

  // What happens as each read completes: hashing, handing files and tensors on.
  void OnReadDone(const ReadOp& op, bool file_done) {
    // Hashed first: a tensor handed out, or a file handed on, is hashed.
    if (hasher_) {
      ForSpans(op, [&](const Span& t, uint64_t lo, uint64_t hi) {
        const uint64_t from = std::max(lo, t.begin), to = std::min(hi, t.end);
        if (background_) {
          background_->Push({t.tensor, from - t.begin, to - from});
        } else {
          hasher_->Landed(t.tensor, from - t.begin, to - from);
        }
      });
    }
    if (file_done && pending_[op.shard].fetch_sub(1, std::memory_order_acq_rel) == 1)
      hooks_->file_done(op.shard);
    if (deliverer_) {
      for (uint32_t t : read_tensors_[op.id]) {
        if (waiting_[t].fetch_sub(1, std::memory_order_acq_rel) == 1) deliverer_->Push(t);
      }
    }
  }

  // auto's views of the page cache: their page tables filled in by the fault
  // threads (after the fresh memory the reads need first), read-only (no
  // copy-on-write), so that the consumer's first pass takes no page faults. An
  // explicit mode=mmap stays lazy, as documented: its bytes come in on first touch.
  std::vector<PopulateAhead::Region> RegionsToFault() const {
    std::vector<PopulateAhead::Region> regions;
    for (const auto& job : jobs_) {
      // A buffer reused from an ArenaPool: only what it has not held before.
      const uint64_t from = job.arena ? job.arena->touched() / kPageAlign * kPageAlign : 0;
      if (!job.wanted.empty() && job.arena && from < job.arena->size()) {
        regions.push_back({job.arena->data() + from, job.arena->size() - from});
      }
    }
    if (hooks_) {
      for (const auto& buf : hooks_->populate) regions.push_back({buf->data(), buf->size()});
    }
    for (const auto& job : jobs_) {
      if (job.wanted.empty() || !job.mapping || options_.mode != IoMode::kAuto) continue;
      // The views' bytes, in runs (a gap under 1 MiB faulted with them): not the
      // tensors read into the arena, nor the rows of other ranks' slices.
      const Header& h = job.shard->header;
      uint64_t lo = 0, hi = 0;  // File offsets of the run being built.
      auto flush = [&] {
        if (hi > lo)
          regions.push_back({job.mapping->data() + lo, AlignUp(hi, kPageAlign) - lo, true});
      };
      for (size_t k = 0; k < job.plan.tensors.size(); ++k) {
        const PlannedTensor& pt = job.plan.tensors[k];
        if (pt.in_arena) continue;
        const TensorSlice* slice = SliceOf(job, k);
        const uint64_t b = h.data_offset() + pt.begin;
        const uint64_t e = b + (slice ? slice->bytes : h.tensors()[pt.index].nbytes());
        if (hi > lo && b <= hi + (1 << 20)) {
          hi = std::max(hi, e);
        } else {
          flush();
          lo = b / kPageAlign * kPageAlign;
          hi = e;
        }
      }
      flush();
    }
    return regions;
  }

  Status RunReads() {
    progress_.tick = [this] {
      reporter_->Report(progress_.bytes_done.load(std::memory_order_relaxed), false);
    };
    reporter_.emplace(options_.progress, read_bytes_);
    const bool file_done = hooks_ && hooks_->file_done;
    // Where nothing is handed on while the reads run (a plain host load), the
    // hashing is a thread's of its own; otherwise it happens before a tensor is
    // handed out or a file handed on (whose memory may then be reused).
    // (The engines' completion threads, io_uring's one that also submits the
    // next reads, only queue what landed.)
    if (hasher_ && !file_done && !deliverer_) {
      background_.emplace(
          [this](Landed& l) {
            hasher_->Landed(l.tensor, l.offset, l.length);
            return Status::Ok();
          },
          WorkQueue<Landed>::Options{});
    }
    if (file_done || deliverer_ || hasher_) {
      progress_.op_done = [this, file_done](const ReadOp& op) { OnReadDone(op, file_done); };
    }
    if (file_done) {
      for (size_t s = 0; s < jobs_.size(); ++s) {
        if (!jobs_[s].wanted.empty() && pending_[s] == 0)
          hooks_->file_done(static_cast<uint32_t>(s));
      }
    }
    // The engines first: their set-up maps memory (the ring, thread stacks), and an
    // mmap waits for the mmap lock that the fault threads' populate steps hold.
    std::unique_ptr<ReadEngine> engines[2];
    for (int direct : {1, 0}) {
      if (ops_[direct].empty()) continue;
      TL_ASSIGN_OR_RETURN(engines[direct],
                          MakeEngine(options_, direct == 1, ops_[direct], &engine_kind_[direct],
                                     ckpt_, EngineFiles(jobs_, direct == 1)));
      if (wrap_) engines[direct] = wrap_(std::move(engines[direct]));
    }
    // Fresh memory's first touch (page faults) costs as much as the reads
    // themselves on some machines; a helper threads fault the arenas in, in
    // file order, ahead of the reads (docs/loading.md, "Memory").
    PopulateAhead populate(RegionsToFault(), FaultThreads(options_));
    for (int direct : {1, 0}) {
      if (engines[direct]) TL_RETURN_IF_ERROR(engines[direct]->Run(ops_[direct], &progress_));
    }
    populate.StopFresh();
    populate.Finish();
    return Status::Ok();
  }

  // Every tensor handed out, no file changed: the result.
  Result<LoadedCheckpoint> Finish(Clock::time_point t0) {
    if (deliverer_) TL_RETURN_IF_ERROR(deliverer_->Finish());
    for (auto& job : jobs_) {
      if (job.wanted.empty()) continue;
      Status st = CheckUnchanged(job);
      if (!st.ok()) return st.WithContext(job.shard->path);
      // Its pages were written by the reads (or faulted in ahead of them).
      if (job.arena) job.arena->set_touched(job.arena->size());
    }
    reporter_->Report(progress_.bytes_done.load(std::memory_order_relaxed), true);
    for (auto& job : jobs_) {
      if (job.wanted.empty()) continue;
      job.report.engine = engine_kind_[job.report.mode == IoMode::kDirect];
      out_.files().push_back(std::move(job.report));
    }
    if (background_) TL_RETURN_IF_ERROR(background_->Finish());
    if (hasher_) {
      out_.set_content(std::make_shared<const ContentIdentity>(std::move(*hasher_).Finish()));
    }
    return std::move(out_).Finish(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  const Checkpoint& ckpt_;
  const LoadOptions& options_;
  const EngineWrapper& wrap_;
  const HostLoadHooks* hooks_;

  std::vector<FileJob> jobs_;
  std::vector<Checkpoint::Location> selected_;
  PlannedIndex<PlannedTensor> placed_;
  CheckpointBuilder out_;

  std::vector<ReadOp> ops_[2];  // [0] buffered, [1] direct.
  uint64_t read_bytes_ = 0;
  uint32_t read_id_ = 0;  // Every read's number, across the files.
  // Reads still to finish per shard, for hooks->file_done.
  std::unique_ptr<std::atomic<uint64_t>[]> pending_;
  IoEngine engine_kind_[2] = {IoEngine::kThreads, IoEngine::kThreads};

  std::vector<std::vector<Span>> spans_;
  std::optional<ContentHasher> hasher_;
  std::vector<std::vector<uint32_t>> read_tensors_;
  std::unique_ptr<std::atomic<uint32_t>[]> waiting_;
  std::optional<WorkQueue<size_t>> deliverer_;  // Tensors ready for on_tensor.

  ReadProgress progress_;
  std::optional<ProgressReporter> reporter_;
  // Pieces landed, hashed on a thread of its own; declared after what it
  // hashes into, destroyed (joined) before it.
  struct Landed {
    uint32_t tensor;
    uint64_t offset, length;
  };
  std::optional<WorkQueue<Landed>> background_;
};

}  // namespace

Result<LoadedCheckpoint> LoadOnHost(const Checkpoint& ckpt, const LoadOptions& options,
                                    const EngineWrapper& wrap, const HostLoadHooks* hooks) {
  return HostLoad(ckpt, options, wrap, hooks).Run();
}

}  // namespace tensorlift
