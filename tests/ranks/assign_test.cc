#include "tensorlift/assign.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace {

using Files = std::vector<std::vector<uint64_t>>;

// Every tensor is in exactly one piece; pieces are well-formed and their
// byte counts add up; each rank's pieces are sorted; the bound holds.
void CheckAssignment(const Files& files, int world, const Assignment& a) {
  ASSERT_EQ(a.ranks.size(), static_cast<size_t>(world));
  std::vector<std::vector<int>> seen(files.size());
  for (size_t f = 0; f < files.size(); ++f) seen[f].assign(files[f].size(), 0);
  uint64_t total = 0;
  uint64_t max_tensor = 0;
  for (const auto& f : files) {
    for (uint64_t b : f) {
      total += b;
      max_tensor = std::max(max_tensor, b);
    }
  }
  uint64_t sum = 0;
  for (int r = 0; r < world; ++r) {
    const RankAssignment& ra = a.ranks[r];
    uint64_t rank_bytes = 0;
    for (size_t p = 0; p < ra.pieces.size(); ++p) {
      const ReadPiece& piece = ra.pieces[p];
      ASSERT_LT(piece.file, files.size());
      ASSERT_LE(piece.first, piece.last);
      ASSERT_LT(piece.last, files[piece.file].size());
      uint64_t bytes = 0;
      for (uint32_t i = piece.first; i <= piece.last; ++i) {
        ++seen[piece.file][i];
        bytes += files[piece.file][i];
      }
      EXPECT_EQ(piece.bytes, bytes);
      rank_bytes += bytes;
      if (p > 0) {
        const ReadPiece& prev = ra.pieces[p - 1];
        EXPECT_LT(std::pair(prev.file, prev.first), std::pair(piece.file, piece.first));
      }
    }
    EXPECT_EQ(ra.bytes, rank_bytes) << "rank " << r;
    sum += rank_bytes;
  }
  EXPECT_EQ(sum, total);
  EXPECT_EQ(a.total_bytes, total);
  EXPECT_EQ(a.max_tensor_bytes, max_tensor);
  const uint64_t ideal = (total + world - 1) / world;
  EXPECT_EQ(a.ideal_bytes, ideal);
  EXPECT_LE(a.max_rank_bytes(), ideal + max_tensor) << "world " << world << " split " << a.split;
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t i = 0; i < files[f].size(); ++i) {
      EXPECT_EQ(seen[f][i], 1) << "file " << f << " tensor " << i;
    }
  }
}

Assignment Assign(const Files& files, int world, AssignOptions options = {}) {
  auto a = AssignByBytes(files, world, options);
  EXPECT_OK(a);
  if (!a.ok()) return {};
  CheckAssignment(files, world, *a);
  return std::move(a).value();
}

Files RandomFiles(uint32_t seed, int num_files, int max_tensors, uint64_t max_bytes) {
  std::mt19937_64 rng(seed);
  Files files(num_files);
  for (auto& f : files) {
    f.resize(rng() % (max_tensors + 1));
    for (auto& b : f) {
      // Some zeros, mostly small, a few large.
      const uint64_t kind = rng() % 10;
      b = kind == 0 ? 0 : kind < 8 ? rng() % (max_bytes / 64 + 1) : rng() % (max_bytes + 1);
    }
  }
  return files;
}

TEST(AssignTest, EveryTensorOnceForManyShapesAndWorlds) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const Files files = RandomFiles(seed, 1 + seed % 9, 1 + seed % 17, 1 << 20);
    for (int world : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " world " + std::to_string(world));
      Assign(files, world);
    }
  }
}

TEST(AssignTest, WorldOneIsWholeFiles) {
  const Files files = {{10, 20}, {5}, {}, {7, 0, 3}};
  const Assignment a = Assign(files, 1);
  EXPECT_FALSE(a.split);
  ASSERT_EQ(a.ranks[0].pieces.size(), 3u);  // The empty file gets no piece.
  EXPECT_EQ(a.ranks[0].pieces[0], (ReadPiece{0, 0, 1, 30}));
  EXPECT_EQ(a.ranks[0].pieces[1], (ReadPiece{1, 0, 0, 5}));
  EXPECT_EQ(a.ranks[0].pieces[2], (ReadPiece{3, 0, 2, 10}));
}

TEST(AssignTest, EqualFilesStayWhole) {
  const Files files(8, std::vector<uint64_t>(16, 1000));
  for (int world : {1, 2, 4, 8}) {
    const Assignment a = Assign(files, world);
    EXPECT_FALSE(a.split) << world;
    for (const auto& r : a.ranks) EXPECT_EQ(r.bytes, 16000u * 8 / world);
  }
}

TEST(AssignTest, SingleHugeFileIsSplit) {
  const Files files = {std::vector<uint64_t>(1000, 4096)};
  for (int world : {2, 3, 4, 8}) {
    SCOPED_TRACE(world);
    const Assignment a = Assign(files, world);
    EXPECT_TRUE(a.split);
    for (const auto& r : a.ranks) {
      ASSERT_EQ(r.pieces.size(), 1u);  // One contiguous range per rank.
      EXPECT_GE(r.bytes + 4096, a.ideal_bytes - 4096);
    }
    EXPECT_LE(a.max_rank_bytes(), a.ideal_bytes + 4096);
  }
}

TEST(AssignTest, OneLargeFileAmongSmallOnes) {
  // 1 GiB-ish file of 1 MiB tensors and 20 files of 4 MiB.
  Files files = {std::vector<uint64_t>(1024, 1 << 20)};
  for (int i = 0; i < 20; ++i) files.push_back({uint64_t{4} << 20});
  for (int world : {2, 3, 4, 8}) {
    SCOPED_TRACE(world);
    const Assignment a = Assign(files, world);
    EXPECT_TRUE(a.split);
    // At most world - 1 cuts: at most world - 1 extra pieces.
    size_t pieces = 0;
    for (const auto& r : a.ranks) pieces += r.pieces.size();
    EXPECT_LE(pieces, files.size() + world - 1);
  }
}

TEST(AssignTest, ManyTinyFiles) {
  const Files files(1000, std::vector<uint64_t>{3});
  for (int world : {1, 2, 3, 4, 8}) {
    const Assignment a = Assign(files, world);
    EXPECT_FALSE(a.split);
    EXPECT_LE(a.max_rank_bytes(), a.ideal_bytes + 3);
  }
}

TEST(AssignTest, ZeroSizeTensors) {
  // All zero: spread by count.
  const Files zeros = {{0, 0}, {0}, {0, 0, 0}, {0}};
  const Assignment a = Assign(zeros, 4);
  for (const auto& r : a.ranks) EXPECT_EQ(r.pieces.size(), 1u);
  // Zeros among data, world 3.
  const Files mixed = {{0, 100, 0, 0, 100, 0}, {0}, {100, 0}};
  Assign(mixed, 3);
  Assign(mixed, 8);
}

TEST(AssignTest, WorldLargerThanTensors) {
  const Files files = {{5, 6}, {7}};
  const Assignment a = Assign(files, 8);
  int busy = 0;
  for (const auto& r : a.ranks) busy += !r.pieces.empty();
  EXPECT_EQ(busy, 3);
  EXPECT_EQ(a.max_rank_bytes(), 7u);
  EXPECT_EQ(Assign({}, 4).max_rank_bytes(), 0u);
  EXPECT_EQ(Assign(files, kMaxAssignWorld).max_rank_bytes(), 7u);
}

TEST(AssignTest, Deterministic) {
  const Files files = RandomFiles(7, 12, 30, 1 << 24);
  const Assignment a = Assign(files, 4);
  const Assignment b = Assign(files, 4);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) EXPECT_EQ(a.ranks[r].pieces, b.ranks[r].pieces);
}

TEST(AssignTest, SlackZeroPrefersTheBetterBalance) {
  // Three equal files on two ranks: whole files give 2:1, the split 1.5:1.5.
  const Files files(3, std::vector<uint64_t>(10, 100));
  EXPECT_TRUE(Assign(files, 2, {.whole_file_slack = 0}).split);
  // A huge slack keeps whole files only while within the bound (here the
  // bound, ideal + largest tensor = 1600, excludes 2000).
  EXPECT_TRUE(Assign(files, 2, {.whole_file_slack = 100}).split);
  const Files coarse(3, std::vector<uint64_t>{1000});
  EXPECT_FALSE(Assign(coarse, 2, {.whole_file_slack = 100}).split);
}

TEST(AssignTest, BadArguments) {
  const Files files = {{1}};
  EXPECT_EQ(AssignByBytes(files, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignByBytes(files, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignByBytes(files, kMaxAssignWorld + 1).status().code(),
            StatusCode::kInvalidArgument);
  const Files overflow = {{UINT64_MAX}, {1}};
  EXPECT_EQ(AssignByBytes(overflow, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignByBytes(files, 2, {.whole_file_slack = -1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(AssignTest, HugeSizesDoNotOverflow) {
  const Files files = {{uint64_t{1} << 62, uint64_t{1} << 62}, {uint64_t{1} << 62}};
  Assign(files, 2);
  Assign(files, 3);
}

TEST(AssignTest, FromCheckpoint) {
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("tl_assign_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::byte> data(4096, std::byte{1});
  Files expect;
  for (int f = 0; f < 3; ++f) {
    std::vector<TensorView> views;
    std::vector<uint64_t> sizes;
    for (int t = 0; t < 4 + f; ++t) {
      const uint64_t n = 64 * (t + 1) * (f + 1);
      views.push_back({"f" + std::to_string(f) + ".t" + std::to_string(t),
                       Dtype::kU8,
                       {n},
                       std::span<const std::byte>(data.data(), n)});
    }
    ASSERT_TRUE(
        WriteFile((dir / ("s" + std::to_string(f) + ".safetensors")).string(), views, std::nullopt)
            .ok());
  }
  auto ckpt = Checkpoint::Open(dir.string());
  ASSERT_OK(ckpt);
  for (const auto& shard : ckpt->shards()) {
    std::vector<uint64_t> sizes;
    for (const auto& t : shard.header.tensors()) sizes.push_back(t.nbytes());
    expect.push_back(sizes);
  }
  for (int world : {1, 2, 3, 4, 8}) {
    auto a = AssignByBytes(*ckpt, world);
    ASSERT_OK(a);
    CheckAssignment(expect, world, *a);
    EXPECT_EQ(a->total_bytes, ckpt->total_bytes());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
TEST(AssignTest, WholeFilesOptionNeverSplitsAFile) {
  const Files one_file = {{50, 50}};
  auto split = AssignByBytes(one_file, 2);
  ASSERT_OK(split);
  EXPECT_TRUE(split->split);
  EXPECT_EQ(split->max_rank_bytes(), 50u);
  AssignOptions whole;
  whole.whole_files = true;
  auto kept = AssignByBytes(one_file, 2, whole);
  ASSERT_OK(kept);
  EXPECT_FALSE(kept->split);
  ASSERT_EQ(kept->ranks[0].pieces.size(), 1u);
  EXPECT_EQ(kept->ranks[0].pieces[0], (ReadPiece{0, 0, 1, 100}));
  EXPECT_TRUE(kept->ranks[1].pieces.empty());
  // Largest first to the lightest rank (ties: fewer pieces, then the lower rank).
  const Files files = {{100}, {70}, {60}, {30}, {30}, {10}};
  auto got = AssignByBytes(files, 2, whole);
  ASSERT_OK(got);
  std::vector<uint32_t> r0, r1;
  for (const ReadPiece& p : got->ranks[0].pieces) r0.push_back(p.file);
  for (const ReadPiece& p : got->ranks[1].pieces) r1.push_back(p.file);
  EXPECT_EQ(r0, (std::vector<uint32_t>{0, 3, 4}));
  EXPECT_EQ(r1, (std::vector<uint32_t>{1, 2, 5}));
}

// The one shard-range rule (vLLM's and Megatron-LM's): blocks of
// ceil(extent / world), the last ones clipped.
TEST(ShardRangeTest, CeilBlocksLastOnesClipped) {
  EXPECT_EQ(*ShardRange(8, 1, 4), (IndexRange{2, 2}));
  // 10 over 4: blocks of 3: 3 3 3 1 (torch.chunk(10, 4) and fastsafetensors' get_sharded too).
  const int64_t starts[] = {0, 3, 6, 9}, lengths[] = {3, 3, 3, 1};
  for (int rank = 0; rank < 4; ++rank) {
    auto s = ShardRange(10, rank, 4);
    ASSERT_OK(s);
    EXPECT_EQ(s->start, starts[rank]);
    EXPECT_EQ(s->length, lengths[rank]);
  }
  // 9 over 4: blocks of 3, the last rank gets nothing (3 3 3 0).
  EXPECT_EQ(*ShardRange(9, 3, 4), (IndexRange{9, 0}));
  // More ranks than elements: the last get nothing.
  EXPECT_EQ(*ShardRange(2, 1, 4), (IndexRange{1, 1}));
  EXPECT_EQ(*ShardRange(2, 3, 4), (IndexRange{2, 0}));
  EXPECT_EQ(*ShardRange(0, 0, 3), (IndexRange{0, 0}));
  // Every split tiles the extent in rank order, with blocks of ceil(extent / world).
  for (int64_t extent = 0; extent < 40; ++extent) {
    for (int world = 1; world <= 9; ++world) {
      const int64_t block = (extent + world - 1) / world;
      int64_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        auto s = ShardRange(extent, rank, world);
        ASSERT_OK(s);
        EXPECT_EQ(s->start, next);
        EXPECT_EQ(s->length, std::max<int64_t>(0, std::min(block, extent - rank * block)));
        next += s->length;
      }
      EXPECT_EQ(next, extent);
    }
  }
  // No overflow at the largest extents.
  const int64_t max = std::numeric_limits<int64_t>::max();
  auto top = ShardRange(max, 6, 7);
  ASSERT_OK(top);
  EXPECT_EQ(top->start + top->length, max);
}

TEST(ShardRangeTest, RejectsBadArguments) {
  EXPECT_EQ(ShardRange(8, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardRange(8, 4, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardRange(8, -1, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardRange(-1, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace tensorlift
