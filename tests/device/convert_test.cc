// The element conversions of convert.h and ConvertOnHost: known values,
// rounding, specials, exhaustive round trips, every fp8 pattern, and that the
// host loops give the same bits as ConvertElement.
#include "kernels/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorlift/convert.h"
#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

namespace tensorlift {
namespace {

using convert::Bf16ToF32;
using convert::BitsToFloat;
using convert::ConversionSupported;
using convert::ConvertElement;
using convert::F16ToF32;
using convert::F32ToBf16;
using convert::F32ToF16;
using convert::FloatToBits;
using convert::Fp8E4m3fnToF32;
using convert::Fp8E5m2ToF32;

float F(uint32_t bits) { return BitsToFloat(bits); }

TEST(ConvertTest, Bf16KnownValues) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16(-2.5f), 0xC020);
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  // Largest finite bf16 (0x7F7F) and the f32 max, which rounds up to inf.
  EXPECT_EQ(F32ToBf16(F(0x7F7F0000)), 0x7F7F);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7F80);
  // Just below the halfway point to inf stays finite.
  EXPECT_EQ(F32ToBf16(F(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(F32ToBf16(F(0x7F7F8000)), 0x7F80);
  // Min normal and subnormals are kept (no flush).
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::min()), 0x0080);
  EXPECT_EQ(F32ToBf16(F(0x00010000)), 0x0001);
  EXPECT_EQ(F32ToBf16(F(0x00000001)), 0x0000);
  EXPECT_EQ(F32ToBf16(F(0x80008000)), 0x8000);  // tie to even (0).
  EXPECT_EQ(F32ToBf16(F(0x00018000)), 0x0002);  // tie to even (2).
  // Ties to even on normals.
  EXPECT_EQ(F32ToBf16(F(0x3F808000)), 0x3F80);
  EXPECT_EQ(F32ToBf16(F(0x3F818000)), 0x3F82);
  EXPECT_EQ(F32ToBf16(F(0x3F808001)), 0x3F81);
  EXPECT_EQ(F32ToBf16(F(0x3F807FFF)), 0x3F80);
  // Infinities and NaN (every NaN becomes 0xFFFF, as PyTorch's f32 -> bf16).
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(F32ToBf16(F(0x7FC00000)), 0xFFFF);
  EXPECT_EQ(F32ToBf16(F(0xFFC00000)), 0xFFFF);
  EXPECT_EQ(F32ToBf16(F(0x7F800001)), 0xFFFF);
  EXPECT_EQ(F32ToBf16(F(0x7FFFFFFF)), 0xFFFF);

  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xC020), -2.5f);
  EXPECT_EQ(FloatToBits(Bf16ToF32(0x0001)), 0x00010000u);
  EXPECT_EQ(FloatToBits(Bf16ToF32(0xFF81)), 0xFF810000u);  // A signalling NaN stays as it is.
}

TEST(ConvertTest, F16KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.5f), 0xC100);
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.996f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // Halfway to 65536: ties to even, inf.
  EXPECT_EQ(F32ToF16(-1e6f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);  // Min normal.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // Min subnormal.
  EXPECT_EQ(F32ToF16(std::ldexp(1023.0f, -24)), 0x03FF);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);              // Tie to even (0).
  EXPECT_EQ(F32ToF16(F(0x33000001)), 0x0001);                      // Just above the tie.
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);              // Tie to even (2).
  EXPECT_EQ(F32ToF16(std::ldexp(5.0f, -25)), 0x0002);              // Tie to even (2).
  EXPECT_EQ(F32ToF16(std::ldexp(2047.0f, -25)), 0x0400);           // Rounds up into the normals.
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::min()), 0x0000);  // f32 min normal underflows.
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // Tie to even (down).
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // Tie to even (up).
  EXPECT_EQ(F32ToF16(F(0x3F801001)), 0x3C01);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  // NaN: sign and top payload bits kept, made quiet (as F16C).
  EXPECT_EQ(F32ToF16(F(0x7FC00000)), 0x7E00);
  EXPECT_EQ(F32ToF16(F(0xFFC00000)), 0xFE00);
  EXPECT_EQ(F32ToF16(F(0x7F800001)), 0x7E00);
  EXPECT_EQ(F32ToF16(F(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(F32ToF16(F(0x7F802000)), 0x7E01);

  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC100), -2.5f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(FloatToBits(F16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(FloatToBits(F16ToF32(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(FloatToBits(F16ToF32(0x7C01)), 0x7FC02000u);  // Signalling: made quiet.
  EXPECT_EQ(FloatToBits(F16ToF32(0xFFFF)), 0xFFFFE000u);
}

// Every fp8 pattern against its definition: (-1)^s * 2^(e - bias) * (1 + m / 2^M)
// for normals, 2^(1 - bias) * m / 2^M for subnormals.
float Fp8Reference(uint8_t v, int exponent_bits, int bias) {
  const int mantissa_bits = 7 - exponent_bits;
  const int e = (v & 0x7F) >> mantissa_bits;
  const int m = v & ((1 << mantissa_bits) - 1);
  const float magnitude =
      e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - mantissa_bits)
             : std::ldexp(static_cast<float>(m + (1 << mantissa_bits)), e - bias - mantissa_bits);
  return (v & 0x80) ? -magnitude : magnitude;
}

TEST(ConvertTest, EveryFp8E4m3fnPattern) {
  for (int v = 0; v < 256; ++v) {
    SCOPED_TRACE(v);
    const float f = Fp8E4m3fnToF32(static_cast<uint8_t>(v));
    if ((v & 0x7F) == 0x7F) {
      EXPECT_EQ(FloatToBits(f), (v & 0x80 ? 0x80000000u : 0u) | 0x7FF00000u);
      continue;
    }
    EXPECT_EQ(FloatToBits(f), FloatToBits(Fp8Reference(static_cast<uint8_t>(v), 4, 7)));
  }
  EXPECT_EQ(Fp8E4m3fnToF32(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4m3fnToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4m3fnToF32(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3fnToF32(0xC2), -2.5f);
  EXPECT_EQ(FloatToBits(Fp8E4m3fnToF32(0x80)), 0x80000000u);
}

TEST(ConvertTest, EveryFp8E5m2Pattern) {
  for (int v = 0; v < 256; ++v) {
    SCOPED_TRACE(v);
    const float f = Fp8E5m2ToF32(static_cast<uint8_t>(v));
    const uint32_t sign = v & 0x80 ? 0x80000000u : 0u;
    if ((v & 0x7C) == 0x7C) {
      // Infinity, or a NaN made quiet with its 2 payload bits kept.
      const uint32_t m = v & 0x3;
      EXPECT_EQ(FloatToBits(f), sign | 0x7F800000u | (m << 21) | (m != 0 ? 0x400000u : 0u));
      continue;
    }
    EXPECT_EQ(FloatToBits(f), FloatToBits(Fp8Reference(static_cast<uint8_t>(v), 5, 15)));
    // e5m2 is the upper half of an f16.
    EXPECT_EQ(FloatToBits(f), FloatToBits(F16ToF32(static_cast<uint16_t>(v << 8))));
  }
  EXPECT_EQ(Fp8E5m2ToF32(0x7B), 57344.0f);
  EXPECT_EQ(Fp8E5m2ToF32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(Fp8E5m2ToF32(0x3C), 1.0f);
  EXPECT_EQ(Fp8E5m2ToF32(0xC1), -2.5f);
}

bool IsNanBf16(uint16_t h) { return (h & 0x7FFF) > 0x7F80; }
bool IsNanF16(uint16_t h) { return (h & 0x7FFF) > 0x7C00; }

TEST(ConvertTest, EveryBf16PatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (IsNanBf16(static_cast<uint16_t>(h))) {
      EXPECT_EQ(F32ToBf16(Bf16ToF32(static_cast<uint16_t>(h))), 0xFFFF) << h;
    } else {
      EXPECT_EQ(F32ToBf16(Bf16ToF32(static_cast<uint16_t>(h))), h) << h;
    }
  }
}

TEST(ConvertTest, EveryF16PatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t back = F32ToF16(F16ToF32(static_cast<uint16_t>(h)));
    if (IsNanF16(static_cast<uint16_t>(h))) {
      EXPECT_EQ(back, h | 0x0200) << h;  // Made quiet.
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

// F32 -> F16 against the value-level definition: the nearest f16 (ties to
// even) of every f32 whose upper 16 bits are given, with several low halves.
TEST(ConvertTest, F32ToF16MatchesNearestEven) {
  // All 63,488 finite f16 values, sorted by value for the non-negative ones.
  std::vector<double> values;
  for (uint32_t h = 0; h < 0x7C00; ++h)
    values.push_back(static_cast<double>(F16ToF32(static_cast<uint16_t>(h))));
  for (uint32_t hi = 0; hi < 0x8000; ++hi) {
    for (uint32_t lo : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t bits = hi << 16 | lo;
      if ((bits & 0x7FFFFFFF) >= 0x7F800000) continue;
      const double x = static_cast<double>(F(bits));
      const uint16_t got = F32ToF16(F(bits));
      uint32_t want;
      if (x >= 65520.0) {
        want = 0x7C00;
      } else {
        const auto it = std::lower_bound(values.begin(), values.end(), x);
        const uint32_t above = static_cast<uint32_t>(it - values.begin());
        if (above < values.size() && values[above] == x) {
          want = above;
        } else {
          const uint32_t below = above - 1;
          const double d_below = x - values[below];
          const double d_above = (above < values.size() ? values[above] : 65536.0) - x;
          want = d_below < d_above   ? below
                 : d_above < d_below ? above
                                     : (below % 2 == 0 ? below : above);
        }
      }
      ASSERT_EQ(got, want) << std::hex << bits;
      ASSERT_EQ(F32ToF16(F(bits | 0x80000000u)), want | 0x8000) << std::hex << bits;
    }
  }
}

TEST(ConvertTest, ConversionSupported) {
  const Dtype floats[] = {Dtype::kF32, Dtype::kF16, Dtype::kBF16};
  for (int i = 0; i < kNumDtypes; ++i) {
    EXPECT_TRUE(ConversionSupported(static_cast<Dtype>(i), static_cast<Dtype>(i)));
  }
  for (Dtype to : floats) {
    for (Dtype from : {Dtype::kF32, Dtype::kF16, Dtype::kBF16, Dtype::kF8_E4M3, Dtype::kF8_E5M2}) {
      EXPECT_TRUE(ConversionSupported(from, to));
    }
  }
  EXPECT_FALSE(ConversionSupported(Dtype::kF32, Dtype::kF8_E4M3));
  EXPECT_FALSE(ConversionSupported(Dtype::kF16, Dtype::kF8_E5M2));
  EXPECT_FALSE(ConversionSupported(Dtype::kF8_E4M3, Dtype::kF8_E5M2));
  EXPECT_FALSE(ConversionSupported(Dtype::kF8_E4M3FNUZ, Dtype::kF32));
  EXPECT_FALSE(ConversionSupported(Dtype::kF64, Dtype::kF32));
  EXPECT_FALSE(ConversionSupported(Dtype::kF32, Dtype::kF64));
  EXPECT_FALSE(ConversionSupported(Dtype::kI32, Dtype::kF32));
  EXPECT_FALSE(ConversionSupported(Dtype::kF32, Dtype::kI8));
  int supported = 0;
  for (int i = 0; i < kNumDtypes; ++i) {
    for (int j = 0; j < kNumDtypes; ++j)
      supported += ConversionSupported(static_cast<Dtype>(i), static_cast<Dtype>(j));
  }
  EXPECT_EQ(supported, kNumDtypes + 6 + 6);
}

// Every input pattern of `from` (all of them for 8 and 16 bits; a sample of
// f32), converted by ConvertOnHost and by ConvertElement, one element at a
// time: the same bits.
std::vector<std::byte> Patterns(Dtype from) {
  const uint32_t bytes = convert::ElementBytes(from);
  std::vector<std::byte> out;
  if (bytes == 4) {
    uint32_t x = 12345;
    for (int i = 0; i < 200000; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint32_t v = i < 0x10000 ? (static_cast<uint32_t>(i) << 16 | (x >> 16)) : x;
      const auto* p = reinterpret_cast<const std::byte*>(&v);
      out.insert(out.end(), p, p + 4);
    }
    return out;
  }
  const uint32_t n = bytes == 1 ? 0x100 : 0x10000;
  for (uint32_t v = 0; v < n; ++v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + bytes);
  }
  return out;
}

TEST(ConvertTest, HostLoopsMatchConvertElement) {
  for (Dtype from : {Dtype::kF32, Dtype::kF16, Dtype::kBF16, Dtype::kF8_E4M3, Dtype::kF8_E5M2}) {
    for (Dtype to : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
      SCOPED_TRACE(std::string(DtypeName(from)) + " -> " + std::string(DtypeName(to)));
      const std::vector<std::byte> src = Patterns(from);
      const uint64_t count = src.size() / convert::ElementBytes(from);
      // Offset by one byte: the host loops need no alignment.
      std::vector<std::byte> fast(count * convert::ElementBytes(to) + 1);
      std::vector<std::byte> slow(count * convert::ElementBytes(to));
      ASSERT_OK(ConvertOnHost(fast.data() + 1, to, src.data(), from, count));
      for (uint64_t i = 0; i < count; ++i) ConvertElement(slow.data(), to, src.data(), from, i);
      ASSERT_EQ(std::memcmp(fast.data() + 1, slow.data(), slow.size()), 0);
      if (from == to) {
        ASSERT_EQ(std::memcmp(fast.data() + 1, src.data(), src.size()), 0);
      }
    }
  }
}

TEST(ConvertTest, ConvertElementValues) {
  const float in[] = {1.0f, -2.5f, 65504.0f};
  uint16_t bf16[3] = {};
  uint16_t f16[3] = {};
  for (uint64_t i = 0; i < 3; ++i) {
    ConvertElement(reinterpret_cast<std::byte*>(bf16), Dtype::kBF16,
                   reinterpret_cast<const std::byte*>(in), Dtype::kF32, i);
    ConvertElement(reinterpret_cast<std::byte*>(f16), Dtype::kF16,
                   reinterpret_cast<const std::byte*>(bf16), Dtype::kBF16, i);
  }
  EXPECT_THAT(bf16, ::testing::ElementsAre(0x3F80, 0xC020, 0x4780));
  // bf16 65536 (rounded from 65504) overflows f16.
  EXPECT_THAT(f16, ::testing::ElementsAre(0x3C00, 0xC100, 0x7C00));

  // Unsupported pair: nothing written.
  uint8_t out[4] = {0xAA, 0xAA, 0xAA, 0xAA};
  ConvertElement(reinterpret_cast<std::byte*>(out), Dtype::kF8_E4M3,
                 reinterpret_cast<const std::byte*>(in), Dtype::kF32, 0);
  EXPECT_THAT(out, ::testing::ElementsAre(0xAA, 0xAA, 0xAA, 0xAA));

  // Identity of a wide type copies its bytes, NaN payload included.
  const uint64_t c64[2] = {0x7FF0000000000001ull, 0x0123456789ABCDEFull};
  uint64_t c64_out[2] = {};
  for (uint64_t i = 0; i < 2; ++i) {
    ConvertElement(reinterpret_cast<std::byte*>(c64_out), Dtype::kF64,
                   reinterpret_cast<const std::byte*>(c64), Dtype::kF64, i);
  }
  EXPECT_THAT(c64_out, ::testing::ElementsAre(c64[0], c64[1]));

  // Identity of a sub-byte dtype goes by bytes.
  EXPECT_EQ(convert::ConvertUnits(Dtype::kF4, Dtype::kF4, 6), 3u);
  EXPECT_EQ(convert::ConvertUnits(Dtype::kF6_E2M3, Dtype::kF6_E2M3, 8), 6u);
  EXPECT_EQ(convert::ConvertUnits(Dtype::kF4, Dtype::kF4, std::numeric_limits<uint64_t>::max() - 1),
            std::numeric_limits<uint64_t>::max() / 2);
  EXPECT_EQ(convert::ConvertUnits(Dtype::kBF16, Dtype::kF32, 7), 7u);
  const uint8_t f4[3] = {0x12, 0x34, 0x56};
  uint8_t f4_out[3] = {};
  for (uint64_t i = 0; i < convert::ConvertUnits(Dtype::kF4, Dtype::kF4, 6); ++i) {
    ConvertElement(reinterpret_cast<std::byte*>(f4_out), Dtype::kF4,
                   reinterpret_cast<const std::byte*>(f4), Dtype::kF4, i);
  }
  EXPECT_THAT(f4_out, ::testing::ElementsAre(0x12, 0x34, 0x56));
}

TEST(ConvertOnHostTest, UnsupportedPairIsInvalidArgument) {
  float in[2] = {1.0f, 2.0f};
  uint8_t out[8] = {};
  const Status st = ConvertOnHost(reinterpret_cast<std::byte*>(out), Dtype::kF8_E4M3,
                                  reinterpret_cast<const std::byte*>(in), Dtype::kF32, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("F32 to F8_E4M3"));
  EXPECT_THAT(out, ::testing::Each(0));
  // Unsupported even when there is nothing to convert.
  EXPECT_EQ(ConvertOnHost(nullptr, Dtype::kI32, nullptr, Dtype::kF32, 0).code(),
            StatusCode::kInvalidArgument);
}

TEST(ConvertOnHostTest, CountZeroIsOk) {
  EXPECT_OK(ConvertOnHost(nullptr, Dtype::kBF16, nullptr, Dtype::kF32, 0));
  EXPECT_OK(ConvertOnHost(nullptr, Dtype::kF32, nullptr, Dtype::kF32, 0));
  uint16_t out = 0xBEEF;
  const float in = 1.0f;
  EXPECT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(&out), Dtype::kBF16,
                            reinterpret_cast<const std::byte*>(&in), Dtype::kF32, 0)
                  .ok());
  EXPECT_EQ(out, 0xBEEF);
}

TEST(ConvertOnHostTest, BadArguments) {
  float in = 1.0f;
  uint16_t out = 0;
  EXPECT_EQ(
      ConvertOnHost(nullptr, Dtype::kBF16, reinterpret_cast<const std::byte*>(&in), Dtype::kF32, 1)
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertOnHost(reinterpret_cast<std::byte*>(&out), Dtype::kBF16, nullptr, Dtype::kF32, 1)
                .code(),
            StatusCode::kInvalidArgument);
  // An identity copy of F4 must fill whole bytes; a huge count overflows.
  uint8_t b[2] = {};
  EXPECT_EQ(ConvertOnHost(reinterpret_cast<std::byte*>(b), Dtype::kF4,
                          reinterpret_cast<const std::byte*>(b + 1), Dtype::kF4, 3)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertOnHost(reinterpret_cast<std::byte*>(&out), Dtype::kF32,
                          reinterpret_cast<const std::byte*>(&in), Dtype::kF32,
                          std::numeric_limits<uint64_t>::max() / 2)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(ConvertOnHostTest, IdentityCopiesBytes) {
  const uint8_t f4[3] = {0x12, 0x34, 0x56};
  uint8_t f4_out[3] = {};
  ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(f4_out), Dtype::kF4,
                            reinterpret_cast<const std::byte*>(f4), Dtype::kF4, 6)
                  .ok());
  EXPECT_THAT(f4_out, ::testing::ElementsAre(0x12, 0x34, 0x56));
  const uint32_t nan[2] = {0x7F800001u, 0xFFFFFFFFu};
  uint32_t nan_out[2] = {};
  ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(nan_out), Dtype::kF32,
                            reinterpret_cast<const std::byte*>(nan), Dtype::kF32, 2)
                  .ok());
  EXPECT_THAT(nan_out, ::testing::ElementsAre(0x7F800001u, 0xFFFFFFFFu));
}

TEST(ConvertOnHostTest, ThroughF32WithOneRounding) {
  // bf16 -> f16 rounds once: bf16 0x3F81 = 1.0078125 is exact in f16.
  const uint16_t bf16[3] = {0x3F81, 0x0001, 0x477F};
  uint16_t f16[3] = {};
  ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(f16), Dtype::kF16,
                            reinterpret_cast<const std::byte*>(bf16), Dtype::kBF16, 3)
                  .ok());
  // bf16 0x0001 (about 9.2e-41) underflows to 0; 0x477F = 65280 is exact.
  EXPECT_THAT(f16, ::testing::ElementsAre(0x3C08, 0x0000, 0x7BF8));
  // f16 -> bf16: 0x3C01 = 1 + 2^-10 rounds to 1.0 (tie? no: 2^-10 < half ulp 2^-8).
  const uint16_t f16_in[2] = {0x3C01, 0x0001};
  uint16_t bf16_out[2] = {};
  ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(bf16_out), Dtype::kBF16,
                            reinterpret_cast<const std::byte*>(f16_in), Dtype::kF16, 2)
                  .ok());
  EXPECT_THAT(bf16_out, ::testing::ElementsAre(0x3F80, 0x3380));
}

// The NaN of a bf16 result depends on the source, as in PyTorch.
TEST(ConvertOnHostTest, Bf16NanDependsOnTheSource) {
  const uint32_t f32[2] = {0x7FC00000u, 0xFF800001u};
  const uint16_t f16[2] = {0x7E00, 0xFC01};
  const uint8_t e4m3[2] = {0x7F, 0xFF};
  const uint8_t e5m2[2] = {0x7D, 0xFE};
  struct Case {
    const void* src;
    Dtype from;
    uint16_t nan;
  };
  for (const Case& c : {Case{f32, Dtype::kF32, 0xFFFF}, Case{f16, Dtype::kF16, 0x7FC0},
                        Case{e4m3, Dtype::kF8_E4M3, 0x7FC0}, Case{e5m2, Dtype::kF8_E5M2, 0x7FC0}}) {
    SCOPED_TRACE(DtypeName(c.from));
    uint16_t out[2] = {};
    ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(out), Dtype::kBF16,
                              static_cast<const std::byte*>(c.src), c.from, 2)
                    .ok());
    EXPECT_THAT(out, ::testing::ElementsAre(c.nan, c.nan));
    for (uint64_t i = 0; i < 2; ++i) {
      ConvertElement(reinterpret_cast<std::byte*>(out), Dtype::kBF16,
                     static_cast<const std::byte*>(c.src), c.from, i);
    }
    EXPECT_THAT(out, ::testing::ElementsAre(c.nan, c.nan));
  }
  // f16 keeps the payload (bf16 0x7F81 is f32 0x7F810000).
  const uint16_t bf16[1] = {0x7F81};
  uint16_t out = 0;
  ASSERT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(&out), Dtype::kF16,
                            reinterpret_cast<const std::byte*>(bf16), Dtype::kBF16, 1)
                  .ok());
  EXPECT_EQ(out, 0x7E08);
}

// ConvertGroup (the vectorised GPU kernel's element logic, on the host here)
// gives ConvertElement's bits for every pair it serves, over patterns that
// include NaNs, infinities, subnormals and values that round.
template <Dtype From, Dtype To>
void ExpectGroupsMatchElements() {
  constexpr uint64_t kGroups = 4096;
  const uint32_t in = DtypeBits(From) / 8, out = DtypeBits(To) / 8;
  std::vector<std::byte> src(kGroups * convert::kGroupElements * in);
  uint64_t x = 0x9E3779B97F4A7C15ull * (static_cast<int>(From) + 1) + static_cast<int>(To);
  for (auto& b : src) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  // Some special patterns at known places: all ones, sign bits, zero.
  for (uint64_t i = 0; i < 64 && i < src.size(); ++i) src[i] = std::byte{0xFF};
  for (uint64_t i = 64; i < 128 && i < src.size(); ++i) src[i] = std::byte{0x80};
  for (uint64_t i = 128; i < 192 && i < src.size(); ++i) src[i] = std::byte{0x00};
  std::vector<std::byte> want(kGroups * convert::kGroupElements * out), got(want.size());
  for (uint64_t i = 0; i < kGroups * convert::kGroupElements; ++i) {
    convert::ConvertElement(want.data(), To, src.data(), From, i);
  }
  for (uint64_t g = 0; g < kGroups; ++g) convert::ConvertGroup<From, To>(got.data(), src.data(), g);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
      << DtypeName(From) << " -> " << DtypeName(To);
}

TEST(ConvertTest, GroupsMatchElementsForEveryVectorisedPair) {
  ExpectGroupsMatchElements<Dtype::kBF16, Dtype::kF16>();
  ExpectGroupsMatchElements<Dtype::kBF16, Dtype::kF32>();
  ExpectGroupsMatchElements<Dtype::kF16, Dtype::kBF16>();
  ExpectGroupsMatchElements<Dtype::kF16, Dtype::kF32>();
  ExpectGroupsMatchElements<Dtype::kF32, Dtype::kBF16>();
  ExpectGroupsMatchElements<Dtype::kF32, Dtype::kF16>();
  ExpectGroupsMatchElements<Dtype::kF8_E4M3, Dtype::kF16>();
  ExpectGroupsMatchElements<Dtype::kF8_E4M3, Dtype::kBF16>();
  ExpectGroupsMatchElements<Dtype::kF8_E4M3, Dtype::kF32>();
  ExpectGroupsMatchElements<Dtype::kF8_E5M2, Dtype::kF16>();
  ExpectGroupsMatchElements<Dtype::kF8_E5M2, Dtype::kBF16>();
  ExpectGroupsMatchElements<Dtype::kF8_E5M2, Dtype::kF32>();
}

}  // namespace
}  // namespace tensorlift
