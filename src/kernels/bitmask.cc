// The codec's portable half: shape checks, encode, validation, the scalar
// (branchless) decoder, dispatch and threading. The SIMD decoders live in
// decode_avx2.cc / decode_avx512.cc.
#include "tensorlift/bitmask.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/decode_simd.h"

namespace tensorlift::sparse {
namespace {

// Decode splits a tensor over threads only when each gets at least this many
// dense bytes: below it, starting a thread costs more than it saves.
constexpr uint64_t kMinBytesPerThread = 1ull << 20;

// Set bits of n mask bytes, 8 at a time. Without -mpopcnt a popcount is a
// call to libgcc's __popcountdi2 per word rather than one instruction, so
// the x86 build also has a POPCNT version, picked at run time (Validate
// reads the whole mask before every decode). always_inline so that the
// builtin is expanded under the caller's target.
[[gnu::always_inline]] inline uint64_t CountBitsLoop(const uint8_t* m, uint64_t n) {
  uint64_t k = 0;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, m + i, 8);
    k += static_cast<uint64_t>(__builtin_popcountll(v));
  }
  for (; i < n; ++i) k += static_cast<uint64_t>(__builtin_popcount(m[i]));
  return k;
}

#if TL_SPARSE_X86
[[gnu::target("popcnt")]] uint64_t CountBitsPopcnt(const uint8_t* m, uint64_t n) {
  return CountBitsLoop(m, n);
}
#endif

uint64_t CountBits(const uint8_t* m, uint64_t n) {
#if TL_SPARSE_X86
  static const bool popcnt = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("popcnt") != 0;
  }();
  if (popcnt) return CountBitsPopcnt(m, n);
#endif
  return CountBitsLoop(m, n);
}

bool IsZero(const std::byte* p, uint32_t w) {
  switch (w) {
    case 1:
      return std::to_integer<uint8_t>(*p) == 0;
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v == 0;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v == 0;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v == 0;
    }
  }
}

}  // namespace

Status CheckShape(const BitmaskShape& s) {
  if (s.elem_bytes != 1 && s.elem_bytes != 2 && s.elem_bytes != 4 && s.elem_bytes != 8) {
    return InvalidArgumentError("sparse bitmask: elements of " + std::to_string(s.elem_bytes) +
                                " bytes (only 1, 2, 4 or 8)");
  }
  unsigned __int128 dense = static_cast<unsigned __int128>(s.rows) * s.cols * s.elem_bytes;
  unsigned __int128 mask = static_cast<unsigned __int128>(s.rows) * ((s.cols + 7) / 8);
  if (dense > UINT64_MAX || mask > UINT64_MAX) {
    return InvalidArgumentError("sparse bitmask: shape [" + std::to_string(s.rows) + ", " +
                                std::to_string(s.cols) + "] overflows 64 bits");
  }
  return Status::Ok();
}

uint64_t CountNonZero(const std::byte* dense, const BitmaskShape& s) {
  uint64_t n = 0;
  const uint64_t count = s.rows * s.cols;
  for (uint64_t i = 0; i < count; ++i) n += !IsZero(dense + i * s.elem_bytes, s.elem_bytes);
  return n;
}

uint64_t Encode(const std::byte* dense, const BitmaskShape& s, std::byte* values, uint8_t* bitmask,
                int64_t* row_offsets) {
  const uint64_t mrow = s.mask_row_bytes();
  const uint32_t w = s.elem_bytes;
  uint64_t k = 0;
  for (uint64_t r = 0; r < s.rows; ++r) {
    row_offsets[r] = static_cast<int64_t>(k);
    uint8_t* m = bitmask + r * mrow;
    std::memset(m, 0, mrow);
    const std::byte* row = dense + r * s.cols * w;
    for (uint64_t c = 0; c < s.cols; ++c) {
      const std::byte* e = row + c * w;
      if (IsZero(e, w)) continue;
      m[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
      std::memcpy(values + k * w, e, w);
      ++k;
    }
  }
  return k;
}

Status Validate(const uint8_t* bitmask, const int64_t* row_offsets, const BitmaskShape& s,
                uint64_t nnz) {
  TL_RETURN_IF_ERROR(CheckShape(s));
  const uint64_t mrow = s.mask_row_bytes();
  const unsigned tail = static_cast<unsigned>(s.cols % 8);
  const uint8_t pad = tail == 0 ? 0 : static_cast<uint8_t>(0xFFu << tail);
  uint64_t k = 0;
  for (uint64_t r = 0; r < s.rows; ++r) {
    if (row_offsets[r] < 0 || static_cast<uint64_t>(row_offsets[r]) != k) {
      return CorruptionError("sparse bitmask: row_offsets[" + std::to_string(r) + "] is " +
                             std::to_string(row_offsets[r]) + ", but the bitmask puts row " +
                             std::to_string(r) + " at " + std::to_string(k));
    }
    const uint8_t* m = bitmask + r * mrow;
    k += CountBits(m, mrow);
    if (mrow > 0 && (m[mrow - 1] & pad) != 0) {
      return CorruptionError("sparse bitmask: row " + std::to_string(r) +
                             " sets padding bits past column " + std::to_string(s.cols));
    }
  }
  if (k != nnz) {
    return CorruptionError("sparse bitmask: the bitmask has " + std::to_string(k) +
                           " non-zeros but the values hold " + std::to_string(nnz));
  }
  return Status::Ok();
}

namespace detail {

uint64_t ValuesEnd(const uint8_t* bitmask, const int64_t* row_offsets, const BitmaskShape& s,
                   uint64_t r1) {
  const uint64_t mrow = s.mask_row_bytes();
  return static_cast<uint64_t>(row_offsets[r1 - 1]) + CountBits(bitmask + (r1 - 1) * mrow, mrow);
}

namespace {

// The portable reference. Branchless: each element is copied from a pointer
// that is either the next value or a zero, selected by its mask bit with
// integer masking (a plain `bit ? v : zero` lets the compiler see the zero
// and turn the copy back into a branch, mispredicted half the time on
// random data), so `values` is read only where a bit is set and never past
// the row's last value. memcpy keeps unaligned values and outputs well
// defined (it compiles to plain moves).
template <typename T>
[[gnu::always_inline]] inline const std::byte* Element(const std::byte*& v, unsigned bit) {
  static constexpr std::byte kZero[sizeof(T)] = {};
  const uintptr_t take = uintptr_t{0} - bit;  // All ones when the bit is set.
  const uintptr_t src =
      (reinterpret_cast<uintptr_t>(v) & take) | (reinterpret_cast<uintptr_t>(kZero) & ~take);
  v += bit * sizeof(T);
  return reinterpret_cast<const std::byte*>(src);
}

template <typename T>
void ScalarRowsT(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                 const BitmaskShape& s, uint64_t r0, uint64_t r1, std::byte* dense) {
  const uint64_t cols = s.cols;
  const uint64_t mrow = s.mask_row_bytes();
  for (uint64_t r = r0; r < r1; ++r) {
    const std::byte* v = values + static_cast<uint64_t>(row_offsets[r]) * sizeof(T);
    std::byte* out = dense + r * cols * sizeof(T);
    const uint8_t* m = bitmask + r * mrow;
    for (uint64_t c = 0; c < cols; c += 8) {
      const unsigned byte = m[c / 8];
      const unsigned n = cols - c < 8 ? static_cast<unsigned>(cols - c) : 8u;
      for (unsigned j = 0; j < n; ++j) {
        std::memcpy(out + (c + j) * sizeof(T), Element<T>(v, (byte >> j) & 1u), sizeof(T));
      }
    }
  }
}

}  // namespace

void DecodeRowsScalar(const std::byte* values, const uint8_t* bitmask, const int64_t* row_offsets,
                      const BitmaskShape& s, uint64_t r0, uint64_t r1, std::byte* dense) {
  switch (s.elem_bytes) {
    case 1:
      ScalarRowsT<uint8_t>(values, bitmask, row_offsets, s, r0, r1, dense);
      break;
    case 2:
      ScalarRowsT<uint16_t>(values, bitmask, row_offsets, s, r0, r1, dense);
      break;
    case 4:
      ScalarRowsT<uint32_t>(values, bitmask, row_offsets, s, r0, r1, dense);
      break;
    default:
      ScalarRowsT<uint64_t>(values, bitmask, row_offsets, s, r0, r1, dense);
      break;
  }
}

}  // namespace detail

namespace {

// What the CPU (and OS: libgcc checks XCR0 for the AVX and AVX-512 state)
// runs, probed once.
struct CpuIsas {
  bool avx2 = false;
  bool avx512 = false;
};

const CpuIsas& Cpu() {
  static const CpuIsas cpu = [] {
    CpuIsas c;
#if TL_SPARSE_X86
    __builtin_cpu_init();
    const bool popcnt = __builtin_cpu_supports("popcnt");
    c.avx2 = popcnt && __builtin_cpu_supports("avx2");
    c.avx512 = popcnt && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2");
#endif
    return c;
  }();
  return cpu;
}

// The best ISA at or below `isa` that this CPU runs.
DecodeIsa Lower(DecodeIsa isa) {
  if (isa == DecodeIsa::kAvx512 && !Cpu().avx512) isa = DecodeIsa::kAvx2;
  if (isa == DecodeIsa::kAvx2 && !Cpu().avx2) isa = DecodeIsa::kScalar;
  return isa;
}

}  // namespace

bool Supported(DecodeIsa isa) { return Lower(isa) == isa; }

const char* IsaName(DecodeIsa isa) {
  switch (isa) {
    case DecodeIsa::kScalar:
      return "scalar";
    case DecodeIsa::kAvx2:
      return "avx2";
    case DecodeIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

DecodeIsa BestDecodeIsa() {
  // Read at every call (not cached) so that a test or a benchmark can change
  // it between decodes; an unknown value caps nothing.
  DecodeIsa cap = DecodeIsa::kAvx512;
  if (const char* env = std::getenv("TL_SPARSE_ISA")) {
    for (DecodeIsa isa : {DecodeIsa::kScalar, DecodeIsa::kAvx2, DecodeIsa::kAvx512}) {
      if (std::strcmp(env, IsaName(isa)) == 0) cap = isa;
    }
  }
  return Lower(cap);
}

void DecodeRows(DecodeIsa isa, const std::byte* values, const uint8_t* bitmask,
                const int64_t* row_offsets, const BitmaskShape& shape, uint64_t row_begin,
                uint64_t row_end, std::byte* dense) {
  if (row_begin >= row_end) return;
  switch (Lower(isa)) {
#if TL_SPARSE_X86
    case DecodeIsa::kAvx512:
      detail::DecodeRowsAvx512(values, bitmask, row_offsets, shape, row_begin, row_end, dense);
      return;
    case DecodeIsa::kAvx2:
      detail::DecodeRowsAvx2(values, bitmask, row_offsets, shape, row_begin, row_end, dense);
      return;
#endif
    default:
      detail::DecodeRowsScalar(values, bitmask, row_offsets, shape, row_begin, row_end, dense);
      return;
  }
}

Status Decode(const std::byte* values, uint64_t nnz, const uint8_t* bitmask,
              const int64_t* row_offsets, const BitmaskShape& shape, std::byte* dense, int threads,
              DecodeIsa isa) {
  TL_RETURN_IF_ERROR(CheckShape(shape));
  if (threads < 0) {
    return InvalidArgumentError("sparse bitmask: " + std::to_string(threads) + " threads");
  }
  if (!Supported(isa)) {
    return InvalidArgumentError(std::string("sparse bitmask: this CPU cannot run the ") +
                                IsaName(isa) + " decoder");
  }
  if ((shape.rows > 0 && row_offsets == nullptr) ||
      (shape.mask_bytes() > 0 && bitmask == nullptr) || (nnz > 0 && values == nullptr) ||
      (shape.dense_bytes() > 0 && dense == nullptr)) {
    return InvalidArgumentError("sparse bitmask: null buffer");
  }
  TL_RETURN_IF_ERROR(Validate(bitmask, row_offsets, shape, nnz));

  // Contiguous row ranges of (nearly) equal size; rows are all the same
  // number of dense bytes, the output that bounds the work.
  uint64_t n = std::min(shape.rows, shape.dense_bytes() / kMinBytesPerThread);
  if (n > 1) {
    // hardware_concurrency() reads sysfs: once, not at every decode.
    static const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    n = std::min<uint64_t>(n, threads > 0 ? static_cast<uint64_t>(threads) : cpus);
  }
  if (n <= 1) {
    DecodeRows(isa, values, bitmask, row_offsets, shape, 0, shape.rows, dense);
    return Status::Ok();
  }
  const uint64_t per = shape.rows / n;
  const uint64_t extra = shape.rows % n;  // The first `extra` ranges get one more row.
  auto begin = [&](uint64_t i) { return i * per + std::min(i, extra); };
  std::vector<std::thread> workers;
  workers.reserve(n - 1);
  for (uint64_t i = 1; i < n; ++i) {
    const uint64_t r0 = begin(i);
    const uint64_t r1 = begin(i + 1);
    try {
      workers.emplace_back(DecodeRows, isa, values, bitmask, row_offsets, std::cref(shape), r0, r1,
                           dense);
    } catch (const std::system_error&) {
      // No thread to be had: this range runs here, as the first one does.
      DecodeRows(isa, values, bitmask, row_offsets, shape, r0, r1, dense);
    }
  }
  DecodeRows(isa, values, bitmask, row_offsets, shape, 0, begin(1), dense);
  for (std::thread& t : workers) t.join();
  return Status::Ok();
}

}  // namespace tensorlift::sparse
