#include "tensorlift/assign.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "common/checked_math.h"

namespace tensorlift {
namespace {

constexpr uint64_t kMaxCount = uint64_t{1} << 32;

struct FileSummary {
  uint64_t bytes = 0;
  uint32_t count = 0;  // Tensors.
};

// Files in decreasing size, ties by index; files without tensors left out.
std::vector<uint32_t> SizeOrder(const std::vector<FileSummary>& files) {
  std::vector<uint32_t> order;
  for (uint32_t f = 0; f < files.size(); ++f) {
    if (files[f].count > 0) order.push_back(f);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return files[a].bytes > files[b].bytes; });
  return order;
}

void SortPieces(Assignment* a) {
  for (RankAssignment& r : a->ranks) {
    std::sort(r.pieces.begin(), r.pieces.end(), [](const ReadPiece& x, const ReadPiece& y) {
      return std::pair(x.file, x.first) < std::pair(y.file, y.first);
    });
  }
}

// Rule 1: whole files, longest processing time first.
Assignment WholeFiles(const std::vector<FileSummary>& files, const std::vector<uint32_t>& order,
                      int world) {
  Assignment a;
  a.ranks.resize(world);
  // Min-heap of (load, pieces, rank): the least loaded rank on top.
  using Key = std::tuple<uint64_t, size_t, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> heap;
  for (int r = 0; r < world; ++r) heap.emplace(0, 0, r);
  for (uint32_t f : order) {
    const int best = std::get<2>(heap.top());
    heap.pop();
    RankAssignment& ra = a.ranks[best];
    ra.pieces.push_back({f, 0, files[f].count - 1, files[f].bytes});
    ra.bytes += files[f].bytes;  // Cannot overflow: <= the checked total.
    heap.emplace(ra.bytes, ra.pieces.size(), best);
  }
  return a;
}

// Rule 2: files end to end in `order`, cut at multiples of `capacity` (> 0);
// a tensor belongs to the rank whose slot holds its first byte.
Assignment Split(std::span<const std::vector<uint64_t>> tensor_bytes,
                 const std::vector<uint32_t>& order, int world, uint64_t capacity) {
  Assignment a;
  a.ranks.resize(world);
  uint64_t pos = 0;  // Global offset of the current tensor; <= the checked total.
  for (uint32_t f : order) {
    const std::vector<uint64_t>& sizes = tensor_bytes[f];
    ReadPiece piece{f, 0, 0, 0};
    int piece_rank = -1;
    for (uint32_t i = 0; i < sizes.size(); ++i) {
      const int rank = static_cast<int>(std::min<uint64_t>(pos / capacity, world - 1));
      if (rank != piece_rank) {
        if (piece_rank >= 0) {
          a.ranks[piece_rank].pieces.push_back(piece);
          a.ranks[piece_rank].bytes += piece.bytes;
        }
        piece = {f, i, i, 0};
        piece_rank = rank;
      }
      piece.last = i;
      piece.bytes += sizes[i];
      pos += sizes[i];
    }
    a.ranks[piece_rank].pieces.push_back(piece);
    a.ranks[piece_rank].bytes += piece.bytes;
  }
  a.split = true;
  return a;
}

}  // namespace

uint64_t Assignment::max_rank_bytes() const {
  uint64_t m = 0;
  for (const RankAssignment& r : ranks) m = std::max(m, r.bytes);
  return m;
}

Result<Assignment> AssignByBytes(std::span<const std::vector<uint64_t>> tensor_bytes, int world,
                                 const AssignOptions& options) {
  if (world < 1 || world > kMaxAssignWorld) {
    return InvalidArgumentError("world size " + std::to_string(world) + " is not in [1, " +
                                std::to_string(kMaxAssignWorld) + "]");
  }
  if (tensor_bytes.size() >= kMaxCount) {
    return InvalidArgumentError(std::to_string(tensor_bytes.size()) + " files are too many");
  }
  if (!(options.whole_file_slack >= 0)) {
    return InvalidArgumentError("whole_file_slack must be >= 0");
  }
  std::vector<FileSummary> files(tensor_bytes.size());
  uint64_t total = 0;
  uint64_t max_tensor = 0;
  for (size_t f = 0; f < tensor_bytes.size(); ++f) {
    if (tensor_bytes[f].size() >= kMaxCount) {
      return InvalidArgumentError("file " + std::to_string(f) + " has " +
                                  std::to_string(tensor_bytes[f].size()) + " tensors (too many)");
    }
    files[f].count = static_cast<uint32_t>(tensor_bytes[f].size());
    for (uint64_t b : tensor_bytes[f]) {
      max_tensor = std::max(max_tensor, b);
      if (!CheckedAdd(files[f].bytes, b, &files[f].bytes) || !CheckedAdd(total, b, &total)) {
        return InvalidArgumentError("the tensors' total size overflows 64 bits (file " +
                                    std::to_string(f) + ")");
      }
    }
  }
  const std::vector<uint32_t> order = SizeOrder(files);
  const uint64_t ideal = total / world + (total % world != 0);

  Assignment result = WholeFiles(files, order, world);
  if (total > 0 && !options.whole_files) {
    Assignment split = Split(tensor_bytes, order, world, ideal);
    const uint64_t whole_max = result.max_rank_bytes();
    const uint64_t split_max = split.max_rank_bytes();
    // The bound, saturated; the slack is compared in floating point (it is
    // only a preference, not the bound).
    uint64_t bound = 0;
    if (!CheckedAdd(ideal, max_tensor, &bound)) bound = UINT64_MAX;
    const bool within_bound = whole_max <= bound;
    const bool close_enough =
        static_cast<double>(whole_max) <=
        static_cast<double>(split_max) + options.whole_file_slack * static_cast<double>(ideal);
    if (!(within_bound && close_enough)) result = std::move(split);
  }
  result.total_bytes = total;
  result.max_tensor_bytes = max_tensor;
  result.ideal_bytes = ideal;
  SortPieces(&result);
  return result;
}

Result<Assignment> AssignByBytes(const Checkpoint& checkpoint, int world,
                                 const AssignOptions& options) {
  const auto& shards = checkpoint.shards();
  std::vector<std::vector<uint64_t>> sizes(shards.size());
  // Only tensors the checkpoint lists count (an index may not name them all).
  std::vector<std::vector<bool>> listed(shards.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    listed[s].assign(shards[s].header.tensors().size(), false);
  }
  for (const Checkpoint::Location& loc : checkpoint.tensors()) listed[loc.shard][loc.index] = true;
  for (size_t s = 0; s < shards.size(); ++s) {
    const auto& tensors = shards[s].header.tensors();
    sizes[s].reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      sizes[s].push_back(listed[s][i] ? tensors[i].nbytes() : 0);
    }
  }
  return AssignByBytes(sizes, world, options);
}

}  // namespace tensorlift
