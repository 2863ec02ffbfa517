// What a striped store fetches (private to sources/): the checkpoint's
// tensors per shard in file order (its layout), and the pieces a read of the
// loader's is cut into: whole checksum chunks, contiguous in a file and in the
// destination, that the sources fill and CheckPiece checks where they land. A
// read that covers only part of a chunk gets a piece of its own that fetches
// the whole chunk into a buffer of its own, checks it there and copies out the
// part asked for.
#ifndef TENSORLIFT_SOURCES_STRIPED_PLAN_H_
#define TENSORLIFT_SOURCES_STRIPED_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "remote/manifest.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/status.h"

namespace tensorlift::sources {

// A tensor of the checkpoint, where its bytes are in its file.
struct LaidOut {
  const TensorInfo* info = nullptr;
  uint32_t shard = 0;
  uint64_t file_offset = 0;  // Absolute, in its shard's file.
  uint64_t nbytes = 0;
  const remote::ManifestTensor* checked_by = nullptr;  // The reference manifest's entry.
};

struct Layout {
  std::vector<std::vector<LaidOut>> shards;  // Per shard, in file order.
  std::map<std::string, uint32_t> shard_of;  // A shard's path: its index.
  uint64_t chunk_bytes = 0;                  // The reference's; 0: nothing is checked.
  uint64_t total_bytes = 0;                  // Of every tensor.
};

// Bytes of one tensor inside a piece.
struct Unit {
  const LaidOut* tensor = nullptr;
  uint64_t offset = 0;  // In the tensor.
  uint64_t bytes = 0;
  int64_t chunk = -1;  // In the reference manifest; -1: unchecked.
};

// Ranges of a read that are contiguous in one file and in memory, cut as
// one: a chunk is cut only where such a run of ranges begins or ends.
struct Run {
  uint32_t shard = 0;
  uint64_t offset = 0, length = 0;
  std::byte* dest = nullptr;
  std::vector<size_t> ranges;  // The read's ranges in it, in file order.
};

// Part of a whole chunk fetched for it, copied out once the chunk checks out.
struct Delivery {
  size_t run = 0;     // The run it fills.
  uint64_t from = 0;  // In the chunk.
  uint64_t bytes = 0;
  std::byte* to = nullptr;
};

// Bytes contiguous in one shard's file and in `dst`: whole units.
struct Piece {
  uint32_t shard = 0;
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
  std::byte* dst = nullptr;
  std::vector<Unit> units;
  size_t run = 0;  // The run it fills (deliveries empty).
  // A chunk fetched whole for parts of it (every part the read asks for):
  // `dst` is `whole`, and each delivery is copied out once it checks out.
  std::shared_ptr<std::byte[]> whole;
  std::vector<Delivery> deliveries;
  // The bytes of the read it fills.
  uint64_t Delivers() const {
    if (deliveries.empty()) return bytes;
    uint64_t n = 0;
    for (const Delivery& d : deliveries) n += d.bytes;
    return n;
  }
};

inline uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// For each of `ref`'s shards, the shard of `other` with the same file name and
// the same header; an error naming the first difference.
Result<std::vector<uint32_t>> MatchShards(const Checkpoint& ref, const Checkpoint& other);

// Every tensor of `ckpt`, per shard in file order.
Layout LayOut(const Checkpoint& ckpt);

struct Cut {
  std::vector<Run> runs;
  std::vector<Piece> pieces;
  std::vector<uint64_t> zeroed;  // Per range: its bytes set to zero (outside every tensor).
};

// Cuts `ranges` (the loader's reads), joined into runs, into pieces of at most
// `piece_bytes` (whole chunks when the layout is checked). Bytes outside every
// tensor (a header's, when a read is aligned down) are set to zero here, not
// fetched: loads use tensor bytes alone.
Result<Cut> CutPieces(const Layout& layout, std::span<const CheckpointStore::Range> ranges,
                      uint64_t piece_bytes);

// Calls landed(range, n) for the bytes of the read's ranges that file bytes
// [file_offset, +bytes) of `run` fill.
void Attribute(const Run& run, std::span<const CheckpointStore::Range> ranges, uint64_t file_offset,
               uint64_t bytes, const std::function<void(size_t range, uint64_t bytes)>& landed);

// Checks the piece's chunks against the reference manifest.
Status CheckPiece(const Piece& p, const std::string& source);

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_STRIPED_PLAN_H_
