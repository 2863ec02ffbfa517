// LoadStriped: one load's reads shared among the local files, a bucket and
// running peers at once (include/tensorlift/striped.h). The sources join a
// striped store (striped_store.h) and the loader's one path reads through it:
// host memory, the GPU pipeline, dtype conversion, sparse decoding and
// on_tensor as for any checkpoint.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "common/posix_file.h"
#include "io/page_cache.h"
#include "remote/peer_session.h"
#include "sources/striped_plan.h"
#include "sources/striped_sources.h"
#include "sources/striped_store.h"
#include "tensorlift/striped.h"

namespace tensorlift {
namespace {

using sources::DiskSource;
using sources::Layout;
using sources::MatchShards;
using sources::ObjectSource;
using sources::PeerSource;
using sources::Source;
using sources::StripedStore;

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
  if (l.threads != 0) return refuse("threads (pread threads) are set per source: disk_threads");
  if (o.store.parallel.size > 1 || !o.store.layout.empty())
    return refuse("a tensor-parallel rank's slices are given in load (LoadOptions::parallel)");
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

// The sources that can join (each that cannot is listed in report->failures);
// `reference`: the first peer's, whose manifest checks every chunk.
std::vector<std::unique_ptr<Source>> JoinSources(const StripeOptions& options,
                                                 const std::optional<Checkpoint>& disk,
                                                 const std::optional<Checkpoint>& bucket,
                                                 const Layout& layout, const PeerKey& key,
                                                 StripeReport* report,
                                                 const PeerSource** reference) {
  std::vector<std::unique_ptr<Source>> sources;
  if (disk) {
    auto d = DiskSource::Open(*disk, options.disk_threads, /*take=*/1);
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
  const remote::PeerSession::DialOptions dial = sources::WholeTensorDial(options);
  remote::UcxClient::GetOptions get;
  get.stall_timeout = std::chrono::milliseconds(options.stall_timeout_ms);
  get.min_rate = options.min_rate;
  *reference = nullptr;
  for (const std::string& url : remote::PeerUrlsFor(
           key, options.peers, options.registry, options.request_timeout_ms, &report->failures)) {
    auto session = remote::PeerSession::Dial(url, key, dial);
    Result<std::unique_ptr<PeerSource>> p =
        session.ok() ? PeerSource::Open(std::move(session).value(), layout, options.load.filter,
                                        options.peer_ranges_at_once, get)
                     : Result<std::unique_ptr<PeerSource>>(session.status());
    if (!p.ok()) {
      report->failures.push_back(p.status().message());
      continue;
    }
    if (!*reference) *reference = p->get();
    sources.push_back(std::move(p).value());
  }
  return sources;
}

// A local copy in the page cache: its views cost no copy, no source is
// faster (and no other source is asked anything). Empty: not so cached.
Result<std::optional<LoadedCheckpoint>> FromPageCache(const StripeOptions& options,
                                                      const Checkpoint& disk,
                                                      StripeReport* report) {
  TL_ASSIGN_OR_RETURN(const double cached, CachedFraction(disk));
  if (cached < 0.9) return std::optional<LoadedCheckpoint>();
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, Load(disk, options.load));
  StripeSourceReport only;
  only.name = "disk:" + options.path;
  only.bytes = loaded.total_bytes();
  report->sources.push_back(only);
  report->bytes = loaded.total_bytes();
  report->note = "the local copy is in the page cache (" + std::to_string(int(cached * 100)) +
                 "%): loaded from it alone";
  return std::optional<LoadedCheckpoint>(std::move(loaded));
}

}  // namespace

Result<LoadedCheckpoint> LoadStriped(const StripeOptions& options, StripeReport* report) {
  const auto t0 = Clock::now();
  StripeReport local;
  if (!report) report = &local;
  *report = StripeReport{};
  TL_RETURN_IF_ERROR(RefuseOptions(options));

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
  if (disk && options.use_page_cache) {
    TL_ASSIGN_OR_RETURN(std::optional<LoadedCheckpoint> cached,
                        FromPageCache(options, *disk, report));
    if (cached) {
      report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return std::move(*cached);
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
  PeerKey key = options.key;
  if (key.model.empty()) {
    TL_ASSIGN_OR_RETURN(key, PeerKeyForCheckpoint(ckpt));
  }
  Layout layout = sources::LayOut(ckpt);
  const PeerSource* reference = nullptr;
  std::vector<std::unique_ptr<Source>> sources =
      JoinSources(options, disk, bucket, layout, key, report, &reference);
  if (sources.empty()) {
    std::string why;
    for (const auto& f : report->failures) why += "\n  " + f;
    return UnavailableError("striped load: no source could join:" + why);
  }
  // Every chunk the reference peer serves is checked where it lands.
  if (reference) {
    for (auto& shard : layout.shards) {
      for (auto& t : shard) t.checked_by = reference->served(t);
    }
    layout.chunk_bytes = reference->manifest().chunk_bytes;
  }
  report->checked = reference != nullptr;
  StripedStore::Options so;
  so.piece_bytes = reference
                       ? std::max(layout.chunk_bytes,
                                  options.range_bytes / layout.chunk_bytes * layout.chunk_bytes)
                       : options.range_bytes;
  so.on_range = options.on_range;
  auto store = std::make_shared<StripedStore>(std::move(layout), std::move(sources), so);
  Result<LoadedCheckpoint> loaded = Load(ckpt.WithStore(store), options.load);
  report->sources = store->SourceReports();
  report->refetched = store->refetched();
  report->ranges = store->pieces();
  if (!loaded.ok()) {
    if (loaded.status().code() != StatusCode::kUnavailable) return loaded.status();
    std::string why;
    for (const auto& f : report->failures) why += "\n  " + f;
    return Status(loaded.status().code(), loaded.status().message() + why);
  }
  report->bytes = loaded->total_bytes();
  report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return loaded;
}

}  // namespace tensorlift
