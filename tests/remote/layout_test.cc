// Layouts: rule parsing, the split of a dim, and slice pieces checked
// against a brute-force copy of every element.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "format/tp_layout.h"

namespace tensorlift::remote {
namespace {

using ::testing::HasSubstr;

constexpr const char* kLlama =
    "(q|k|v|gate|up)_proj\\.weight$=0;(o|down)_proj\\.weight$=1;embed_tokens=0;lm_head=0";

TEST(LayoutTest, ParseAndDimFor) {
  auto l = ParallelLayout::Parse(kLlama);
  ASSERT_OK(l);
  EXPECT_EQ(l->text(), kLlama);
  EXPECT_FALSE(l->empty());
  EXPECT_EQ(l->DimFor("model.layers.0.self_attn.q_proj.weight"), 0);
  EXPECT_EQ(l->DimFor("model.layers.0.mlp.up_proj.weight"), 0);
  EXPECT_EQ(l->DimFor("model.layers.0.self_attn.o_proj.weight"), 1);
  EXPECT_EQ(l->DimFor("model.layers.0.mlp.down_proj.weight"), 1);
  EXPECT_EQ(l->DimFor("model.embed_tokens.weight"), 0);
  EXPECT_EQ(l->DimFor("lm_head.weight"), 0);
  EXPECT_EQ(l->DimFor("model.layers.0.self_attn.q_proj.bias"), -1);
  EXPECT_EQ(l->DimFor("model.norm.weight"), -1);
  EXPECT_EQ(l->DimFor(""), -1);
}

TEST(LayoutTest, FirstRuleWinsAndTrims) {
  auto l = ParallelLayout::Parse("  w = 1 ;  w.*=0 ; a=b=2");
  ASSERT_OK(l);
  EXPECT_EQ(l->text(), "w = 1;w.*=0;a=b=2");
  EXPECT_EQ(l->DimFor("xw"), 1);
  EXPECT_EQ(l->DimFor("a=b"), 2);  // The dim follows the last '='.
}

TEST(LayoutTest, EmptyLayout) {
  for (const char* text : {"", "   "}) {
    auto l = ParallelLayout::Parse(text);
    ASSERT_OK(l);
    EXPECT_TRUE(l->empty());
    EXPECT_EQ(l->DimFor("anything"), -1);
  }
  ParallelLayout d;
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.DimFor("x"), -1);
}

TEST(LayoutTest, RejectsBadRules) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"(unclosed=0", "bad regex"},
      {"[a-=0", "bad regex"},
      {"*a=0", "bad regex"},
      {"w=8", "0..7"},
      {"w=-1", "0..7"},
      {"w=01", "0..7"},
      {"w=", "0..7"},
      {"w", "expected REGEX=DIM"},
      {"=0", "regex is empty"},
      {"w=0;;v=1", "rule 1 is empty"},
      {"w=0;", "rule 1 is empty"},
      {";w=0", "rule 0 is empty"},
  };
  for (const auto& c : cases) {
    auto l = ParallelLayout::Parse(c.text);
    ASSERT_FALSE(l.ok()) << c.text;
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(l.status().message(), HasSubstr(c.why)) << c.text;
  }
}

// The bytes of shard `r` along `dim` of a tensor whose elements are
// `elem_bits` wide and hold their (whole-tensor) bit pattern `full`.
// Elements are numbered row-major; bits are packed little-endian within
// bytes, so a sub-byte element's bits may straddle bytes only when its width
// does not divide 8 (not used here).
std::vector<uint8_t> ShardBytes(const std::vector<uint8_t>& full, const std::vector<int64_t>& shape,
                                uint32_t elem_bits, int dim, IndexRange r) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t extent = shape[dim];
  const uint64_t shard_bits = static_cast<uint64_t>(outer * r.length * inner) * elem_bits;
  std::vector<uint8_t> out((shard_bits + 7) / 8, 0);
  uint64_t dst_elem = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = r.start; i < r.start + r.length; ++i) {
      for (int64_t k = 0; k < inner; ++k, ++dst_elem) {
        const uint64_t src_elem = static_cast<uint64_t>((o * extent + i) * inner + k);
        for (uint32_t b = 0; b < elem_bits; ++b) {
          const uint64_t sbit = src_elem * elem_bits + b, dbit = dst_elem * elem_bits + b;
          const int v = (full[sbit / 8] >> (sbit % 8)) & 1;
          out[dbit / 8] |= static_cast<uint8_t>(v << (dbit % 8));
        }
      }
    }
  }
  return out;
}

TEST(SlicePiecesTest, MatchesBruteForce) {
  const std::vector<std::vector<int64_t>> shapes = {
      {4, 6, 2}, {8, 4, 4}, {5, 3, 6}, {3, 7, 2}, {2, 2, 8}};
  int checked = 0;
  for (const auto& shape : shapes) {
    for (uint32_t bits : {4u, 8u, 16u, 32u}) {
      const uint64_t total_bits = static_cast<uint64_t>(shape[0] * shape[1] * shape[2]) * bits;
      std::vector<uint8_t> full((total_bits + 7) / 8);
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<uint8_t>(i * 131 + 7);
      for (int dim = 0; dim < 3; ++dim) {
        int64_t inner = 1;
        for (int i = dim + 1; i < 3; ++i) inner *= shape[i];
        const bool whole_rows = (inner * bits) % 8 == 0;
        for (int src_world : {1, 2, 4}) {
          for (int dst_world : {1, 2, 4}) {
            for (int dst_rank = 0; dst_rank < dst_world; ++dst_rank) {
              const IndexRange dst = *ShardRange(shape[dim], dst_rank, dst_world);
              const std::vector<uint8_t> want = ShardBytes(full, shape, bits, dim, dst);
              // Assemble the destination shard from every source shard.
              std::vector<uint8_t> got(want.size(), 0xee);
              std::vector<bool> written(want.size(), false);
              bool failed = false;
              for (int src_rank = 0; src_rank < src_world; ++src_rank) {
                const IndexRange src = *ShardRange(shape[dim], src_rank, src_world);
                const std::vector<uint8_t> src_bytes = ShardBytes(full, shape, bits, dim, src);
                auto pieces = SlicePieces(shape, bits, dim, src, dst);
                if (!whole_rows) {
                  ASSERT_FALSE(pieces.ok());
                  EXPECT_EQ(pieces.status().code(), StatusCode::kInvalidArgument);
                  EXPECT_THAT(pieces.status().message(), HasSubstr("not a whole number of bytes"));
                  failed = true;
                  break;
                }
                ASSERT_OK(pieces);
                const int64_t lo = std::max(src.start, dst.start);
                const int64_t hi = std::min(src.start + src.length, dst.start + dst.length);
                if (lo >= hi) {
                  EXPECT_TRUE(pieces->empty());
                }
                if (dim == 0) {
                  EXPECT_LE(pieces->size(), 1u);
                }
                for (size_t p = 0; p < pieces->size(); ++p) {
                  const CopyPiece& c = (*pieces)[p];
                  ASSERT_GT(c.bytes, 0u);
                  ASSERT_LE(c.src_offset + c.bytes, src_bytes.size());
                  ASSERT_LE(c.dst_offset + c.bytes, got.size());
                  for (uint64_t b = 0; b < c.bytes; ++b) {
                    ASSERT_FALSE(written[c.dst_offset + b]) << "byte written twice";
                    written[c.dst_offset + b] = true;
                  }
                  std::memcpy(got.data() + c.dst_offset, src_bytes.data() + c.src_offset, c.bytes);
                  // Merged: no piece continues the previous one in both shards.
                  if (p > 0) {
                    const CopyPiece& prev = (*pieces)[p - 1];
                    EXPECT_FALSE(prev.src_offset + prev.bytes == c.src_offset &&
                                 prev.dst_offset + prev.bytes == c.dst_offset);
                  }
                }
              }
              if (failed) continue;
              EXPECT_EQ(got, want) << "shape [" << shape[0] << "," << shape[1] << "," << shape[2]
                                   << "] bits " << bits << " dim " << dim << " " << src_world
                                   << "->" << dst_world << " rank " << dst_rank;
              for (bool w : written) ASSERT_TRUE(w);
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(SlicePiecesTest, SameSplitIsOnePiece) {
  // The same shard on both sides: one piece, whatever the dim.
  const std::vector<int64_t> shape = {4, 6, 2};
  for (int dim = 0; dim < 3; ++dim) {
    const IndexRange r = *ShardRange(shape[dim], 1, 2);
    auto pieces = SlicePieces(shape, 16, dim, r, r);
    ASSERT_OK(pieces);
    ASSERT_EQ(pieces->size(), 1u) << dim;
    EXPECT_EQ((*pieces)[0].src_offset, 0u);
    EXPECT_EQ((*pieces)[0].dst_offset, 0u);
  }
  // Whole to half along dim 1: one piece per outer row.
  auto pieces = SlicePieces(shape, 8, 1, {0, 6}, {3, 3});
  ASSERT_OK(pieces);
  ASSERT_EQ(pieces->size(), 4u);
  EXPECT_EQ((*pieces)[1].src_offset, 12u + 6u);
  EXPECT_EQ((*pieces)[1].dst_offset, 6u);
  EXPECT_EQ((*pieces)[1].bytes, 6u);
}

TEST(SlicePiecesTest, RejectsBadArguments) {
  const std::vector<int64_t> shape = {4, 6, 2};
  EXPECT_EQ(SlicePieces(shape, 8, 3, {0, 2}, {0, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SlicePieces(shape, 8, -1, {0, 2}, {0, 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SlicePieces({}, 8, 0, {0, 0}, {0, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SlicePieces(shape, 8, 0, {3, 2}, {0, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SlicePieces(shape, 8, 0, {-1, 2}, {0, 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SlicePieces(shape, 0, 0, {0, 2}, {0, 2}).status().code(), StatusCode::kInvalidArgument);
  // A 4-bit row of 3 elements.
  auto sub = SlicePieces({4, 3}, 4, 0, {0, 2}, {0, 2});
  EXPECT_EQ(sub.status().code(), StatusCode::kInvalidArgument);
  // Overflowing sizes.
  const int64_t big = int64_t{1} << 40;
  auto over = SlicePieces({big, big, big}, 8, 0, {0, 1}, {0, 1});
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  // Disjoint ranges: nothing to copy.
  auto none = SlicePieces(shape, 8, 1, {0, 3}, {3, 3});
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace tensorlift::remote
