// A striped load's plan (see striped_plan.h).
#include "sources/striped_plan.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <utility>

#include "tensorlift/checksum.h"

namespace tensorlift::sources {
namespace {

std::string Basename(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

Result<std::vector<uint32_t>> MatchShards(const Checkpoint& ref, const Checkpoint& other) {
  std::map<std::string, uint32_t> by_name;
  for (uint32_t s = 0; s < other.shards().size(); ++s)
    by_name[Basename(other.shards()[s].path)] = s;
  std::vector<uint32_t> out;
  for (const Checkpoint::Shard& shard : ref.shards()) {
    const std::string name = Basename(shard.path);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return InvalidArgumentError(other.path() + ": has no " + name + " (" + ref.path() + " has)");
    }
    const Header& a = shard.header;
    const Header& b = other.shards()[it->second].header;
    bool same = a.data_offset() == b.data_offset() && a.tensors().size() == b.tensors().size();
    for (size_t i = 0; same && i < a.tensors().size(); ++i) {
      const TensorInfo &x = a.tensors()[i], &y = b.tensors()[i];
      same = x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.begin == y.begin &&
             x.end == y.end;
    }
    if (!same) {
      return InvalidArgumentError(other.path() + ": the header of " + name + " differs from " +
                                  shard.path + "'s");
    }
    out.push_back(it->second);
  }
  return out;
}

Layout LayOut(const Checkpoint& ckpt) {
  Layout layout;
  layout.shards.resize(ckpt.shards().size());
  for (uint32_t s = 0; s < ckpt.shards().size(); ++s) {
    const Checkpoint::Shard& shard = ckpt.shards()[s];
    layout.shard_of[shard.path] = s;
    for (const TensorInfo& info : shard.header.tensors()) {
      layout.shards[s].push_back(
          {&info, s, shard.header.data_offset() + info.begin, info.nbytes(), nullptr});
      layout.total_bytes += info.nbytes();
    }
    std::sort(layout.shards[s].begin(), layout.shards[s].end(),
              [](const LaidOut& a, const LaidOut& b) { return a.file_offset < b.file_offset; });
  }
  return layout;
}

namespace {

// Builds the pieces of one read: whole chunks joined up to piece_bytes, a
// chunk the read covers only part of in a piece of its own (shared by every
// range of the read that needs part of it).
class Cutter {
 public:
  Cutter(const Layout& layout, uint64_t piece_bytes) : layout_(layout), piece_bytes_(piece_bytes) {}

  // [offset, offset + length) of `t`'s bytes (offset in the tensor) into dst.
  void Add(size_t run, const LaidOut& t, uint64_t offset, uint64_t length, std::byte* dst) {
    const uint64_t cb = t.checked_by ? layout_.chunk_bytes : 0;
    while (length > 0) {
      if (cb == 0) {
        // Cut where the file's offset is a multiple of piece_bytes: a piece's
        // ends are then aligned for O_DIRECT (all but a run's own ends).
        const uint64_t file = t.file_offset + offset;
        const uint64_t n = std::min(length, piece_bytes_ - file % piece_bytes_);
        Append(run, {&t, offset, n, -1}, dst);
        offset += n, dst += n, length -= n;
        continue;
      }
      const uint64_t chunk = offset / cb, begin = chunk * cb;
      const uint64_t end = std::min(begin + cb, t.nbytes);
      const uint64_t n = std::min(length, end - offset);
      if (offset == begin && n == end - begin) {
        Append(run, {&t, offset, n, static_cast<int64_t>(chunk)}, dst);
      } else {
        Part(run, t, chunk, begin, end, offset, n, dst);
      }
      offset += n, dst += n, length -= n;
    }
  }

  std::vector<Piece> Finish() && { return std::move(pieces_); }

 private:
  void Append(size_t run, const Unit& u, std::byte* dst) {
    const uint64_t file = u.tensor->file_offset + u.offset;
    Piece* last = open_ == SIZE_MAX ? nullptr : &pieces_[open_];
    if (last && last->run == run && last->shard == u.tensor->shard &&
        last->file_offset + last->bytes == file && last->dst + last->bytes == dst &&
        last->bytes + u.bytes <= std::max(piece_bytes_, u.bytes) &&
        (u.chunk >= 0 || file % piece_bytes_ != 0)) {
      last->bytes += u.bytes;
      last->units.push_back(u);
      return;
    }
    Piece p;
    p.shard = u.tensor->shard;
    p.file_offset = file;
    p.bytes = u.bytes;
    p.dst = dst;
    p.units.push_back(u);
    p.run = run;
    open_ = pieces_.size();
    pieces_.push_back(std::move(p));
  }

  void Part(size_t run, const LaidOut& t, uint64_t chunk, uint64_t begin, uint64_t end,
            uint64_t offset, uint64_t n, std::byte* dst) {
    open_ = SIZE_MAX;  // Whole units after it start a piece of their own.
    const auto key = std::make_pair(&t, chunk);
    auto it = parts_.find(key);
    if (it == parts_.end()) {
      Piece p;
      p.shard = t.shard;
      p.file_offset = t.file_offset + begin;
      p.bytes = end - begin;
      p.whole = std::shared_ptr<std::byte[]>(new std::byte[p.bytes]);
      p.dst = p.whole.get();
      p.units.push_back({&t, begin, p.bytes, static_cast<int64_t>(chunk)});
      it = parts_.emplace(key, pieces_.size()).first;
      pieces_.push_back(std::move(p));
    }
    pieces_[it->second].deliveries.push_back({run, offset - begin, n, dst});
  }

  const Layout& layout_;
  const uint64_t piece_bytes_;
  std::vector<Piece> pieces_;
  size_t open_ = SIZE_MAX;  // The piece whole units may join.
  std::map<std::pair<const LaidOut*, uint64_t>, size_t> parts_;
};

}  // namespace

Result<Cut> CutPieces(const Layout& layout, std::span<const CheckpointStore::Range> ranges,
                      uint64_t piece_bytes) {
  Cut cut;
  cut.zeroed.assign(ranges.size(), 0);
  // The ranges in file order, each joining the run before it where it continues it.
  std::vector<std::pair<uint32_t, size_t>> order;  // (shard, range)
  for (size_t i = 0; i < ranges.size(); ++i) {
    const CheckpointStore::Range& r = ranges[i];
    auto shard = r.path ? layout.shard_of.find(*r.path) : layout.shard_of.end();
    if (shard == layout.shard_of.end()) {
      return InvalidArgumentError("striped load: a read of " + (r.path ? *r.path : "no file") +
                                  ", which is not one of the checkpoint's files");
    }
    order.emplace_back(shard->second, i);
  }
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first
                              : ranges[a.second].offset < ranges[b.second].offset;
  });
  for (const auto& [shard, i] : order) {
    const CheckpointStore::Range& r = ranges[i];
    Run* last = cut.runs.empty() ? nullptr : &cut.runs.back();
    if (last && last->shard == shard && last->offset + last->length == r.offset &&
        last->dest + last->length == r.dest) {
      last->length += r.length;
      last->ranges.push_back(i);
    } else {
      cut.runs.push_back({shard, r.offset, r.length, r.dest, {i}});
    }
  }
  Cutter cutter(layout, piece_bytes);
  for (size_t k = 0; k < cut.runs.size(); ++k) {
    const Run& run = cut.runs[k];
    const std::vector<LaidOut>& tensors = layout.shards[run.shard];
    uint64_t at = run.offset;
    const uint64_t end = run.offset + run.length;
    // The first tensor that ends after `at`.
    auto t = std::upper_bound(tensors.begin(), tensors.end(), at, [](uint64_t v, const LaidOut& x) {
      return v < x.file_offset + x.nbytes;
    });
    while (at < end) {
      const uint64_t next = t == tensors.end() ? end : std::min(end, t->file_offset);
      if (at < next) {  // Outside every tensor.
        std::memset(run.dest + (at - run.offset), 0, next - at);
        Attribute(run, ranges, at, next - at,
                  [&](size_t range, uint64_t n) { cut.zeroed[range] += n; });
        at = next;
        continue;
      }
      const uint64_t stop = std::min(end, t->file_offset + t->nbytes);
      if (stop > at) {
        cutter.Add(k, *t, at - t->file_offset, stop - at, run.dest + (at - run.offset));
        at = stop;
      }
      ++t;
    }
  }
  cut.pieces = std::move(cutter).Finish();
  return cut;
}

void Attribute(const Run& run, std::span<const CheckpointStore::Range> ranges, uint64_t file_offset,
               uint64_t bytes, const std::function<void(size_t range, uint64_t bytes)>& landed) {
  const uint64_t end = file_offset + bytes;
  // The first range of the run that ends after file_offset.
  auto it = std::partition_point(run.ranges.begin(), run.ranges.end(), [&](size_t i) {
    return ranges[i].offset + ranges[i].length <= file_offset;
  });
  for (; it != run.ranges.end() && ranges[*it].offset < end; ++it) {
    const CheckpointStore::Range& r = ranges[*it];
    const uint64_t from = std::max(file_offset, r.offset);
    const uint64_t to = std::min(end, r.offset + r.length);
    if (to > from) landed(*it, to - from);
  }
}

Status CheckPiece(const Piece& p, const std::string& source) {
  const std::byte* at = p.dst;
  for (const Unit& unit : p.units) {
    if (unit.chunk >= 0) {
      const remote::ManifestTensor& m = *unit.tensor->checked_by;
      const uint64_t sum = Xxh3_64(at, unit.bytes);
      if (sum != m.chunk_xxh3[unit.chunk]) {
        return CorruptionError(source + ": tensor '" + m.name + "' bytes " +
                               std::to_string(unit.offset) + ".." +
                               std::to_string(unit.offset + unit.bytes) + ": XXH3 " + HexU64(sum) +
                               ", the peer manifest says " + HexU64(m.chunk_xxh3[unit.chunk]));
      }
    }
    at += unit.bytes;
  }
  return Status::Ok();
}

}  // namespace tensorlift::sources
