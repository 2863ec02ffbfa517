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

Status DiskSource::Fetch(const std::vector<const Range*>& ranges, const Plan&) {
  for (const Range* r : ranges) {
    const uint64_t begin = r->file_offset, end = r->file_offset + r->bytes;
    const uint64_t a = RoundUp(begin, kBlock), b = end / kBlock * kBlock;
    if (direct_[r->shard].fd() < 0 || b <= a) {
      TL_RETURN_IF_ERROR(ReadAt(files_[r->shard], r->shard, begin, end, r->dst));
      continue;
    }
    TL_RETURN_IF_ERROR(ReadAt(files_[r->shard], r->shard, begin, a, r->dst));
    TL_RETURN_IF_ERROR(ReadAt(direct_[r->shard], r->shard, a, b, r->dst + (a - begin)));
    TL_RETURN_IF_ERROR(ReadAt(files_[r->shard], r->shard, b, end, r->dst + (b - begin)));
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

Status ObjectSource::Fetch(const std::vector<const Range*>& ranges, const Plan&) {
  std::vector<objstore::RangeRequest> requests;
  for (const Range* r : ranges) {
    const objstore::ObjectUrl& u = objects_[r->shard];
    requests.push_back({u.bucket, u.key, r->file_offset, r->bytes, r->dst});
  }
  return client_->GetRanges(requests);
}

Result<std::unique_ptr<PeerSource>> PeerSource::Open(std::unique_ptr<remote::PeerReader> reader,
                                                     const Checkpoint& ckpt, const Plan& plan,
                                                     int take) {
  std::unique_ptr<PeerSource> p(new PeerSource(reader->url()));
  p->take = take;
  const remote::Manifest& mf = reader->manifest();
  for (const Planned& t : plan.tensors) {
    const TensorInfo& info = ckpt.info(t.loc);
    const remote::ManifestTensor* m = mf.Find(info.name);
    const bool same =
        m && m->dtype == info.dtype && m->shard_dim == -1 && m->nbytes == info.nbytes() &&
        std::equal(m->shape.begin(), m->shape.end(), info.shape.begin(), info.shape.end(),
                   [](int64_t a, uint64_t b) { return a >= 0 && static_cast<uint64_t>(a) == b; });
    if (!same) {
      return InvalidArgumentError(reader->url() + ": tensor '" + info.name + "' is " +
                                  (m ? "served with another dtype or shape" : "not served") +
                                  " (the headers': " + std::string(DtypeName(info.dtype)) + ")");
    }
    p->served_.push_back(m);
  }
  TL_RETURN_IF_ERROR(reader->MapLocal(plan.buffer->data(), plan.buffer->size()));
  p->reader_ = std::move(reader);
  return p;
}

Status PeerSource::Fetch(const std::vector<const Range*>& ranges, const Plan& plan) {
  std::vector<remote::PeerReader::Piece> pieces;
  for (const Range* r : ranges) {
    std::byte* dst = r->dst;
    for (size_t u = r->first_unit; u < r->end_unit; ++u) {
      const Unit& unit = plan.units[u];
      // Adjacent units of one tensor are read as one piece.
      if (!pieces.empty() && pieces.back().tensor == served_[unit.tensor] &&
          pieces.back().offset + pieces.back().bytes == unit.offset &&
          static_cast<std::byte*>(pieces.back().dst) + pieces.back().bytes == dst) {
        pieces.back().bytes += unit.bytes;
      } else {
        pieces.push_back({served_[unit.tensor], unit.offset, unit.bytes, dst});
      }
      dst += unit.bytes;
    }
  }
  return reader_->Read(pieces);
}

}  // namespace tensorlift::sources
