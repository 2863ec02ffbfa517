// The sparse-bitmask GPU decode (layout: bitmask.h), element by element, as
// __host__ __device__ code: the CUDA kernel (device/cuda/kernels.cu) runs it
// on the GPU, and DecodeRowEmulated below runs the same code on the host
// with the warp emulated, for the emulated device and for tests
// (tests/sparse/bitmask_kernel_test.cc compares it with the CPU decoders).
// Header-only; no CUDA header, no library call device code cannot make.
//
// The kernel: one warp per row, "per-row offsets, popcount prefix within a
// warp, no global scan". A row is decoded in chunks of 32 lanes x 32
// columns:
// 1. Lane l reads the 32 mask bits of columns [32 l, 32 l + 32) of the chunk
//    (bytewise: mask rows are not 4-byte aligned in general) and counts them.
// 2. A warp exclusive scan of the counts (shuffles, Hillis-Steele) gives each
//    lane the index of its first value within the chunk; the chunk's total
//    moves the row's value pointer, which starts at row_offsets[row].
// 3. The outputs are written in steps of 32 x 16 contiguous bytes (so that
//    the warp's stores coalesce): at a step each lane takes a group of
//    V = 16 / W consecutive columns, fetches the mask word and prefix of the
//    lane that owns them (shuffles), and each element whose bit b is set
//    takes value number prefix + popcount(word & ((1 << b) - 1)).
// Rows are independent, so there is no scan across the tensor; a row's
// chunks are sequential within its warp (a tensor needs many rows to fill a
// GPU, as weight matrices have).
//
// Values are read only where a bit is set (never past the row's last
// value). The caller validates the encoding first (bitmask.h: Validate): a
// bad row offset would make the kernel read out of bounds.
#ifndef TENSORLIFT_SPARSE_BITMASK_KERNEL_H_
#define TENSORLIFT_SPARSE_BITMASK_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define TL_SPARSE_HD __host__ __device__ inline
#else
#define TL_SPARSE_HD inline
#endif

namespace tensorlift::sparse::kernel {

inline constexpr uint32_t kWarp = 32;
// Columns of one chunk: a 32-bit mask word per lane.
inline constexpr uint64_t kChunkCols = kWarp * 32;
// Output bytes a lane writes per step (one 128-bit store when aligned).
inline constexpr uint32_t kGroupBytes = 16;
// Elements of a lane's group: V above.
template <uint32_t W>
inline constexpr uint32_t kGroupElems = kGroupBytes / W;

// How the kernel accesses memory; the launcher picks by alignment. The host
// emulation copies bytes whatever the mode.
enum class Access {
  kBytes,     // Byte loads and stores (values or output not W-aligned).
  kElements,  // W-byte loads and stores.
  kVectors,   // W-byte loads, 16-byte stores (output rows 16-byte aligned).
};

// The unsigned integer of W bytes.
template <uint32_t W>
using UInt = std::conditional_t<
    W == 1, uint8_t,
    std::conditional_t<W == 2, uint16_t, std::conditional_t<W == 4, uint32_t, uint64_t>>>;

TL_SPARSE_HD uint32_t PopCount(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(x));
#else
  return static_cast<uint32_t>(__builtin_popcount(x));
#endif
}

// The mask bits of columns [col, col + 32) of a row (col a multiple of 8),
// least-significant first; bytes past the row's mask_row_bytes read as 0.
TL_SPARSE_HD uint32_t MaskWord(const uint8_t* mask_row, uint64_t mask_row_bytes, uint64_t col) {
  const uint64_t first = col / 8;
  uint32_t word = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    if (first + i < mask_row_bytes) word |= static_cast<uint32_t>(mask_row[first + i]) << (8 * i);
  }
  return word;
}

// The index, among the chunk's values, of the element at bit `bit` (< 32) of
// a lane's word, given the index of the lane's first value (`prefix`).
TL_SPARSE_HD uint32_t ValueIndex(uint32_t word, uint32_t prefix, uint32_t bit) {
  return prefix + PopCount(word & ((1u << bit) - 1u));
}

// At step `step` of a chunk, lane `lane` decodes columns
// [step * 32 * V + lane * V, + V) of the chunk: these bits of this lane's word.
template <uint32_t W>
TL_SPARSE_HD uint32_t GroupSourceLane(uint32_t step, uint32_t lane) {
  return step * kGroupElems<W> + lane * kGroupElems<W> / 32;
}
template <uint32_t W>
TL_SPARSE_HD uint32_t GroupFirstBit(uint32_t lane) {
  return lane * kGroupElems<W> % 32;
}
template <uint32_t W>
TL_SPARSE_HD uint64_t GroupFirstColumn(uint32_t step, uint32_t lane) {
  return static_cast<uint64_t>(step) * kWarp * kGroupElems<W> + lane * kGroupElems<W>;
}
template <uint32_t W>
inline constexpr uint32_t kStepsPerChunk = 32 / kGroupElems<W>;

// A lane's 16 output bytes as 4 little-endian words (registers on the GPU).
struct Group {
  uint32_t word[4] = {0, 0, 0, 0};
};

// Element i (of W bytes) of a group.
template <uint32_t W>
TL_SPARSE_HD uint64_t GetElement(const Group& g, uint32_t i) {
  if constexpr (W == 8) {
    return g.word[2 * i] | static_cast<uint64_t>(g.word[2 * i + 1]) << 32;
  } else if constexpr (W == 4) {
    return g.word[i];
  } else {
    constexpr uint32_t kPerWord = 4 / W;
    return (g.word[i / kPerWord] >> (8 * W * (i % kPerWord))) & ((1u << (8 * W)) - 1u);
  }
}

// Sets element i of a zero-initialised group.
template <uint32_t W>
TL_SPARSE_HD void PutElement(Group& g, uint32_t i, uint64_t value) {
  if constexpr (W == 8) {
    g.word[2 * i] = static_cast<uint32_t>(value);
    g.word[2 * i + 1] = static_cast<uint32_t>(value >> 32);
  } else if constexpr (W == 4) {
    g.word[i] = static_cast<uint32_t>(value);
  } else {
    constexpr uint32_t kPerWord = 4 / W;
    g.word[i / kPerWord] |= static_cast<uint32_t>(value) << (8 * W * (i % kPerWord));
  }
}

template <uint32_t W, Access A>
TL_SPARSE_HD uint64_t LoadElement(const std::byte* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (A != Access::kBytes) {
    return *reinterpret_cast<const UInt<W>*>(p);
  } else {
    uint64_t v = 0;
    for (uint32_t b = 0; b < W; ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
    return v;
  }
#else
  uint64_t v = 0;  // Little-endian host: the low W bytes.
  std::memcpy(&v, p, W);
  return v;
#endif
}

// The group of V elements whose mask bits are bits [bit0, bit0 + V) of
// `word`, the lane's first value being chunk_values[prefix].
template <uint32_t W, Access A>
TL_SPARSE_HD Group DecodeGroup(const std::byte* chunk_values, uint32_t word, uint32_t prefix,
                               uint32_t bit0) {
  Group g;
  for (uint32_t i = 0; i < kGroupElems<W>; ++i) {
    const uint32_t bit = bit0 + i;
    if ((word >> bit) & 1u) {
      PutElement<W>(g, i, LoadElement<W, A>(chunk_values + ValueIndex(word, prefix, bit) * W));
    }
  }
  return g;
}

// Stores the first n elements of a group at `out` (all V of them for
// kVectors, whose rows hold whole groups). The loops have constant bounds
// so that the group stays in registers (a variable index would put it in
// local memory).
template <uint32_t W, Access A>
TL_SPARSE_HD void StoreGroup(std::byte* out, const Group& g, uint64_t n) {
#if defined(__CUDA_ARCH__)
  if constexpr (A == Access::kVectors) {
    *reinterpret_cast<uint4*>(out) = make_uint4(g.word[0], g.word[1], g.word[2], g.word[3]);
  } else if constexpr (A == Access::kElements) {
    using T = UInt<W>;
    for (uint32_t i = 0; i < kGroupElems<W>; ++i) {
      if (i < n) reinterpret_cast<T*>(out)[i] = static_cast<T>(GetElement<W>(g, i));
    }
  } else {
    for (uint32_t i = 0; i < kGroupElems<W>; ++i) {
      const uint64_t e = GetElement<W>(g, i);
      for (uint32_t b = 0; b < W; ++b) {
        if (i < n) out[i * W + b] = static_cast<std::byte>(e >> (8 * b));
      }
    }
  }
#else
  const uint64_t count = n < kGroupElems<W> ? n : kGroupElems<W>;
  std::memcpy(out, g.word, count * W);
#endif
}

// The host emulation of one warp decoding one row: the kernel's steps with
// the lanes run one after another and the shuffles read from arrays.
// `values` points at the row's first value.
template <uint32_t W>
void DecodeRowEmulated(const uint8_t* mask_row, uint64_t cols, const std::byte* values,
                       std::byte* out) {
  const uint64_t mask_row_bytes = (cols + 7) / 8;
  for (uint64_t chunk = 0; chunk < cols; chunk += kChunkCols) {
    uint32_t word[kWarp];
    uint32_t count[kWarp];
    uint32_t inclusive[kWarp];
    for (uint32_t lane = 0; lane < kWarp; ++lane) {
      word[lane] = MaskWord(mask_row, mask_row_bytes, chunk + lane * 32);
      count[lane] = PopCount(word[lane]);
      inclusive[lane] = count[lane];
    }
    // The kernel's scan: round d adds the value d lanes below
    // (__shfl_up_sync), all lanes reading before any writes.
    for (uint32_t d = 1; d < kWarp; d *= 2) {
      uint32_t up[kWarp];
      for (uint32_t lane = 0; lane < kWarp; ++lane)
        up[lane] = inclusive[lane >= d ? lane - d : lane];
      for (uint32_t lane = d; lane < kWarp; ++lane) inclusive[lane] += up[lane];
    }
    for (uint32_t step = 0; step < kStepsPerChunk<W>; ++step) {
      for (uint32_t lane = 0; lane < kWarp; ++lane) {
        const uint64_t col = chunk + GroupFirstColumn<W>(step, lane);
        if (col >= cols) continue;
        const uint32_t src = GroupSourceLane<W>(step, lane);
        const Group g = DecodeGroup<W, Access::kBytes>(
            values, word[src], inclusive[src] - count[src], GroupFirstBit<W>(lane));
        StoreGroup<W, Access::kBytes>(out + col * W, g, cols - col);
      }
    }
    values += static_cast<uint64_t>(inclusive[kWarp - 1]) * W;
  }
}

}  // namespace tensorlift::sparse::kernel

#endif  // TENSORLIFT_SPARSE_BITMASK_KERNEL_H_
