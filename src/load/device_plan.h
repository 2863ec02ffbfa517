// The plan of a load through staging buffers (GPU loads, and conversions):
// where each tensor goes in its file's device buffer, which blocks of the file
// are read into a staging slot, and which copies and conversions each block
// feeds. Pure: no I/O, no allocation beyond the plan itself.
//
// Placement. Tensors keep their file order. Consecutive tensors that keep
// their dtype form runs, placed contiguously at an offset congruent, modulo
// 256, to the run's position in the data section: a tensor is then aligned on
// the device exactly when its data offset is aligned, whatever the header
// size (the odd-header case costs nothing: the copy out of the staging slot
// lands the bytes where they belong). A tensor whose data offset is
// misaligned for its dtype, and every converted tensor, gets a 256-byte
// aligned slot of its own ("realigned": the copy moves it; no extra pass).
//
// Slices (LoadOptions::parallel): a slice that is one piece of its tensor's
// bytes is placed as a tensor of those bytes; one of several pieces gets a
// slot of its own, each piece a segment of the file copied to its place.
//
// Blocks. The wanted byte ranges, in file order, are cut into blocks of at
// most slot_bytes; a block never cuts an element of a converted tensor (the
// conversion of a block's part of a tensor is done from that block alone).
// Direct blocks read the 4 KiB-aligned span that covers them (so a slot is
// slot_bytes + 8 KiB), and may read past the end of the file, which gives a
// short read; min_read says how much must come back.
#ifndef TENSORLIFT_LOAD_DEVICE_PLAN_H_
#define TENSORLIFT_LOAD_DEVICE_PLAN_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "format/tp_layout.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {

inline constexpr uint64_t kDeviceAlign = 256;

struct DeviceTensorPlan {
  uint32_t index = 0;        // Into header.tensors().
  Dtype dtype = Dtype::kU8;  // On the device (converted or not).
  uint64_t offset = 0;       // In the file's device buffer.
  uint64_t bytes = 0;        // On the device.
  bool converted = false;
};

// `bytes` at `slot_offset` of the block's slot go to `dst_offset` of the
// file's device buffer (a copy), or, for a conversion, are copied to
// `scratch_offset` of the device slot (8-byte aligned, so the kernel reads
// aligned elements) and converted (`count` elements) from there.
struct BlockCopy {
  uint64_t slot_offset = 0;
  uint64_t bytes = 0;
  uint64_t dst_offset = 0;
  bool convert = false;
  uint64_t scratch_offset = 0;
  Dtype from = Dtype::kU8;
  Dtype to = Dtype::kU8;
  uint64_t count = 0;
};

struct DeviceBlock {
  uint64_t read_offset = 0;  // File offset read into the slot's first byte.
  uint64_t read_length = 0;  // Bytes asked for (aligned for direct reads).
  uint64_t min_read = 0;     // Bytes that must come back (the rest is past EOF).
  std::vector<BlockCopy> copies;
};

struct DeviceFilePlan {
  uint64_t device_bytes = 0;
  uint64_t tensor_bytes = 0;  // In the file.
  uint32_t realigned = 0;
  uint64_t realigned_bytes = 0;
  uint32_t converted = 0;
  uint64_t scratch_bytes = 0;             // Device slot bytes the largest converting block needs.
  std::vector<DeviceTensorPlan> tensors;  // In file order.
  std::vector<DeviceBlock> blocks;        // In file order.
};

// The dtype `from` becomes when loading with LoadOptions::dtype = `to`: `to`
// for the floating-point types tensorlift converts, `from` otherwise.
Dtype TargetDtype(Dtype from, std::optional<Dtype> to);

// `wanted` are indices into header.tensors(), increasing. slot_bytes is
// rounded up to a multiple of 4 KiB (at least 64 KiB). `slices`: empty, or
// wanted[i]'s slice at [i] (OpenedFile::slices).
DeviceFilePlan PlanDeviceFile(const Header& header, std::span<const uint32_t> wanted,
                              std::optional<Dtype> dtype, bool direct, uint64_t slot_bytes,
                              std::span<const TensorSlice> slices = {});

// The slot size for a given LoadOptions::staging_bytes: rounded up, plus the
// 8 KiB a direct block may read around its bytes.
uint64_t StagingSlotBytes(uint64_t staging_bytes);
uint64_t RoundedStagingBytes(uint64_t staging_bytes);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_DEVICE_PLAN_H_
