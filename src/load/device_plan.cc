#include "load/device_plan.h"

#include <algorithm>

#include "common/checked_math.h"
#include "io/pread.h"
#include "kernels/convert.h"
#include "load/planner.h"

namespace tensorlift {
namespace {

constexpr uint64_t kMinSlot = 64ull << 10;
// Wanted ranges closer than this are read as one block (the gap with them).
constexpr uint64_t kReadThroughGap = 64ull << 10;

uint64_t AlignDown(uint64_t x, uint64_t a) { return x / a * a; }

// The smallest offset >= cur congruent to `residue` modulo kDeviceAlign.
uint64_t PlaceAt(uint64_t cur, uint64_t residue) {
  const uint64_t base = AlignDown(cur, kDeviceAlign) + residue;
  return base >= cur ? base : base + kDeviceAlign;
}

// A byte range of the data section and where it goes.
struct Segment {
  uint64_t begin = 0, end = 0;  // Data-section offsets.
  uint64_t dst = 0;             // Device offset of `begin`.
  bool convert = false;
  Dtype from = Dtype::kU8, to = Dtype::kU8;
};

}  // namespace

Dtype TargetDtype(Dtype from, std::optional<Dtype> to) {
  if (!to || !convert::ConversionSupported(from, *to)) return from;
  return *to;
}

uint64_t RoundedStagingBytes(uint64_t staging_bytes) {
  return AlignUp(std::max(staging_bytes, kMinSlot), kDirectAlign);
}

uint64_t StagingSlotBytes(uint64_t staging_bytes) {
  return RoundedStagingBytes(staging_bytes) + 2 * kDirectAlign;
}

DeviceFilePlan PlanDeviceFile(const Header& header, std::span<const uint32_t> wanted,
                              std::optional<Dtype> dtype, bool direct, uint64_t slot_bytes,
                              std::span<const TensorSlice> slices) {
  DeviceFilePlan plan;
  slot_bytes = RoundedStagingBytes(slot_bytes);
  const auto& all = header.tensors();
  const uint64_t data_offset = header.data_offset();

  // Placement, and the segments to read in file order.
  std::vector<Segment> segments;
  uint64_t cur = 0;
  bool in_run = false;
  uint64_t run_end = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorInfo& t = all[wanted[i]];
    const TensorSlice* slice = slices.empty() || slices[i].whole() ? nullptr : &slices[i];
    const uint64_t stored = slice ? slice->bytes : t.nbytes();
    plan.tensor_bytes += stored;
    DeviceTensorPlan dt;
    dt.index = wanted[i];
    dt.dtype = TargetDtype(t.dtype, dtype);
    dt.converted = dt.dtype != t.dtype;
    dt.bytes = dt.converted ? (slice ? slice->elements : t.num_elements) * (DtypeBits(dt.dtype) / 8)
                            : stored;
    if (dt.bytes == 0) {
      dt.offset = 0;  // The buffer's aligned base; nothing to read.
      plan.tensors.push_back(dt);
      continue;
    }
    // Its pieces of the file: the tensor's bytes, or its slice's.
    const CopyPiece whole{0, 0, stored};
    const std::span<const CopyPiece> pieces =
        slice ? std::span<const CopyPiece>(slice->pieces) : std::span(&whole, 1);
    const uint64_t begin = t.begin + pieces[0].src_offset;
    if (dt.converted || pieces.size() > 1 || begin % ElementAlignment(t.dtype) != 0) {
      in_run = false;
      cur = AlignUp(cur, kDeviceAlign);
      dt.offset = cur;
      cur += dt.bytes;
      const uint64_t esize = DtypeBits(t.dtype) / 8, dsize = DtypeBits(dt.dtype) / 8;
      for (const CopyPiece& p : pieces) {
        const uint64_t dst =
            dt.offset + (dt.converted ? p.dst_offset / esize * dsize : p.dst_offset);
        segments.push_back({t.begin + p.src_offset, t.begin + p.src_offset + p.bytes, dst,
                            dt.converted, t.dtype, dt.dtype});
      }
      if (dt.converted) {
        ++plan.converted;
      } else if (pieces.size() == 1) {
        ++plan.realigned;
        plan.realigned_bytes += stored;
      }
    } else {
      const uint64_t end = begin + stored;
      if (in_run && begin == run_end) {
        dt.offset = segments.back().dst + (begin - segments.back().begin);
        segments.back().end = end;
      } else {
        dt.offset = PlaceAt(cur, begin % kDeviceAlign);
        segments.push_back({begin, end, dt.offset, false, t.dtype, t.dtype});
        in_run = true;
      }
      run_end = end;
      cur = dt.offset + dt.bytes;
    }
    plan.tensors.push_back(dt);
  }
  plan.device_bytes = std::max(AlignUp(cur, kDeviceAlign), kDeviceAlign);

  // Blocks.
  bool open = false;
  uint64_t b0 = 0, b_end = 0, scratch = 0, limit = 0;
  auto close_block = [&] {
    if (!open) return;
    open = false;
    DeviceBlock& b = plan.blocks.back();
    const uint64_t f0 = data_offset + b0, f1 = data_offset + b_end;
    b.read_offset = direct ? AlignDown(f0, kDirectAlign) : f0;
    b.read_length = (direct ? AlignUp(f1, kDirectAlign) : f1) - b.read_offset;
    b.min_read = f1 - b.read_offset;
    for (BlockCopy& c : b.copies) c.slot_offset += f0 - b.read_offset;
    plan.scratch_bytes = std::max(plan.scratch_bytes, scratch);
  };
  for (const Segment& s : segments) {
    uint64_t x = s.begin;
    const uint64_t esize = s.convert ? DtypeBits(s.from) / 8 : 1;
    const uint64_t dsize = s.convert ? DtypeBits(s.to) / 8 : 1;
    while (x < s.end) {
      if (open && (x - b_end > kReadThroughGap || x >= limit)) close_block();
      if (!open) {
        open = true;
        b0 = x;
        scratch = 0;
        plan.blocks.emplace_back();
        // A direct block ends on a page of the file, so that the next one's
        // read starts where this one's ended: no page read twice, and every
        // read is whole requests of the disk (16 MiB + 4 KiB was 5 requests
        // of a disk that takes 4 MiB at most, the fifth a single page).
        limit = b0 + slot_bytes;
        if (direct) {
          const uint64_t end = AlignDown(data_offset + limit, kDirectAlign);
          if (end > data_offset + b0) limit = end - data_offset;
        }
      }
      uint64_t take = std::min(s.end - x, limit - x);
      if (take < s.end - x) take = AlignDown(take, esize);
      if (take == 0) {
        close_block();
        continue;
      }
      BlockCopy c;
      c.slot_offset = x - b0;  // Shifted to the read's start when closed.
      c.bytes = take;
      c.dst_offset = s.dst + (x - s.begin) / esize * dsize;
      if (s.convert) {
        c.convert = true;
        c.from = s.from;
        c.to = s.to;
        c.count = take / esize;
        c.scratch_offset = AlignUp(scratch, 8);
        scratch = c.scratch_offset + take;
      }
      plan.blocks.back().copies.push_back(c);
      x += take;
      b_end = x;
    }
  }
  close_block();
  return plan;
}

}  // namespace tensorlift
