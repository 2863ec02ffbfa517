// The sources of a striped load (see striped_sources.h).
#include "sources/striped_sources.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>

#include "io/faults.h"
#include "objstore/s3_store.h"

namespace tensorlift::sources {

Result<std::unique_ptr<DiskSource>> DiskSource::Open(const Checkpoint& ckpt, int workers,
                                                     int take) {
  std::unique_ptr<DiskSource> d(new DiskSource("disk:" + ckpt.path()));
  d->workers = workers;
  d->take = take;
  for (const Checkpoint::Shard& shard : ckpt.shards()) {
    // O_DIRECT where the filesystem has it (not tmpfs): buffered otherwise.
    auto f = PosixFile::OpenForRead(shard.path, O_DIRECT);
    const bool direct = f.ok();
    if (!direct) f = PosixFile::OpenForRead(shard.path);
    if (!f.ok()) return f.status().WithContext(shard.path);
    TL_ASSIGN_OR_RETURN(FileIdentity id, f->Identity());
    if (id != shard.identity) {
      return IOError(shard.path + ": changed since its header was read");
    }
    d->files_.push_back(std::move(f).value());
    if (direct) {
      auto buffered = PosixFile::OpenForRead(shard.path);
      if (!buffered.ok()) return buffered.status().WithContext(shard.path);
      d->buffered_.push_back(std::move(buffered).value());
    } else {
      d->buffered_.emplace_back();
    }
    d->paths_.push_back(shard.path);
  }
  // Every worker's engine now, before the load: a ring's set-up maps memory,
  // which would wait for the mmap lock that the loader's fault threads hold.
  for (int w = 0; w < workers; ++w) {
    TL_ASSIGN_OR_RETURN(std::unique_ptr<ReadEngine> engine, d->MakeEngine());
    d->idle_.push_back(std::move(engine));
  }
  return d;
}

DiskSource::~DiskSource() = default;

Result<std::unique_ptr<ReadEngine>> DiskSource::MakeEngine() const {
  std::vector<EngineFile> files;
  // Shard s is file s (O_DIRECT where it can be) and file n + s (buffered).
  for (size_t s = 0; s < files_.size(); ++s) files.push_back({files_[s].fd(), &paths_[s]});
  for (size_t s = 0; s < files_.size(); ++s) files.push_back({buffered_[s].fd(), &paths_[s]});
  auto uring = MakeUringEngine(2 * take, files);
  if (uring.ok()) return std::move(uring).value();
  return MakeInlineEngine(std::move(files));
}

Result<std::unique_ptr<ReadEngine>> DiskSource::TakeEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<ReadEngine> e = std::move(idle_.back());
      idle_.pop_back();
      return e;
    }
  }
  return MakeEngine();
}

Status DiskSource::Fetch(const std::vector<const Piece*>& pieces) {
  // The aligned middles first, in flight together; the bounce blocks of the
  // unaligned ends after them (read one at a time, while the middles are).
  std::vector<ReadOp> ops, ends;
  for (const Piece* p : pieces) {
    const uint64_t begin = p->file_offset, end = p->file_offset + p->bytes;
    const uint64_t a = RoundUp(begin, kDirectAlign), b = end / kDirectAlign * kDirectAlign;
    const bool aligned = (reinterpret_cast<uintptr_t>(p->dst) - begin) % kDirectAlign == 0;
    if (buffered_[p->shard].fd() < 0) {  // The file itself is read buffered.
      ops.push_back({p->shard, begin, p->bytes, p->dst});
    } else if (!aligned || p->whole) {
      // Through the page cache: no O_DIRECT read lands there, or a chunk
      // fetched whole for parts of it, which the reads of its other parts
      // may fetch again (from the page cache then, not from the disk).
      const uint32_t buffered = static_cast<uint32_t>(files_.size()) + p->shard;
      ops.push_back({buffered, begin, p->bytes, p->dst});
    } else if (a == begin && b == end) {
      ops.push_back({p->shard, begin, p->bytes, p->dst});
    } else if (b <= a) {
      ends.push_back({p->shard, begin, p->bytes, p->dst, /*bounce=*/true});
    } else {
      if (a > begin) ends.push_back({p->shard, begin, a - begin, p->dst, true});
      ops.push_back({p->shard, a, b - a, p->dst + (a - begin)});
      if (end > b) ends.push_back({p->shard, b, end - b, p->dst + (b - begin), true});
    }
  }
  ops.insert(ops.end(), ends.begin(), ends.end());
  TL_ASSIGN_OR_RETURN(std::unique_ptr<ReadEngine> engine, TakeEngine());
  ReadProgress progress;
  Status st = engine->Run(ops, &progress);
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(engine));
  return st;
}

Result<std::unique_ptr<ObjectSource>> ObjectSource::Open(const Checkpoint& bucket,
                                                         const std::vector<uint32_t>& shard_of,
                                                         const ObjectStoreOptions& store,
                                                         int threads) {
  std::unique_ptr<ObjectSource> o(new ObjectSource(bucket.path()));
  o->workers = threads;
  TL_ASSIGN_OR_RETURN(objstore::ObjectUrl url, objstore::ParseObjectUrl(bucket.path()));
  TL_ASSIGN_OR_RETURN(o->client_, objstore::ClientForStore(url, store));
  for (uint32_t s : shard_of) {
    TL_ASSIGN_OR_RETURN(objstore::ObjectUrl u, objstore::ParseObjectUrl(bucket.shards()[s].path));
    o->objects_.push_back(std::move(u));
  }
  return o;
}

Status ObjectSource::Fetch(const std::vector<const Piece*>& pieces) {
  std::vector<objstore::RangeRequest> requests;
  for (const Piece* p : pieces) {
    const objstore::ObjectUrl& u = objects_[p->shard];
    requests.push_back({u.bucket, u.key, p->file_offset, p->bytes, p->dst});
  }
  return client_->GetRanges(requests);
}

Result<std::unique_ptr<PeerSource>> PeerSource::Open(std::unique_ptr<remote::PeerSession> session,
                                                     const Layout& layout,
                                                     const TensorFilter& filter, int take,
                                                     remote::UcxClient::GetOptions get) {
  std::unique_ptr<PeerSource> p(new PeerSource(session->url()));
  p->take = take;
  p->get_ = std::move(get);
  const remote::Manifest& mf = session->manifest;
  for (const std::vector<LaidOut>& shard : layout.shards) {
    for (const LaidOut& t : shard) {
      const TensorInfo& info = *t.info;
      const remote::ManifestTensor* m = mf.Find(info.name);
      const bool same =
          m && m->dtype == info.dtype && m->shard_dim == -1 && m->nbytes == info.nbytes() &&
          std::equal(m->shape.begin(), m->shape.end(), info.shape.begin(), info.shape.end(),
                     [](int64_t a, uint64_t b) { return a >= 0 && static_cast<uint64_t>(a) == b; });
      if (same) {
        p->served_[&t] = m;
      } else if (filter.Matches(info.name)) {
        return InvalidArgumentError(session->url() + ": tensor '" + info.name + "' is " +
                                    (m ? "served with another dtype or shape" : "not served") +
                                    " (the headers': " + std::string(DtypeName(info.dtype)) + ")");
      }
    }
  }
  p->session_ = std::move(session);
  return p;
}

const remote::ManifestTensor* PeerSource::served(const LaidOut& t) const {
  auto it = served_.find(&t);
  return it == served_.end() ? nullptr : it->second;
}

Status PeerSource::Fetch(const std::vector<const Piece*>& pieces) {
  if (!session_->ucx) TL_RETURN_IF_ERROR(session_->Connect(lazy_transports_, lazy_timeout_ms_));
  std::vector<remote::UcxClient::Get> gets;
  for (const Piece* p : pieces) {
    std::byte* dst = p->dst;
    for (const Unit& unit : p->units) {
      const remote::ManifestTensor* m = served(*unit.tensor);
      if (!m) {
        return NotFoundError(report.name + ": does not serve tensor '" + unit.tensor->info->name +
                             "' as the headers say");
      }
      const uint64_t at = m->offset + unit.offset;
      const uint32_t region = session_->regions[m->region];
      // Adjacent units of one tensor are got as one.
      if (!gets.empty() && gets.back().region == region &&
          gets.back().offset + gets.back().bytes == at &&
          static_cast<std::byte*>(gets.back().dst) + gets.back().bytes == dst) {
        gets.back().bytes += unit.bytes;
      } else {
        gets.push_back({region, at, unit.bytes, dst});
      }
      dst += unit.bytes;
    }
  }
  remote::UcxClient::GetOptions go = get_;
  go.on_done = [&](size_t i) { session_->pulled += gets[i].bytes; };
  return session_->GetAll(gets, go);
}

Result<std::unique_ptr<RelaySource>> RelaySource::Open(std::unique_ptr<remote::PeerSession> session,
                                                       remote::Control control,
                                                       const Layout& layout,
                                                       const TensorFilter& filter, int take,
                                                       remote::UcxClient::GetOptions get) {
  const std::string url = session->url();
  std::unique_ptr<RelaySource> r(new RelaySource(url));
  r->take = take;
  r->starts_ = remote::ChunkStarts(session->manifest);
  r->first_ = session->manifest.tensors.data();
  TL_ASSIGN_OR_RETURN(r->peer_,
                      PeerSource::Open(std::move(session), layout, filter, take, std::move(get)));
  r->control_ = std::make_unique<remote::Control>(std::move(control));
  r->follower_ = std::thread([p = r.get()] { p->Follow(); });
  return r;
}

RelaySource::~RelaySource() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (follower_.joinable()) follower_.join();
}

void RelaySource::Follow() {
  constexpr int kWaitMs = kHaveWaitMs;  // Also bounds how long stopping takes.
  const uint64_t chunks = starts_.back();
  for (;;) {
    uint64_t after = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || held_.complete) return;
      after = held_.version;
    }
    Result<std::string> text = control_->Send(
        "GET", "/v1/have?after=" + std::to_string(after) + "&wait_ms=" + std::to_string(kWaitMs),
        "", 64 + 2 * chunks);
    Result<remote::HeldChunks> held = text.ok() ? remote::ParseHeldChunks(*text, chunks)
                                                : Result<remote::HeldChunks>(text.status());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      if (!held.ok()) {
        lost_ = held.status().message();
        held_ = remote::HeldChunks();
      } else if (held->version >= held_.version) {
        held_ = std::move(held).value();
      }
    }
    if (changed) changed();
    if (!held.ok()) return;
  }
}

bool RelaySource::Holds(const Piece& p) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_.complete) return true;
  for (const Unit& u : p.units) {
    const remote::ManifestTensor* m = peer_->served(*u.tensor);
    if (!m || u.chunk < 0) return false;
    if (!held_.Has(starts_[static_cast<size_t>(m - first_)] + static_cast<uint64_t>(u.chunk)))
      return false;
  }
  return true;
}

uint64_t RelaySource::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_.complete) return starts_.back();
  uint64_t n = 0;
  for (uint8_t b : held_.bits) n += static_cast<uint64_t>(std::popcount(b));
  return n;
}

std::string RelaySource::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

}  // namespace tensorlift::sources
