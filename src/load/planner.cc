#include "load/planner.h"

#include <algorithm>

#include "common/checked_math.h"
#include "io/read_op.h"

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
                  uint64_t block_size, bool misaligned_views) {
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
  auto read_alone = [&](const TensorInfo& t, PlannedTensor& pt) {
    cur = AlignUp(cur, kSlotAlign);
    pt.arena_offset = cur;
    AddChunks(&plan.reads, data_offset + t.begin, t.nbytes(), cur, block_size, false, false);
    cur += t.nbytes();
    ++plan.realigned;
    plan.realigned_bytes += t.nbytes();
  };

  for (uint32_t idx : wanted) {
    const TensorInfo& t = all[idx];
    plan.tensor_bytes += t.nbytes();
    PlannedTensor pt;
    pt.index = idx;
    if (mode == IoMode::kMmap) {
      if (t.nbytes() == 0) {
        pt.arena_offset = 0;  // The arena's aligned base; nothing to read.
      } else if ((data_offset + t.begin) % ElementAlignment(t.dtype) == 0) {
        pt.in_arena = false;
      } else if (misaligned_views) {
        pt.in_arena = false;
        ++plan.misaligned_views;
      } else {
        read_alone(t, pt);  // Misaligned in the mapping.
      }
      plan.tensors.push_back(pt);
      continue;
    }
    const uint64_t position = direct ? data_offset + t.begin : t.begin;
    const bool aligned = position % ElementAlignment(t.dtype) == 0;
    if (t.nbytes() == 0) {
      // No bytes: the arena's (aligned) base will do; runs go on across it.
      pt.arena_offset = 0;
      plan.tensors.push_back(pt);
      continue;
    }
    if (aligned) {
      if (!in_run || t.begin != run_end) {
        close_run();
        in_run = true;
        run_begin = t.begin;
        run_end = t.begin;
        run_arena = PlaceAt(cur, position % kDirectAlign);
      }
      pt.arena_offset = run_arena + (t.begin - run_begin);
      run_end = t.end;
      cur = run_arena + (run_end - run_begin);
    } else {
      close_run();
      read_alone(t, pt);
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
