// Planning a peer load's gets (see peer_plan.h).
#include "remote/peer_plan.h"

#include <algorithm>
#include <utility>

#include "common/checked_math.h"

namespace tensorlift::remote {
namespace {

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

}  // namespace

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

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

Status CopyStaged(const std::vector<RankPlan::Staged>& staged, Landing& landing) {
  for (const RankPlan::Staged& s : staged) {
    for (const CopyPiece& p : s.pieces) {
      TL_RETURN_IF_ERROR(landing.Put(s.dst_base + p.dst_offset,
                                     s.bytes.get() + (p.src_offset - s.chunk_begin), p.bytes));
    }
  }
  return landing.device ? landing.stream->Synchronize() : Status::Ok();
}

}  // namespace tensorlift::remote
