// ConvertOnHost: one tight loop per (from, to) pair, each an instance of a
// template over the element functions of convert.h, so that the compiler
// sees a branch-free body it can vectorise and no loop dispatches per element.
#include <cstring>
#include <string>

#include "common/checked_math.h"
#include "kernels/convert.h"
#include "tensorlift/convert.h"

namespace tensorlift {
namespace {

using convert::internal::Bf16NanFrom;
using convert::internal::F16ToF32Bits;
using convert::internal::F32BitsToBf16;
using convert::internal::F32BitsToF16;
using convert::internal::Fp8E4m3fnToF32Bits;
using convert::internal::Fp8E5m2ToF32Bits;

// The storage type of each supported dtype, its widening to f32 bits and
// (for the targets) the narrowing of f32 bits read from a `From` element.
// Working on bits keeps NaN payloads out of floating-point registers.
template <Dtype D>
struct Elem;

template <>
struct Elem<Dtype::kF32> {
  using T = uint32_t;
  static uint32_t ToF32(T v) { return v; }
  template <Dtype From>
  static T FromF32(uint32_t u) {
    return u;
  }
};
template <>
struct Elem<Dtype::kBF16> {
  using T = uint16_t;
  static uint32_t ToF32(T v) { return static_cast<uint32_t>(v) << 16; }
  template <Dtype From>
  static T FromF32(uint32_t u) {
    return F32BitsToBf16(u, Bf16NanFrom(From));
  }
};
template <>
struct Elem<Dtype::kF16> {
  using T = uint16_t;
  static uint32_t ToF32(T v) { return F16ToF32Bits(v); }
  template <Dtype From>
  static T FromF32(uint32_t u) {
    return F32BitsToF16(u);
  }
};
template <>
struct Elem<Dtype::kF8_E4M3> {
  using T = uint8_t;
  static uint32_t ToF32(T v) { return Fp8E4m3fnToF32Bits(v); }
};
template <>
struct Elem<Dtype::kF8_E5M2> {
  using T = uint8_t;
  static uint32_t ToF32(T v) { return Fp8E5m2ToF32Bits(v); }
};

// One element of a pair. Loaded and stored with memcpy: `src` and `dst`
// need no alignment.
template <Dtype From, Dtype To>
inline void ConvertOne(std::byte* __restrict dst, const std::byte* __restrict src, uint64_t i) {
  using S = typename Elem<From>::T;
  using D = typename Elem<To>::T;
  S s;
  std::memcpy(&s, src + i * sizeof(S), sizeof(S));
  const D d = Elem<To>::template FromF32<From>(Elem<From>::ToF32(s));
  std::memcpy(dst + i * sizeof(D), &d, sizeof(D));
}

// Blocks of a fixed number of elements, whose constant trip count lets the
// compiler vectorise even under -O2's cost model, then a scalar tail.
constexpr uint64_t kBlock = 64;

template <Dtype From, Dtype To>
[[gnu::always_inline]] inline void ConvertBlocks(std::byte* __restrict dst,
                                                 const std::byte* __restrict src, uint64_t count) {
  using S = typename Elem<From>::T;
  using D = typename Elem<To>::T;
  uint64_t i = 0;
  for (; count - i >= kBlock; i += kBlock) {
    std::byte* __restrict block_dst = dst + i * sizeof(D);
    const std::byte* __restrict block_src = src + i * sizeof(S);
    for (uint64_t j = 0; j < kBlock; ++j) ConvertOne<From, To>(block_dst, block_src, j);
  }
  for (; i < count; ++i) ConvertOne<From, To>(dst, src, i);
}

using LoopFn = void (*)(std::byte*, const std::byte*, uint64_t);

// The same loop compiled for the baseline ISA and, on x86-64 with GCC, for
// AVX2 and AVX-512 (chosen at run time by what the CPU has): the element
// code is integer-only, so every version gives the same bits.
template <Dtype From, Dtype To>
void LoopBaseline(std::byte* __restrict dst, const std::byte* __restrict src, uint64_t count) {
  ConvertBlocks<From, To>(dst, src, count);
}

enum class Isa { kBaseline, kAvx2, kAvx512 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
template <Dtype From, Dtype To>
[[gnu::target("avx2")]] void LoopAvx2(std::byte* __restrict dst, const std::byte* __restrict src,
                                      uint64_t count) {
  ConvertBlocks<From, To>(dst, src, count);
}

template <Dtype From, Dtype To>
[[gnu::target("avx512f,avx512bw,avx512vl,prefer-vector-width=512")]] void LoopAvx512(
    std::byte* __restrict dst, const std::byte* __restrict src, uint64_t count) {
  ConvertBlocks<From, To>(dst, src, count);
}

Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
  return Isa::kBaseline;
}

template <Dtype From, Dtype To>
LoopFn LoopFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return LoopAvx512<From, To>;
    case Isa::kAvx2:
      return LoopAvx2<From, To>;
    case Isa::kBaseline:
      break;
  }
  return LoopBaseline<From, To>;
}
#else
Isa DetectIsa() { return Isa::kBaseline; }

template <Dtype From, Dtype To>
LoopFn LoopFor(Isa) {
  return LoopBaseline<From, To>;
}
#endif

template <Dtype From>
LoopFn LoopTo(Dtype to, Isa isa) {
  switch (to) {
    case Dtype::kF32:
      return LoopFor<From, Dtype::kF32>(isa);
    case Dtype::kF16:
      return LoopFor<From, Dtype::kF16>(isa);
    case Dtype::kBF16:
      return LoopFor<From, Dtype::kBF16>(isa);
    default:
      return nullptr;
  }
}

// The loop for a supported pair that is not the identity; nullptr otherwise.
LoopFn FindLoop(Dtype from, Dtype to) {
  static const Isa isa = DetectIsa();
  if (from == to) return nullptr;
  switch (from) {
    case Dtype::kF32:
      return LoopTo<Dtype::kF32>(to, isa);
    case Dtype::kF16:
      return LoopTo<Dtype::kF16>(to, isa);
    case Dtype::kBF16:
      return LoopTo<Dtype::kBF16>(to, isa);
    case Dtype::kF8_E4M3:
      return LoopTo<Dtype::kF8_E4M3>(to, isa);
    case Dtype::kF8_E5M2:
      return LoopTo<Dtype::kF8_E5M2>(to, isa);
    default:
      return nullptr;
  }
}

std::string PairName(Dtype from, Dtype to) {
  return std::string(DtypeName(from)) + " to " + std::string(DtypeName(to));
}

}  // namespace

Status ConvertOnHost(std::byte* dst, Dtype to, const std::byte* src, Dtype from, uint64_t count) {
  if (!convert::ConversionSupported(from, to)) {
    return InvalidArgumentError("conversion from " + PairName(from, to) + " is not supported");
  }
  if (count == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError("conversion from " + PairName(from, to) + " of " +
                                std::to_string(count) + " elements: null " +
                                (dst == nullptr ? "destination" : "source"));
  }
  if (from == to) {
    const int bits = DtypeBits(from);
    uint64_t total_bits = 0;
    if (!CheckedMul(count, static_cast<uint64_t>(bits), &total_bits) || total_bits % 8 != 0) {
      return InvalidArgumentError("copy of " + std::to_string(count) + " " +
                                  std::string(DtypeName(from)) +
                                  " elements: not a whole number of bytes that fits in 64 bits");
    }
    std::memcpy(dst, src, total_bits / 8);
    return Status::Ok();
  }
  uint64_t unused = 0;
  if (!CheckedMul(count, sizeof(float), &unused)) {
    return InvalidArgumentError("conversion from " + PairName(from, to) + " of " +
                                std::to_string(count) + " elements: the size overflows 64 bits");
  }
  LoopFn loop = FindLoop(from, to);
  if (loop == nullptr) {
    return InternalError("conversion from " + PairName(from, to) +
                         " is supported but has no host loop");
  }
  loop(dst, src, count);
  return Status::Ok();
}

}  // namespace tensorlift
