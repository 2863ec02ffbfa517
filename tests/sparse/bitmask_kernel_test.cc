// The GPU decode kernel's code (kernels/bitmask_kernel.h) on the CPU: the
// warp emulation (the kernel's steps, lanes in turn, the shuffle scan as
// arrays) gives the scalar decoder's bytes for every width, density and row
// length (tails of 8, 32 and 1024 columns included), and the work mapping
// covers each column of a chunk exactly once from the right mask bit.
#include "kernels/bitmask_kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bitmask_test_util.h"
#include "tensorlift/bitmask.h"

namespace tensorlift::sparse {
namespace {

using test::Encoded;
using test::EncodeDense;
using test::RandomDense;

void DecodeEmulated(const Encoded& e, std::byte* out) {
  const BitmaskShape& s = e.shape;
  const uint64_t mrow = s.mask_row_bytes();
  for (uint64_t r = 0; r < s.rows; ++r) {
    const uint8_t* mask = e.bitmask.data() + r * mrow;
    const std::byte* values =
        e.values.data() + static_cast<uint64_t>(e.row_offsets[r]) * s.elem_bytes;
    std::byte* row = out + r * s.cols * s.elem_bytes;
    switch (s.elem_bytes) {
      case 1:
        kernel::DecodeRowEmulated<1>(mask, s.cols, values, row);
        break;
      case 2:
        kernel::DecodeRowEmulated<2>(mask, s.cols, values, row);
        break;
      case 4:
        kernel::DecodeRowEmulated<4>(mask, s.cols, values, row);
        break;
      default:
        kernel::DecodeRowEmulated<8>(mask, s.cols, values, row);
        break;
    }
  }
}

TEST(BitmaskKernelTest, WarpEmulationMatchesTheScalarDecoder) {
  std::mt19937_64 rng(11);
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    for (uint64_t cols : {1, 7, 9, 31, 32, 33, 100, 1023, 1024, 1025, 2047, 3000, 4099}) {
      for (double density : {0.0, 1.0, 0.5, 0.05, 0.95, -1.0}) {
        SCOPED_TRACE(testing::Message() << "w " << w << " cols " << cols << " density " << density);
        const BitmaskShape s{.rows = 5, .cols = cols, .elem_bytes = w};
        const std::vector<std::byte> dense = RandomDense(s, density, rng);
        const Encoded e = EncodeDense(dense, s);
        std::vector<std::byte> scalar(s.dense_bytes());
        DecodeRows(DecodeIsa::kScalar, e.values.data(), e.bitmask.data(), e.row_offsets.data(), s,
                   0, s.rows, scalar.data());
        ASSERT_EQ(scalar, dense);
        std::vector<std::byte> emulated(s.dense_bytes(), std::byte{0xCD});
        DecodeEmulated(e, emulated.data());
        ASSERT_EQ(emulated, scalar);
      }
    }
  }
}

// For each width: over one chunk, the (step, lane) groups cover every column
// once, and each column's bit is read from the lane that owns it (column /
// 32) at bit column % 32.
template <uint32_t W>
void ExpectMappingCoversTheChunk() {
  std::vector<int> seen(kernel::kChunkCols, 0);
  for (uint32_t step = 0; step < kernel::kStepsPerChunk<W>; ++step) {
    for (uint32_t lane = 0; lane < kernel::kWarp; ++lane) {
      const uint64_t first = kernel::GroupFirstColumn<W>(step, lane);
      for (uint32_t i = 0; i < kernel::kGroupElems<W>; ++i) {
        const uint64_t col = first + i;
        ASSERT_LT(col, kernel::kChunkCols);
        ++seen[col];
        EXPECT_EQ(kernel::GroupSourceLane<W>(step, lane), col / 32) << "W " << W;
        EXPECT_EQ(kernel::GroupFirstBit<W>(lane) + i, col % 32) << "W " << W;
      }
    }
  }
  for (uint64_t col = 0; col < kernel::kChunkCols; ++col) ASSERT_EQ(seen[col], 1) << col;
  EXPECT_EQ(kernel::kGroupElems<W> * W, kernel::kGroupBytes);
}

TEST(BitmaskKernelTest, StepsCoverEachColumnOnce) {
  ExpectMappingCoversTheChunk<1>();
  ExpectMappingCoversTheChunk<2>();
  ExpectMappingCoversTheChunk<4>();
  ExpectMappingCoversTheChunk<8>();
}

TEST(BitmaskKernelTest, MaskWordReadsBytewiseAndStopsAtTheRow) {
  const uint8_t mask[] = {0x01, 0x80, 0xFF, 0x10, 0xAA, 0x55};
  EXPECT_EQ(kernel::MaskWord(mask, 6, 0), 0x10FF8001u);
  EXPECT_EQ(kernel::MaskWord(mask, 6, 32), 0x000055AAu);     // Bytes 6 and 7 are past the row.
  EXPECT_EQ(kernel::MaskWord(mask + 1, 3, 0), 0x0010FF80u);  // Unaligned row start.
  EXPECT_EQ(kernel::MaskWord(mask, 2, 8), 0x00000080u);
}

TEST(BitmaskKernelTest, ValueIndexIsTheRankAmongSetBits) {
  const uint32_t word = 0b1011'0010u;
  EXPECT_EQ(kernel::ValueIndex(word, 10, 1), 10u);
  EXPECT_EQ(kernel::ValueIndex(word, 10, 4), 11u);
  EXPECT_EQ(kernel::ValueIndex(word, 10, 5), 12u);
  EXPECT_EQ(kernel::ValueIndex(word, 10, 7), 13u);
  EXPECT_EQ(kernel::ValueIndex(0xFFFFFFFFu, 0, 31), 31u);
}

TEST(BitmaskKernelTest, GroupsPackLittleEndianElements) {
  kernel::Group g;
  kernel::PutElement<2>(g, 0, 0x8000);
  kernel::PutElement<2>(g, 7, 0x7FC1);
  EXPECT_EQ(kernel::GetElement<2>(g, 0), 0x8000u);
  EXPECT_EQ(kernel::GetElement<2>(g, 7), 0x7FC1u);
  EXPECT_EQ(kernel::GetElement<2>(g, 3), 0u);
  kernel::Group h;
  kernel::PutElement<8>(h, 1, 0xFFF8DEADBEEF0001ull);
  EXPECT_EQ(kernel::GetElement<8>(h, 1), 0xFFF8DEADBEEF0001ull);
  std::byte bytes[16];
  kernel::StoreGroup<8, kernel::Access::kBytes>(bytes, h, 2);
  uint64_t second;
  std::memcpy(&second, bytes + 8, 8);
  EXPECT_EQ(second, 0xFFF8DEADBEEF0001ull);
}

}  // namespace
}  // namespace tensorlift::sparse
