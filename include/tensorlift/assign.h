// Balanced assignment of a checkpoint's read work to ranks, by bytes, and
// the shard-range rule (ShardRange, at the end).
//
// Each rank reads its pieces once; the tensors are then shuffled to the ranks
// that need them. A piece is a contiguous run of whole tensors of one file.
//
// The rule (deterministic: every rank computes the same assignment from the
// same headers, with no communication):
//   1. Whole files, greedy longest-processing-time: files in decreasing size
//      (ties: lower file index first), each to the rank with the least load
//      (ties: fewer pieces, then lower rank).
//   2. Split: the files are laid end to end in decreasing size and cut at
//      multiples of the capacity C = ceil(total / world); a tensor goes to the
//      rank whose slot holds its first byte (a zero-size tensor: its offset).
//      No tensor is split; there are at most world - 1 cuts, so at most
//      world - 1 files are split. The max load is at most C + the largest
//      tensor.
//   The whole-file assignment (1) is kept when its max load is within both
//   that bound and `whole_file_slack` x C of the split's max load; otherwise
//   the split (2) is used. Either way:
//     max rank load <= ceil(total / world) + largest tensor.
//   With total == 0 (no bytes at all) pieces are spread by count (rule 1).
//
// Every tensor of every file is in exactly one piece; files without tensors
// get no piece. A rank may get no piece (world > number of tensors).
// Each rank's pieces are sorted by (file, first tensor).
//
// Pure functions of their inputs; thread-safe.
#ifndef TENSORLIFT_ASSIGN_H_
#define TENSORLIFT_ASSIGN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/status.h"

namespace tensorlift {

// The largest world AssignByBytes accepts.
inline constexpr int kMaxAssignWorld = 1 << 20;

// Tensors [first, last] (inclusive, indices into the file's tensors) of one
// file: file bytes [begin of first, end of last) of its data section.
struct ReadPiece {
  uint32_t file = 0;
  uint32_t first = 0;
  uint32_t last = 0;
  uint64_t bytes = 0;  // Counted bytes of the piece (see the Checkpoint overload).
  bool operator==(const ReadPiece&) const = default;
};

struct RankAssignment {
  std::vector<ReadPiece> pieces;
  uint64_t bytes = 0;  // Sum of the pieces' bytes.
};

struct Assignment {
  std::vector<RankAssignment> ranks;  // One per rank, world entries.
  bool split = false;                 // True when rule 2 was used.
  uint64_t total_bytes = 0;
  uint64_t max_tensor_bytes = 0;
  // ceil(total_bytes / world).
  uint64_t ideal_bytes = 0;
  // The largest rank load.
  uint64_t max_rank_bytes() const;
};

struct AssignOptions {
  // Whole files are kept when their max load is at most the split's max load
  // plus whole_file_slack x ideal (and within the bound). 0: only when as good.
  double whole_file_slack = 0.02;
  // Always rule 1: every file is read whole by one rank (the fastsafetensors
  // API, whose ranks each open only the files given to them).
  bool whole_files = false;
};

// The byte sizes of each file's tensors, in file order: tensor_bytes[f][i]
// is the size of tensor i of file f. Fails (InvalidArgument) when world is
// not in [1, kMaxAssignWorld], a file has 2^32 or more tensors, there are
// 2^32 or more files, or the total overflows 64 bits.
Result<Assignment> AssignByBytes(std::span<const std::vector<uint64_t>> tensor_bytes, int world,
                                 const AssignOptions& options = {});

// The same for a checkpoint's shards (file index = index into shards(),
// tensor index = index into header.tensors()). For an index checkpoint,
// tensors that the index does not name weigh 0 bytes: they are in pieces
// (pieces stay contiguous) but the loader skips them.
Result<Assignment> AssignByBytes(const Checkpoint& checkpoint, int world,
                                 const AssignOptions& options = {});

// The one shard-range rule of tensorlift (multi-rank loading's GetSharded,
// slices served to a peer's tensor-parallel ranks, the fastsafetensors API's
// get_sharded): a dimension of `extent` indices is cut into blocks of
// ceil(extent / world) and rank r gets [r * block, min((r + 1) * block,
// extent)), so the last ranks' blocks may be short or empty. It is the rule
// of vLLM and Megatron-LM: their tensor-parallel layers give rank r the block
// that starts at r * (extent / world) (they require world to divide the
// extent, where every rule agrees), and vLLM's padded vocabulary embedding
// clips the last blocks in exactly this way; fastsafetensors' get_sharded and
// torch.chunk cut the same way.
struct IndexRange {
  int64_t start = 0;
  int64_t length = 0;
  bool operator==(const IndexRange&) const = default;
};
// InvalidArgument when world < 1, rank is not in [0, world) or extent < 0.
Result<IndexRange> ShardRange(int64_t extent, int rank, int world);

}  // namespace tensorlift

#endif  // TENSORLIFT_ASSIGN_H_
