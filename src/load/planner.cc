#include "load/planner.h"

#include <algorithm>

#include "common/checked_math.h"
#include "io/pread.h"

namespace tensorlift {
namespace {

constexpr uint64_t kMinDirectSpan = 64 << 10;  // Smaller runs: all through bounce.
constexpr uint64_t kBounceChunk = 64 << 10;
constexpr uint64_t kSlotAlign = 64;

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

// The smallest offset >= cur that is congruent to `residue` modulo 4 KiB.
uint64_t PlaceAt(uint64_t cur, uint64_t residue) {
  const uint64_t base = AlignDown(cur, kDirectAlign) + residue;
  return base >= cur ? base : base + kDirectAlign;
}

void AddChunks(std::vector<PlannedRead>* reads, uint64_t file_off, uint64_t len, uint64_t arena_off,
               uint64_t chunk, bool direct, bool bounce) {
  for (uint64_t done = 0; done < len; done += chunk) {
    const uint64_t n = std::min(chunk, len - done);
    reads->push_back({file_off + done, n, arena_off + done, direct, bounce});
  }
}

}  // namespace

uint64_t ElementAlignment(Dtype dtype) {
  const int bits = DtypeBits(dtype);
  return bits < 8 ? 1 : std::min<uint64_t>(bits / 8, 8);
}

FilePlan PlanFile(const Header& header, std::span<const uint32_t> wanted, IoMode mode,
                  uint64_t block_size, bool misaligned_views, std::span<const TensorSlice> slices) {
  FilePlan plan;
  plan.mode = mode;
  block_size = AlignUp(std::max<uint64_t>(block_size, kDirectAlign), kDirectAlign);
  const auto& all = header.tensors();
  const uint64_t data_offset = header.data_offset();
  const bool direct = mode == IoMode::kDirect;
  uint64_t cur = 0;

  // The run being built: [run_begin, run_end) in data-section offsets.
  bool in_run = false;
  uint64_t run_begin = 0, run_end = 0, run_arena = 0;
  auto close_run = [&] {
    if (!in_run) return;
    in_run = false;
    const uint64_t len = run_end - run_begin;
    const uint64_t f0 = data_offset + run_begin, f1 = f0 + len;
    if (!direct) {
      AddChunks(&plan.reads, f0, len, run_arena, block_size, false, false);
      return;
    }
    const uint64_t a0 = AlignUp(f0, kDirectAlign), a1 = AlignDown(f1, kDirectAlign);
    if (a1 <= a0 || a1 - a0 < kMinDirectSpan) {
      AddChunks(&plan.reads, f0, len, run_arena, kBounceChunk, true, true);
      return;
    }
    if (f0 < a0) plan.reads.push_back({f0, a0 - f0, run_arena, true, true});
    AddChunks(&plan.reads, a0, a1 - a0, run_arena + (a0 - f0), block_size, true, false);
    if (a1 < f1) plan.reads.push_back({a1, f1 - a1, run_arena + (a1 - f0), true, true});
  };

  // A misaligned tensor: read on its own, buffered, into an aligned slot.
  auto read_alone = [&](PlannedTensor& pt, uint64_t begin, uint64_t bytes) {
    cur = AlignUp(cur, kSlotAlign);
    pt.arena_offset = cur;
    AddChunks(&plan.reads, data_offset + begin, bytes, cur, block_size, false, false);
    cur += bytes;
  };

  // A slice of several pieces (a tensor starting at `begin`): into an aligned
  // slot of its size, buffered; its rows (equal pieces, equally far apart,
  // packed) as reads of rows.
  auto read_pieces = [&](PlannedTensor& pt, uint64_t begin, const std::vector<CopyPiece>& pieces) {
    cur = AlignUp(cur, kSlotAlign);
    pt.arena_offset = cur;
    const CopyPiece& first = pieces.front();
    const uint64_t width = first.bytes;
    const uint64_t stride = pieces.size() > 1 ? pieces.at(1).src_offset - first.src_offset : 0;
    bool rows = pieces.size() > 1 && width > 0 && stride > width;
    for (size_t i = 0; rows && i < pieces.size(); ++i) {
      rows = pieces[i].bytes == width && pieces[i].dst_offset == i * width &&
             pieces[i].src_offset == first.src_offset + i * stride;
    }
    if (rows) {
      // Spans of up to 1 MiB: the scratch a reader thread copies the rows out of stays small.
      const uint64_t per_read =
          std::max<uint64_t>(1, std::min<uint64_t>(block_size, 1 << 20) / stride);
      for (uint64_t i = 0; i < pieces.size(); i += per_read) {
        const uint64_t n = std::min<uint64_t>(per_read, pieces.size() - i);
        PlannedRead r{data_offset + begin + pieces[i].src_offset, n * width, cur + i * width};
        r.row_bytes = width;
        r.row_stride = stride;
        plan.reads.push_back(r);
      }
    } else {
      for (const CopyPiece& p : pieces) {
        AddChunks(&plan.reads, data_offset + begin + p.src_offset, p.bytes, cur + p.dst_offset,
                  block_size, false, false);
      }
    }
    cur += pieces.back().dst_offset + pieces.back().bytes;
  };

  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorInfo& t = all[wanted[i]];
    const TensorSlice* slice = slices.empty() || slices[i].whole() ? nullptr : &slices[i];
    PlannedTensor pt;
    pt.index = wanted[i];
    // The bytes to read: the tensor's, or its slice's.
    const uint64_t nbytes = slice ? slice->bytes : t.nbytes();
    plan.tensor_bytes += nbytes;
    if (slice && slice->pieces.size() > 1) {
      read_pieces(pt, t.begin, slice->pieces);
      plan.tensors.push_back(pt);
      continue;
    }
    const uint64_t begin = t.begin + (slice ? slice->pieces[0].src_offset : 0);
    const uint64_t end = begin + nbytes;
    auto realign = [&] {
      read_alone(pt, begin, nbytes);
      ++plan.realigned;
      plan.realigned_bytes += nbytes;
    };
    pt.begin = begin;
    if (mode == IoMode::kMmap) {
      if (nbytes == 0) {
        pt.arena_offset = 0;  // The arena's aligned base; nothing to read.
      } else if ((data_offset + begin) % ElementAlignment(t.dtype) == 0) {
        pt.in_arena = false;
      } else if (misaligned_views) {
        pt.in_arena = false;
        ++plan.misaligned_views;
      } else {
        realign();  // Misaligned in the mapping.
      }
      plan.tensors.push_back(pt);
      continue;
    }
    const uint64_t position = direct ? data_offset + begin : begin;
    const bool aligned = position % ElementAlignment(t.dtype) == 0;
    if (nbytes == 0) {
      // No bytes: the arena's (aligned) base will do; runs go on across it.
      pt.arena_offset = 0;
      plan.tensors.push_back(pt);
      continue;
    }
    if (aligned) {
      if (!in_run || begin != run_end) {
        close_run();
        in_run = true;
        run_begin = begin;
        run_end = begin;
        run_arena = PlaceAt(cur, position % kDirectAlign);
      }
      pt.arena_offset = run_arena + (begin - run_begin);
      run_end = end;
      cur = run_arena + (run_end - run_begin);
    } else {
      close_run();
      realign();
    }
    plan.tensors.push_back(pt);
  }
  close_run();
  plan.arena_bytes = AlignUp(cur, kSlotAlign);
  std::stable_sort(
      plan.reads.begin(), plan.reads.end(),
      [](const PlannedRead& a, const PlannedRead& b) { return a.file_offset < b.file_offset; });
  return plan;
}

}  // namespace tensorlift
