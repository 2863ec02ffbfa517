// The AVX-512 sparse-bitmask decoder (decode_simd.h): expand-loads.
//
// vpexpand{b,w,d,q} from memory (VBMI2 for bytes and words, AVX-512F for
// dwords and qwords) reads popcount(k) consecutive elements and places them
// at the set bits of k, zeroing the others: one instruction per 64 output
// bytes, with the mask bits taken straight from the bitmap (64 for bytes, 32
// for 2-byte, 16 for 4-byte, 8 for 8-byte elements). It reads exactly the
// elements it places (the masked-off ones are not accessed and cannot
// fault), so no load goes past the row's last value. Each 64-column block is
// W such loads whose input offsets (popcounts of the mask bits below them)
// do not depend on each other. The partial block at a row's end is stored
// with a byte mask covering only its columns.
//
// Prefetch: the expand-loads do not seem to train the hardware prefetcher
// (measured on AMD Zen 5: with a software prefetch of the values 1 KiB
// ahead, a 32 MiB decode runs about twice as fast, from below memcpy's
// speed to well above it; docs/sparse.md). A prefetch never faults, so
// running past the end of the values is harmless.
#include <immintrin.h>

#include <cstring>

#include "kernels/decode_simd.h"

#if TL_SPARSE_X86

#define TL_TARGET_AVX512 [[gnu::target("avx512f,avx512bw,avx512vbmi2,bmi,bmi2,popcnt")]]

namespace tensorlift::sparse::detail {
namespace {

constexpr uint64_t kBlockCols = 64;        // Mask bits per block: one 64-bit load.
constexpr uint64_t kPrefetchBytes = 1024;  // How far ahead values are prefetched.

// The 64 bytes of elements for mask bits `bits` (64 / W of them), from `p`.
template <uint32_t W>
TL_TARGET_AVX512 inline __m512i ExpandLoad(uint64_t bits, const std::byte* p) {
  if constexpr (W == 1) {
    return _mm512_maskz_expandloadu_epi8(static_cast<__mmask64>(bits), p);
  } else if constexpr (W == 2) {
    return _mm512_maskz_expandloadu_epi16(static_cast<__mmask32>(bits), p);
  } else if constexpr (W == 4) {
    return _mm512_maskz_expandloadu_epi32(static_cast<__mmask16>(bits), p);
  } else {
    return _mm512_maskz_expandloadu_epi64(static_cast<__mmask8>(bits), p);
  }
}

// Decodes the first `cols` (1..64; kFull: 64) columns of a block whose 64
// mask bits are the 8 bytes at `mask`, from values at `v`, into
// out[0, cols * W). Returns the value bytes consumed.
template <uint32_t W, bool kFull>
TL_TARGET_AVX512 inline uint64_t Block(const uint8_t* mask, const std::byte* v, std::byte* out,
                                       uint64_t cols) {
  constexpr uint32_t kPer = 64 / W;  // Elements (mask bits) per 64-byte vector.
  constexpr uint64_t kPerMask = kPer == 64 ? ~0ull : (1ull << (kPer % 64)) - 1;
  uint64_t word;
  std::memcpy(&word, mask, 8);
  // All the block's loads come before its stores: an expand-load issued
  // after a store waits for it (the compiler cannot tell that they do not
  // overlap, nor, it seems, can the CPU), which made the L2-resident decode
  // a third slower.
  __m512i x[W];
#pragma GCC unroll 8
  for (uint32_t j = 0; j < W; ++j) {
    const uint32_t first = j * kPer;  // < 64.
    const uint64_t at = _mm_popcnt_u64(_bzhi_u64(word, first)) * W;
    // One prefetch per (at most) 128 bytes of values consumed. The address
    // is computed as an integer: it may lie past the end of the values.
    if (j % 2 == 0) {
      _mm_prefetch(
          reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(v) + at + kPrefetchBytes),
          _MM_HINT_T0);
    }
    x[j] = ExpandLoad<W>((word >> first) & kPerMask, v + at);
  }
#pragma GCC unroll 8
  for (uint32_t j = 0; j < W; ++j) {
    const uint32_t first = j * kPer;
    if constexpr (kFull) {
      _mm512_storeu_si512(out + j * 64, x[j]);
    } else {
      if (cols <= first) break;
      // bzhi keeps all 64 bits for an index of 64 (it reads only the
      // index's low byte, hence the clamp).
      const uint64_t bytes = (cols - first) * W;
      _mm512_mask_storeu_epi8(
          out + j * 64, _bzhi_u64(~0ull, bytes < 64 ? static_cast<uint32_t>(bytes) : 64u), x[j]);
    }
  }
  return _mm_popcnt_u64(word) * W;
}

template <uint32_t W>
TL_TARGET_AVX512 void Rows(const std::byte* values, const uint8_t* bitmask,
                           const int64_t* row_offsets, const BitmaskShape& s, uint64_t r0,
                           uint64_t r1, std::byte* dense) {
  const uint64_t mrow = s.mask_row_bytes();
  const uint64_t cols = s.cols;
  for (uint64_t r = r0; r < r1; ++r) {
    const uint8_t* mask = bitmask + r * mrow;
    const std::byte* v = values + static_cast<uint64_t>(row_offsets[r]) * W;
    std::byte* out = dense + r * cols * W;
    uint64_t c = 0;
    for (; c + kBlockCols <= cols; c += kBlockCols) {
      v += Block<W, true>(mask + c / 8, v, out + c * W, kBlockCols);
    }
    if (c < cols) {
      uint8_t last[8] = {};
      std::memcpy(last, mask + c / 8, (cols - c + 7) / 8);  // Not past the row's mask.
      Block<W, false>(last, v, out + c * W, cols - c);
    }
  }
}

}  // namespace

void DecodeRowsAvx512(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                      const BitmaskShape& s, uint64_t r0, uint64_t r1, std::byte* dense) {
  ByWidth(s.elem_bytes, [&](auto w) {
    Rows<decltype(w)::value>(values, bitmask, row_offsets, s, r0, r1, dense);
  });
}

}  // namespace tensorlift::sparse::detail

#endif  // TL_SPARSE_X86
