// LoadStriped: the planner's byte ranges shared among the local files, a
// bucket and running peers at once, work-stealing from one queue, each chunk
// checked where it lands (include/tensorlift/striped.h).
//
// The plan is striped_plan.h's, the sources (disk, bucket, peers)
// striped_sources.h's; here: the scheduler that shares the ranges among the
// sources, and LoadStriped.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/posix_file.h"
#include "device/device.h"
#include "device/host_buffer.h"
#include "device/populate.h"
#include "io/page_cache.h"
#include "load/checkpoint_builder.h"
#include "load/file_job.h"
#include "load/upload.h"
#include "remote/peer_reader.h"
#include "sources/striped_plan.h"
#include "sources/striped_sources.h"
#include "tensorlift/sparse.h"
#include "tensorlift/striped.h"

namespace tensorlift {
namespace {

using sources::CheckRange;
using sources::CutRanges;
using sources::DiskSource;
using sources::MatchShards;
using sources::ObjectSource;
using sources::PeerSource;
using sources::Plan;
using sources::Planned;
using sources::PlanTensors;
using sources::Range;
using sources::Source;

using Clock = std::chrono::steady_clock;

// The fraction of the checkpoint's data in the page cache (its least cached
// shard's).
Result<double> CachedFraction(const Checkpoint& ckpt) {
  double least = 1;
  for (const Checkpoint::Shard& shard : ckpt.shards()) {
    auto f = PosixFile::OpenForRead(shard.path);
    if (!f.ok()) return f.status().WithContext(shard.path);
    const uint64_t begin = shard.header.data_offset();
    TL_ASSIGN_OR_RETURN(const double r,
                        ResidentFraction(f->fd(), begin, shard.identity.size - begin));
    least = std::min(least, r);
  }
  return least;
}

Status RefuseOptions(const StripeOptions& o) {
  auto refuse = [](const std::string& what) {
    return InvalidArgumentError("striped load: " + what);
  };
  const LoadOptions& l = o.load;
  if (l.mode != IoMode::kAuto) return refuse("the I/O mode is chosen per source; leave it auto");
  if (l.engine != IoEngine::kAuto)
    return refuse("the I/O engine is chosen per source; leave it auto");
  if (l.copy) return refuse("copy (views of the page cache) does not apply to striped loads");
  if (l.arena_pool) return refuse("an arena pool is not used for striped loads");
  if (l.dtype) return refuse("dtype conversion is not built for striped loads yet");
  if (l.on_tensor) return refuse("on_tensor is not built for striped loads yet");
  if (o.store.parallel.size > 1 || !o.store.layout.empty())
    return refuse("tensor-parallel slices are not built for striped loads yet (whole tensors)");
  if (!o.store.cache_dir.empty()) return refuse("cache_dir applies to object-storage loads alone");
  if (o.range_bytes < 4096) return refuse("range_bytes must be at least 4096");
  if (o.disk_threads < 1 || o.disk_threads > 256) return refuse("disk_threads must be 1..256");
  if (o.object_threads < 0 || o.object_threads > 256)
    return refuse("object_threads must be 0..256");
  if (o.peer_ranges_at_once < 1 || o.peer_ranges_at_once > 1024)
    return refuse("peer_ranges_at_once must be 1..1024");
  if (o.path.empty() && o.object_url.empty())
    return refuse("needs a local path or an object URL: the headers come from one of them");
  if (!o.object_url.empty() && !IsObjectStoreUrl(o.object_url))
    return refuse("object_url must be s3:// or gs://, not '" + o.object_url + "'");
  return Status::Ok();
}

// The queue every source's workers take ranges from.
class Scheduler {
 public:
  Scheduler(const Plan& plan, std::vector<std::unique_ptr<Source>>& sources,
            const StripeOptions& options)
      : plan_(plan),
        sources_(sources),
        options_(options),
        progress_(options.load.progress, plan.bytes) {
    for (size_t i = 0; i < plan.ranges.size(); ++i) {
      queue_.push_back(i);
      queued_bytes_ += plan.ranges[i].bytes;
    }
    alive_ = static_cast<int>(sources.size());
  }

  // Runs every source's workers until the ranges are all in or every source
  // has failed; true when all are in.
  bool Run(uint64_t* refetched) {
    start_ = Clock::now();
    // Every worker starts with a batch of its own, dealt round-robin over the
    // sources, so that every source is used (and measured) from the start
    // however fast the others are; then they all take from the queue.
    struct Worker {
      Source* source;
      std::vector<size_t> first;
    };
    std::vector<Worker> workers;
    int most = 0;
    for (auto& s : sources_) most = std::max(most, s->workers);
    for (int w = 0; w < most; ++w) {
      for (auto& s : sources_) {
        if (w >= s->workers) continue;
        Worker worker{s.get(), {}};
        while (!queue_.empty() && static_cast<int>(worker.first.size()) < s->take) {
          worker.first.push_back(queue_.front());
          queued_bytes_ -= plan_.ranges[queue_.front()].bytes;
          queue_.pop_front();
        }
        workers.push_back(std::move(worker));
      }
    }
    std::vector<std::thread> threads;
    for (Worker& w : workers) {
      threads.emplace_back([this, &w] { Work(*w.source, std::move(w.first)); });
    }
    for (auto& t : threads) t.join();
    *refetched = refetched_;
    if (done_ == plan_.ranges.size()) progress_.Report(bytes_, true);
    return done_ == plan_.ranges.size();
  }

 private:
  // Fetches `ids` (its first batch), then batches from the queue, until the
  // load is over or its source has failed.
  void Work(Source& src, std::vector<size_t> ids) {
    for (;; ids.clear()) {
      std::vector<const Range*> mine;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!ids.empty() && src.dead) {  // Another worker of its source failed first.
          for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
            queue_.push_front(*it);
            queued_bytes_ += plan_.ranges[*it].bytes;
          }
          cv_.notify_all();
          return;
        }
        if (ids.empty()) {
          cv_.wait(lock,
                   [&] { return (!queue_.empty() && !LeaveToOthers(src)) || Over() || src.dead; });
          if (Over() || src.dead) return;
          while (!queue_.empty() && static_cast<int>(ids.size()) < src.take) {
            ids.push_back(queue_.front());
            queued_bytes_ -= plan_.ranges[ids.back()].bytes;
            queue_.pop_front();
          }
        }
      }
      for (size_t i : ids) mine.push_back(&plan_.ranges[i]);
      const auto fetch_start = Clock::now();
      Status st = src.Fetch(mine, plan_);
      for (size_t k = 0; st.ok() && k < mine.size(); ++k)
        st = CheckRange(*mine[k], plan_, src.report.name);
      std::unique_lock<std::mutex> lock(mu_);
      if (!st.ok()) {
        if (!src.dead) {
          src.dead = true;
          src.report.failure = st.message();
          --alive_;
        }
        // Back to the front: the others take them next.
        for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
          queue_.push_front(*it);
          queued_bytes_ += plan_.ranges[*it].bytes;
        }
        refetched_ += ids.size();
        cv_.notify_all();
        return;
      }
      uint64_t bytes = 0;
      for (const Range* r : mine) bytes += r->bytes;
      done_ += ids.size();
      bytes_ += bytes;
      src.busy_s += std::chrono::duration<double>(Clock::now() - fetch_start).count();
      src.report.bytes += bytes;
      src.report.ranges += ids.size();
      src.report.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
      progress_.Report(bytes_, false);
      if (options_.on_range) options_.on_range(src.report.name, bytes);
      // Rates changed: workers that left the queue to the others ask again.
      cv_.notify_all();
    }
  }
  bool Over() const { return done_ == plan_.ranges.size() || alive_ == 0; }

  // The tail of a load: whether a worker of `src` should leave the queue to
  // the others, because they would fetch all of it before this worker
  // fetched one batch (at the rates measured so far). The fastest source,
  // and a source not measured yet, always take; so the queue is always
  // drained. Re-asked whenever the queue or the sources change.
  bool LeaveToOthers(const Source& src) const {
    const double mine = src.WorkerRate();
    if (mine <= 0) return false;
    double others = 0, fastest = 0;
    for (const auto& s : sources_) {
      if (s->dead || s->WorkerRate() <= 0) continue;
      const double rate = s->WorkerRate() * s->workers;
      fastest = std::max(fastest, rate);
      if (s.get() != &src) others += rate;
    }
    if (others <= 0 || mine * src.workers >= fastest) return false;
    uint64_t batch = 0;
    for (size_t k = 0; k < queue_.size() && static_cast<int>(k) < src.take; ++k)
      batch += plan_.ranges[queue_[k]].bytes;
    return batch / mine > queued_bytes_ / others;
  }

  const Plan& plan_;
  std::vector<std::unique_ptr<Source>>& sources_;
  const StripeOptions& options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  uint64_t queued_bytes_ = 0;  // Of the ranges in queue_.
  size_t done_ = 0;
  uint64_t bytes_ = 0;
  uint64_t refetched_ = 0;
  int alive_ = 0;
  Clock::time_point start_;
  ProgressReporter progress_;
};

}  // namespace

Result<LoadedCheckpoint> LoadStriped(const StripeOptions& options, StripeReport* report) {
  const auto t0 = Clock::now();
  StripeReport local;
  if (!report) report = &local;
  *report = StripeReport{};
  TL_RETURN_IF_ERROR(RefuseOptions(options));
  std::shared_ptr<Device> device;
  if (options.load.device != "cpu") {
    TL_ASSIGN_OR_RETURN(const auto where, ParseDevice(options.load.device));
    TL_ASSIGN_OR_RETURN(device, OpenDevice(where.first, where.second));
  }

  // The headers: the local copy's, else the bucket's.
  std::optional<Checkpoint> disk, bucket;
  if (!options.path.empty()) {
    auto c = Checkpoint::Open(options.path);
    if (c.ok()) {
      disk = std::move(c).value();
    } else if (options.object_url.empty()) {
      return c.status();
    } else {
      report->failures.push_back("disk:" + options.path + ": " + c.status().message());
    }
  }
  // A local copy in the page cache: its views cost no copy, no source is
  // faster (and no other source is asked anything).
  if (disk && options.use_page_cache) {
    TL_ASSIGN_OR_RETURN(const double cached, CachedFraction(*disk));
    if (cached >= 0.9) {
      TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, Load(*disk, options.load));
      StripeSourceReport only;
      only.name = "disk:" + options.path;
      only.bytes = loaded.total_bytes();
      report->sources.push_back(only);
      report->bytes = loaded.total_bytes();
      report->note = "the local copy is in the page cache (" + std::to_string(int(cached * 100)) +
                     "%): loaded from it alone";
      report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return loaded;
    }
  }
  if (!options.object_url.empty()) {
    auto c = OpenObjectStoreCheckpoint(options.object_url, options.store);
    if (c.ok()) {
      bucket = std::move(c).value();
    } else if (!disk) {
      return c.status();
    } else {
      report->failures.push_back(options.object_url + ": " + c.status().message());
    }
  }
  const Checkpoint& ckpt = disk ? *disk : *bucket;
  if (options.load.decode_sparse) {
    TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, sparse::FindSparse(ckpt));
    if (!catalog.empty()) {
      return UnimplementedError(ckpt.path() +
                                ": it has sparse-bitmask tensors, and decoding them is not built "
                                "for striped loads yet; load with decode_sparse off to get the "
                                "parts as stored");
    }
  }
  TL_ASSIGN_OR_RETURN(Plan plan, PlanTensors(ckpt, options.load.filter));
  PeerKey key = options.key;
  if (key.model.empty()) {
    TL_ASSIGN_OR_RETURN(key, PeerKeyForCheckpoint(ckpt));
  }

  // Sources that can join.
  std::vector<std::unique_ptr<Source>> sources;
  if (disk) {
    auto d = DiskSource::Open(*disk, options.disk_threads);
    if (d.ok()) {
      sources.push_back(std::move(d).value());
    } else {
      report->failures.push_back("disk:" + options.path + ": " + d.status().message());
    }
  }
  if (bucket) {
    Result<std::vector<uint32_t>> shard_of =
        disk ? MatchShards(*disk, *bucket) : Result<std::vector<uint32_t>>([&] {
          std::vector<uint32_t> v;
          for (uint32_t s = 0; s < bucket->shards().size(); ++s) v.push_back(s);
          return v;
        }());
    int threads = options.object_threads;
    if (threads == 0) {
      const uint64_t by_memory = options.store.max_in_flight_bytes / options.range_bytes;
      threads = static_cast<int>(std::clamp<uint64_t>(
          by_memory, 1, static_cast<uint64_t>(std::max(1, options.store.connections))));
    }
    Result<std::unique_ptr<ObjectSource>> o =
        shard_of.ok() ? ObjectSource::Open(*bucket, *shard_of, options.store, threads)
                      : Result<std::unique_ptr<ObjectSource>>(shard_of.status());
    if (o.ok()) {
      sources.push_back(std::move(o).value());
    } else {
      report->failures.push_back(options.object_url + ": " + o.status().message());
    }
  }
  remote::PeerReaderOptions ro;
  ro.token = options.token;
  ro.request_timeout_ms = options.request_timeout_ms;
  ro.connect_timeout_ms = options.connect_timeout_ms;
  ro.stall_timeout_ms = options.stall_timeout_ms;
  ro.min_rate = options.min_rate;
  ro.transports = options.transports;
  const PeerSource* reference = nullptr;
  for (const std::string& url : remote::PeerUrlsFor(
           key, options.peers, options.registry, options.request_timeout_ms, &report->failures)) {
    auto reader = remote::PeerReader::Open(url, key, ro);
    Result<std::unique_ptr<PeerSource>> p =
        reader.ok()
            ? PeerSource::Open(std::move(reader).value(), ckpt, plan, options.peer_ranges_at_once)
            : Result<std::unique_ptr<PeerSource>>(reader.status());
    if (!p.ok()) {
      report->failures.push_back(p.status().message());
      continue;
    }
    if (!reference) reference = p->get();
    sources.push_back(std::move(p).value());
  }
  if (sources.empty()) {
    std::string why;
    for (const auto& f : report->failures) why += "\n  " + f;
    return UnavailableError("striped load: no source could join:" + why);
  }

  // Ranges: the reference peer's chunks, each checked where it lands.
  if (reference) {
    for (uint32_t i = 0; i < plan.tensors.size(); ++i)
      plan.tensors[i].checked_by = reference->served(i);
    const uint64_t cb = reference->manifest().chunk_bytes;
    CutRanges(plan, cb, std::max(cb, options.range_bytes / cb * cb), true);
  } else {
    CutRanges(plan, options.range_bytes, options.range_bytes, false);
  }
  report->checked = reference != nullptr;
  report->ranges = plan.ranges.size();

  bool all_in = false;
  {
    // Fresh memory is faulted in ahead of the transfers (as a disk load does).
    PopulateAhead populate({{plan.buffer->data(), plan.buffer->size()}},
                           FaultThreadCount(options.load.fault_threads));
    Scheduler scheduler(plan, sources, options);
    all_in = scheduler.Run(&report->refetched);
    populate.StopFresh();
  }
  for (const auto& s : sources) report->sources.push_back(s->report);
  if (!all_in) {
    std::string why;
    for (const auto& s : sources) why += "\n  " + s->report.name + ": " + s->report.failure;
    for (const auto& f : report->failures) why += "\n  " + f;
    return UnavailableError("striped load: every source failed:" + why);
  }
  sources.clear();  // Peer sessions closed; the buffer is no longer mapped.

  CheckpointBuilder out;
  std::vector<FileReport> files(ckpt.shards().size());
  for (size_t s = 0; s < files.size(); ++s) {
    files[s].path = ckpt.shards()[s].path;
    files[s].reason = "striped over " + std::to_string(report->sources.size()) + " source(s)";
  }
  for (const Planned& t : plan.tensors) {
    const TensorInfo& info = ckpt.info(t.loc);
    out.Add(MakeTensor(info, info.dtype, t.nbytes ? t.data : nullptr, t.nbytes), plan.buffer);
    files[t.loc.shard].bytes += t.nbytes;
    ++files[t.loc.shard].tensors;
  }
  for (FileReport& f : files) {
    if (f.tensors) out.files().push_back(std::move(f));
  }
  report->bytes = plan.bytes;
  report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  LoadedCheckpoint loaded = std::move(out).Finish(report->seconds);
  if (device) return UploadToDevice(std::move(loaded), device);
  return loaded;
}

}  // namespace tensorlift
