// A striped load's plan (private to sources/): the wanted tensors in file
// order and where their bytes land in one buffer, cut into units (checksum
// chunks) and ranges (whole units contiguous in a file and in the buffer),
// which the sources fill and CheckRange checks where they land.
#ifndef TENSORLIFT_SOURCES_STRIPED_PLAN_H_
#define TENSORLIFT_SOURCES_STRIPED_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/host_buffer.h"
#include "remote/peer_reader.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/status.h"

namespace tensorlift::sources {

// A wanted tensor, where its bytes land.
struct Planned {
  Checkpoint::Location loc;
  uint64_t file_offset = 0;  // Absolute, in its shard's file.
  uint64_t nbytes = 0;
  std::byte* data = nullptr;
  const remote::ManifestTensor* checked_by = nullptr;  // The reference manifest's entry.
};

// A checksum chunk of one tensor (or a piece of range_bytes when nothing is
// checked): the unit ranges are made of.
struct Unit {
  uint32_t tensor = 0;  // Into the plan's tensors.
  uint64_t offset = 0;  // In the tensor.
  uint64_t bytes = 0;
  int64_t chunk = -1;  // In the reference manifest; -1: unchecked.
};

// Bytes contiguous in one shard's file and in the destination: whole units.
struct Range {
  uint32_t shard = 0;
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
  std::byte* dst = nullptr;
  size_t first_unit = 0, end_unit = 0;
};

struct Plan {
  std::vector<Planned> tensors;  // In file order (shard, then offset).
  std::vector<Unit> units;
  std::vector<Range> ranges;
  std::shared_ptr<HostBuffer> buffer;
  uint64_t bytes = 0;
};

inline uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// For each of `ref`'s shards, the shard of `other` with the same file name and
// the same header; an error naming the first difference.
Result<std::vector<uint32_t>> MatchShards(const Checkpoint& ref, const Checkpoint& other);

// The wanted tensors in file order, where they land (runs of tensors
// adjacent in a file stay adjacent, each run 64-byte aligned), in one buffer.
Result<Plan> PlanTensors(const Checkpoint& ckpt, const TensorFilter& filter);

// Units (chunks of `chunk_bytes`, checked against `reference` when not null)
// and ranges of up to `range_bytes`.
void CutRanges(Plan& plan, uint64_t chunk_bytes, uint64_t range_bytes, bool checked);

// Checks the range's chunks against the reference manifest.
Status CheckRange(const Range& r, const Plan& plan, const std::string& source);

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_STRIPED_PLAN_H_
