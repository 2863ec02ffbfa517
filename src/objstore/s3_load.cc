// Checkpoints in a bucket: S3Store, the bucket's files for Checkpoint::Open and
// the source of a load's bytes (ranged GETs written straight into place), and
// LoadFromObjectStore, which loads through the one loader (Load) reading
// through the store: every load option works as for local files. A
// tensor-parallel rank's slices still have a loader of their own (LoadSlices)
// until the planner plans slices.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/posix_file.h"
#include "device/device.h"
#include "device/host_buffer.h"
#include "io/read_op.h"
#include "load/checkpoint_builder.h"
#include "load/file_job.h"
#include "load/upload.h"
#include "objstore/s3_client.h"
#include "objstore/s3_store.h"
#include "remote/layout.h"
#include "tensorlift/assign.h"
#include "tensorlift/objstore.h"
#include "tensorlift/sparse.h"

namespace tensorlift {
namespace {

using objstore::ObjectUrl;
using objstore::RangeRequest;
using objstore::S3Client;

// The first GET of a file's header: most headers fit, larger ones take a
// second GET of exactly their size.
constexpr uint64_t kHeaderProbeBytes = 1ull << 20;
// Wanted tensors closer than this in a file are fetched as one run (the gap
// bytes with them) rather than as two.
constexpr uint64_t kMergeGap = 1ull << 20;

// Checkpoint files in a bucket: for Checkpoint::Open (listings, headers), and
// the source of a load's bytes (ReadRanges: ranged GETs, or the write-through
// cache's copy of a file). Object sizes seen in listings and HEADs are kept,
// so each header costs one GET. Thread-safe.
class S3Store final : public CheckpointStore {
 public:
  S3Store(std::shared_ptr<S3Client> client, std::string scheme, std::string bucket,
          uint64_t request_bytes)
      : client_(std::move(client)),
        scheme_(std::move(scheme)),
        bucket_(std::move(bucket)),
        request_bytes_(request_bytes) {}

  S3Client& client() { return *client_; }
  // Ranged GETs of tensor data so far.
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  void CountRequests(uint64_t n) { requests_.fetch_add(n, std::memory_order_relaxed); }

  Result<bool> IsDirectory(const std::string& path) override {
    TL_ASSIGN_OR_RETURN(ObjectUrl url, Parse(path));
    if (!url.key.empty() && !url.key.ends_with('/')) {
      Result<objstore::ObjectInfo> head = client_->Head(url.bucket, url.key);
      if (head.ok()) {
        Remember(path, head->size, head->etag);
        return false;
      }
      if (head.status().code() != StatusCode::kNotFound) return head.status();
    }
    TL_ASSIGN_OR_RETURN(auto objects, Listing(url));
    if (objects.empty()) {
      return NotFoundError("no object or prefix " + path + " (nothing is stored under it)");
    }
    return true;
  }

  Result<std::vector<Entry>> List(const std::string& path) override {
    TL_ASSIGN_OR_RETURN(ObjectUrl url, Parse(path));
    TL_ASSIGN_OR_RETURN(auto objects, Listing(url));
    const std::string prefix = Prefix(url.key);
    std::vector<Entry> entries;
    for (const auto& o : objects) {
      if (o.key.size() <= prefix.size()) continue;
      entries.push_back({o.key.substr(prefix.size()), false});
      Remember(Join(path, entries.back().name), o.size, o.etag);
    }
    return entries;
  }

  Result<std::string> ReadSmall(const std::string& path, uint64_t limit) override {
    TL_ASSIGN_OR_RETURN(ObjectUrl url, Parse(path));
    return client_->Get(url.bucket, url.key, limit);
  }

  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override {
    Result<Header> h = ReadHeaderOf(path, identity);
    if (!h.ok() && h.status().message().rfind(path, 0) != 0) return h.status().WithContext(path);
    return h;
  }

  // Ranges of one object that follow each other in the object and in memory
  // go as one GET of up to request_bytes; a file with a current copy in the
  // cache (UseCache) is read from that copy instead.
  Status ReadRanges(std::span<const Range> ranges,
                    const std::function<void(size_t, uint64_t)>& landed) override {
    std::vector<RangeRequest> requests;
    // Per request, the ranges it carries (a piece of one, or several whole).
    std::vector<std::vector<uint32_t>> carries;
    std::unordered_map<const std::string*, ObjectUrl> urls;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      if (r.length == 0) continue;
      if (const CachedFile* copy = CachedCopy(*r.path)) {
        TL_RETURN_IF_ERROR(ReadCopy(*copy, *r.path, r));
        if (landed) landed(i, r.length);
        continue;
      }
      auto [it, fresh] = urls.try_emplace(r.path);
      if (fresh) {
        TL_ASSIGN_OR_RETURN(it->second, Parse(*r.path));
      }
      const ObjectUrl& url = it->second;
      RangeRequest* last = requests.empty() ? nullptr : &requests.back();
      if (last && last->key == url.key && last->bucket == url.bucket &&
          last->offset + last->bytes == r.offset && last->dst + last->bytes == r.dest &&
          last->bytes + r.length <= request_bytes_) {
        last->bytes += r.length;  // The whole range rides on the previous GET.
        carries.back().push_back(static_cast<uint32_t>(i));
        continue;
      }
      for (uint64_t off = 0; off < r.length; off += request_bytes_) {
        requests.push_back({url.bucket, url.key, r.offset + off,
                            std::min(request_bytes_, r.length - off), r.dest + off});
        carries.push_back({static_cast<uint32_t>(i)});
      }
    }
    requests_.fetch_add(requests.size(), std::memory_order_relaxed);
    return client_->GetRanges(requests, [&](size_t q) {
      if (!landed) return;
      if (carries[q].size() == 1) {
        landed(carries[q][0], requests[q].bytes);  // A piece of one range, or all of it.
        return;
      }
      for (uint32_t i : carries[q]) landed(i, ranges[i].length);
    });
  }

  std::string Describe(const std::string& path) const override {
    if (const CachedFile* copy = CachedCopy(path)) {
      return "from the cache of " + path + " (" + copy->path + ")";
    }
    return "object storage: ranged GETs of up to " + std::to_string(request_bytes_ >> 10) + " KiB";
  }

  // The write-through cache (ObjectStoreOptions::cache_dir): an object's copy
  // at DIR/BUCKET/KEY, valid while DIR/BUCKET/KEY.tl-etag holds the object's
  // size and ETag as the bucket lists them now. Reads of `paths` whose copy is
  // current come from it from now on (each copy opened once, here; one that
  // does not open is not a hit).
  void UseCache(const std::string& dir, const std::vector<std::string>& paths) {
    std::lock_guard lock(mu_);
    cache_dir_ = dir;
    for (const std::string& path : paths) {
      std::string hit = HitLocked(path);
      if (hit.empty()) continue;
      Result<PosixFile> file = PosixFile::OpenForRead(hit);
      if (file.ok()) cached_[path] = CachedFile{std::move(hit), std::move(file).value()};
    }
  }
  bool Cached(const std::string& path) const { return CachedCopy(path) != nullptr; }

  // Writes the object at `path` into the cache from its header's bytes and
  // its data section, which `write(out)` writes (in order) to the stream
  // through a temporary file renamed into place, then its stamp.
  Status WriteCache(const std::string& path, const std::function<Status(std::ostream&)>& write) {
    Object o;
    std::string file;
    {
      std::lock_guard lock(mu_);
      o = objects_[path];
      file = CacheFileLocked(path);
    }
    if (!o.known || o.etag.empty() || o.header.empty() || file.empty()) {
      return UnavailableError("the object's ETag or header is not known");
    }
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
    if (ec) return IOError("cannot create " + file + "'s directory: " + ec.message());
    const std::string tmp = file + ".tl-partial";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(o.header.data()),
              static_cast<std::streamsize>(o.header.size()));
      Status st = write(f);
      f.close();
      if (!st.ok()) {
        std::filesystem::remove(tmp, ec);
        return st;
      }
      if (!f) return IOError("cannot write " + tmp);
    }
    std::filesystem::remove(file + ".tl-etag", ec);
    std::filesystem::rename(tmp, file, ec);
    if (ec) return IOError("cannot rename " + tmp + ": " + ec.message());
    std::ofstream stamp(file + ".tl-etag", std::ios::trunc);
    stamp << Stamp(o);
    stamp.close();
    if (!stamp) return IOError("cannot write " + file + ".tl-etag");
    return Status::Ok();
  }

 private:
  // What the listing or a HEAD said of the object at `path`, and its header's
  // bytes once read (for the cache).
  struct Object {
    uint64_t size = 0;
    std::string etag;
    std::vector<std::byte> header;
    bool known = false;
  };

  Result<Header> ReadHeaderOf(const std::string& path, FileIdentity* identity) {
    TL_ASSIGN_OR_RETURN(ObjectUrl url, Parse(path));
    TL_ASSIGN_OR_RETURN(const uint64_t size, SizeOf(path, url));
    if (identity) *identity = FileIdentity{.size = size};
    if (size < 8) {
      return CorruptionError("the object has " + std::to_string(size) +
                             " bytes, too short for a safetensors header");
    }
    std::vector<std::byte> prefix(std::min(size, kHeaderProbeBytes));
    RangeRequest probe{url.bucket, url.key, 0, prefix.size(), prefix.data()};
    TL_RETURN_IF_ERROR(client_->GetRanges({&probe, 1}));
    uint64_t n = 0;
    std::memcpy(&n, prefix.data(), 8);  // Little-endian, as the format says.
    if (n <= kMaxHeaderSize && 8 + n <= size && 8 + n > prefix.size()) {
      prefix.resize(8 + n);
      RangeRequest rest{url.bucket, url.key, kHeaderProbeBytes, 8 + n - kHeaderProbeBytes,
                        prefix.data() + kHeaderProbeBytes};
      TL_RETURN_IF_ERROR(client_->GetRanges({&rest, 1}));
    }
    TL_ASSIGN_OR_RETURN(Header header, Header::ParsePrefix(prefix, size));  // Checks n.
    prefix.resize(8 + header.header_size());
    std::lock_guard lock(mu_);
    objects_[path].header = std::move(prefix);
    return header;
  }

  Result<ObjectUrl> Parse(const std::string& path) const {
    TL_ASSIGN_OR_RETURN(ObjectUrl url, objstore::ParseObjectUrl(path));
    if (url.bucket != bucket_ || url.scheme != scheme_) {
      return InvalidArgumentError(path + " is not in " + scheme_ + "://" + bucket_);
    }
    return url;
  }

  static std::string Prefix(const std::string& key) {
    return key.empty() || key.ends_with('/') ? key : key + "/";
  }
  static std::string Join(const std::string& dir, const std::string& name) {
    return dir.ends_with('/') ? dir + name : dir + "/" + name;
  }
  static std::string Stamp(const Object& o) { return std::to_string(o.size) + " " + o.etag + "\n"; }

  Result<std::vector<objstore::ObjectInfo>> Listing(const ObjectUrl& url) {
    return client_->List(url.bucket, Prefix(url.key), "/");
  }

  void Remember(const std::string& path, uint64_t size, const std::string& etag) {
    std::lock_guard lock(mu_);
    Object& o = objects_[path];
    o.size = size;
    o.etag = etag;
    o.known = true;
  }

  Result<uint64_t> SizeOf(const std::string& path, const ObjectUrl& url) {
    {
      std::lock_guard lock(mu_);
      if (auto it = objects_.find(path); it != objects_.end() && it->second.known) {
        return it->second.size;
      }
    }
    TL_ASSIGN_OR_RETURN(objstore::ObjectInfo info, client_->Head(url.bucket, url.key));
    Remember(path, info.size, info.etag);
    return info.size;
  }

  std::string CacheFileLocked(const std::string& url) const {
    Result<ObjectUrl> u = objstore::ParseObjectUrl(url);
    return u.ok() && !cache_dir_.empty() ? cache_dir_ + "/" + u->bucket + "/" + u->key
                                         : std::string();
  }
  // The cached copy of `url` when it is current, else "".
  std::string HitLocked(const std::string& url) const {
    auto it = objects_.find(url);
    const std::string path = CacheFileLocked(url);
    if (it == objects_.end() || !it->second.known || it->second.etag.empty() || path.empty())
      return "";
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) != it->second.size || ec) return "";
    std::ifstream stamp(path + ".tl-etag");
    std::string text((std::istreambuf_iterator<char>(stamp)), std::istreambuf_iterator<char>());
    return text == Stamp(it->second) ? path : "";
  }
  // A current copy in the cache, open for reading.
  struct CachedFile {
    std::string path;
    PosixFile file;
  };
  const CachedFile* CachedCopy(const std::string& path) const {
    std::lock_guard lock(mu_);
    auto it = cached_.find(path);
    return it == cached_.end() ? nullptr : &it->second;  // Never erased: stays valid.
  }
  // A range of `url` from its cached copy.
  static Status ReadCopy(const CachedFile& copy, const std::string& url, const Range& r) {
    Status st = ReadExactlyAt(copy.file.fd(), r.offset, r.dest, r.length);
    return st.ok() ? st : st.WithContext(url + ": the cache (" + copy.path + ")");
  }

  std::shared_ptr<S3Client> client_;
  std::string scheme_, bucket_;
  const uint64_t request_bytes_;
  std::atomic<uint64_t> requests_{0};
  mutable std::mutex mu_;
  std::map<std::string, Object> objects_;
  std::string cache_dir_;
  std::map<std::string, CachedFile> cached_;  // URL -> its current copy in the cache.
};

objstore::S3Overrides OverridesFrom(const ObjectStoreOptions& o) {
  objstore::S3Overrides v;
  v.endpoint = o.endpoint;
  v.region = o.region;
  v.profile = o.profile;
  v.anonymous = o.anonymous;
  v.addressing = o.addressing;
  return v;
}

Status CheckStoreOptions(const ObjectStoreOptions& o) {
  if (o.connections < 1) return InvalidArgumentError("object storage: connections must be >= 1");
  if (o.request_bytes < 4096)
    return InvalidArgumentError("object storage: request_bytes must be at least 4096");
  if (o.max_in_flight_bytes < o.request_bytes) {
    return InvalidArgumentError(
        "object storage: max_in_flight_bytes (" + std::to_string(o.max_in_flight_bytes) +
        ") is below request_bytes (" + std::to_string(o.request_bytes) + ")");
  }
  if (o.retries < 0) return InvalidArgumentError("object storage: retries must be >= 0");
  if (o.addressing != "auto" && o.addressing != "path" && o.addressing != "virtual") {
    return InvalidArgumentError("object storage: addressing must be auto, path or virtual, not '" +
                                o.addressing + "'");
  }
  return Status::Ok();
}

// The client for `url`, with the transfer settings of `o`.
Result<std::unique_ptr<S3Client>> ClientFor(const ObjectUrl& url, const ObjectStoreOptions& o) {
  TL_RETURN_IF_ERROR(CheckStoreOptions(o));
  TL_ASSIGN_OR_RETURN(objstore::S3Settings settings,
                      objstore::ResolveS3Settings(url.scheme, OverridesFrom(o)));
  const uint64_t by_memory = o.max_in_flight_bytes / o.request_bytes;
  settings.max_connections =
      static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(o.connections, by_memory)));
  settings.retries = o.retries;
  settings.min_rate = o.min_rate;
  return S3Client::Create(settings);
}

// A tensor-parallel rank's load of slices (LoadSlices) is still a loader of
// its own: the options it does not take are refused here, never ignored.
Status RefuseForSlices(const LoadOptions& options) {
  auto refuse = [](const char* what) {
    return InvalidArgumentError(std::string("object storage, a tensor-parallel rank's slices: ") +
                                what);
  };
  if (options.mode != IoMode::kAuto)
    return refuse("the I/O mode applies to local files; leave it auto");
  if (options.engine != IoEngine::kAuto)
    return refuse("the I/O engine applies to local files; leave it auto");
  if (options.arena_pool) return refuse("an arena pool is not used for slices");
  if (options.dtype) return refuse("dtype conversion is not built for slices yet");
  if (options.on_tensor) return refuse("on_tensor is not built for slices yet");
  if (options.shared_memory) return refuse("shared_memory is not built for slices yet");
  if (options.content_hash == ContentHashMode::kOn)
    return refuse("content_hash is the whole checkpoint's, not a rank's slices");
  return Status::Ok();
}

// A run of wanted tensors of one file fetched together: file bytes
// [begin, end) land at buffer offset `at`.
struct Run {
  uint64_t begin = 0, end = 0, at = 0;
};

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The store of `url`'s bucket over a client with `store`'s settings.
Result<std::shared_ptr<S3Store>> StoreFor(const ObjectUrl& url, const ObjectStoreOptions& store) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, ClientFor(url, store));
  return std::make_shared<S3Store>(std::shared_ptr<S3Client>(std::move(client)), url.scheme,
                                   url.bucket, store.request_bytes);
}

void FillReport(S3Store& files, ObjectStoreReport* report) {
  if (!report) return;
  S3Client& client = files.client();
  report->endpoint = client.settings().endpoint;
  report->credential_source = client.settings().credential_source;
  report->bytes = client.bytes_received();
  report->requests = files.requests();
  report->retries = client.retries();
  report->connections = client.settings().max_connections;
}

// Writes shard `s` of `ckpt` into the cache from the load's tensors when they
// are its stored bytes and cover its whole data section; returns what to add
// to its report's reason ("" when the load did not take all of it).
std::string WriteToCache(S3Store& files, const Checkpoint& ckpt, size_t s,
                         const LoadedCheckpoint& loaded) {
  const Checkpoint::Shard& shard = ckpt.shards()[s];
  if (files.Cached(shard.path)) return "";
  std::vector<const TensorInfo*> infos;
  for (const TensorInfo& t : shard.header.tensors()) infos.push_back(&t);
  std::sort(infos.begin(), infos.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  std::vector<const LoadedTensor*> tensors;
  uint64_t at = 0;
  bool covered = true;
  for (const TensorInfo* t : infos) {
    const LoadedTensor* got = loaded.Find(t->name);
    if (got == nullptr) return "";  // A filtered load: not all of the object.
    if (got->dtype != t->dtype || got->nbytes != t->nbytes()) {
      return "; not cached (the load converted its tensors)";
    }
    covered &= t->begin == at;
    at = t->end;
    tensors.push_back(got);
  }
  const uint64_t data_bytes = shard.header.file_size() - shard.header.data_offset();
  if (data_bytes == 0) return "";
  if (!covered || at != data_bytes) {
    return "; not cached (its data section has bytes no tensor covers)";
  }
  Status w = files.WriteCache(shard.path, [&](std::ostream& out) {
    std::vector<std::byte> bounce;
    for (const LoadedTensor* t : tensors) {
      const std::byte* bytes = static_cast<const std::byte*>(t->data);
      if (t->device != DeviceType::kCpu && t->nbytes > 0) {  // Through host memory, a tensor
        bounce.resize(t->nbytes);                            // at a time.
        TL_RETURN_IF_ERROR(loaded.CopyToHost(t->name, bounce.data()));
        bytes = bounce.data();
      }
      out.write(reinterpret_cast<const char*>(bytes), static_cast<std::streamsize>(t->nbytes));
    }
    return Status::Ok();
  });
  return w.ok() ? "; written to the cache" : "; not cached: " + w.message();
}

// The one loader (Load) over `ckpt` read through `files`, then the cache's
// writes and the report.
Result<LoadedCheckpoint> LoadThroughStore(const Checkpoint& ckpt,
                                          const std::shared_ptr<S3Store>& files,
                                          const LoadOptions& options, bool cache,
                                          ObjectStoreReport* report,
                                          std::chrono::steady_clock::time_point start) {
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, Load(ckpt.WithStore(files), options));
  std::vector<std::string> notes(ckpt.shards().size());
  for (size_t s = 0; cache && s < notes.size(); ++s) {
    notes[s] = WriteToCache(*files, ckpt, s, loaded);
  }
  // The same tensors where they are; the reports say what the cache did, and
  // the time counts the listing and the headers too.
  CheckpointBuilder out(std::move(loaded));
  for (FileReport& f : out.files()) {
    for (size_t s = 0; s < notes.size(); ++s) {
      if (ckpt.shards()[s].path == f.path) f.reason += notes[s];
    }
  }
  FillReport(*files, report);
  return std::move(out).Finish(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// A tensor-parallel rank's slices (ObjectStoreOptions::parallel): only the
// slices' bytes are fetched.
Result<LoadedCheckpoint> LoadSlices(S3Store& files, const Checkpoint& ckpt,
                                    const LoadOptions& options, const ObjectStoreOptions& store,
                                    std::chrono::steady_clock::time_point start);

}  // namespace

namespace objstore {
Result<std::unique_ptr<S3Client>> ClientForStore(const ObjectUrl& url,
                                                 const ObjectStoreOptions& store) {
  return ClientFor(url, store);
}
}  // namespace objstore

bool IsObjectStoreUrl(std::string_view path) { return objstore::IsObjectUrl(path); }

Status ReadObjectStoreRange(const std::string& url, uint64_t offset, uint64_t bytes, void* dst,
                            const ObjectStoreOptions& store) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgumentError("ReadObjectStoreRange: no destination");
  TL_ASSIGN_OR_RETURN(ObjectUrl parsed, objstore::ParseObjectUrl(url));
  TL_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, ClientFor(parsed, store));
  std::vector<RangeRequest> requests;
  for (uint64_t off = 0; off < bytes; off += store.request_bytes) {
    requests.push_back({parsed.bucket, parsed.key, offset + off,
                        std::min(store.request_bytes, bytes - off),
                        static_cast<std::byte*>(dst) + off});
  }
  return client->GetRanges(requests);
}

std::function<Result<LoadedCheckpoint>(const std::string& path, const LoadOptions& options)>
ObjectStoreFallback(const ObjectStoreOptions& store) {
  return [store](const std::string& path, const LoadOptions& options) {
    return IsObjectStoreUrl(path) ? LoadFromObjectStore(path, options, store) : Load(path, options);
  };
}

Result<Checkpoint> OpenObjectStoreCheckpoint(const std::string& url,
                                             const ObjectStoreOptions& store) {
  TL_ASSIGN_OR_RETURN(ObjectUrl parsed, objstore::ParseObjectUrl(url));
  TL_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> files, StoreFor(parsed, store));
  return Checkpoint::Open(url, std::shared_ptr<CheckpointStore>(files));
}

Result<LoadedCheckpoint> LoadFromObjectStore(const std::string& url, const LoadOptions& options,
                                             const ObjectStoreOptions& store,
                                             ObjectStoreReport* report) {
  const auto start = std::chrono::steady_clock::now();
  // One client for the listing, the headers and the data: one set of
  // connections, and the report counts all of it.
  TL_ASSIGN_OR_RETURN(ObjectUrl parsed, objstore::ParseObjectUrl(url));
  TL_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> files, StoreFor(parsed, store));
  if (store.parallel.size > 1) {
    if (!store.cache_dir.empty()) {
      return InvalidArgumentError(
          "object storage: cache_dir keeps whole objects; a tensor-parallel rank's load fetches "
          "slices");
    }
    TL_RETURN_IF_ERROR(RefuseForSlices(options));
    TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(url, *files));
    TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSlices(*files, ckpt, options, store, start));
    FillReport(*files, report);
    return loaded;
  }
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(url, *files));
  if (!store.cache_dir.empty()) {
    std::vector<std::string> paths;
    for (const auto& shard : ckpt.shards()) paths.push_back(shard.path);
    files->UseCache(store.cache_dir, paths);
  }
  return LoadThroughStore(ckpt, files, options, !store.cache_dir.empty(), report, start);
}

Result<LoadedCheckpoint> LoadFromObjectStore(const Checkpoint& ckpt, const LoadOptions& options,
                                             const ObjectStoreOptions& store,
                                             ObjectStoreReport* report) {
  const auto start = std::chrono::steady_clock::now();
  if (!store.cache_dir.empty()) {
    return InvalidArgumentError(
        "object storage: cache_dir needs LoadFromObjectStore(url), which lists the objects' "
        "ETags; this checkpoint was opened before");
  }
  TL_ASSIGN_OR_RETURN(ObjectUrl parsed, objstore::ParseObjectUrl(ckpt.path()));
  TL_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> files, StoreFor(parsed, store));
  if (store.parallel.size > 1) {
    TL_RETURN_IF_ERROR(RefuseForSlices(options));
    TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadSlices(*files, ckpt, options, store, start));
    FillReport(*files, report);
    return loaded;
  }
  return LoadThroughStore(ckpt, files, options, false, report, start);
}

namespace {

Result<LoadedCheckpoint> LoadSlices(S3Store& files, const Checkpoint& ckpt,
                                    const LoadOptions& options, const ObjectStoreOptions& store,
                                    std::chrono::steady_clock::time_point start) {
  S3Client* client = &files.client();
  const std::string& url = ckpt.path();
  std::shared_ptr<Device> device;
  if (options.device != "cpu") {
    TL_ASSIGN_OR_RETURN(const auto where, ParseDevice(options.device));
    TL_ASSIGN_OR_RETURN(device, OpenDevice(where.first, where.second));
  }
  if (options.decode_sparse) {
    TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, sparse::FindSparse(ckpt));
    if (!catalog.empty()) {
      return UnimplementedError(
          url +
          ": it has sparse-bitmask tensors, and decoding them is not built for object "
          "storage loads yet; load with decode_sparse off to get the parts as stored");
    }
  }

  // This rank's slices (ObjectStoreOptions::parallel and layout).
  remote::Layout layout;
  if (store.parallel.size > 1) {
    TL_ASSIGN_OR_RETURN(layout, remote::Layout::Parse(store.layout));
    TL_RETURN_IF_ERROR(ShardRange(1, store.parallel.rank, store.parallel.size).status());
  }

  // Per file: the wanted tensors in file order. Whole ones are cut into runs
  // fetched straight into place; a slice is fetched as its pieces (one for a
  // dim-0 slice) straight into place, or, where its pieces lie close together
  // (a slice along a later dim: a piece per row), as the span covering them
  // into scratch memory, packed afterwards.
  struct Slice {
    uint32_t index = 0;          // Into the shard's tensors.
    std::vector<int64_t> shape;  // This rank's.
    uint64_t at = 0, bytes = 0;  // Where in the file's buffer.
    std::vector<remote::CopyPiece> pieces;
  };
  struct FilePlan {
    std::vector<uint32_t> whole;
    std::vector<Slice> slices;
    std::vector<Run> runs;
    uint64_t buffer_bytes = 0;
    std::shared_ptr<HostBuffer> buffer;
  };
  // A span of a sliced tensor fetched into scratch, then packed.
  struct Packed {
    std::string bucket, key;
    uint64_t begin = 0, end = 0;  // File bytes.
    uint64_t tensor_offset = 0;   // The span's offset in the tensor.
    std::vector<remote::CopyPiece> pieces;
    std::byte* slot = nullptr;
  };
  std::vector<FilePlan> plans(ckpt.shards().size());
  for (const auto loc : ckpt.tensors()) {
    const TensorInfo& t = ckpt.info(loc);
    if (!options.filter.Matches(t.name)) continue;
    const int dim = store.parallel.size > 1 ? layout.DimFor(t.name) : -1;
    if (dim < 0 || dim >= static_cast<int>(t.shape.size())) {
      plans[loc.shard].whole.push_back(loc.index);
      continue;
    }
    Slice slice;
    slice.index = loc.index;
    for (uint64_t d : t.shape) slice.shape.push_back(static_cast<int64_t>(d));
    const std::vector<int64_t> full = slice.shape;
    TL_ASSIGN_OR_RETURN(const IndexRange mine,
                        ShardRange(full[dim], store.parallel.rank, store.parallel.size));
    slice.shape[dim] = mine.length;
    Result<std::vector<remote::CopyPiece>> pieces = remote::SlicePieces(
        full, static_cast<uint32_t>(DtypeBits(t.dtype)), dim, IndexRange{0, full[dim]}, mine);
    if (!pieces.ok()) return pieces.status().WithContext(url + ": tensor '" + t.name + "'");
    slice.pieces = std::move(pieces).value();
    for (const auto& p : slice.pieces) slice.bytes += p.bytes;
    plans[loc.shard].slices.push_back(std::move(slice));
  }

  uint64_t total = 0;
  std::vector<RangeRequest> requests;
  std::vector<Packed> packed;
  for (size_t s = 0; s < plans.size(); ++s) {
    FilePlan& plan = plans[s];
    const Checkpoint::Shard& shard = ckpt.shards()[s];
    const auto& infos = shard.header.tensors();
    std::sort(plan.whole.begin(), plan.whole.end(),
              [&](uint32_t a, uint32_t b) { return infos[a].begin < infos[b].begin; });
    const uint64_t base = shard.header.data_offset();
    bool run_closed = true;  // The next tensor starts a run.
    for (uint32_t i : plan.whole) {
      const TensorInfo& t = infos[i];
      const uint64_t b = base + t.begin, e = base + t.end;
      const uint64_t align = std::min<uint64_t>(8, std::max<uint64_t>(1, DtypeBits(t.dtype) / 8));
      const bool aligned = b % align == 0;
      if (!run_closed && aligned && b <= plan.runs.back().end + kMergeGap) {
        plan.runs.back().end = std::max(plan.runs.back().end, e);
      } else {
        // A run lands at its file offset's place modulo 64, so the tensors in
        // it keep their alignment; a misaligned tensor gets a run of its own
        // at an aligned place.
        plan.runs.push_back({b, e, RoundUp(plan.buffer_bytes, 64) + (aligned ? b % 64 : 0)});
      }
      run_closed = !aligned;
      plan.buffer_bytes = plan.runs.back().at + (plan.runs.back().end - plan.runs.back().begin);
    }
    for (Slice& slice : plan.slices) {  // Each slice at an aligned place after the runs.
      slice.at = RoundUp(plan.buffer_bytes, 64);
      plan.buffer_bytes = slice.at + slice.bytes;
    }
    TL_ASSIGN_OR_RETURN(plan.buffer, HostBuffer::Allocate(plan.buffer_bytes));
    TL_ASSIGN_OR_RETURN(ObjectUrl object, objstore::ParseObjectUrl(shard.path));
    auto fetch = [&](uint64_t begin, uint64_t end, std::byte* dst) {
      for (uint64_t off = begin; off < end; off += store.request_bytes) {
        const uint64_t n = std::min(store.request_bytes, end - off);
        requests.push_back({object.bucket, object.key, off, n, dst + (off - begin)});
        total += n;
      }
    };
    for (const Run& run : plan.runs) fetch(run.begin, run.end, plan.buffer->data() + run.at);
    for (const Slice& slice : plan.slices) {
      const uint64_t t0 = base + infos[slice.index].begin;
      std::byte* slot = plan.buffer->data() + slice.at;
      // Pieces closer than kMergeGap share a span.
      for (size_t p = 0; p < slice.pieces.size();) {
        size_t q = p + 1;
        while (q < slice.pieces.size() &&
               slice.pieces[q].src_offset <=
                   slice.pieces[q - 1].src_offset + slice.pieces[q - 1].bytes + kMergeGap) {
          ++q;
        }
        const auto& first = slice.pieces[p];
        if (q == p + 1) {
          fetch(t0 + first.src_offset, t0 + first.src_offset + first.bytes,
                slot + first.dst_offset);
        } else {
          const auto& last = slice.pieces[q - 1];
          packed.push_back(
              {object.bucket, object.key, t0 + first.src_offset, t0 + last.src_offset + last.bytes,
               first.src_offset,
               std::vector<remote::CopyPiece>(slice.pieces.begin() + p, slice.pieces.begin() + q),
               slot});
          total += packed.back().end - packed.back().begin;
        }
        p = q;
      }
    }
  }

  ProgressReporter progress(options.progress, total);
  uint64_t done = 0;
  auto count = [&](const std::vector<RangeRequest>& list) {
    return [&](size_t i) {
      done += list[i].bytes;
      progress.Report(done, false);
    };
  };
  Status fetched = client->GetRanges(requests, count(requests));
  if (!fetched.ok()) return fetched.WithContext(url);
  // Packed spans in batches of scratch memory up to max_in_flight_bytes (a
  // larger span on its own).
  for (size_t p = 0; p < packed.size();) {
    size_t q = p;
    uint64_t scratch_bytes = 0;
    while (q < packed.size() && (q == p || scratch_bytes + (packed[q].end - packed[q].begin) <=
                                               store.max_in_flight_bytes)) {
      scratch_bytes += RoundUp(packed[q].end - packed[q].begin, 64);
      ++q;
    }
    TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> scratch, HostBuffer::Allocate(scratch_bytes));
    std::vector<RangeRequest> batch;
    std::vector<std::byte*> spans;
    uint64_t at = 0;
    for (size_t i = p; i < q; ++i) {
      spans.push_back(scratch->data() + at);
      for (uint64_t off = packed[i].begin; off < packed[i].end; off += store.request_bytes) {
        const uint64_t n = std::min(store.request_bytes, packed[i].end - off);
        batch.push_back(
            {packed[i].bucket, packed[i].key, off, n, spans.back() + (off - packed[i].begin)});
      }
      at += RoundUp(packed[i].end - packed[i].begin, 64);
    }
    fetched = client->GetRanges(batch, count(batch));
    if (!fetched.ok()) return fetched.WithContext(url);
    for (size_t i = p; i < q; ++i) {
      for (const auto& piece : packed[i].pieces) {
        std::memcpy(packed[i].slot + piece.dst_offset,
                    spans[i - p] + (piece.src_offset - packed[i].tensor_offset), piece.bytes);
      }
    }
    p = q;
  }
  progress.Report(done, true);

  CheckpointBuilder out;
  for (size_t s = 0; s < plans.size(); ++s) {
    const FilePlan& plan = plans[s];
    const Checkpoint::Shard& shard = ckpt.shards()[s];
    const auto& infos = shard.header.tensors();
    const uint64_t base = shard.header.data_offset();
    FileReport f;
    f.path = shard.path;
    f.reason = "object storage: " + std::to_string(plan.runs.size()) + " run(s) of ranged GETs";
    if (!plan.slices.empty()) {
      f.reason += ", " + std::to_string(plan.slices.size()) + " slice(s) for rank " +
                  std::to_string(store.parallel.rank) + " of " +
                  std::to_string(store.parallel.size);
    }
    for (uint32_t i : plan.whole) {
      const TensorInfo& t = infos[i];
      const uint64_t b = base + t.begin;
      auto run = std::find_if(plan.runs.begin(), plan.runs.end(),
                              [&](const Run& r) { return b >= r.begin && b < r.end; });
      std::byte* data = plan.buffer->data();
      if (run != plan.runs.end()) data += run->at + (b - run->begin);
      out.Add(MakeTensor(t, t.dtype, t.nbytes() ? data : nullptr, t.nbytes()), plan.buffer);
      f.bytes += t.nbytes();
      ++f.tensors;
    }
    for (const Slice& slice : plan.slices) {
      TensorInfo info = infos[slice.index];
      info.shape.assign(slice.shape.begin(), slice.shape.end());
      info.num_elements = 1;
      for (uint64_t d : info.shape) info.num_elements *= d;
      out.Add(MakeTensor(info, info.dtype, slice.bytes ? plan.buffer->data() + slice.at : nullptr,
                         slice.bytes),
              plan.buffer);
      f.bytes += slice.bytes;
      ++f.tensors;
    }
    out.files().push_back(std::move(f));
  }
  files.CountRequests(requests.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LoadedCheckpoint loaded = std::move(out).Finish(seconds);
  if (device) return UploadToDevice(std::move(loaded), device);
  return loaded;
}

}  // namespace

}  // namespace tensorlift
