// The loader: per file, choose the mode, plan, allocate the arena, then run
// every read of every file on one engine, check that no file changed, and
// hand out views. See include/tensorlift/loader.h for the contract.
#include "tensorlift/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <unordered_set>

#include "common/posix_file.h"
#include "device/device.h"
#include "device/host_buffer.h"
#include "io/page_cache.h"
#include "io/read_op.h"
#include "load/arena_pool.h"
#include "load/checkpoint_builder.h"
#include "load/file_job.h"
#include "load/loader_internal.h"
#include "load/owners.h"
#include "load/planner.h"
#include "load/shared_memory.h"
#include "tensorlift/text.h"

namespace tensorlift {

std::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto:
      return "auto";
    case IoMode::kBuffered:
      return "buffered";
    case IoMode::kDirect:
      return "direct";
    case IoMode::kMmap:
      return "mmap";
  }
  return "?";
}

std::string_view IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kThreads:
      return "threads";
    case IoEngine::kUring:
      return "uring";
  }
  return "?";
}

Result<IoMode> ParseIoMode(std::string_view name) {
  for (IoMode m : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    if (IoModeName(m) == name) return m;
  }
  return InvalidArgumentError("unknown I/O mode " + QuoteName(name) +
                              " (expected auto, buffered, direct or mmap)");
}

Result<IoEngine> ParseIoEngine(std::string_view name) {
  for (IoEngine e : {IoEngine::kAuto, IoEngine::kThreads, IoEngine::kUring}) {
    if (IoEngineName(e) == name) return e;
  }
  return InvalidArgumentError("unknown I/O engine " + QuoteName(name) +
                              " (expected auto, threads or uring)");
}

TensorFilter TensorFilter::Names(std::vector<std::string> names) {
  auto set = std::make_shared<std::unordered_set<std::string>>(names.begin(), names.end());
  TensorFilter f;
  f.pred_ = [set](std::string_view n) { return set->count(std::string(n)) > 0; };
  return f;
}

Result<TensorFilter> TensorFilter::Regex(const std::string& pattern) {
  std::shared_ptr<std::regex> re;
  try {  // std::regex reports a bad pattern only by throwing.
    re = std::make_shared<std::regex>(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return InvalidArgumentError("invalid regular expression " + QuoteName(pattern) + ": " +
                                e.what());
  }
  TensorFilter f;
  f.pred_ = [re](std::string_view n) { return std::regex_search(n.begin(), n.end(), *re); };
  return f;
}

TensorFilter TensorFilter::Predicate(std::function<bool(std::string_view)> pred) {
  TensorFilter f;
  f.pred_ = std::move(pred);
  return f;
}

LoadedCheckpoint::LoadedCheckpoint() : owners_(std::make_unique<Owners>()) {}
LoadedCheckpoint::~LoadedCheckpoint() = default;
LoadedCheckpoint::LoadedCheckpoint(LoadedCheckpoint&&) noexcept = default;
LoadedCheckpoint& LoadedCheckpoint::operator=(LoadedCheckpoint&&) noexcept = default;

const LoadedTensor* LoadedCheckpoint::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const LoadedTensor& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

Status LoadedCheckpoint::CopyToHost(std::string_view name, void* dst) const {
  const LoadedTensor* t = Find(name);
  if (t == nullptr) return NotFoundError("no tensor " + QuoteName(name) + " was loaded");
  if (t->nbytes == 0) return Status::Ok();
  if (!owners_->device || t->device == DeviceType::kCpu) {
    std::memcpy(dst, t->data, t->nbytes);
    return Status::Ok();
  }
  TL_ASSIGN_OR_RETURN(auto stream, owners_->device->CreateStream());
  TL_RETURN_IF_ERROR(stream->CopyToHost(static_cast<std::byte*>(dst),
                                        static_cast<const std::byte*>(t->data), t->nbytes));
  return stream->Synchronize();
}

uint64_t LoadedCheckpoint::buffer_bytes() const {
  std::unordered_set<const Buffer*> seen;
  uint64_t total = 0;
  for (const auto& b : owners_->buffers) {
    if (b && seen.insert(b.get()).second) total += b->size();
  }
  return total;
}

namespace {

// ContentHasher::Landed on a thread of its own: the read engines' completion
// threads (io_uring's is one thread that also submits the next reads) only
// queue what landed, so hashing overlaps the reads instead of delaying them.
class BackgroundHasher {
 public:
  explicit BackgroundHasher(ContentHasher* hasher) : hasher_(hasher), thread_([this] { Run(); }) {}
  ~BackgroundHasher() { Finish(); }
  BackgroundHasher(const BackgroundHasher&) = delete;
  BackgroundHasher& operator=(const BackgroundHasher&) = delete;

  void Landed(uint32_t tensor, uint64_t offset, uint64_t length) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({tensor, offset, length});
    }
    cv_.notify_one();
  }
  // Returns once everything queued is hashed.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Piece {
    uint32_t tensor;
    uint64_t offset, length;
  };
  void Run() {
    std::vector<Piece> batch;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Done, and all of it hashed.
      batch.swap(queue_);
      lock.unlock();
      for (const Piece& p : batch) hasher_->Landed(p.tensor, p.offset, p.length);
      batch.clear();
      lock.lock();
    }
  }

  ContentHasher* hasher_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Piece> queue_;
  bool done_ = false;
  std::thread thread_;  // Last: starts once the rest is in place.
};

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
  job.plan = PlanFile(h, job.wanted, mode, options.block_size, options.misaligned_views);
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

// Hands tensors to LoadOptions::on_tensor from a thread of its own, in the
// order Ready() is called (engine threads call it; it must be quick).
class Deliverer {
 public:
  Deliverer(const TensorCallback& callback, const std::vector<LoadedTensor>& tensors,
            const std::vector<std::shared_ptr<Buffer>>& owners)
      : callback_(callback), tensors_(tensors), owners_(owners) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Deliverer() { (void)Finish(); }
  void Ready(size_t i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(i);
    }
    cv_.notify_one();
  }
  // Waits until every tensor made ready was handed out (or the callback failed).
  Status Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    return error_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !ready_.empty() || done_; });
      if (ready_.empty()) return;
      const size_t i = ready_.front();
      ready_.pop_front();
      if (!error_.ok()) continue;
      lock.unlock();
      Status st = callback_(StreamedTensor(tensors_[i], owners_[i]));
      lock.lock();
      if (!st.ok()) error_ = st;
    }
  }
  const TensorCallback& callback_;
  const std::vector<LoadedTensor>& tensors_;
  const std::vector<std::shared_ptr<Buffer>>& owners_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> ready_;
  bool done_ = false;
  Status error_;
  std::thread thread_;
};

}  // namespace

Status OpenForLoad(OpenedFile& job, IoMode mode, bool cached_views, bool misaligned_views) {
  const Header& h = job.shard->header;
  TL_ASSIGN_OR_RETURN(job.buffered, PosixFile::OpenForRead(job.shard->path));
  TL_ASSIGN_OR_RETURN(job.identity, job.buffered.Identity());
  if (job.identity.size != h.file_size()) {
    return CorruptionError("the file has " + std::to_string(job.identity.size) +
                           " bytes but its header says " + std::to_string(h.file_size()) +
                           ": it changed after its header was read");
  }
  if (job.identity != job.shard->identity) {
    return CorruptionError("the file was modified or replaced after its header was read");
  }
  uint64_t first = 0, last = 0;
  if (!job.wanted.empty()) {
    first = h.tensors()[job.wanted.front()].begin;
    last = h.tensors()[job.wanted.back()].end;
  }
  if (mode == IoMode::kAuto) {
    TL_ASSIGN_OR_RETURN(double resident,
                        ResidentFraction(job.buffered.fd(), h.data_offset() + first, last - first));
    char pct[32];
    job.resident = resident;
    std::snprintf(pct, sizeof pct, "%.0f%%", resident * 100);
    // Views only of (nearly) fully cached files: the rest of a view's bytes would
    // come in by page faults, a small read each.
    mode = resident < 0.5                    ? IoMode::kDirect
           : cached_views && resident >= 0.9 ? IoMode::kMmap
                                             : IoMode::kBuffered;
    job.report.reason =
        std::string(pct) + " in page cache" + (mode == IoMode::kMmap ? ": views of it" : "");
    // A tensor misaligned for its dtype in the file (a header length that is
    // not a multiple of 8 shifts them all) is never a view: it is copied to an
    // aligned place. When that is a tenth of the bytes or more, plain reads
    // into aligned memory do it in one pass; views would also keep the mapped
    // pages resident beside the copies (twice the file).
    if (mode == IoMode::kMmap && !misaligned_views) {
      uint64_t wanted = 0, misaligned = 0;
      uint32_t count = 0;
      for (uint32_t idx : job.wanted) {
        const TensorInfo& t = h.tensors()[idx];
        wanted += t.nbytes();
        if (t.nbytes() > 0 && (h.data_offset() + t.begin) % ElementAlignment(t.dtype) != 0) {
          misaligned += t.nbytes();
          ++count;
        }
      }
      if (misaligned > 0 && misaligned >= wanted / 10) {
        mode = IoMode::kBuffered;
        job.report.reason = std::string(pct) + " in page cache; " + std::to_string(count) +
                            " of its tensors are misaligned for their dtype (a header of " +
                            std::to_string(h.data_offset() - 8) +
                            " bytes): read into aligned memory, not views";
      }
    }
  }
  if (mode == IoMode::kDirect) {
    TL_ASSIGN_OR_RETURN(const bool opened, OpenDirect(job));
    if (!opened) {
      mode = IoMode::kBuffered;
      job.report.reason += (job.report.reason.empty() ? "" : "; ") +
                           std::string("the filesystem refuses O_DIRECT, buffered instead");
    }
  }
  job.report.mode = mode;
  job.report.path = job.shard->path;
  return Status::Ok();
}

Result<bool> OpenDirect(OpenedFile& job) {
  int fd;
  do {
    fd = ::open(job.shard->path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0) {
    job.direct = PosixFile::Adopt(fd);
    return true;
  }
  if (errno == EINVAL) return false;  // The filesystem has no O_DIRECT.
  return PosixError("cannot open with O_DIRECT", errno);
}

Status CheckUnchanged(const OpenedFile& job) {
  TL_ASSIGN_OR_RETURN(FileIdentity now, job.buffered.Identity());
  if (now.size != job.identity.size || now.mtime_ns != job.identity.mtime_ns) {
    return IOError("the file was modified during the load (size " +
                   std::to_string(job.identity.size) + " -> " + std::to_string(now.size) +
                   ", or its modification time changed)");
  }
  struct stat st;
  if (::stat(job.shard->path.c_str(), &st) != 0) {
    return PosixError("the file was removed during the load", errno);
  }
  if (static_cast<uint64_t>(st.st_dev) != job.identity.device ||
      static_cast<uint64_t>(st.st_ino) != job.identity.inode) {
    return IOError("the file was replaced during the load");
  }
  return Status::Ok();
}

LoadedTensor MakeTensor(const TensorInfo& info, Dtype dtype, void* data, uint64_t nbytes) {
  LoadedTensor t;
  t.name = info.name;
  t.dtype = dtype;
  t.shape.assign(info.shape.begin(), info.shape.end());
  SetRowMajorStrides(&t);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

void ProgressReporter::Report(uint64_t done, bool final_call) {
  if (!callback_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!final_call && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  Progress p;
  p.bytes_done = done;
  p.bytes_total = total_;
  p.seconds = std::chrono::duration<double>(now - start_).count();
  callback_(p);
}

// Engine choice. Measured on this project's machines (docs/performance.md):
// io_uring keeps more O_DIRECT reads in flight than a thread pool of the same
// size, while buffered io_uring reads are punted to io-wq workers and trail a
// plain pread pool. So `auto` uses io_uring for direct reads and threads for
// buffered ones; an explicit choice applies to both.
Result<std::unique_ptr<ReadEngine>> MakeEngine(const LoadOptions& options, bool direct,
                                               std::span<const ReadOp> ops, IoEngine* chosen) {
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  // A handful of small reads (one tensor of a safe_open, say): starting
  // threads or a ring would cost more than the reads.
  constexpr size_t kInlineOps = 4;
  constexpr uint64_t kInlineBytes = 4ull << 20;
  uint64_t bytes = 0;
  for (const ReadOp& op : ops) bytes += op.length;
  if (options.engine == IoEngine::kAuto && ops.size() <= kInlineOps && bytes <= kInlineBytes) {
    *chosen = IoEngine::kThreads;
    return MakeInlineEngine();
  }
  const IoEngine want = options.engine != IoEngine::kAuto ? options.engine
                        : direct                          ? IoEngine::kUring
                                                          : IoEngine::kThreads;
  if (want == IoEngine::kUring) {
    auto uring = MakeUringEngine(options.queue_depth > 0 ? options.queue_depth : 32);
    if (uring.ok()) {
      *chosen = IoEngine::kUring;
      return std::move(uring).value();
    }
    if (options.engine == IoEngine::kUring) return uring.status();
  }
  *chosen = IoEngine::kThreads;
  return MakeThreadPoolEngine(threads);
}

// (loader_internal.h) LoadOptions::fault_threads resolved.
int FaultThreads(const LoadOptions& options) { return FaultThreadCount(options.fault_threads); }

Result<LoadedCheckpoint> LoaderImpl::Run(const Checkpoint& ckpt, const LoadOptions& options,
                                         const EngineWrapper& wrap, const HostLoadHooks* hooks) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (options.block_size == 0) return InvalidArgumentError("block_size must be positive");

  std::vector<FileJob> jobs;
  const std::vector<Checkpoint::Location> selected = SelectTensors(ckpt, options.filter, jobs);
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    // Views of the page cache for auto's cached files, unless the caller asked for owned
    // copies or places the tensors itself (hooks: its own buffers, served or broadcast).
    Status st = PlanJob(job, options, !options.copy && !options.shared_memory && hooks == nullptr);
    if (!st.ok()) return st.WithContext(job.shard->path);
  }

  // Plans list tensors in file order; find each selected one's placement.
  std::vector<std::vector<const PlannedTensor*>> placed(jobs.size());
  for (size_t s = 0; s < jobs.size(); ++s) {
    placed[s].assign(ckpt.shards()[s].header.tensors().size(), nullptr);
    for (const auto& pt : jobs[s].plan.tensors) placed[s][pt.index] = &pt;
  }
  auto address = [&](Checkpoint::Location loc) -> std::byte* {
    const FileJob& job = jobs[loc.shard];
    const PlannedTensor* pt = placed[loc.shard][loc.index];
    return pt->in_arena
               ? job.arena->data() + pt->arena_offset
               : job.mapping->data() + job.shard->header.data_offset() + ckpt.info(loc).begin;
  };
  if (hooks && hooks->placed) {
    for (auto loc : selected) hooks->placed(loc, address(loc));
  }

  // The result's tensors, in name order, before any read: on_tensor hands them
  // out as their bytes land.
  CheckpointBuilder out;
  out.Reserve(selected.size());
  for (auto loc : selected) {
    const FileJob& job = jobs[loc.shard];
    const TensorInfo& info = ckpt.info(loc);
    out.Add(MakeTensor(info, info.dtype, address(loc), info.nbytes()),
            placed[loc.shard][loc.index]->in_arena ? job.arena : job.mapping);
  }

  // Direct and buffered reads go to their own engines (see MakeEngine).
  std::vector<ReadOp> ops[2];  // [0] buffered, [1] direct.
  uint64_t read_bytes = 0;
  uint32_t read_id = 0;  // Every read's number, across the files.
  // Reads still to finish per shard, for hooks->file_done.
  std::unique_ptr<std::atomic<uint64_t>[]> pending(new std::atomic<uint64_t>[jobs.size()]);
  for (size_t s = 0; s < jobs.size(); ++s) {
    auto& job = jobs[s];
    pending[s] = 0;
    if (job.wanted.empty()) continue;
    for (const PlannedRead& r : job.plan.reads) {
      ops[r.direct].push_back({r.direct ? job.direct.fd() : job.buffered.fd(), r.file_offset,
                               r.length, job.arena->data() + r.arena_offset, r.bounce,
                               &job.shard->path, static_cast<uint32_t>(s), read_id++});
      read_bytes += r.length;
      ++pending[s];
    }
  }

  // Where each tensor's bytes sit in its file's arena (those read into it), per
  // shard in arena order: which tensors a read fills.
  struct Span {
    uint64_t begin, end;
    uint32_t tensor;
  };
  std::vector<std::vector<Span>> spans;
  // The content identity (LoadOptions::content_hash): pieces hashed as reads
  // complete them; views of the page cache are not read, so kAuto skips loads
  // that have any, and kOn hashes them after the reads.
  std::optional<ContentHasher> hasher;
  {
    bool views = false;
    for (auto loc : selected) views |= !placed[loc.shard][loc.index]->in_arena;
    if (options.content_hash == ContentHashMode::kOn ||
        (options.content_hash == ContentHashMode::kAuto && !views)) {
      std::vector<TensorContent> contents;
      std::vector<const std::byte*> data;
      contents.reserve(selected.size());
      data.reserve(selected.size());
      for (const LoadedTensor& t : out.tensors()) {
        contents.push_back({t.name, t.dtype, t.shape, t.nbytes, {}});
        data.push_back(static_cast<const std::byte*>(t.data));
      }
      hasher.emplace(std::move(contents), std::move(data));
    }
  }
  if (options.on_tensor || hasher) {
    spans.resize(jobs.size());
    for (size_t i = 0; i < selected.size(); ++i) {
      const PlannedTensor* pt = placed[selected[i].shard][selected[i].index];
      const uint64_t n = out.tensors()[i].nbytes;
      if (pt->in_arena && n > 0) {
        spans[selected[i].shard].push_back(
            {pt->arena_offset, pt->arena_offset + n, static_cast<uint32_t>(i)});
      }
    }
    for (auto& sp : spans) {
      std::sort(sp.begin(), sp.end(),
                [](const Span& a, const Span& b) { return a.begin < b.begin; });
    }
  }
  // Calls f(span) for each tensor span that read `op` overlaps.
  auto for_spans = [&](const ReadOp& op, auto&& f) {
    const auto& sp = spans[op.tag];
    const uint64_t lo = static_cast<uint64_t>(op.dest - jobs[op.tag].arena->data()),
                   hi = lo + op.length;
    // Tensors in an arena do not overlap: the first that ends after lo, then on.
    auto it =
        std::partition_point(sp.begin(), sp.end(), [&](const Span& t) { return t.end <= lo; });
    for (; it != sp.end() && it->begin < hi; ++it) f(*it, lo, hi);
  };

  // on_tensor: which tensors each read fills, and how many reads each tensor waits for.
  std::vector<std::vector<uint32_t>> read_tensors;
  std::unique_ptr<std::atomic<uint32_t>[]> waiting;
  std::optional<Deliverer> deliverer;
  if (options.on_tensor) {
    read_tensors.resize(read_id);
    waiting.reset(new std::atomic<uint32_t>[selected.size()]);
    for (size_t i = 0; i < selected.size(); ++i) waiting[i] = 0;
    for (const auto& list : ops) {
      for (const ReadOp& op : list) {
        for_spans(op, [&](const Span& t, uint64_t, uint64_t) {
          read_tensors[op.id].push_back(t.tensor);
          ++waiting[t.tensor];
        });
      }
    }
    deliverer.emplace(options.on_tensor, out.tensors(), out.owners());
    for (size_t i = 0; i < selected.size(); ++i) {
      if (waiting[i] == 0) deliverer->Ready(i);  // Views, and tensors with no bytes.
    }
  }

  ReadProgress progress;
  ProgressReporter reporter(options.progress, read_bytes);
  progress.tick = [&] {
    reporter.Report(progress.bytes_done.load(std::memory_order_relaxed), false);
  };
  const bool file_done = hooks && hooks->file_done;
  // Where nothing is handed on while the reads run (a plain host load), the
  // hashing is a thread's of its own; otherwise it happens before a tensor is
  // handed out or a file handed on (whose memory may then be reused).
  std::optional<BackgroundHasher> background;
  if (hasher && !file_done && !deliverer) background.emplace(&*hasher);
  if (file_done || deliverer || hasher) {
    progress.op_done = [&](const ReadOp& op) {
      // Hashed first: a tensor handed out, or a file handed on, is hashed.
      if (hasher) {
        for_spans(op, [&](const Span& t, uint64_t lo, uint64_t hi) {
          const uint64_t from = std::max(lo, t.begin), to = std::min(hi, t.end);
          if (background) {
            background->Landed(t.tensor, from - t.begin, to - from);
          } else {
            hasher->Landed(t.tensor, from - t.begin, to - from);
          }
        });
      }
      if (file_done && pending[op.tag].fetch_sub(1, std::memory_order_acq_rel) == 1)
        hooks->file_done(op.tag);
      if (deliverer) {
        for (uint32_t t : read_tensors[op.id]) {
          if (waiting[t].fetch_sub(1, std::memory_order_acq_rel) == 1) deliverer->Ready(t);
        }
      }
    };
  }
  if (file_done) {
    for (size_t s = 0; s < jobs.size(); ++s) {
      if (!jobs[s].wanted.empty() && pending[s] == 0) hooks->file_done(static_cast<uint32_t>(s));
    }
  }
  IoEngine engine_kind[2] = {IoEngine::kThreads, IoEngine::kThreads};
  // The engines first: their set-up maps memory (the ring, thread stacks), and an
  // mmap waits for the mmap lock that the fault threads' populate steps hold.
  std::unique_ptr<ReadEngine> engines[2];
  for (int direct : {1, 0}) {
    if (ops[direct].empty()) continue;
    TL_ASSIGN_OR_RETURN(engines[direct],
                        MakeEngine(options, direct == 1, ops[direct], &engine_kind[direct]));
    if (wrap) engines[direct] = wrap(std::move(engines[direct]));
  }
  {
    // Fresh memory's first touch (page faults) costs as much as the reads
    // themselves on some machines; a helper threads fault the arenas in, in
    // file order, ahead of the reads (docs/loading.md, "Memory").
    std::vector<PopulateAhead::Region> regions;
    for (const auto& job : jobs) {
      // A buffer reused from an ArenaPool: only what it has not held before.
      const uint64_t from = job.arena ? job.arena->touched() / kPageAlign * kPageAlign : 0;
      if (!job.wanted.empty() && job.arena && from < job.arena->size()) {
        regions.push_back({job.arena->data() + from, job.arena->size() - from});
      }
    }
    if (hooks) {
      for (const auto& buf : hooks->populate) regions.push_back({buf->data(), buf->size()});
    }
    // auto's views of the page cache: their page tables filled in by the same threads
    // (after the fresh memory the reads need first), read-only (no copy-on-write), so that
    // the consumer's first pass takes no page faults. An explicit mode=mmap stays lazy, as
    // documented: its bytes come in on first touch.
    for (const auto& job : jobs) {
      if (job.wanted.empty() || !job.mapping || options.mode != IoMode::kAuto) continue;
      const Header& h = job.shard->header;
      const uint64_t first =
          (h.data_offset() + h.tensors()[job.wanted.front()].begin) / kPageAlign * kPageAlign;
      const uint64_t last = h.data_offset() + h.tensors()[job.wanted.back()].end;
      regions.push_back({job.mapping->data() + first,
                         (last - first + kPageAlign - 1) / kPageAlign * kPageAlign,
                         /*read=*/true});
    }
    PopulateAhead populate(regions, FaultThreads(options));
    for (int direct : {1, 0}) {
      if (engines[direct]) TL_RETURN_IF_ERROR(engines[direct]->Run(ops[direct], &progress));
    }
    populate.StopFresh();
    populate.Finish();
  }
  if (deliverer) TL_RETURN_IF_ERROR(deliverer->Finish());
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    Status st = CheckUnchanged(job);
    if (!st.ok()) return st.WithContext(job.shard->path);
    // Its pages were written by the reads (or faulted in ahead of them).
    if (job.arena) job.arena->set_touched(job.arena->size());
  }
  reporter.Report(progress.bytes_done.load(std::memory_order_relaxed), true);
  for (auto& job : jobs) {
    if (job.wanted.empty()) continue;
    job.report.engine = engine_kind[job.report.mode == IoMode::kDirect];
    out.files().push_back(std::move(job.report));
  }
  if (background) background->Finish();
  if (hasher) {
    out.set_content(std::make_shared<const ContentIdentity>(std::move(*hasher).Finish()));
  }
  return std::move(out).Finish(std::chrono::duration<double>(Clock::now() - t0).count());
}

Result<std::pair<DeviceType, int>> ParseDevice(std::string_view name) {
  auto bad = [&] {
    return InvalidArgumentError("unknown device " + QuoteName(name) +
                                " (expected cpu, cuda or cuda:N)");
  };
  std::string_view kind = name, index;
  if (auto colon = name.find(':'); colon != std::string_view::npos) {
    kind = name.substr(0, colon);
    index = name.substr(colon + 1);
    if (index.empty() || index.size() > 4 ||
        index.find_first_not_of("0123456789") != std::string_view::npos) {
      return bad();
    }
  }
  const int n = index.empty() ? 0 : std::stoi(std::string(index));
  if (kind == "cpu" && n == 0) return std::pair{DeviceType::kCpu, 0};
  if (kind == "cuda") return std::pair{DeviceType::kCuda, n};
  if (kind == "emulated") return std::pair{DeviceType::kEmulated, n};
  return bad();
}

namespace {

// The device of options.device, or none for a plain host load.
Result<std::shared_ptr<Device>> DeviceFor(const LoadOptions& options) {
  TL_ASSIGN_OR_RETURN(auto dev, ParseDevice(options.device));
  switch (dev.first) {
    case DeviceType::kCpu:
      if (!options.dtype) return std::shared_ptr<Device>();
      return MakeHostDevice();
    case DeviceType::kCuda:
    case DeviceType::kEmulated:
      return OpenDevice(dev.first, dev.second);
  }
  return std::shared_ptr<Device>();
}

}  // namespace

Status LoaderImpl::HandOutAll(const LoadedCheckpoint& loaded, const TensorCallback& on_tensor) {
  const auto& owners = CheckpointBuilder::Owners(loaded);
  for (size_t i = 0; i < loaded.tensors().size(); ++i) {
    TL_RETURN_IF_ERROR(on_tensor(StreamedTensor(loaded.tensors()[i], owners[i])));
  }
  return Status::Ok();
}

namespace {

// Load without LoadOptions::shared_memory's last step.
Result<LoadedCheckpoint> LoadAnyPath(const Checkpoint& checkpoint, const LoadOptions& options) {
  TL_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, DeviceFor(options));
  const bool sparse = options.decode_sparse && MayBeSparse(checkpoint);
  if (!device && !sparse) return LoaderImpl::Run(checkpoint, options, nullptr);
  if (options.content_hash == ContentHashMode::kOn) {
    return InvalidArgumentError(
        "content_hash: the content identity is computed by host loads of the stored bytes, not "
        "by device loads, dtype conversions or decoded sparse checkpoints (decode_sparse)");
  }
  // These loads hand their tensors to on_tensor once they are complete.
  LoadOptions inner = options;
  inner.on_tensor = nullptr;
  inner.content_hash = ContentHashMode::kOff;
  Result<LoadedCheckpoint> r = !device  ? LoaderImpl::RunSparse(checkpoint, inner, nullptr)
                               : sparse ? LoadSparseThroughDevice(checkpoint, inner, device)
                                        : LoadThroughDevice(checkpoint, inner, device, nullptr);
  if (r.ok() && options.on_tensor)
    TL_RETURN_IF_ERROR(LoaderImpl::HandOutAll(*r, options.on_tensor));
  return r;
}

}  // namespace

Result<LoadedCheckpoint> Load(const Checkpoint& checkpoint, const LoadOptions& options) {
  if (!options.shared_memory) return LoadAnyPath(checkpoint, options);
  TL_RETURN_IF_ERROR(CheckSharedMemoryOptions(options));
  // The arenas are shared memory (PlanJob); what else the load makes
  // (conversions, decoded sparse tensors) is moved into it at the end, and
  // everything sealed before a tensor is handed out.
  LoadOptions inner = options;
  inner.on_tensor = nullptr;
  inner.copy = true;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadAnyPath(checkpoint, inner));
  TL_ASSIGN_OR_RETURN(loaded, IntoSharedMemory(std::move(loaded), checkpoint.path()));
  if (options.on_tensor) TL_RETURN_IF_ERROR(LoaderImpl::HandOutAll(loaded, options.on_tensor));
  return loaded;
}

Result<LoadedCheckpoint> Load(const std::string& path, const LoadOptions& options) {
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path));
  return Load(ckpt, options);
}

Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint,
                                               const LoadOptions& options,
                                               const EngineWrapper& wrap) {
  if (options.decode_sparse && MayBeSparse(checkpoint)) {
    LoadOptions inner = options;
    inner.on_tensor = nullptr;
    Result<LoadedCheckpoint> r = LoaderImpl::RunSparse(checkpoint, inner, wrap);
    if (r.ok() && options.on_tensor)
      TL_RETURN_IF_ERROR(LoaderImpl::HandOutAll(*r, options.on_tensor));
    return r;
  }
  return LoaderImpl::Run(checkpoint, options, wrap);
}

}  // namespace tensorlift
