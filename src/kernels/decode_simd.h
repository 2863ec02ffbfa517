// Internal to the sparse-bitmask codec (bitmask.h): the row decoders of each
// ISA. The SIMD ones live in their own translation units (decode_avx2.cc,
// decode_avx512.cc) whose functions carry [[gnu::target]], so the library
// needs no global -mavx2 and still runs on any x86-64; bitmask.cc calls one
// only after Supported() said the CPU has its ISA.
//
// Every decoder has DecodeRows's contract: rows [r0, r1) of a validated
// encoding are written into `dense` (the whole tensor's buffer), zeros
// included, and nothing else is written; `values` is read only inside the
// values of those rows (the SIMD loads never cross the end of the last row's
// values, so an array of exactly nnz elements is safe; only prefetches,
// which cannot fault, look further).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tensorlift/bitmask.h"

// The SIMD decoders are built for x86-64 with GCC or clang (both take
// [[gnu::target]] and the intrinsics under it).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TL_SPARSE_X86 1
#else
#define TL_SPARSE_X86 0
#endif

namespace tensorlift::sparse::detail {

// Calls f(std::integral_constant<uint32_t, W>{}) for the element width W in
// bytes: 1, 2, 4, or 8 for anything else (CheckShape allows no other).
template <typename F>
void ByWidth(uint32_t elem_bytes, F&& f) {
  switch (elem_bytes) {
    case 1:
      f(std::integral_constant<uint32_t, 1>{});
      return;
    case 2:
      f(std::integral_constant<uint32_t, 2>{});
      return;
    case 4:
      f(std::integral_constant<uint32_t, 4>{});
      return;
    default:
      f(std::integral_constant<uint32_t, 8>{});
      return;
  }
}

// One past the last value of rows [r0, r1) (r0 < r1), in elements: where the
// SIMD decoders' loads must stop.
uint64_t ValuesEnd(const uint8_t* bitmask, const int64_t* row_offsets, const BitmaskShape& shape,
                   uint64_t r1);

void DecodeRowsScalar(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                      const BitmaskShape& shape, uint64_t r0, uint64_t r1, std::byte* dense);

#if TL_SPARSE_X86
// pshufb lookup tables; needs AVX2, POPCNT.
void DecodeRowsAvx2(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                    const BitmaskShape& shape, uint64_t r0, uint64_t r1, std::byte* dense);
// vpexpand{b,w,d,q} from memory; needs AVX-512 F, BW, VBMI2 and BMI2, POPCNT.
void DecodeRowsAvx512(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                      const BitmaskShape& shape, uint64_t r0, uint64_t r1, std::byte* dense);
#endif

}  // namespace tensorlift::sparse::detail
