// Checkpoints in a bucket: S3Store, the bucket's files for Checkpoint::Open and
// the source of a load's bytes (ranged GETs written straight into place), and
// LoadFromObjectStore, which loads through the one loader (Load) reading
// through the store: every load option works as for local files, a
// tensor-parallel rank's slices (planned by the loader's planners) too.
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
#include "format/tp_layout.h"
#include "io/pread.h"
#include "load/checkpoint_builder.h"
#include "load/file_job.h"
#include "load/upload.h"
#include "objstore/s3_client.h"
#include "objstore/s3_store.h"
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
  // go as one GET of up to request_bytes; small ranges that lie close
  // together in the object (a tensor-parallel slice's rows) go as one GET of
  // the span covering them into scratch memory, copied out to their places
  // (scratch up to kGatherBudget at a time). A file with a current copy in
  // the cache (UseCache) is read from that copy instead.
  Status ReadRanges(std::span<const Range> ranges,
                    const std::function<void(size_t, uint64_t)>& landed) override {
    Requests batch;
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
      if (!batch.list.empty()) {
        RangeRequest& last = batch.list.back();
        const uint64_t last_end = last.offset + last.bytes;
        const bool same = last.key == url.key && last.bucket == url.bucket &&
                          r.offset >= last_end &&
                          r.offset + r.length - last.offset <= request_bytes_;
        if (same && r.offset == last_end && last.dst + last.bytes == r.dest &&
            !batch.gather.back()) {
          last.bytes += r.length;  // The whole range rides on the previous GET.
          batch.carries.back().push_back(static_cast<uint32_t>(i));
          continue;
        }
        if (same && r.offset - last_end <= kMergeGap && r.length < kMergeGap &&
            !batch.partial.back()) {
          const uint64_t before = batch.gather.back() ? last.bytes : 0;
          last.bytes = r.offset + r.length - last.offset;  // The span, gap and all.
          batch.gather.back() = true;
          batch.gathered += last.bytes - before;
          batch.carries.back().push_back(static_cast<uint32_t>(i));
          continue;
        }
        if (batch.gathered >= kGatherBudget) {
          TL_RETURN_IF_ERROR(Fetch(batch, ranges, landed));
          batch = Requests();
        }
      }
      for (uint64_t off = 0; off < r.length; off += request_bytes_) {
        batch.list.push_back({url.bucket, url.key, r.offset + off,
                              std::min(request_bytes_, r.length - off), r.dest + off});
        batch.carries.push_back({static_cast<uint32_t>(i)});
        batch.gather.push_back(false);
        batch.partial.push_back(r.length > request_bytes_);
      }
    }
    return Fetch(batch, ranges, landed);
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
  // Scratch memory of gathered spans at most, per batch of GETs.
  static constexpr uint64_t kGatherBudget = 64ull << 20;
  // GETs to make, each with the ranges it carries (a piece of one, or several
  // whole), and whether it is a gathered span (into scratch, then copied out).
  struct Requests {
    std::vector<RangeRequest> list;
    std::vector<std::vector<uint32_t>> carries;
    std::vector<bool> gather, partial;
    uint64_t gathered = 0;  // The gathered spans' bytes.
  };

  Status Fetch(Requests& batch, std::span<const Range> ranges,
               const std::function<void(size_t, uint64_t)>& landed) {
    std::vector<std::unique_ptr<std::byte[]>> scratch(batch.list.size());
    for (size_t q = 0; q < batch.list.size(); ++q) {
      if (!batch.gather[q]) continue;
      scratch[q] = std::make_unique_for_overwrite<std::byte[]>(batch.list[q].bytes);
      batch.list[q].dst = scratch[q].get();
    }
    requests_.fetch_add(batch.list.size(), std::memory_order_relaxed);
    return client_->GetRanges(batch.list, [&](size_t q) {
      const RangeRequest& got = batch.list[q];
      for (uint32_t i : batch.carries[q]) {
        if (batch.gather[q]) {
          std::memcpy(ranges[i].dest, got.dst + (ranges[i].offset - got.offset), ranges[i].length);
        }
        const bool piece = !batch.gather[q] && batch.carries[q].size() == 1;  // Or all of it.
        if (landed) landed(i, piece ? got.bytes : ranges[i].length);
      }
    });
  }

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
    // Its header's bytes alone (a copy: the probe's 1 MiB would stay with it).
    std::vector<std::byte> kept(prefix.begin(), prefix.begin() + 8 + header.header_size());
    std::lock_guard lock(mu_);
    objects_[path].header = std::move(kept);
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

// The store of `url`'s bucket over a client with `store`'s settings.
Result<std::shared_ptr<S3Store>> StoreFor(const ObjectUrl& url, const ObjectStoreOptions& store) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, ClientFor(url, store));
  return std::make_shared<S3Store>(std::shared_ptr<S3Client>(std::move(client)), url.scheme,
                                   url.bucket, store.request_bytes);
}

// `options` with ObjectStoreOptions::parallel and layout (which mean what
// LoadOptions' do) when they slice: one of the two, or both the same.
Result<LoadOptions> WithStoreSlices(const LoadOptions& options, const ObjectStoreOptions& store) {
  LoadOptions out = options;
  if (store.parallel.size == 1 && store.layout.empty()) return out;
  if (options.parallel.size != 1 &&
      (options.parallel.size != store.parallel.size ||
       options.parallel.rank != store.parallel.rank || options.layout != store.layout)) {
    return InvalidArgumentError(
        "object storage: tensor-parallel slices are asked for in both LoadOptions and "
        "ObjectStoreOptions, differently; give them in one");
  }
  out.parallel = store.parallel;
  out.layout = store.layout;
  return out;
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

std::function<Result<Checkpoint>(const std::string& path)> ObjectStoreOpener(
    const ObjectStoreOptions& store) {
  return [store](const std::string& path) -> Result<Checkpoint> {
    if (!IsObjectStoreUrl(path)) return Checkpoint::Open(path);
    const char* whose = !store.cache_dir.empty()   ? "cache_dir"
                        : store.parallel.size != 1 ? "parallel"
                        : !store.layout.empty()    ? "layout"
                                                   : nullptr;
    if (whose) {
      return InvalidArgumentError(std::string("object storage: ObjectStoreOptions::") + whose +
                                  " is LoadFromObjectStore's (ObjectStoreFallback); an opener's "
                                  "load takes the peer load's dtype and slices");
    }
    return OpenObjectStoreCheckpoint(path, store);
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
  TL_ASSIGN_OR_RETURN(const LoadOptions sliced, WithStoreSlices(options, store));
  if (sliced.parallel.size > 1 && !store.cache_dir.empty()) {
    return InvalidArgumentError(
        "object storage: cache_dir keeps whole objects; a tensor-parallel rank's load fetches "
        "slices");
  }
  TL_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> files, StoreFor(parsed, store));
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(url, *files));
  if (!store.cache_dir.empty()) {
    std::vector<std::string> paths;
    for (const auto& shard : ckpt.shards()) paths.push_back(shard.path);
    files->UseCache(store.cache_dir, paths);
  }
  return LoadThroughStore(ckpt, files, sliced, !store.cache_dir.empty(), report, start);
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
  TL_ASSIGN_OR_RETURN(const LoadOptions sliced, WithStoreSlices(options, store));
  TL_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> files, StoreFor(parsed, store));
  return LoadThroughStore(ckpt, files, sliced, false, report, start);
}

}  // namespace tensorlift
