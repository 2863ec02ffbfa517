// The sources of a striped load (see striped_sources.h).
#include "sources/striped_sources.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "io/faults.h"
#include "objstore/s3_store.h"

namespace tensorlift::sources {

Result<std::unique_ptr<DiskSource>> DiskSource::Open(const Checkpoint& ckpt, int threads) {
  std::unique_ptr<DiskSource> d(new DiskSource("disk:" + ckpt.path()));
  d->workers = threads;
  for (const Checkpoint::Shard& shard : ckpt.shards()) {
    auto f = PosixFile::OpenForRead(shard.path);
    if (!f.ok()) return f.status().WithContext(shard.path);
    TL_ASSIGN_OR_RETURN(FileIdentity id, f->Identity());
    if (id != shard.identity) {
      return IOError(shard.path + ": changed since its header was read");
    }
    // O_DIRECT where the filesystem has it (not tmpfs): buffered otherwise.
    auto direct = PosixFile::OpenForRead(shard.path, O_DIRECT);
    d->direct_.push_back(direct.ok() ? std::move(direct).value() : PosixFile());
    d->files_.push_back(std::move(f).value());
    d->paths_.push_back(shard.path);
  }
  return d;
}

Status DiskSource::Fetch(const std::vector<const Piece*>& pieces) {
  for (const Piece* p : pieces) {
    const uint64_t begin = p->file_offset, end = p->file_offset + p->bytes;
    const uint64_t a = RoundUp(begin, kBlock), b = end / kBlock * kBlock;
    const bool aligned = (reinterpret_cast<uintptr_t>(p->dst) - begin) % kBlock == 0;
    if (direct_[p->shard].fd() < 0 || b <= a || !aligned) {
      TL_RETURN_IF_ERROR(ReadAt(files_[p->shard], p->shard, begin, end, p->dst));
      continue;
    }
    TL_RETURN_IF_ERROR(ReadAt(files_[p->shard], p->shard, begin, a, p->dst));
    TL_RETURN_IF_ERROR(ReadAt(direct_[p->shard], p->shard, a, b, p->dst + (a - begin)));
    TL_RETURN_IF_ERROR(ReadAt(files_[p->shard], p->shard, b, end, p->dst + (b - begin)));
  }
  return Status::Ok();
}

Status DiskSource::ReadAt(const PosixFile& file, uint32_t shard, uint64_t begin, uint64_t end,
                          std::byte* dst) const {
  uint64_t done = 0;
  while (begin + done < end) {
    const ssize_t n =
        io::Pread(file.fd(), dst + done, end - begin - done, static_cast<off_t>(begin + done));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return PosixError(paths_[shard] + ": read", errno);
    if (n == 0) {
      return IOError(paths_[shard] + ": ends at " + std::to_string(begin + done) +
                     ", before the range's end " + std::to_string(end));
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
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

}  // namespace tensorlift::sources
