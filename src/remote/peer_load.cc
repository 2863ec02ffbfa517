// LoadFromPeer: find compatible sources, check the key before any byte moves,
// validate each manifest, pull one-sided in bounded batches, verify every
// chunk, and fall back (next source, then disk) on any failure, discarding
// what was pulled. docs/remote.md, "Pulling".
#include <httplib.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/checked_math.h"
#include "device/device.h"
#include "device/populate.h"
#include "load/upload.h"
#include "remote/auth.h"
#include "remote/control.h"
#include "remote/handover.h"
#include "remote/layout.h"
#include "remote/manifest.h"
#include "remote/peer_access.h"
#include "remote/peer_reader.h"
#include "remote/server.h"
#include "remote/ucx_transport.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/checksum.h"
#include "tensorlift/content.h"
#include "tensorlift/sparse.h"

namespace tensorlift {
namespace remote {
namespace {

using Clock = std::chrono::steady_clock;

// PeerKey::content: the identity of the tensors `loaded` holds, recomputed
// from their bytes (on up to 4 threads; device tensors through a host copy),
// against `want`. `manifest` (a single whole-tensor source's; may be null)
// names the tensor whose bytes differ from what the source published.
// kCorruption naming `who`, the tensor or the roots on a mismatch.
Status CheckContent(const LoadedCheckpoint& loaded, const std::string& want,
                    const Manifest* manifest, const std::string& who) {
  const std::vector<LoadedTensor>& tensors = loaded.tensors();
  std::vector<TensorContent> got(tensors.size());
  if (const ContentIdentity* c = loaded.content(); c != nullptr) {
    got = c->tensors;  // The load hashed them as they landed.
  } else {
    std::atomic<size_t> next{0};
    std::mutex mu;
    Status failed = Status::Ok();
    auto work = [&] {
      std::vector<std::byte> host;
      for (size_t i; (i = next.fetch_add(1)) < tensors.size();) {
        const LoadedTensor& t = tensors[i];
        const void* data = t.data;
        if (t.device != DeviceType::kCpu && t.nbytes > 0) {
          host.resize(t.nbytes);
          Status st = loaded.CopyToHost(t.name, host.data());
          if (!st.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            failed = st;
            return;
          }
          data = host.data();
        }
        got[i] = {t.name, t.dtype, t.shape, t.nbytes, TensorContentHash(data, t.nbytes)};
      }
    };
    const unsigned threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    TL_RETURN_IF_ERROR(failed);
  }
  if (manifest != nullptr) {
    for (const TensorContent& t : got) {
      const ManifestTensor* m = manifest->Find(t.name);
      if (m && m->xxh128 && *m->xxh128 != t.hash) {
        return CorruptionError(who + ": tensor '" + t.name + "': the bytes received hash to " +
                               t.hash.Hex() + ", the seed published " + m->xxh128->Hex() +
                               " (content " + want + " asked for)");
      }
    }
  }
  const std::string root = ContentRoot(got).Hex();
  if (root != want) {
    return CorruptionError(who + ": the bytes received have content root " + root + ", expected " +
                           want);
  }
  return Status::Ok();
}

// A source rank's pull: its endpoint, session and manifest.
struct Source {
  const Control* control = nullptr;
  const PeerInfo* info = nullptr;  // What its GET /v1/key said.
  std::string session;
  Manifest manifest;
  std::unique_ptr<UcxClient> ucx;
  std::vector<uint32_t> regions;  // Manifest region -> client region index.
  uint64_t pulled = 0;
  std::string transports;  // What UCX used, for the report.
};

// A tensor as the fallback checkpoint's headers give it (what a disk load
// would hand out: sparse groups by their dense names).
struct Expected {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

// The fallback checkpoint's tensors in name order; nullopt when they cannot be
// read here (not a local checkpoint, or it does not open: its load reports that).
std::optional<std::vector<Expected>> FallbackTensors(const PeerLoadOptions& options) {
  if (options.fallback_path.empty() || options.fallback_loader) return std::nullopt;
  auto ckpt = Checkpoint::Open(options.fallback_path);
  if (!ckpt.ok()) return std::nullopt;
  std::vector<Expected> out;
  auto add = [&](const std::string& name, Dtype dtype, const std::vector<uint64_t>& shape) {
    out.push_back({name, dtype, std::vector<int64_t>(shape.begin(), shape.end())});
  };
  if (options.fallback_load.decode_sparse) {
    auto catalog = sparse::FindSparse(*ckpt);
    if (!catalog.ok()) return std::nullopt;
    for (const auto& t : catalog->sparse) add(t.name, t.dtype, t.dense_shape);
    for (const auto& loc : catalog->dense) {
      const TensorInfo& info = ckpt->info(loc);
      add(info.name, info.dtype, info.shape);
    }
  } else {
    for (const auto& loc : ckpt->tensors()) {
      const TensorInfo& info = ckpt->info(loc);
      add(info.name, info.dtype, info.shape);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Expected& a, const Expected& b) { return a.name < b.name; });
  return out;
}

// One destination tensor.
struct Wanted {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> full_shape;
  int dim = -1;
  IndexRange range;  // Along dim (dim >= 0).
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t offset = 0;  // In the destination buffer.
};

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Closes every session a pull opened (DELETE, with the bytes pulled), whatever
// happens.
struct SessionCloser {
  std::vector<Source>* s;
  ~SessionCloser() {
    for (Source& src : *s) {
      src.ucx.reset();
      if (!src.session.empty()) {
        src.control->Send("DELETE", "/v1/session/" + src.session, std::to_string(src.pulled), 1024)
            .status()
            .IgnoreError();
      }
    }
  }
};

// Gives each wanted tensor its offset in the destination buffer (64-byte
// aligned); returns the buffer's size.
Result<uint64_t> PlaceWanted(const std::string& url, std::vector<Wanted>* wanted) {
  uint64_t total = 0;
  for (Wanted& w : *wanted) {
    total = (total + 63) / 64 * 64;
    w.offset = total;
    if (!CheckedAdd(total, w.nbytes, &total) || total > ManifestLimits().max_total_bytes) {
      return CorruptionError(url + ": the tensors' bytes exceed the limit");
    }
  }
  return total;
}

// One source rank's gets: one per manifest chunk, straight into the
// destination where the whole chunk lands in one place, else into a staging
// chunk copied out once every chunk has checked out.
struct RankPlan {
  struct Chunk {
    const ManifestTensor* t;
    uint64_t index;
    std::byte* dst;
  };
  struct Staged {
    std::byte* dst_base;                 // The destination tensor's bytes.
    std::vector<CopyPiece> pieces;       // Source-shard offsets -> destination offsets.
    uint64_t chunk_begin;                // Source-shard offset of the chunk.
    std::unique_ptr<std::byte[]> bytes;  // The chunk.
    uint64_t size;
  };
  std::vector<UcxClient::Get> gets;
  std::vector<Chunk> chunks;  // chunks[i] is what gets[i] fetches.
  std::vector<Staged> staged;

  // A staging chunk of `size` bytes at source-shard offset `begin`, whose
  // `pieces` go to `dst_base`; returns where the get lands.
  Result<std::byte*> AddStaged(std::byte* dst_base, std::vector<CopyPiece> pieces, uint64_t begin,
                               uint64_t size) {
    Staged s;
    s.dst_base = dst_base;
    s.pieces = std::move(pieces);
    s.chunk_begin = begin;
    s.size = size;
    s.bytes.reset(new (std::nothrow) std::byte[s.size]);
    if (!s.bytes) return ResourceExhaustedError("peer load: no memory for a staging chunk");
    std::byte* into = s.bytes.get();
    staged.push_back(std::move(s));
    return into;
  }
};

// The parts of `pieces` inside source bytes [begin, end).
std::vector<CopyPiece> PiecesWithin(const std::vector<CopyPiece>& pieces, uint64_t begin,
                                    uint64_t end) {
  std::vector<CopyPiece> out;
  for (const CopyPiece& p : pieces) {
    const uint64_t a = std::max(p.src_offset, begin), b = std::min(p.src_offset + p.bytes, end);
    if (a < b) out.push_back({a, p.dst_offset + (a - p.src_offset), b - a});
  }
  return out;
}

// Adds the gets of the chunks (of `chunk_bytes`) of `t` that `pieces` (sorted,
// source offsets -> offsets in `dst`, the destination tensor) touch.
Status AddChunkGets(const ManifestTensor& t, const std::vector<CopyPiece>& pieces,
                    uint64_t chunk_bytes, std::byte* dst, RankPlan* plan) {
  const uint64_t cb = chunk_bytes;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const CopyPiece& p : pieces) {
    lo = std::min(lo, p.src_offset);
    hi = std::max(hi, p.src_offset + p.bytes);
  }
  size_t piece = 0;
  for (uint64_t c = lo / cb; c * cb < hi; ++c) {
    const uint64_t begin = c * cb, end = std::min(t.nbytes, begin + cb);
    while (piece < pieces.size() && pieces[piece].src_offset + pieces[piece].bytes <= begin) {
      ++piece;
    }
    std::byte* into = nullptr;
    if (piece < pieces.size() && pieces[piece].src_offset <= begin &&
        end <= pieces[piece].src_offset + pieces[piece].bytes) {
      into = dst + pieces[piece].dst_offset + (begin - pieces[piece].src_offset);
    } else {
      std::vector<CopyPiece> within = PiecesWithin(pieces, begin, end);
      if (within.empty()) continue;
      TL_ASSIGN_OR_RETURN(into, plan->AddStaged(dst, std::move(within), begin, end - begin));
    }
    plan->gets.push_back({t.region, t.offset + begin, end - begin, into});
    plan->chunks.push_back({&t, c, into});
  }
  return Status::Ok();
}

// Plans the gets from one source rank (manifest `mf`) into the destination
// buffer at `base`; `sends_whole`: this rank also sends the unsplit tensors.
Status PlanRankGets(const Manifest& mf, const std::vector<Wanted>& wanted, bool sends_whole,
                    std::byte* base, RankPlan* plan) {
  for (const Wanted& w : wanted) {
    const ManifestTensor* t = mf.Find(w.name);
    std::byte* dst = base + w.offset;
    std::vector<CopyPiece> pieces;
    if (w.dim < 0) {
      if (!sends_whole) continue;
      pieces.push_back({0, 0, t->nbytes});
    } else {
      const IndexRange src_range{t->shard_start, t->shape[w.dim]};
      const uint32_t bits = static_cast<uint32_t>(DtypeBits(w.dtype));
      TL_ASSIGN_OR_RETURN(pieces, SlicePieces(w.full_shape, bits, w.dim, src_range, w.range));
    }
    if (pieces.empty() || t->nbytes == 0) continue;
    TL_RETURN_IF_ERROR(AddChunkGets(*t, pieces, mf.chunk_bytes, dst, plan));
  }
  return Status::Ok();
}

// Where a pull lands: host memory, or straight in a device's memory (UCX
// writes it at `visible`: a GPU's device addresses, mapped as CUDA memory, or
// the host's mapping of the emulated device's memory). Device bytes are
// checked on staged copies in pinned host memory, once a source rank's gets
// have all landed (CheckStaged).
struct Landing {
  std::shared_ptr<Buffer> buffer;  // Owns the destination bytes.
  std::byte* visible = nullptr;    // Where UCX writes them.
  uint64_t size = 0;
  std::shared_ptr<Device> device;  // Null: host memory.
  UcxMemory memory = UcxMemory::kHost;
  std::unique_ptr<DeviceStream> stream;

  // Whether `p` is in the device's memory (not host memory, nor a staging
  // chunk).
  bool OnDevice(const std::byte* p) const { return device && p >= visible && p < visible + size; }
  // The device address of `p` (a UCX-visible address in the buffer).
  std::byte* DeviceAddress(const std::byte* p) const { return buffer->data() + (p - visible); }
  // Copies host bytes to UCX-visible address `dst` in the buffer.
  Status Put(std::byte* dst, const std::byte* src, uint64_t n) {
    if (!device) {
      std::memcpy(dst, src, n);
      return Status::Ok();
    }
    return stream->CopyToDevice(DeviceAddress(dst), src, n);
  }
};

// Copies the staging chunks' bytes to their destinations.
Status CopyStaged(const std::vector<RankPlan::Staged>& staged, Landing& landing) {
  for (const RankPlan::Staged& s : staged) {
    for (const CopyPiece& p : s.pieces) {
      TL_RETURN_IF_ERROR(landing.Put(s.dst_base + p.dst_offset,
                                     s.bytes.get() + (p.src_offset - s.chunk_begin), p.bytes));
    }
  }
  return landing.device ? landing.stream->Synchronize() : Status::Ok();
}

class Puller {
 public:
  Puller(const PeerKey& key, const PeerLoadOptions& options, std::shared_ptr<Device> device)
      : key_(key),
        options_(options),
        device_(std::move(device)),
        expected_(FallbackTensors(options)) {}

  // Pulls from `group` (one endpoint per source rank, index = rank). On
  // failure `failed_url` names the endpoint to blame (empty: the first).
  Result<LoadedCheckpoint> Pull(const std::vector<const Control*>& group,
                                const std::vector<const PeerInfo*>& infos,
                                std::vector<ShardOf>* shards, PeerLoadReport* report,
                                std::string* failed_url) {
    const auto t0 = Clock::now();
    const int n = static_cast<int>(group.size());
    TL_ASSIGN_OR_RETURN(Layout layout, Layout::Parse(key_.layout));
    std::vector<Source> sources(n);
    // Declared before the closer, so that on an error the UCX clients (which
    // map it) are closed before the buffer is freed.
    Landing landing;
    SessionCloser closer{&sources};
    for (int r = 0; r < n; ++r) sources[r].info = infos[r];
    TL_RETURN_IF_ERROR(OpenSessions(group, &sources, failed_url));

    *failed_url = group[0]->url();
    TL_ASSIGN_OR_RETURN(std::vector<Wanted> wanted, PlanWanted(group, sources, layout, failed_url));
    if (HandsOverWhole(sources, wanted)) {
      TakeOptions take;
      take.token = options_.token;
      take.timeout_ms = options_.connect_timeout_ms;
      take.copy_on_write = options_.handover_copy_on_write;
      take.verify = options_.handover_verify;
      take.device = device_;
      Result<LoadedCheckpoint> taken =
          TakeHandover(sources[0].manifest, group[0]->url(), sources[0].session, take);
      if (taken.ok() && !key_.content.empty()) {
        // The mapped bytes, hashed here: a seed could publish a matching root over other bytes.
        TL_RETURN_IF_ERROR(CheckContent(*taken, key_.content, &sources[0].manifest,
                                        group[0]->url() + " (handover)"));
      }
      if (taken.ok()) {
        sources[0].pulled = taken->total_bytes();  // Counted as served when the session closes.
        shards->clear();
        for (const Wanted& w : wanted)
          shards->push_back({w.dim, w.dim >= 0 ? w.range.start : 0, w.full_shape});
        report->bytes = taken->total_bytes();
        report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        report->source_ranks = 1;
        report->handover = true;
        failed_url->clear();
        return taken;
      }
      // Not a failure of the source: its bytes come over UCX instead.
      report->failures.push_back(group[0]->url() + ": no handover (" + taken.status().message() +
                                 "); pulled over UCX");
    }
    TL_ASSIGN_OR_RETURN(uint64_t total, PlaceWanted(group[0]->url(), &wanted));
    TL_RETURN_IF_ERROR(Allocate(total, &landing));
    // Fresh host memory is faulted in by helper threads ahead of the gets, as
    // a disk load does (docs/loading.md, "Memory"): first touches cost more
    // than the transfer itself on the machine measured (docs/remote.md).
    // That includes the emulated device's memory, which UCX writes through
    // the host's mapping; a GPU's memory is not the host's to fault.
    std::vector<PopulateAhead::Region> fresh;
    if (landing.memory == UcxMemory::kHost) fresh.push_back({landing.visible, landing.size});
    PopulateAhead populate(fresh, FaultThreadCount(options_.fallback_load.fault_threads));

    int ranks_used = 0;
    uint64_t pulled = 0;
    for (int r = 0; r < n; ++r) {
      *failed_url = group[r]->url();
      TL_ASSIGN_OR_RETURN(bool used, PullRank(r, n, group[r]->url(), wanted, landing, &sources[r]));
      if (!used) continue;
      ++ranks_used;
      pulled += sources[r].pulled;
    }

    CheckpointBuilder out;
    AddPulledTensors(wanted, landing, &out, shards);
    AddSourceReports(group, sources, landing, &out);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!key_.content.empty()) {
      // Every byte received, hashed (the chunk checks only say that the bytes are the seed's).
      LoadedCheckpoint result = std::move(out).Finish(seconds);
      TL_RETURN_IF_ERROR(CheckContent(result, key_.content, n == 1 ? &sources[0].manifest : nullptr,
                                      group[0]->url()));
      report->bytes = pulled;
      report->seconds = seconds;
      report->source_ranks = ranks_used;
      failed_url->clear();
      return result;
    }
    report->bytes = pulled;
    report->seconds = seconds;
    report->source_ranks = ranks_used;
    failed_url->clear();
    return std::move(out).Finish(seconds);
  }

 private:
  // Opens a session on each source rank and checks its manifest: the key,
  // and the rank and size it says against the group's.
  Status OpenSessions(const std::vector<const Control*>& group, std::vector<Source>* sources,
                      std::string* failed_url) const {
    const int n = static_cast<int>(group.size());
    for (int r = 0; r < n; ++r) {
      *failed_url = group[r]->url();
      Source& src = (*sources)[r];
      src.control = group[r];
      TL_ASSIGN_OR_RETURN(
          std::string json,
          group[r]->Send("POST", "/v1/session", "", ManifestLimits().max_json_bytes, &src.session));
      auto m = ParseManifest(json);
      if (!m.ok()) return m.status().WithContext(group[r]->url());
      src.manifest = std::move(m).value();
      const Manifest& mf = src.manifest;
      if (!mf.key.Mismatch(key_).empty()) {
        return InvalidArgumentError(group[r]->url() +
                                    ": manifest key differs: " + key_.Mismatch(mf.key));
      }
      if (mf.parallel.size != n || mf.parallel.rank != r) {
        return CorruptionError(group[r]->url() + ": manifest says rank " +
                               std::to_string(mf.parallel.rank) + " of " +
                               std::to_string(mf.parallel.size) + ", its key said rank " +
                               std::to_string(r) + " of " + std::to_string(n));
      }
      TL_RETURN_IF_ERROR(ManifestAgreesWithKey(*src.info, mf));
      if (!key_.content.empty() && n == 1 && mf.content && mf.content->Hex() != key_.content) {
        return InvalidArgumentError(group[r]->url() + ": content differs: expected " +
                                    key_.content + ", the seed's manifest says " +
                                    mf.content->Hex());
      }
      TL_RETURN_IF_ERROR(RateIsEnough(group[r]->url(), mf, options_.min_rate));
    }
    return Status::Ok();
  }

  // Whether the one source rank offers this host a handover of exactly the
  // tensors wanted, whole (PeerLoadOptions::handover).
  bool HandsOverWhole(const std::vector<Source>& sources, const std::vector<Wanted>& wanted) const {
    if (options_.handover != "auto" || sources.size() != 1) return false;
    const Manifest& m = sources[0].manifest;
    if (!HandoverOffered(m) || m.tensors.size() != wanted.size()) return false;
    for (size_t i = 0; i < wanted.size(); ++i) {
      const ManifestTensor& t = m.tensors[i];
      if (t.name != wanted[i].name || t.shape != wanted[i].shape || t.nbytes != wanted[i].nbytes)
        return false;
    }
    return true;
  }

  // The destination's tensors (rank 0's list), checked across the source
  // ranks; `failed_url` is set to the rank that disagrees.
  Result<std::vector<Wanted>> PlanWanted(const std::vector<const Control*>& group,
                                         const std::vector<Source>& sources, const Layout& layout,
                                         std::string* failed_url) const {
    const int n = static_cast<int>(group.size());
    std::vector<Wanted> wanted;
    const Manifest& m0 = sources[0].manifest;
    for (const ManifestTensor& t : m0.tensors) {
      TL_ASSIGN_OR_RETURN(Wanted w, WantedFor(t, group, sources, layout, failed_url));
      wanted.push_back(std::move(w));
    }
    for (int r = 1; r < n; ++r) {
      if (sources[r].manifest.tensors.size() != m0.tensors.size()) {
        *failed_url = group[r]->url();
        return CorruptionError(group[r]->url() + ": serves " +
                               std::to_string(sources[r].manifest.tensors.size()) +
                               " tensors, rank 0 serves " + std::to_string(m0.tensors.size()));
      }
    }
    *failed_url = group[0]->url();
    TL_RETURN_IF_ERROR(MatchesFallback(group[0]->url(), wanted));
    return wanted;
  }

  // A peer whose tensors (names, full shapes, and dtypes unless the key
  // converts them) are not the fallback checkpoint's serves another model
  // under this key: its checksums only say that its bytes are its own.
  Status MatchesFallback(const std::string& url, const std::vector<Wanted>& wanted) const {
    if (!expected_) return Status::Ok();
    const std::vector<Expected>& want = *expected_;
    const bool same_dtypes = key_.dtype == "as-stored";
    const std::string there = "the fallback checkpoint " + options_.fallback_path;
    if (wanted.size() != want.size()) {
      return CorruptionError(url + ": serves " + std::to_string(wanted.size()) + " tensors, " +
                             std::to_string(want.size()) + " in " + there);
    }
    size_t i = 0;
    for (const Wanted& w : wanted) {  // Both in name order, and as many.
      if (w.name < want[i].name) {
        return CorruptionError(url + ": serves tensor '" + w.name + "', which " + there +
                               " does not have");
      }
      if (want[i].name < w.name) {
        return CorruptionError(url + ": does not serve tensor '" + want[i].name + "' of " + there);
      }
      if (w.full_shape != want[i].shape || (same_dtypes && w.dtype != want[i].dtype)) {
        return CorruptionError(url + ": tensor '" + w.name + "' is " +
                               std::string(DtypeName(w.dtype)) + " " + ShapeText(w.full_shape) +
                               " there, " + std::string(DtypeName(want[i].dtype)) + " " +
                               ShapeText(want[i].shape) + " in " + there);
      }
      ++i;
    }
    return Status::Ok();
  }

  // Rank 0's tensor `t` as the destination wants it: split as the layout
  // says, every rank holding its part, and this rank's part of it.
  Result<Wanted> WantedFor(const ManifestTensor& t, const std::vector<const Control*>& group,
                           const std::vector<Source>& sources, const Layout& layout,
                           std::string* failed_url) const {
    Wanted w;
    w.name = t.name;
    w.dtype = t.dtype;
    w.full_shape = t.full_shape;
    w.dim = t.shard_dim;
    const int rule = layout.DimFor(t.name);
    if (w.dim != rule && !(rule >= static_cast<int>(t.full_shape.size()) && w.dim == -1)) {
      return CorruptionError(group[0]->url() + ": tensor '" + t.name + "' is split along dim " +
                             std::to_string(w.dim) + ", the layout says " + std::to_string(rule));
    }
    TL_RETURN_IF_ERROR(CheckRanksAgree(t, group, sources, failed_url));
    w.shape = w.full_shape;
    if (w.dim >= 0) {
      TL_ASSIGN_OR_RETURN(
          w.range, ShardRange(w.full_shape[w.dim], options_.parallel.rank, options_.parallel.size));
      w.shape[w.dim] = w.range.length;
    }
    // The full tensor's bytes were bounded by the manifest's checks on
    // each shard; the destination's part is no larger than the full tensor.
    w.nbytes = Elements(w.shape) * static_cast<uint64_t>(DtypeBits(w.dtype)) / 8;
    return w;
  }

  // Every source rank holds rank 0's tensor `t` (same dtype, full shape and
  // split dim) and, when it is split, its own part of it.
  static Status CheckRanksAgree(const ManifestTensor& t, const std::vector<const Control*>& group,
                                const std::vector<Source>& sources, std::string* failed_url) {
    const int n = static_cast<int>(group.size());
    const int dim = t.shard_dim;
    for (int r = 0; r < n; ++r) {
      const ManifestTensor* o = sources[r].manifest.Find(t.name);
      if (!o || o->dtype != t.dtype || o->full_shape != t.full_shape ||
          o->shard_dim != t.shard_dim) {
        *failed_url = group[r]->url();
        return CorruptionError(group[r]->url() + ": tensor '" + t.name +
                               "' differs from rank 0's or is missing");
      }
      if (dim >= 0) {
        TL_ASSIGN_OR_RETURN(IndexRange expect, ShardRange(t.full_shape[dim], r, n));
        if (o->shard_start != expect.start || o->shape[dim] != expect.length) {
          *failed_url = group[r]->url();
          return CorruptionError(
              group[r]->url() + ": tensor '" + t.name + "': rank " + std::to_string(r) +
              " holds [" + std::to_string(o->shard_start) + ", +" + std::to_string(o->shape[dim]) +
              ") of dim " + std::to_string(dim) + ", expected [" + std::to_string(expect.start) +
              ", +" + std::to_string(expect.length) + ")");
        }
      }
    }
    return Status::Ok();
  }

  // Pulls source rank `r`'s part of the destination into `buffer`: the gets,
  // then the copies out of the staging chunks, once every chunk has checked
  // out. False when the rank holds nothing the destination wants.
  Result<bool> PullRank(int r, int n, const std::string& url, const std::vector<Wanted>& wanted,
                        Landing& landing, Source* src) const {
    RankPlan plan;
    const bool sends_whole = r == options_.parallel.rank % n;
    TL_RETURN_IF_ERROR(PlanRankGets(src->manifest, wanted, sends_whole, landing.visible, &plan));
    if (plan.gets.empty()) return false;
    TL_RETURN_IF_ERROR(ConnectSource(url, src));
    for (auto& g : plan.gets) g.region = src->regions[g.region];
    TL_RETURN_IF_ERROR(src->ucx->MapLocal(landing.visible, landing.size, landing.memory));
    Status got = GetVerified(url, plan, landing, src);
    if (!got.ok()) {
      // No copy of this pull may still run when the buffer is freed.
      if (landing.stream) landing.stream->Synchronize().IgnoreError();
      return got;
    }
    TL_RETURN_IF_ERROR(CopyStaged(plan.staged, landing));
    src->transports = src->ucx->TransportsInUse();
    src->ucx.reset();
    return true;
  }

  // Connects to the source's UCX worker and adds its manifest's regions.
  Status ConnectSource(const std::string& url, Source* src) const {
    UcxOptions uo;
    uo.transports = options_.transports;
    auto ucx = UcxClient::Connect(src->manifest.worker_address, uo,
                                  std::chrono::milliseconds(options_.connect_timeout_ms));
    if (!ucx.ok()) return ucx.status().WithContext(url);  // Name the source.
    src->ucx = std::move(ucx).value();
    for (const Region& region : src->manifest.regions) {
      if (region.rkey.empty()) {
        return PermissionDeniedError(url + ": the manifest has no remote keys");
      }
      auto idx = src->ucx->AddRegion(region.rkey, region.address, region.bytes);
      if (!idx.ok()) return idx.status().WithContext(url);
      src->regions.push_back(*idx);
    }
    return Status::Ok();
  }

  // Runs the plan's gets, checking each chunk's XXH3 against the manifest as
  // it lands; counts the bytes in src->pulled.
  Status GetVerified(const std::string& url, const RankPlan& plan, Landing& landing,
                     Source* src) const {
    const Manifest& mf = src->manifest;
    const std::vector<UcxClient::Get>& gets = plan.gets;
    UcxClient::GetOptions go;
    go.max_in_flight = options_.max_in_flight;
    go.max_get_bytes = options_.batch_bytes;
    go.rate_limit = mf.rate_limit;
    go.stall_timeout = std::chrono::milliseconds(options_.stall_timeout_ms);
    go.min_rate = options_.min_rate;
    Status bad = Status::Ok();
    std::vector<size_t> on_device;  // Gets landed in device memory: checked after.
    go.on_done = [&](size_t i) {
      const RankPlan::Chunk& c = plan.chunks[i];
      src->pulled += gets[i].bytes;
      if (!bad.ok()) return;
      if (landing.OnDevice(c.dst)) {
        on_device.push_back(i);
        return;
      }
      bad = CheckChunk(url, mf, c, gets[i].bytes, Xxh3_64(c.dst, gets[i].bytes));
    };
    // A chunk that failed its check ends the pull: the rest is not worth pulling.
    go.cancelled = [&] { return !bad.ok(); };
    Status got = src->ucx->GetAll(gets, go).WithContext(url);
    TL_RETURN_IF_ERROR(bad);
    TL_RETURN_IF_ERROR(got);
    return CheckStaged(url, mf, plan, on_device, landing);
  }

  // kCorruption naming the chunk when `sum` is not the manifest's.
  static Status CheckChunk(const std::string& url, const Manifest& mf, const RankPlan::Chunk& c,
                           uint64_t bytes, uint64_t sum) {
    if (sum == c.t->chunk_xxh3[c.index]) return Status::Ok();
    return CorruptionError(url + ": tensor '" + c.t->name + "' chunk " + std::to_string(c.index) +
                           " (bytes " + std::to_string(c.index * mf.chunk_bytes) + ".." +
                           std::to_string(c.index * mf.chunk_bytes + bytes) + "): XXH3 " +
                           HexU64(sum) + ", the manifest says " + HexU64(c.t->chunk_xxh3[c.index]));
  }

  // Checks the chunks of `gets` that landed in device memory: copied to
  // pinned host memory in windows of about 16 MiB (two, so that the next
  // window's copy runs while this one is hashed) and hashed there.
  static Status CheckStaged(const std::string& url, const Manifest& mf, const RankPlan& plan,
                            const std::vector<size_t>& gets, Landing& landing) {
    if (gets.empty()) return Status::Ok();
    uint64_t largest = 0;
    for (size_t i : gets) largest = std::max(largest, plan.gets[i].bytes);
    const uint64_t window = std::max<uint64_t>(largest, 16ull << 20);
    // Windows: runs of gets (in landing order) whose bytes fit in one window.
    std::vector<std::pair<size_t, size_t>> windows;  // [begin, end) in `gets`.
    for (size_t b = 0; b < gets.size();) {
      size_t e = b;
      for (uint64_t used = 0; e < gets.size() && used + plan.gets[gets[e]].bytes <= window; ++e) {
        used += plan.gets[gets[e]].bytes;
      }
      windows.push_back({b, e});
      b = e;
    }
    std::shared_ptr<Buffer> staging[2];
    std::unique_ptr<DeviceEvent> copied[2];
    for (int k = 0; k < 2 && k < static_cast<int>(windows.size()); ++k) {
      TL_ASSIGN_OR_RETURN(staging[k], landing.device->AllocatePinned(window));
      TL_ASSIGN_OR_RETURN(copied[k], landing.device->CreateEvent());
    }
    auto issue = [&](size_t w) -> Status {
      std::byte* to = staging[w % 2]->data();
      for (size_t j = windows[w].first; j < windows[w].second; ++j) {
        const UcxClient::Get& g = plan.gets[gets[j]];
        TL_RETURN_IF_ERROR(landing.stream->CopyToHost(
            to, landing.DeviceAddress(static_cast<const std::byte*>(g.dst)), g.bytes));
        to += g.bytes;
      }
      return landing.stream->Record(*copied[w % 2]);
    };
    auto check = [&]() -> Status {
      TL_RETURN_IF_ERROR(issue(0));
      for (size_t w = 0; w < windows.size(); ++w) {
        TL_RETURN_IF_ERROR(copied[w % 2]->Synchronize());
        if (w + 1 < windows.size()) TL_RETURN_IF_ERROR(issue(w + 1));
        const std::byte* at = staging[w % 2]->data();
        for (size_t j = windows[w].first; j < windows[w].second; ++j) {
          const uint64_t bytes = plan.gets[gets[j]].bytes;
          TL_RETURN_IF_ERROR(CheckChunk(url, mf, plan.chunks[gets[j]], bytes, Xxh3_64(at, bytes)));
          at += bytes;
        }
      }
      return Status::Ok();
    };
    const Status checked = check();
    // No copy into the staging buffers may run once they are freed.
    const Status drained = landing.stream->Synchronize();
    return checked.ok() ? drained : checked;
  }

  // Where the pull lands: straight on the destination device when UCX can
  // write its memory (a GPU's with a CUDA build of UCX; the emulated device's
  // through its host mapping), else in host memory (then copied up).
  Status Allocate(uint64_t total, Landing* landing) const {
    if (device_) {
      const bool cuda = device_->kind() == DeviceType::kCuda;
      if (!cuda || UcxMapsCudaMemory()) {
        Result<std::shared_ptr<Buffer>> b = device_->Allocate(total);
        if (!b.ok()) {
          return b.status().WithContext("peer load: " + std::to_string(total) + " bytes on " +
                                        device_->name());
        }
        std::byte* visible = cuda ? (*b)->data() : (*b)->host_mapping();
        if (visible != nullptr) {
          TL_ASSIGN_OR_RETURN(landing->stream, device_->CreateStream());
          landing->buffer = std::move(b).value();
          landing->visible = visible;
          landing->size = landing->buffer->size();
          landing->device = device_;
          landing->memory = cuda ? UcxMemory::kCuda : UcxMemory::kHost;
          return Status::Ok();
        }
      }
    }
    TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> host, HostBuffer::Allocate(total));
    landing->visible = host->data();
    landing->size = host->size();
    landing->buffer = std::move(host);
    return Status::Ok();
  }

  // The pulled tensors (views into the landing buffer, which owns them) and
  // each one's shard.
  static void AddPulledTensors(const std::vector<Wanted>& wanted, const Landing& landing,
                               CheckpointBuilder* out, std::vector<ShardOf>* shards) {
    out->Reserve(wanted.size());
    shards->clear();
    if (landing.device) out->set_device(landing.device);
    for (const Wanted& w : wanted) {
      LoadedTensor t;
      t.name = w.name;
      t.dtype = w.dtype;
      t.shape = w.shape;
      SetRowMajorStrides(&t);
      t.data = landing.buffer->data() + w.offset;
      t.nbytes = w.nbytes;
      if (landing.device) {
        t.device = landing.device->kind();
        t.device_index = landing.device->ordinal();
      }
      out->Add(std::move(t), landing.buffer);
      shards->push_back({w.dim, w.dim >= 0 ? w.range.start : 0, w.full_shape});
    }
  }

  // One file report per source rank: its endpoint, transports and bytes.
  static void AddSourceReports(const std::vector<const Control*>& group,
                               const std::vector<Source>& sources, const Landing& landing,
                               CheckpointBuilder* out) {
    const int n = static_cast<int>(group.size());
    for (int r = 0; r < n; ++r) {
      FileReport f;
      f.path = group[r]->url();
      f.reason = "peer rank " + std::to_string(r) + " of " + std::to_string(n) +
                 (sources[r].transports.empty() ? "" : " over UCX " + sources[r].transports) +
                 (landing.device ? " into " + landing.device->name() + "'s memory" : "");
      f.bytes = sources[r].pulled;
      out->files().push_back(std::move(f));
    }
  }

  const PeerKey& key_;
  const PeerLoadOptions& options_;
  std::shared_ptr<Device> device_;  // The destination's; null: host memory.
  // The fallback checkpoint's tensors, which a peer's must be (MatchesFallback).
  std::optional<std::vector<Expected>> expected_;
};

}  // namespace

// The device of PeerLoadOptions::device, or null for host memory.
Result<std::shared_ptr<Device>> DestinationDevice(const PeerLoadOptions& options) {
  TL_ASSIGN_OR_RETURN(const auto dev, ParseDevice(options.device));
  const std::string& fallback = options.fallback_load.device;
  if (fallback != "cpu" && fallback != options.device) {
    return InvalidArgumentError("peer load: fallback_load.device \"" + fallback +
                                "\" differs from PeerLoadOptions::device \"" + options.device +
                                "\" (set PeerLoadOptions::device: it applies to peers and disk)");
  }
  if (dev.first == DeviceType::kCpu) return std::shared_ptr<Device>();
  return OpenDevice(dev.first, dev.second);
}

// The load, and each tensor's shard (for become-a-seed).
Result<LoadedCheckpoint> LoadFromPeerWithShards(const PeerKey& key, const PeerLoadOptions& options,
                                                PeerLoadReport* report,
                                                std::vector<ShardOf>* shards) {
  const auto t0 = Clock::now();
  PeerLoadReport local;
  if (!report) report = &local;
  *report = PeerLoadReport();
  TL_RETURN_IF_ERROR(key.Validate());
  TL_ASSIGN_OR_RETURN(Layout layout, Layout::Parse(key.layout));
  if (!key.content.empty() && options.parallel.size > 1 && !layout.empty()) {
    return InvalidArgumentError(
        "peer load: key.content names a whole checkpoint's bytes; tensor parallel rank " +
        std::to_string(options.parallel.rank) + " of " + std::to_string(options.parallel.size) +
        " receives slices of it and cannot check it");
  }
  if (options.parallel.size < 1 || options.parallel.rank < 0 ||
      options.parallel.rank >= options.parallel.size) {
    return InvalidArgumentError("peer load: tensor parallel rank " +
                                std::to_string(options.parallel.rank) + " of size " +
                                std::to_string(options.parallel.size) + " is out of range");
  }
  const std::string& token = options.token;
  if (options.handover != "auto" && options.handover != "off") {
    return InvalidArgumentError("peer load: handover \"" + options.handover +
                                "\" is not \"auto\" or \"off\"");
  }
  TL_ASSIGN_OR_RETURN(const std::shared_ptr<Device> device, DestinationDevice(options));
  // Disk loads that slice, and pulls that UCX cannot land on the device, are
  // in host memory: a device destination gets a copy.
  auto place = [&](Result<LoadedCheckpoint> r) -> Result<LoadedCheckpoint> {
    if (!r.ok() || !device || r->tensors().empty() ||
        r->tensors().front().device != DeviceType::kCpu) {
      return r;
    }
    return UploadToDevice(std::move(r).value(), device);
  };

  // The endpoints: this host's resident seed, the given ones, then the
  // registry's live seeds.
  std::vector<std::string> urls = PeerUrlsFor(key, options.peers, options.registry,
                                              options.request_timeout_ms, &report->failures);
  if (options.local) {
    // This rank's seed, else a seed of the whole model.
    for (const TensorParallel& at : {options.parallel, TensorParallel{1, 0}}) {
      Result<std::string> local =
          FindLocalSeed(key.Digest(), at.rank, at.size, options.request_timeout_ms);
      if (!local.ok()) continue;
      if (std::find(urls.begin(), urls.end(), *local) == urls.end())
        urls.insert(urls.begin(), *local);
      break;
    }
  }
  std::vector<Control> controls;
  std::vector<PeerInfo> infos;
  controls.reserve(urls.size());
  for (const std::string& url : urls) {
    auto c = Control::Make(url, token, options.request_timeout_ms);
    if (!c.ok()) {
      report->failures.push_back(url + ": " + c.status().message());
      continue;
    }
    auto body = c->Send("GET", "/v1/key", "", 64 << 10);
    Result<PeerInfo> info = body.ok() ? ParseKeyJson(url, *body) : Result<PeerInfo>(body.status());
    if (!info.ok()) {
      report->failures.push_back(info.status().message());
      continue;
    }
    const std::string mismatch = key.Mismatch(info->key);
    if (!mismatch.empty()) {
      report->failures.push_back(url + ": incompatible: " + mismatch);
      continue;
    }
    if (!key.content.empty() && info->parallel.size == 1 && !info->content.empty() &&
        info->content != key.content) {
      report->failures.push_back(url + ": content differs: expected " + key.content +
                                 ", the seed's is " + info->content);
      continue;
    }
    controls.push_back(std::move(c).value());
    infos.push_back(std::move(info).value());
  }

  // Source groups by size (the destination's own size first), each rank's
  // endpoints least loaded first; a failed endpoint is dropped and the group
  // tried again while every rank still has one.
  std::map<int, std::vector<std::vector<size_t>>> groups;  // size -> rank -> endpoint indexes.
  for (size_t i = 0; i < infos.size(); ++i) {
    auto& g = groups[infos[i].parallel.size];
    g.resize(infos[i].parallel.size);
    g[infos[i].parallel.rank].push_back(i);
  }
  std::vector<int> sizes;
  if (groups.count(options.parallel.size)) sizes.push_back(options.parallel.size);
  for (const auto& [size, g] : groups) {
    if (size != options.parallel.size) sizes.push_back(size);
  }
  std::set<size_t> failed;
  Puller puller(key, options, device);
  std::vector<const PeerInfo*> pick_infos;
  for (int size : sizes) {
    auto& g = groups[size];
    for (auto& endpoints : g) {
      std::stable_sort(endpoints.begin(), endpoints.end(),
                       [&](size_t a, size_t b) { return infos[a].load < infos[b].load; });
    }
    for (;;) {
      std::vector<const Control*> pick;
      pick_infos.clear();
      std::string missing;
      for (int r = 0; r < size; ++r) {
        auto it =
            std::find_if(g[r].begin(), g[r].end(), [&](size_t i) { return !failed.count(i); });
        if (it == g[r].end()) {
          missing = "rank " + std::to_string(r);
          break;
        }
        pick.push_back(&controls[*it]);
        pick_infos.push_back(&infos[*it]);
      }
      if (!missing.empty()) {
        report->failures.push_back("sources of size " + std::to_string(size) +
                                   ": no live endpoint for " + missing);
        break;
      }
      std::string failed_url;
      auto loaded = place(puller.Pull(pick, pick_infos, shards, report, &failed_url));
      if (loaded.ok()) {
        std::string used;
        for (const Control* c : pick) used += (used.empty() ? "" : ",") + c->url();
        report->source = used;
        report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        return loaded;
      }
      report->failures.push_back(loaded.status().message());
      size_t culprit = 0;
      for (int r = 0; r < size; ++r) {
        if (pick[r]->url() == failed_url) culprit = static_cast<size_t>(pick[r] - controls.data());
      }
      if (failed_url.empty()) culprit = static_cast<size_t>(pick[0] - controls.data());
      failed.insert(culprit);
    }
  }
  if (urls.empty()) report->failures.push_back("no peers given and none found");

  if (options.fallback_path.empty()) {
    std::string why;
    for (const auto& f : report->failures) why += "\n  " + f;
    return UnavailableError("peer load: no peer worked and there is no fallback path:" + why);
  }
  LoadOptions disk = options.fallback_load;
  // Nothing sliced: straight onto the device. Else slices are cut on the host.
  const bool whole_tensors = options.parallel.size == 1 || layout.empty();
  disk.device = whole_tensors ? options.device : "cpu";
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint whole,
                      options.fallback_loader ? options.fallback_loader(options.fallback_path, disk)
                                              : Load(options.fallback_path, disk));
  if (!key.content.empty()) {
    TL_RETURN_IF_ERROR(CheckContent(whole, key.content, nullptr, "disk:" + options.fallback_path));
  }
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint mine,
                      place(SliceForRank(std::move(whole), layout, options.parallel, shards)));
  report->source =
      options.fallback_loader ? options.fallback_path : "disk:" + options.fallback_path;
  report->bytes = mine.total_bytes();
  report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  report->source_ranks = 0;
  return mine;
}

}  // namespace remote

Result<LoadedCheckpoint> LoadFromPeer(const PeerKey& key, const PeerLoadOptions& options,
                                      PeerLoadReport* report) {
  if (options.fallback_load.on_tensor) {
    return InvalidArgumentError(
        "peer loading: LoadOptions::on_tensor applies to Load, not to peer loads");
  }
  std::vector<remote::ShardOf> shards;
  return remote::LoadFromPeerWithShards(key, options, report, &shards);
}

Result<PeerLoad> LoadFromPeerAndSeed(const PeerKey& key, const PeerLoadOptions& options) {
  if (options.fallback_load.on_tensor) {
    return InvalidArgumentError(
        "peer loading: LoadOptions::on_tensor applies to Load, not to peer loads");
  }
  PeerLoad out;
  std::vector<remote::ShardOf> shards;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                      remote::LoadFromPeerWithShards(key, options, &out.report, &shards));
  out.loaded = std::make_shared<const LoadedCheckpoint>(std::move(loaded));
  if (options.become_seed) {
    ServeOptions seed = options.seed;
    if (seed.registry.empty()) seed.registry = options.registry;
    if (seed.token.empty()) seed.token = options.token;
    if (seed.transports.empty()) seed.transports = options.transports;
    seed.parallel = options.parallel;
    TL_ASSIGN_OR_RETURN(out.seed, remote::ServeShards(out.loaded, std::move(shards), key, seed));
  }
  return out;
}

}  // namespace tensorlift

namespace tensorlift {

Result<PeerKey> PeerKeyForCheckpoint(const std::string& path) {
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path));
  return PeerKeyForCheckpoint(ckpt);
}

Result<PeerKey> PeerKeyForCheckpoint(const Checkpoint& ckpt) {
  const std::string& path = ckpt.path();
  std::string desc;
  for (const auto& loc : ckpt.tensors()) {
    const TensorInfo& t = ckpt.info(loc);
    desc += t.name;
    desc += '\0';
    desc += DtypeName(t.dtype);
    for (uint64_t d : t.shape) desc += "," + std::to_string(d);
    desc += ";" + std::to_string(t.nbytes()) + "\n";
  }
  PeerKey key;
  std::string name = path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') == std::string::npos ? 0 : name.find_last_of('/') + 1);
  for (const char* suffix : {".safetensors.index.json", ".safetensors"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      name.resize(name.size() - s.size());
    }
  }
  if (name == "model" || name.empty()) {  // model.safetensors: the directory's name says more.
    std::string dir =
        path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
    const size_t slash = dir.find_last_of('/');
    if (!dir.empty()) name = dir.substr(slash == std::string::npos ? 0 : slash + 1);
  }
  key.model = name.empty() ? "model" : name;
  key.revision = "h:" + HexU64(Xxh3_64(desc.data(), desc.size()));
  return key;
}

}  // namespace tensorlift
