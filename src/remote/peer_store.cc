// PeerStore (peer_store.h): the destination's tensors as one file whose
// bytes are gets from the source ranks, every chunk checked.
#include "remote/peer_store.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <utility>

#include "common/checked_math.h"
#include "device/device.h"
#include "device/populate.h"
#include "io/direct_reader.h"
#include "remote/peer_faults.h"
#include "tensorlift/checksum.h"
#include "tensorlift/text.h"

namespace tensorlift::remote {
namespace {

std::atomic<uint64_t> direct_blocks_for_testing{0};
std::mutex hook_mu;
std::function<void()> before_device_checks;  // Guarded by hook_mu.

// kCorruption naming the chunk when `sum` is not the manifest's.
Status CheckChunk(const std::string& url, const Manifest& mf, const ManifestTensor& t,
                  uint64_t index, uint64_t bytes, uint64_t sum) {
  if (sum == t.chunk_xxh3[index]) return Status::Ok();
  return CorruptionError(url + ": tensor '" + t.name + "' chunk " + std::to_string(index) +
                         " (bytes " + std::to_string(index * mf.chunk_bytes) + ".." +
                         std::to_string(index * mf.chunk_bytes + bytes) + "): XXH3 " + HexU64(sum) +
                         ", the manifest says " + HexU64(t.chunk_xxh3[index]));
}

// A get of one whole chunk: into its place, or into `staged` (a buffer of
// its own) whose deliveries are copied out once it checks out.
struct Delivery {
  uint64_t from = 0;  // In the chunk.
  uint64_t bytes = 0;
  std::byte* to = nullptr;
  size_t range = 0;
};
struct ChunkGet {
  const ManifestTensor* tensor = nullptr;
  uint64_t index = 0;
  // Landed straight: whose bytes (range, bytes), once checked.
  std::vector<std::pair<size_t, uint64_t>> lands;
  std::shared_ptr<std::byte[]> staged;
  std::vector<Delivery> deliveries;
  uint64_t needed = 0;  // Staged: the chunk's bytes the destination wants, all its reads'.
};

}  // namespace

// Where a fetch lands: host memory (no device), or a device's memory at the
// addresses UCX writes (`device_address` gives the device's own), each chunk
// checked on a copy staged back in pinned host memory.
struct FetchTarget {
  std::shared_ptr<Device> device;
  std::unique_ptr<DeviceStream> stream;
  std::function<std::byte*(std::byte* visible)> device_address;
  // The checks' two windows of pinned host memory (window bytes each) and
  // their events, kept from fetch to fetch.
  uint64_t window = 0;
  std::shared_ptr<Buffer> staging[2];
  std::unique_ptr<DeviceEvent> copied[2];
};

namespace {

// Whether segments [j, k) of `list` (by source offset) cover source bytes
// [begin, end) and follow each other in memory as they do in the source.
template <typename Seg>
bool Straight(const std::vector<Seg>& list, size_t j, size_t k, uint64_t begin, uint64_t end) {
  if (j == k || list[j].src > begin || list[k - 1].src + list[k - 1].bytes < end) return false;
  for (size_t m = j + 1; m < k; ++m) {
    const Seg& a = list[m - 1];
    if (a.src + a.bytes != list[m].src || a.dst + a.bytes != list[m].dst) return false;
  }
  return true;
}

// The bytes of source range [begin, end) that `pieces` (increasing) take.
uint64_t NeededOf(const std::vector<CopyPiece>& pieces, uint64_t begin, uint64_t end) {
  uint64_t n = 0;
  auto p = std::partition_point(pieces.begin(), pieces.end(), [&](const CopyPiece& c) {
    return c.src_offset + c.bytes <= begin;
  });
  for (; p != pieces.end() && p->src_offset < end; ++p) {
    n += std::min(end, p->src_offset + p->bytes) - std::max(begin, p->src_offset);
  }
  return n;
}

// A device read's checks copy its chunks back in windows of at least this.
constexpr uint64_t kWindow = 16ull << 20;

// The target's two windows of at least `window` bytes, and their events.
Status Reserve(FetchTarget& target, uint64_t window) {
  if (target.window >= window) return Status::Ok();
  for (int k = 0; k < 2; ++k) {
    target.staging[k].reset();
    TL_ASSIGN_OR_RETURN(target.staging[k], target.device->AllocatePinned(window));
    if (!target.copied[k]) {
      TL_ASSIGN_OR_RETURN(target.copied[k], target.device->CreateEvent());
    }
  }
  target.window = window;
  return Status::Ok();
}

// Checks the chunks `which` of `gets` that landed in device memory: copied to
// pinned host memory in windows of at least 16 MiB (two, so that the next
// window's copy runs while this one is hashed) and hashed there.
Status CheckOnDevice(const PeerSession& src, const std::vector<UcxClient::Get>& gets,
                     const std::vector<ChunkGet>& chunks, const std::vector<size_t>& which,
                     FetchTarget& target) {
  uint64_t largest = 0;
  for (size_t k : which) largest = std::max(largest, gets[k].bytes);
  const uint64_t window = std::max<uint64_t>(largest, kWindow);
  // Windows: runs of gets (in landing order) whose bytes fit in one window.
  std::vector<std::pair<size_t, size_t>> windows;  // [begin, end) in `which`.
  for (size_t b = 0; b < which.size();) {
    size_t e = b;
    for (uint64_t used = 0; e < which.size() && used + gets[which[e]].bytes <= window; ++e) {
      used += gets[which[e]].bytes;
    }
    windows.push_back({b, e});
    b = e;
  }
  TL_RETURN_IF_ERROR(Reserve(target, window));
  std::shared_ptr<Buffer>* staging = target.staging;
  std::unique_ptr<DeviceEvent>* copied = target.copied;
  auto issue = [&](size_t w) -> Status {
    std::byte* to = staging[w % 2]->data();
    for (size_t j = windows[w].first; j < windows[w].second; ++j) {
      const UcxClient::Get& g = gets[which[j]];
      TL_RETURN_IF_ERROR(target.stream->CopyToHost(
          to, target.device_address(static_cast<std::byte*>(g.dst)), g.bytes));
      to += g.bytes;
    }
    return target.stream->Record(*copied[w % 2]);
  };
  auto check = [&]() -> Status {
    TL_RETURN_IF_ERROR(issue(0));
    for (size_t w = 0; w < windows.size(); ++w) {
      TL_RETURN_IF_ERROR(copied[w % 2]->Synchronize());
      if (w + 1 < windows.size()) TL_RETURN_IF_ERROR(issue(w + 1));
      const std::byte* at = staging[w % 2]->data();
      for (size_t j = windows[w].first; j < windows[w].second; ++j) {
        const ChunkGet& c = chunks[which[j]];
        const uint64_t bytes = gets[which[j]].bytes;
        TL_RETURN_IF_ERROR(
            CheckChunk(src.url(), src.manifest, *c.tensor, c.index, bytes, Xxh3_64(at, bytes)));
        at += bytes;
      }
    }
    return Status::Ok();
  };
  const Status checked = check();
  // No copy into the staging buffers may run once they are freed.
  const Status drained = target.stream->Synchronize();
  return checked.ok() ? drained : checked;
}

}  // namespace

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<PullFile> MakePullFile(const std::vector<Wanted>& wanted, const std::string& url) {
  // The file: the tensors one after another, in name order.
  PullFile f;
  std::string json = "{";
  uint64_t at = 0;
  for (const Wanted& w : wanted) {
    f.begins.push_back(at);
    if (!CheckedAdd(at, w.nbytes, &at) || at > ManifestLimits().max_total_bytes) {
      return CorruptionError(url + ": the tensors' bytes exceed the limit");
    }
    if (json.size() > 1) json += ',';
    AppendJsonString(w.name, &json);
    json += ":{\"dtype\":" + JsonString(DtypeName(w.dtype)) + ",\"shape\":[";
    for (size_t d = 0; d < w.shape.size(); ++d) {
      json += (d ? "," : "") + std::to_string(w.shape[d]);
    }
    json +=
        "],\"data_offsets\":[" + std::to_string(f.begins.back()) + "," + std::to_string(at) + "]}";
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) f.header += static_cast<char>((len >> (8 * i)) & 0xff);
  f.header += json;
  f.size = f.header.size() + at;
  return f;
}

namespace {

// Opens the pull's file and nothing else; its reads are another store's.
class PullFileStore final : public CheckpointStore {
 public:
  explicit PullFileStore(PullFile file) : file_(std::move(file)) {}
  Result<bool> IsDirectory(const std::string& path) override {
    if (path == PeerStore::kPath) return false;
    return NotFoundError(path + ": not this pull's file");
  }
  Result<std::vector<Entry>> List(const std::string& path) override {
    return NotFoundError(path + ": not a directory");
  }
  Result<std::string> ReadSmall(const std::string& path, uint64_t /*limit*/) override {
    return NotFoundError(path + ": a pull's file is read as a checkpoint");
  }
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override {
    TL_RETURN_IF_ERROR(IsDirectory(path).status());
    auto h = Header::ParsePrefix(
        {reinterpret_cast<const std::byte*>(file_.header.data()), file_.header.size()}, file_.size);
    if (!h.ok()) return h.status().WithContext(path);
    if (identity) {
      *identity = FileIdentity();
      identity->size = file_.size;
    }
    return h;
  }

 private:
  PullFile file_;
};

}  // namespace

Result<Checkpoint> OpenPullFile(const std::vector<Wanted>& wanted, const std::string& url) {
  TL_ASSIGN_OR_RETURN(PullFile file, MakePullFile(wanted, url));
  return Checkpoint::Open(PeerStore::kPath, std::make_shared<PullFileStore>(std::move(file)));
}

Result<std::shared_ptr<PeerStore>> PeerStore::Make(std::vector<Wanted> wanted,
                                                   std::vector<PeerSession>* sources,
                                                   const Options& options) {
  std::shared_ptr<PeerStore> s(new PeerStore());
  s->sources_ = sources;
  s->options_ = options;
  const int n = static_cast<int>(sources->size());
  const std::string& url = (*sources)[0].url();
  TL_ASSIGN_OR_RETURN(PullFile file, MakePullFile(wanted, url));
  s->begin_ = std::move(file.begins);
  s->header_ = std::move(file.header);
  s->file_size_ = file.size;
  for (const Wanted& w : wanted) {
    // What each source rank gives of it.
    std::vector<Part> parts(n);
    for (int r = 0; r < n; ++r) {
      const ManifestTensor* t = (*sources)[r].manifest.Find(w.name);
      parts[r].tensor = t;
      if (t == nullptr || t->nbytes == 0) continue;
      if (w.dim < 0) {
        // Whole: one rank sends it (the one the destination's rank falls on).
        if (r == options.parallel_rank % n) parts[r].pieces.push_back({0, 0, t->nbytes});
      } else {
        const IndexRange src{t->shard_start, t->shape[w.dim]};
        const uint32_t bits = static_cast<uint32_t>(DtypeBits(w.dtype));
        TL_ASSIGN_OR_RETURN(parts[r].pieces, SlicePieces(w.full_shape, bits, w.dim, src, w.range));
      }
    }
    s->parts_.push_back(std::move(parts));
  }
  s->wanted_ = std::move(wanted);
  return s;
}

bool PeerStore::Uses(int r) const {
  for (const std::vector<Part>& parts : parts_) {
    if (!parts[r].pieces.empty()) return true;
  }
  return false;
}

Result<bool> PeerStore::IsDirectory(const std::string& path) {
  if (path == kPath) return false;
  return NotFoundError(path + ": not this pull's file");
}

Result<std::vector<CheckpointStore::Entry>> PeerStore::List(const std::string& path) {
  return NotFoundError(path + ": not a directory");
}

Result<std::string> PeerStore::ReadSmall(const std::string& path, uint64_t /*limit*/) {
  return NotFoundError(path + ": a pull's file is read as a checkpoint");
}

Result<Header> PeerStore::ReadHeader(const std::string& path, FileIdentity* identity) {
  TL_RETURN_IF_ERROR(IsDirectory(path).status());  // This pull's file, else NotFound.
  auto h = Header::ParsePrefix({reinterpret_cast<const std::byte*>(header_.data()), header_.size()},
                               file_size_);
  if (!h.ok()) return h.status().WithContext(path);
  if (identity) {
    *identity = FileIdentity();
    identity->size = file_size_;
  }
  return h;
}

std::string PeerStore::Describe(const std::string& /*path*/) const {
  return "peer: gets from the source ranks, every chunk checked";
}

void PeerStore::Map(uint64_t begin, uint64_t bytes, std::byte* dst, size_t range,
                    std::vector<std::vector<std::vector<Seg>>>* segs) const {
  const uint64_t end = begin + bytes;
  // The first tensor ending after `begin`.
  size_t i =
      static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), begin) - begin_.begin());
  i = i == 0 ? 0 : i - 1;
  for (; i < wanted_.size() && begin_[i] < end; ++i) {
    const uint64_t lo = std::max(begin, begin_[i]);
    const uint64_t hi = std::min(end, begin_[i] + wanted_[i].nbytes);
    if (lo >= hi) continue;
    const uint64_t x0 = lo - begin_[i], x1 = hi - begin_[i];  // In the slice.
    for (size_t r = 0; r < parts_[i].size(); ++r) {
      const std::vector<CopyPiece>& pieces = parts_[i][r].pieces;
      auto p = std::partition_point(pieces.begin(), pieces.end(), [&](const CopyPiece& c) {
        return c.dst_offset + c.bytes <= x0;
      });
      for (; p != pieces.end() && p->dst_offset < x1; ++p) {
        const uint64_t a = std::max(x0, p->dst_offset);
        const uint64_t b = std::min(x1, p->dst_offset + p->bytes);
        if (a >= b) continue;
        (*segs)[r][i].push_back(
            {p->src_offset + (a - p->dst_offset), b - a, dst + (begin_[i] + a - begin), range});
      }
    }
  }
}

Status PeerStore::Fetch(std::vector<std::vector<std::vector<Seg>>>& segs, FetchTarget& target,
                        const std::function<void(size_t range, uint64_t bytes)>& landed,
                        std::unique_lock<std::mutex>& lock) {
  auto done = [&](size_t range, uint64_t bytes) {
    if (landed) landed(range, bytes);
  };
  for (size_t r = 0; r < segs.size(); ++r) {
    Status st = FetchFrom((*sources_)[r], r, segs, target, done, lock);
    if (!st.ok()) {
      failed_url_ = (*sources_)[r].url();
      return st;
    }
  }
  return Status::Ok();
}

Status PeerStore::FetchFrom(PeerSession& src, size_t r,
                            std::vector<std::vector<std::vector<Seg>>>& segs, FetchTarget& target,
                            const std::function<void(size_t range, uint64_t bytes)>& done,
                            std::unique_lock<std::mutex>& lock) {
  const Manifest& mf = src.manifest;
  const uint64_t cb = mf.chunk_bytes;
  std::vector<UcxClient::Get> gets;
  std::vector<ChunkGet> chunks;  // chunks[k] is what gets[k] fetches.
  std::vector<ChunkGet> cached;  // Kept whole from an earlier read.
  for (size_t i = 0; i < segs[r].size(); ++i) {
    std::vector<Seg>& list = segs[r][i];
    if (list.empty()) continue;
    const ManifestTensor& t = *parts_[i][r].tensor;
    std::sort(list.begin(), list.end(), [](const Seg& a, const Seg& b) { return a.src < b.src; });
    size_t j = 0;
    uint64_t c = list[0].src / cb;
    while (j < list.size()) {
      c = std::max(c, list[j].src / cb);
      const uint64_t begin = c * cb, end = std::min(t.nbytes, begin + cb);
      size_t k = j;
      while (k < list.size() && list[k].src < end) ++k;
      ChunkGet g;
      g.tensor = &t;
      g.index = c;
      std::byte* into;
      if (Straight(list, j, k, begin, end)) {
        // The chunk lands in one place (the segments, of one range or
        // several, follow each other in memory).
        into = list[j].dst + (begin - list[j].src);
        for (size_t m = j; m < k; ++m) {
          const uint64_t a = std::max(begin, list[m].src);
          const uint64_t b = std::min(end, list[m].src + list[m].bytes);
          g.lands.push_back({list[m].range, b - a});
        }
      } else {
        for (size_t m = j; m < k; ++m) {
          const uint64_t a = std::max(begin, list[m].src);
          const uint64_t b = std::min(end, list[m].src + list[m].bytes);
          g.deliveries.push_back(
              {a - begin, b - a, list[m].dst + (a - list[m].src), list[m].range});
        }
        // Part of a chunk another read also wants part of: kept from the
        // read that got it, checked, until every part is delivered.
        auto kept = partial_.find({r, &t, c});
        if (kept != partial_.end()) {
          g.staged = kept->second.bytes;
          g.needed = kept->second.needed;
          partial_.erase(kept);
          cached.push_back(std::move(g));
          ++c;
          while (j < list.size() && list[j].src + list[j].bytes <= c * cb) ++j;
          continue;
        }
        ++src.staged;
        g.staged.reset(new (std::nothrow) std::byte[end - begin]);
        if (!g.staged) return ResourceExhaustedError("peer load: no memory for a staged chunk");
        g.needed = NeededOf(parts_[i][r].pieces, begin, end);
        into = g.staged.get();
      }
      gets.push_back({src.regions[t.region], t.offset + begin, end - begin, into});
      chunks.push_back(std::move(g));
      ++c;
      while (j < list.size() && list[j].src + list[j].bytes <= c * cb) ++j;
    }
  }
  UcxClient::GetOptions go = options_.get;
  Status bad = Status::Ok();
  std::vector<size_t> on_device;  // Landed in device memory: checked after.
  go.on_done = [&](size_t k) {
    src.pulled += gets[k].bytes;
    if (!bad.ok()) return;
    const ChunkGet& g = chunks[k];
    if (target.device && !g.staged) {
      on_device.push_back(k);
      return;
    }
    const auto* at = static_cast<const std::byte*>(gets[k].dst);
    bad = CheckChunk(src.url(), mf, *g.tensor, g.index, gets[k].bytes, Xxh3_64(at, gets[k].bytes));
    if (bad.ok()) {
      for (const auto& [range, n] : g.lands) done(range, n);
    }
  };
  // A chunk that failed its check ends the pull: the rest is not worth pulling.
  go.cancelled = [&] { return !bad.ok(); };
  Status got = src.GetAll(gets, go);
  TL_RETURN_IF_ERROR(bad);
  TL_RETURN_IF_ERROR(got);
  // Staged chunks (checked as they landed, in host memory) of which another
  // read wants parts are kept for it before the lock is released below: a
  // read planned meanwhile finds them instead of getting them again.
  for (ChunkGet& g : cached) chunks.push_back(std::move(g));
  for (const ChunkGet& g : chunks) {
    uint64_t delivered = 0;
    for (const Delivery& d : g.deliveries) delivered += d.bytes;
    if (g.staged && delivered < g.needed) {
      partial_[{r, g.tensor, g.index}] = {g.staged, g.needed - delivered};
    }
  }
  if (!on_device.empty()) {
    // Checked with the store's lock released: the chunks are this read's
    // alone (their memory, and the kept chunks' entries taken above), and
    // the next read's gets go on meanwhile.
    lock.unlock();
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> h(hook_mu);
      hook = before_device_checks;
    }
    if (hook) hook();
    const Status checked = CheckOnDevice(src, gets, chunks, on_device, target);
    lock.lock();
    TL_RETURN_IF_ERROR(checked);
    for (size_t k : on_device) {
      for (const auto& [range, n] : chunks[k].lands) done(range, n);
    }
  }
  // The staged chunks' parts, copied out (up to the device: synchronized
  // before their buffers go).
  Status copied = Status::Ok();
  for (const ChunkGet& g : chunks) {
    for (const Delivery& d : g.deliveries) {
      if (!target.device) {
        std::memcpy(d.to, g.staged.get() + d.from, d.bytes);
      } else if (copied.ok()) {
        copied = target.stream->CopyToDevice(target.device_address(d.to), g.staged.get() + d.from,
                                             d.bytes);
      }
    }
  }
  if (target.device) {
    const Status drained = target.stream->Synchronize();
    TL_RETURN_IF_ERROR(copied);
    TL_RETURN_IF_ERROR(drained);
  }
  for (const ChunkGet& g : chunks) {
    for (const Delivery& d : g.deliveries) done(d.range, d.bytes);
  }
  return Status::Ok();
}

Status PeerStore::ReadRanges(std::span<const Range> ranges,
                             const std::function<void(size_t range, uint64_t bytes)>& landed) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t data = header_.size();
  std::vector<std::vector<std::vector<Seg>>> segs(sources_->size(),
                                                  std::vector<std::vector<Seg>>(wanted_.size()));
  for (size_t k = 0; k < ranges.size(); ++k) {
    const Range& r = ranges[k];
    if (r.path == nullptr || *r.path != kPath) {
      return NotFoundError((r.path ? *r.path : std::string("?")) + ": not this pull's file");
    }
    if (r.offset > file_size_ || r.length > file_size_ - r.offset) {
      return OutOfRangeError(*r.path + ": bytes [" + std::to_string(r.offset) + ", +" +
                             std::to_string(r.length) + ") past its " + std::to_string(file_size_));
    }
    uint64_t off = r.offset, len = r.length;
    std::byte* dst = r.dest;
    if (off < data) {  // The header's bytes, as the file has them.
      const uint64_t n = std::min(len, data - off);
      std::memcpy(dst, header_.data() + off, n);
      if (landed) landed(k, n);
      off += n;
      len -= n;
      dst += n;
    }
    if (len > 0) Map(off - data, len, dst, k, &segs);
  }
  MapDestinations(ranges);
  FetchTarget host;
  return Fetch(segs, host, landed, lock);
}

void PeerStore::MapDestinations(std::span<const Range> ranges) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const Range& r : ranges) {
    if (r.length == 0) continue;
    lo = std::min(lo, reinterpret_cast<uintptr_t>(r.dest));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(r.dest) + r.length);
  }
  if (lo >= hi) return;
  for (const auto& [a, b] : mapped_) {
    if (a <= lo && hi <= b) return;
  }
  // The memory the gets land in, mapped for UCX: gets into memory it has not
  // mapped go through buffers of its own (as large as the gets in flight).
  // Only an optimization: a failure leaves them so.
  bool any = false;
  for (PeerSession& src : *sources_) {
    if (!src.ucx) continue;
    any = src.ucx->MapLocal(reinterpret_cast<void*>(lo), hi - lo, UcxMemory::kHost).ok() || any;
  }
  if (any) mapped_.push_back({lo, hi});
}

// Gets straight into device memory (PeerStore::MakeDirectReader).
class PeerStore::Direct final : public DirectReader {
 public:
  Direct(PeerStore& store, std::shared_ptr<Device> device, UcxMemory memory)
      : store_(store), device_(std::move(device)), memory_(memory) {}

  // Each block's gets are a run of their own and its chunks are checked
  // after it (a copy back and a hash) with the store's lock released, so that
  // the next block's gets go on meanwhile. Blocks are large: each costs a
  // round of gets that drains before it ends. A 1 GB pull onto the emulated
  // device, medians of 7 alternated with the old puller's single run (0.193 s
  // over shared memory, 0.821 s over tcp): 256 MiB blocks 0.317 s and 0.712
  // s, 512 MiB 0.222 s and 0.745 s, 1 GiB 0.194 s and 0.749 s (docs/remote.md).
  uint64_t BlockBytes() const override {
    const uint64_t testing = direct_blocks_for_testing;
    return testing != 0 ? testing : 1ull << 30;
  }

  Status AddFile(uint32_t file, int /*fd*/) override {
    if (file != 0) return InvalidArgumentError("a pull has one file");
    return Status::Ok();
  }

  // The buffers the reads land in, as UCX sees them (a GPU's own addresses,
  // the emulated device's host mapping), mapped for each source rank's gets.
  Status AddBuffer(std::byte* device_base, uint64_t bytes) override {
    std::byte* visible = device_base;
    if (memory_ == UcxMemory::kHost) {
      TL_ASSIGN_OR_RETURN(visible, device_->HostMapping(device_base, bytes));
    }
    for (PeerSession& src : *store_.sources_) {
      if (src.ucx) TL_RETURN_IF_ERROR(src.ucx->MapLocal(visible, bytes, memory_));
    }
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.push_back({device_base, bytes, visible});
    if (memory_ == UcxMemory::kHost) {
      // Memory the host maps (the emulated device's), faulted in ahead of the
      // gets as a host load's arena is (first touches inside the gets cost
      // more than the copies themselves; docs/remote.md), from the first read.
      fresh_.push_back({visible, bytes});
      if (prepared_) StartFaults();  // Added after the reads began.
    }
    return Status::Ok();
  }

  Status Read(uint32_t file, std::byte* device_base, uint64_t offset, uint64_t bytes,
              uint64_t file_offset) override {
    const Request one{device_base, offset, bytes, file_offset};
    return ReadBatch(file, {&one, 1});
  }

  Status ReadBatch(uint32_t /*file*/, std::span<const Request> reads) override {
    TL_RETURN_IF_ERROR(Prepare());
    std::unique_ptr<FetchTarget> target = TakeTarget();
    Status st = [&]() -> Status {
      std::unique_lock<std::mutex> lock(store_.mu_);
      const uint64_t data = store_.header_.size();
      std::vector<std::vector<std::vector<Seg>>> segs(
          store_.sources_->size(), std::vector<std::vector<Seg>>(store_.wanted_.size()));
      for (const Request& r : reads) {
        TL_ASSIGN_OR_RETURN(std::byte* const visible, Visible(r.device_base + r.offset, r.bytes));
        if (r.file_offset < data || r.file_offset + r.bytes > store_.file_size_) {
          return InternalError("a pull's direct read of bytes outside its tensors");
        }
        store_.Map(r.file_offset - data, r.bytes, visible, 0, &segs);
      }
      return store_.Fetch(segs, *target, {}, lock);
    }();
    GiveTarget(std::move(target));
    return st;
  }

 private:
  struct Mapped {
    std::byte* base;
    uint64_t bytes;
    std::byte* visible;
  };
  // Targets for the reads' checks (a stream and two pinned windows each):
  // two, so that one read's checks overlap the next read's gets and the
  // windows' memory stays two reads' worth.
  static constexpr size_t kTargets = 2;
  // Once, at the first read: the targets, then the fault threads. In that
  // order: a populate step holds the mmap lock that a new mapping (a stream's
  // thread stack, a window) waits for, and the pipeline's reader threads
  // have started by now (1 GB over shared memory onto the emulated device:
  // the first read waited 50 to 340 ms for them when faults began at
  // AddBuffer).
  Status Prepare() {
    std::lock_guard<std::mutex> lock(prepare_mu_);
    if (prepared_) return Status::Ok();
    for (size_t k = 0; k < kTargets; ++k) {
      auto t = std::make_unique<FetchTarget>();
      TL_ASSIGN_OR_RETURN(t->stream, device_->CreateStream());
      t->device = device_;
      t->device_address = [this](std::byte* v) { return DeviceAddress(v); };
      TL_RETURN_IF_ERROR(Reserve(*t, kWindow));
      GiveTarget(std::move(t));
    }
    std::lock_guard<std::mutex> l(mu_);
    StartFaults();
    prepared_ = true;
    return Status::Ok();
  }
  // Under mu_: fault threads over the regions added since the last call.
  void StartFaults() {
    if (fresh_.empty()) return;
    populate_.push_back(
        std::make_unique<PopulateAhead>(fresh_, FaultThreadCount(store_.options_.fault_threads)));
    fresh_.clear();
  }
  std::unique_ptr<FetchTarget> TakeTarget() {
    std::unique_lock<std::mutex> lock(mu_);
    target_cv_.wait(lock, [&] { return !free_.empty(); });
    std::unique_ptr<FetchTarget> t = std::move(free_.back());
    free_.pop_back();
    return t;
  }
  void GiveTarget(std::unique_ptr<FetchTarget> t) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(t));
    target_cv_.notify_one();
  }
  Result<std::byte*> Visible(std::byte* p, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Mapped& m : buffers_) {
      if (p >= m.base && p + bytes <= m.base + m.bytes) return m.visible + (p - m.base);
    }
    return InternalError("a pull's direct read into a buffer not added");
  }
  std::byte* DeviceAddress(std::byte* visible) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Mapped& m : buffers_) {
      if (visible >= m.visible && visible < m.visible + m.bytes)
        return m.base + (visible - m.visible);
    }
    return visible;
  }

  PeerStore& store_;
  std::shared_ptr<Device> device_;
  UcxMemory memory_;
  std::mutex prepare_mu_;              // Prepare, once.
  std::atomic<bool> prepared_{false};  // Set under prepare_mu_ and mu_.
  std::mutex mu_;                      // buffers_, free_, fresh_, populate_.
  std::condition_variable target_cv_;
  std::vector<Mapped> buffers_;
  std::vector<std::unique_ptr<FetchTarget>> free_;
  std::vector<PopulateAhead::Region> fresh_;  // Not yet being faulted in.
  std::vector<std::unique_ptr<PopulateAhead>> populate_;
};

Result<std::unique_ptr<DirectReader>> PeerStore::MakeDirectReader(
    const std::shared_ptr<Device>& device, size_t /*files*/) {
  if (BounceDevicePulls() != 0) {
    return UnavailableError("UCX cannot write " + device->name() + "'s memory (a test's)");
  }
  UcxMemory memory = UcxMemory::kHost;
  if (device->kind() == DeviceType::kCuda) {
    if (!UcxMapsCudaMemory()) {
      return UnavailableError("the loaded UCX cannot write " + device->name() +
                              "'s memory (no CUDA support)");
    }
    memory = UcxMemory::kCuda;
  }
  return std::unique_ptr<DirectReader>(new Direct(*this, device, memory));
}

void DirectPullBlocksForTesting(uint64_t bytes) { direct_blocks_for_testing = bytes; }

void BeforeDeviceChecksForTesting(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hook_mu);
  before_device_checks = std::move(hook);
}

}  // namespace tensorlift::remote
