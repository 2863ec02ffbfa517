// The read planner: from a file's header and the tensors wanted, where each
// tensor goes in the file's buffer (the "arena") and which reads fill it.
// Pure: no I/O, no allocation beyond the plan itself.
//
// Placement. Contiguous wanted tensors form runs that are read as one range.
// A run is placed in the arena at an offset congruent, modulo 4 KiB, to its
// position in the data section (buffered) or in the file (direct: O_DIRECT
// needs buffer and file offsets aligned alike). A tensor then sits at an
// address congruent to its data offset (buffered) or file offset (direct), so
// it is aligned to its element size exactly when that offset is. A tensor that
// would be misaligned is left out of runs and read on its own, with buffered
// I/O, into a 64-byte aligned slot ("realigned": no extra copy, only a read of
// its own). The arena is at most the wanted bytes plus 4 KiB per run plus 64
// bytes per realigned tensor.
//
// Slices (LoadOptions::parallel). A slice that is one piece of its tensor's
// bytes (a split along dim 0) is placed and read as a tensor of those bytes;
// one of several pieces (a later dim: a piece per outer row) gets a 64-byte
// aligned slot, its rows read buffered into it as reads of rows (each the
// span of up to 1 MiB covering its rows, copied out: one read, not one a
// row).
//
// Reads. Buffered runs become reads of at most block_size bytes. Direct runs
// become 4 KiB-aligned reads of at most block_size bytes, plus "bounce" reads
// for the unaligned head and tail (and for whole runs under 64 KiB).
#ifndef TENSORLIFT_LOAD_PLANNER_H_
#define TENSORLIFT_LOAD_PLANNER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "format/tp_layout.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {

struct PlannedTensor {
  uint32_t index = 0;         // Into header.tensors().
  uint64_t arena_offset = 0;  // Where its first byte lands (unused for mmap views).
  bool in_arena = true;       // False: an mmap view at data_offset + begin.
  uint64_t begin = 0;         // Data-section offset of its first byte (a slice's, when sliced).
};

struct PlannedRead {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t arena_offset = 0;
  bool direct = false;  // On the O_DIRECT descriptor (else the buffered one).
  bool bounce = false;  // Direct, but unaligned: through a bounce buffer.
  // A slice's rows (ReadOp::row_bytes, row_stride): length / row_bytes rows,
  // row_stride apart in the file, one after another in the arena.
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
};

struct FilePlan {
  IoMode mode = IoMode::kBuffered;  // Never kAuto: the loader resolves it per file first.
  uint64_t arena_bytes = 0;
  uint64_t tensor_bytes = 0;
  uint32_t realigned = 0;
  uint64_t realigned_bytes = 0;
  uint32_t misaligned_views = 0;       // Mmap, misaligned_views: viewed where they are.
  std::vector<PlannedTensor> tensors;  // In file order.
  std::vector<PlannedRead> reads;      // In file order.
};

// Element alignment: the element size for types of 8 bits or more, capped at
// 8 bytes; 1 for sub-byte types.
uint64_t ElementAlignment(Dtype dtype);

// `wanted` are indices into header.tensors(), increasing (file order).
// block_size is rounded up to a multiple of 4 KiB. With misaligned_views,
// mmap mode views misaligned tensors in the mapping instead of reading them.
// `slices`: empty, or wanted[i]'s slice at [i] (OpenedFile::slices).
FilePlan PlanFile(const Header& header, std::span<const uint32_t> wanted, IoMode mode,
                  uint64_t block_size, bool misaligned_views = false,
                  std::span<const TensorSlice> slices = {});

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_PLANNER_H_
