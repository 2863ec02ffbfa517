// Element-level dtype conversions, bit-exact with PyTorch on the CPU, usable
// from host code and from CUDA device code (header-only; no CUDA header, no
// standard library call that device code cannot make).
//
// Rounding: round to nearest, ties to even; no flush of subnormals; values
// past the target's range become infinity. Every conversion that is not
// exact goes through f32 with a single rounding at the end, as PyTorch does
// (bf16 -> f16 is bf16 -> f32 -> f16; fp8 -> f16 is fp8 -> f32 -> f16).
//
// NaN bit patterns: those of PyTorch's contiguous CPU conversions on x86
// with AVX2 or AVX-512 (its usual kernels), measured with torch 2.15 and
// checked by tests/python/test_convert.py. PyTorch itself is not consistent
// across pairs, so neither is this:
// - f32 -> bf16: every NaN becomes 0xFFFF (ATen's vectorised
//   cvtfp32_bf16). c10::BFloat16, and torch built or run without AVX2, give
//   0x7FC0 instead.
// - f16, fp8 -> bf16 (through f32): every NaN becomes 0x7FC0 (sign dropped),
//   as c10::BFloat16's round_to_nearest_even.
// - f32 -> f16 (also bf16, fp8 -> f16 through f32): a NaN keeps its sign
//   and the top 10 payload bits and is made quiet (sign | 0x7E00 |
//   payload >> 13), as x86 F16C's vcvtps2ph.
// - f16 -> f32: the payload is widened and the NaN made quiet, as F16C's
//   vcvtph2ps. (PyTorch's scalar tail loop, for the last count % 8
//   elements of a tensor, gives 0x7FFFFFFF instead; this follows its
//   vectorised body.)
// - bf16 -> f32: a shift; every NaN is kept as it is (signalling included).
// - fp8 e4m3fn -> f32: the NaNs 0x7F / 0xFF become sign | 0x7FF00000 (c10's
//   fp8e4m3fn_to_fp32_value). e4m3fn has no infinity.
// - fp8 e5m2 -> f32: through f16 (the byte is the upper half of an f16), so
//   a NaN is made quiet with its 2 payload bits kept.
// The identity copies the bits unchanged.
//
// Everything here is a pure function: thread-safe, no allocation.
#ifndef TENSORLIFT_DEVICE_CONVERT_H_
#define TENSORLIFT_DEVICE_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tensorlift/dtype.h"

#if defined(__CUDACC__)
#define TL_HD __host__ __device__
#else
#define TL_HD
#endif
#define TL_HD_INLINE TL_HD inline

namespace tensorlift::convert {

// Bit casts between float and uint32_t, valid in host and device code.
TL_HD_INLINE uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TL_HD_INLINE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The helpers below use integer operations, constant shifts and selects
// only, so that host loops over them vectorise.
namespace internal {

// f32 bits -> bf16 bits; every NaN becomes `nan`.
TL_HD_INLINE uint16_t F32BitsToBf16(uint32_t u, uint16_t nan) {
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// The bf16 NaN that PyTorch's CPU conversion from `from` gives (see the top
// of this file).
TL_HD_INLINE uint16_t Bf16NanFrom(Dtype from) { return from == Dtype::kF32 ? 0xFFFFu : 0x7FC0u; }

// f32 bits -> f16 bits.
TL_HD_INLINE uint16_t F32BitsToF16(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal f16 range [2^-14, 65520): rebias the exponent (127 -> 15) and
  // round the 23-bit mantissa to 10 bits. A carry out of the mantissa
  // correctly bumps the exponent.
  const uint32_t rebiased = a - 0x38000000u;
  const uint32_t normal = (rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13;
  // Below 2^-14 (f16 subnormals and zero): the value in units of 2^-24 is
  // m * 2^(e - 126), m the 24-bit significand; shift m right by 126 - e =
  // 14 + k, rounding to nearest even. k is clamped to 12, which gives 0 for
  // every input below 2^-26. Integer operations and constant shifts only,
  // so that loops over this vectorise (no variable shift, no float
  // operation that compilers will not if-convert).
  const uint32_t e = a >> 23;
  const uint32_t k = e >= 112u ? 0u : (e <= 100u ? 12u : 112u - e);
  uint32_t x = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t sticky = 0;  // Nonzero when a bit shifted out below x is set.
  sticky |= (k & 8u) ? (x & 0xFFu) : 0u;
  x = (k & 8u) ? x >> 8 : x;
  sticky |= (k & 4u) ? (x & 0xFu) : 0u;
  x = (k & 4u) ? x >> 4 : x;
  sticky |= (k & 2u) ? (x & 0x3u) : 0u;
  x = (k & 2u) ? x >> 2 : x;
  sticky |= (k & 1u) ? (x & 0x1u) : 0u;
  x = (k & 1u) ? x >> 1 : x;
  const uint32_t q = x >> 14;
  const uint32_t rem = x & 0x3FFFu;
  const bool up = rem > 0x2000u || (rem == 0x2000u && (sticky != 0 || (q & 1u) != 0));
  const uint32_t subnormal = q + (up ? 1u : 0u);
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  uint32_t r = a >= 0x38800000u ? normal : subnormal;
  r = a >= 0x477FF000u ? 0x7C00u : r;  // 65520 and up (and inf) round to inf.
  r = a > 0x7F800000u ? nan : r;
  return static_cast<uint16_t>(sign | r);
}

// f16 bits -> f32 bits (exact).
TL_HD_INLINE uint32_t F16ToF32Bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  const uint32_t normal = ((e + 112u) << 23) | (m << 13);
  // A subnormal m * 2^-24 is a normal f32: shift m left by s until its top
  // bit is bit 10; the value is then 2^(-14 - s) * (1 + (x & 0x3FF) / 2^10).
  // Integer operations only (see F32BitsToF16).
  uint32_t x = m;
  uint32_t s = 0;
  s += x < 0x8u ? 8u : 0u;
  x = x < 0x8u ? x << 8 : x;
  s += x < 0x80u ? 4u : 0u;
  x = x < 0x80u ? x << 4 : x;
  s += x < 0x200u ? 2u : 0u;
  x = x < 0x200u ? x << 2 : x;
  s += x < 0x400u ? 1u : 0u;
  x = x < 0x400u ? x << 1 : x;
  const uint32_t subnormal = m == 0 ? 0u : (((113u - s) << 23) | ((x & 0x3FFu) << 13));
  const uint32_t special = 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u);
  const uint32_t r = e == 0x1Fu ? special : (e == 0 ? subnormal : normal);
  return sign | r;
}

// fp8 e4m3fn bits -> f32 bits (exact).
TL_HD_INLINE uint32_t Fp8E4m3fnToF32Bits(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xFu;
  const uint32_t m = v & 0x7u;
  const uint32_t normal = ((e + 120u) << 23) | (m << 20);
  // A subnormal m * 2^-9: shift m left by s until its top bit is bit 2; the
  // value is then 2^(-7 - s) * (1 + (x & 3) / 4).
  uint32_t x = m;
  uint32_t s = 0;
  s += x < 0x2u ? 2u : 0u;
  x = x < 0x2u ? x << 2 : x;
  s += x < 0x4u ? 1u : 0u;
  x = x < 0x4u ? x << 1 : x;
  const uint32_t subnormal = m == 0 ? 0u : (((120u - s) << 23) | ((x & 0x3u) << 21));
  uint32_t r = e == 0 ? subnormal : normal;
  r = (v & 0x7Fu) == 0x7Fu ? 0x7FF00000u : r;
  return sign | r;
}

// fp8 e5m2 bits -> f32 bits (exact). The byte is the upper half of an f16,
// and this equals F16ToF32Bits(v << 8) (NaN made quiet), with less work.
TL_HD_INLINE uint32_t Fp8E5m2ToF32Bits(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t e = (v >> 2) & 0x1Fu;
  const uint32_t m = v & 0x3u;
  const uint32_t normal = ((e + 112u) << 23) | (m << 21);
  // A subnormal m * 2^-16: 1 -> 2^-16, 2 -> 2^-15, 3 -> 1.5 * 2^-15.
  const uint32_t subnormal =
      m == 0 ? 0u : (m == 1 ? (111u << 23) : ((112u << 23) | ((m & 1u) << 22)));
  const uint32_t special = 0x7F800000u | (m << 21) | (m != 0 ? 0x400000u : 0u);
  const uint32_t r = e == 0x1Fu ? special : (e == 0 ? subnormal : normal);
  return sign | r;
}

}  // namespace internal

// float -> bfloat16 bits, as PyTorch's f32 -> bf16: NaN becomes 0xFFFF.
TL_HD_INLINE uint16_t F32ToBf16(float f) {
  return internal::F32BitsToBf16(FloatToBits(f), 0xFFFFu);
}

// bfloat16 bits -> float (exact).
TL_HD_INLINE float Bf16ToF32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// float -> IEEE half bits.
TL_HD_INLINE uint16_t F32ToF16(float f) { return internal::F32BitsToF16(FloatToBits(f)); }

// IEEE half bits -> float (exact).
TL_HD_INLINE float F16ToF32(uint16_t h) { return BitsToFloat(internal::F16ToF32Bits(h)); }

// float8_e4m3fn bits -> float (exact).
TL_HD_INLINE float Fp8E4m3fnToF32(uint8_t v) {
  return BitsToFloat(internal::Fp8E4m3fnToF32Bits(v));
}

// float8_e5m2 bits -> float (exact; through f16, as PyTorch).
TL_HD_INLINE float Fp8E5m2ToF32(uint8_t v) { return BitsToFloat(internal::Fp8E5m2ToF32Bits(v)); }

// Bytes per element of a dtype with a whole number of bytes per element; 0
// for the sub-byte dtypes (F4, F6_*).
TL_HD_INLINE uint32_t ElementBytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF4:
    case Dtype::kF6_E2M3:
    case Dtype::kF6_E3M2:
      return 0;
    case Dtype::kBool:
    case Dtype::kU8:
    case Dtype::kI8:
    case Dtype::kF8_E5M2:
    case Dtype::kF8_E4M3:
    case Dtype::kF8_E8M0:
    case Dtype::kF8_E4M3FNUZ:
    case Dtype::kF8_E5M2FNUZ:
      return 1;
    case Dtype::kI16:
    case Dtype::kU16:
    case Dtype::kF16:
    case Dtype::kBF16:
      return 2;
    case Dtype::kI32:
    case Dtype::kU32:
    case Dtype::kF32:
      return 4;
    case Dtype::kC64:
    case Dtype::kF64:
    case Dtype::kI64:
    case Dtype::kU64:
      return 8;
  }
  return 0;
}

// True when `from` can be converted to `to`: the identity for every dtype;
// any pair among F32, F16 and BF16; F8_E4M3 (float8_e4m3fn) and F8_E5M2 to
// F32, F16 or BF16.
TL_HD_INLINE bool ConversionSupported(Dtype from, Dtype to) {
  if (from == to) return true;
  const bool to_float = to == Dtype::kF32 || to == Dtype::kF16 || to == Dtype::kBF16;
  switch (from) {
    case Dtype::kF32:
    case Dtype::kF16:
    case Dtype::kBF16:
    case Dtype::kF8_E4M3:
    case Dtype::kF8_E5M2:
      return to_float;
    default:
      return false;
  }
}

// The number of ConvertElement calls (the index range) that convert `count`
// elements: `count`, except for the identity of a sub-byte dtype (F4, F6_*),
// whose elements are not addressable: there the unit is a byte, and the
// caller passes a count whose bits fill whole bytes. Requires
// ConversionSupported(from, to).
TL_HD_INLINE uint64_t ConvertUnits(Dtype from, Dtype to, uint64_t count) {
  if (from == to && ElementBytes(from) == 0) {
    const uint64_t bits = from == Dtype::kF4 ? 4 : 6;
    return count / 8 * bits + count % 8 * bits / 8;  // count * bits / 8 without overflow.
  }
  return count;
}

// Reads element `i` of `src` (dtype `from`: F32, F16, BF16, F8_E4M3 or
// F8_E5M2) as f32 bits. Bits, not a float, so that NaN payloads never pass
// through floating-point registers.
TL_HD_INLINE uint32_t LoadAsF32Bits(const std::byte* src, Dtype from, uint64_t i) {
  switch (from) {
    case Dtype::kF16: {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      return internal::F16ToF32Bits(h);
    }
    case Dtype::kBF16: {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      return static_cast<uint32_t>(h) << 16;
    }
    case Dtype::kF8_E4M3:
      return internal::Fp8E4m3fnToF32Bits(static_cast<uint8_t>(src[i]));
    case Dtype::kF8_E5M2:
      return internal::Fp8E5m2ToF32Bits(static_cast<uint8_t>(src[i]));
    default: {
      uint32_t u;
      memcpy(&u, src + 4 * i, 4);
      return u;
    }
  }
}

// Writes f32 bits `u`, read from a `from` element, as element `i` of `dst`
// (dtype `to`: F32, F16 or BF16).
TL_HD_INLINE void StoreFromF32Bits(std::byte* dst, Dtype to, uint64_t i, uint32_t u, Dtype from) {
  switch (to) {
    case Dtype::kF16: {
      const uint16_t h = internal::F32BitsToF16(u);
      memcpy(dst + 2 * i, &h, 2);
      return;
    }
    case Dtype::kBF16: {
      const uint16_t h = internal::F32BitsToBf16(u, internal::Bf16NanFrom(from));
      memcpy(dst + 2 * i, &h, 2);
      return;
    }
    default:
      memcpy(dst + 4 * i, &u, 4);
      return;
  }
}

// Converts element `i` (a unit of ConvertUnits) of `src` (dtype `from`) into
// element `i` of `dst` (dtype `to`). Requires ConversionSupported(from, to);
// an unsupported pair writes nothing. The identity copies the element's
// bytes unchanged (NaN payloads included); other pairs go through f32 with
// one rounding. One element per call, for a GPU kernel's thread; host loops
// use ConvertOnHost (tensorlift/convert.h), which gives the same bits faster.
TL_HD_INLINE void ConvertElement(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                                 uint64_t i) {
  if (from == to) {
    const uint32_t n = ElementBytes(from);
    if (n == 0) {
      dst[i] = src[i];
    } else {
      memcpy(dst + n * i, src + n * i, n);
    }
    return;
  }
  if (!ConversionSupported(from, to)) return;
  StoreFromF32Bits(dst, to, i, LoadAsF32Bits(src, from, i), from);
}

// Elements a thread of the vectorised kernel converts: 8, so that a group of
// 2-byte elements is one 16-byte load or store (4-byte: two; 1-byte: 8 bytes).
inline constexpr uint32_t kGroupElements = 8;

// Converts group `g` (elements 8g to 8g + 7) of `src` (dtype From) into `dst`
// (dtype To), with ConvertElement's bits: the group is loaded whole into
// registers, converted element by element there, and stored whole. From and
// To are compile-time, so no per-element switch is left. On the device, src
// and dst must be 16-byte aligned when a group spans 16 bytes or more (the
// launcher checks), and the loads and stores are 8- or 16-byte words.
// Requires ConversionSupported(From, To) and From != To.
template <Dtype From, Dtype To>
TL_HD_INLINE void ConvertGroup(std::byte* dst, const std::byte* src, uint64_t g) {
  constexpr uint32_t kIn = From == Dtype::kF32                           ? 4
                           : From == Dtype::kF16 || From == Dtype::kBF16 ? 2
                                                                         : 1;
  constexpr uint32_t kOut = To == Dtype::kF32 ? 4 : 2;
  constexpr uint32_t kInBytes = kGroupElements * kIn, kOutBytes = kGroupElements * kOut;
  alignas(16) std::byte in[kInBytes];
  alignas(16) std::byte out[kOutBytes];
  const std::byte* from = src + g * kInBytes;
  std::byte* to = dst + g * kOutBytes;
#ifdef __CUDA_ARCH__
  if constexpr (kInBytes % 16 == 0) {
    for (uint32_t w = 0; w < kInBytes / 16; ++w)
      reinterpret_cast<uint4*>(in)[w] = reinterpret_cast<const uint4*>(from)[w];
  } else {
    reinterpret_cast<uint2*>(in)[0] = reinterpret_cast<const uint2*>(from)[0];
  }
#else
  memcpy(in, from, kInBytes);
#endif
  for (uint32_t k = 0; k < kGroupElements; ++k) {
    StoreFromF32Bits(out, To, k, LoadAsF32Bits(in, From, k), From);
  }
#ifdef __CUDA_ARCH__
  for (uint32_t w = 0; w < kOutBytes / 16; ++w)
    reinterpret_cast<uint4*>(to)[w] = reinterpret_cast<const uint4*>(out)[w];
#else
  memcpy(to, out, kOutBytes);
#endif
}

}  // namespace tensorlift::convert

#endif  // TENSORLIFT_DEVICE_CONVERT_H_
