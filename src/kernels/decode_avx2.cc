// The AVX2 sparse-bitmask decoder (decode_simd.h): pshufb with lookup tables.
//
// Each 128-bit lane of output (16 bytes: 16 / W elements of W bytes) is one
// pshufb of the 16 bytes of values at the lane's input offset, under a
// control from a table indexed by the lane's mask bits: output byte j takes
// input byte (rank of its element among the set bits) * W + j % W, or 0x80
// (pshufb's zero) where the element's bit is clear. A lane's input offset is
// the popcount of the mask bits below it, so the lanes of a 64-column block
// do not depend on each other. For W = 1 a lane holds 16 elements: its
// control is two 8-byte entries, the upper one shifted by the popcount of the
// lower byte (0x80 plus at most 8 keeps bit 7 set, so zeros stay zeros).
//
// Bounds: a lane's load reads 16 bytes whatever the mask, so a block's loads
// reach up to 64 * W bytes past its first value. While at least that many
// bytes of values remain the loads run in place; after that (the last blocks
// of the range) the few remaining values are copied into a zero-padded
// buffer and decoded from there. A partial block at the end of a row is
// decoded into a buffer and only its columns are copied out.
#include <immintrin.h>

#include <cstring>

#include "kernels/decode_simd.h"

#if TL_SPARSE_X86

#define TL_TARGET_AVX2 [[gnu::target("avx2,popcnt")]]

namespace tensorlift::sparse::detail {
namespace {

constexpr uint64_t kBlockCols = 64;  // Mask bits per block: one 64-bit load.

template <uint32_t W>
struct Lut {
  // Mask bits per table entry: 16 / W elements fill a 16-byte lane; for
  // W = 1 an entry is half a lane (8 bits, 256 entries rather than 65536).
  static constexpr uint32_t kBits = W == 1 ? 8 : 16 / W;
  alignas(16) uint8_t entry[1u << kBits][16];
};

template <uint32_t W>
constexpr Lut<W> MakeLut() {
  Lut<W> t{};
  for (uint32_t bits = 0; bits < (1u << Lut<W>::kBits); ++bits) {
    uint32_t rank = 0;
    for (uint32_t e = 0; e < Lut<W>::kBits; ++e) {
      const bool set = (bits >> e) & 1u;
      for (uint32_t b = 0; b < W; ++b) {
        t.entry[bits][e * W + b] = set ? static_cast<uint8_t>(rank * W + b) : uint8_t{0x80};
      }
      rank += set;
    }
  }
  return t;
}

template <uint32_t W>
constexpr Lut<W> kLut = MakeLut<W>();

// The pshufb control of one 16-byte output lane with mask bits `bits`.
template <uint32_t W>
TL_TARGET_AVX2 inline __m128i Control(uint64_t bits) {
  if constexpr (W == 1) {
    const uint64_t low = bits & 0xFF;
    const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kLut<1>.entry[low]));
    const __m128i hi =
        _mm_add_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kLut<1>.entry[bits >> 8])),
                     _mm_set1_epi8(static_cast<char>(_mm_popcnt_u64(low))));
    return _mm_unpacklo_epi64(lo, hi);
  } else {
    return _mm_load_si128(reinterpret_cast<const __m128i*>(kLut<W>.entry[bits]));
  }
}

// Decodes one block of 64 columns with mask bits `word` from values at `v`
// into out[0, 64 * W). Reads v[0, 64 * W) at most. Returns the value bytes
// consumed.
template <uint32_t W>
TL_TARGET_AVX2 inline uint64_t Block(uint64_t word, const std::byte* v, std::byte* out) {
  constexpr uint32_t kLaneBits = W == 1 ? 16 : 16 / W;
  constexpr uint32_t kLanes = kBlockCols / kLaneBits;  // 4, 8, 16 or 32: even.
  constexpr uint64_t kLaneMask = (1ull << kLaneBits) - 1;
#pragma GCC unroll 16
  for (uint32_t i = 0; i < kLanes; i += 2) {
    const uint32_t lo = i * kLaneBits;   // First bit of the low lane; < 64,
    const uint32_t hi = lo + kLaneBits;  // and of the high lane, < 64.
    const uint64_t lo_at = _mm_popcnt_u64(word & ((1ull << lo) - 1)) * W;
    const uint64_t hi_at = _mm_popcnt_u64(word & ((1ull << hi) - 1)) * W;
    const __m256i src = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + lo_at))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + hi_at)), 1);
    const __m256i control = _mm256_set_m128i(Control<W>((word >> hi) & kLaneMask),
                                             Control<W>((word >> lo) & kLaneMask));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * 16),
                        _mm256_shuffle_epi8(src, control));
  }
  return _mm_popcnt_u64(word) * W;
}

// Columns [0, cols) of a row from `mask` (its remaining bytes), with values
// at `v` readable up to 64 * W bytes past the last one consumed.
template <uint32_t W>
TL_TARGET_AVX2 void RowRest(const uint8_t* mask, uint64_t cols, const std::byte* v,
                            std::byte* out) {
  for (uint64_t c = 0; c < cols; c += kBlockCols) {
    const uint64_t n = cols - c < kBlockCols ? cols - c : kBlockCols;
    uint64_t word = 0;
    std::memcpy(&word, mask + c / 8, (n + 7) / 8);  // Not past the row's mask.
    if (n == kBlockCols) {
      v += Block<W>(word, v, out + c * W);
    } else {
      alignas(32) std::byte block[kBlockCols * W];
      v += Block<W>(word, v, block);
      std::memcpy(out + c * W, block, n * W);
    }
  }
}

template <uint32_t W>
TL_TARGET_AVX2 void Row(const uint8_t* mask, uint64_t cols, const std::byte* v,
                        const std::byte* v_end, std::byte* out) {
  constexpr uint64_t kReach = kBlockCols * W;  // How far a block's loads may read.
  uint64_t c = 0;
  for (; c + kBlockCols <= cols && static_cast<uint64_t>(v_end - v) >= kReach; c += kBlockCols) {
    uint64_t word;
    std::memcpy(&word, mask + c / 8, 8);
    v += Block<W>(word, v, out + c * W);
  }
  if (c == cols) return;
  const uint64_t left = static_cast<uint64_t>(v_end - v);
  if (left >= kReach) {
    RowRest<W>(mask + c / 8, cols - c, v, out + c * W);
    return;
  }
  // Fewer than kReach bytes of values remain in the whole range (this row's
  // rest among them): decode the rest of the row from a copy of them with
  // kReach bytes of zeros after.
  alignas(32) std::byte padded[2 * kReach] = {};
  if (left > 0) std::memcpy(padded, v, left);
  RowRest<W>(mask + c / 8, cols - c, padded, out + c * W);
}

template <uint32_t W>
TL_TARGET_AVX2 void Rows(const std::byte* values, const uint8_t* bitmask,
                         const int64_t* row_offsets, const BitmaskShape& s, uint64_t r0,
                         uint64_t r1, std::byte* dense) {
  const std::byte* v_end = values + ValuesEnd(bitmask, row_offsets, s, r1) * W;
  const uint64_t mrow = s.mask_row_bytes();
  for (uint64_t r = r0; r < r1; ++r) {
    Row<W>(bitmask + r * mrow, s.cols, values + static_cast<uint64_t>(row_offsets[r]) * W, v_end,
           dense + r * s.cols * W);
  }
}

}  // namespace

void DecodeRowsAvx2(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                    const BitmaskShape& s, uint64_t r0, uint64_t r1, std::byte* dense) {
  if (r0 >= r1) return;
  ByWidth(s.elem_bytes, [&](auto w) {
    Rows<decltype(w)::value>(values, bitmask, row_offsets, s, r0, r1, dense);
  });
}

}  // namespace tensorlift::sparse::detail

#endif  // TL_SPARSE_X86
