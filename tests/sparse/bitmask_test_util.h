// Test helpers for the sparse-bitmask codec: random dense tensors and their
// encodings, each held in a vector of exactly its size (so that ASan
// catches a read past the end of the values or the mask).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "tensorlift/bitmask.h"

namespace tensorlift::sparse::test {

struct Encoded {
  BitmaskShape shape;
  std::vector<std::byte> values;  // nnz * elem_bytes bytes.
  std::vector<uint8_t> bitmask;
  std::vector<int64_t> row_offsets;
  uint64_t nnz() const { return shape.elem_bytes == 0 ? 0 : values.size() / shape.elem_bytes; }
};

inline Encoded EncodeDense(const std::vector<std::byte>& dense, const BitmaskShape& shape) {
  Encoded e;
  e.shape = shape;
  e.values.resize(CountNonZero(dense.data(), shape) * shape.elem_bytes);
  e.bitmask.resize(shape.mask_bytes());
  e.row_offsets.resize(shape.rows);
  const uint64_t nnz =
      Encode(dense.data(), shape, e.values.data(), e.bitmask.data(), e.row_offsets.data());
  if (nnz * shape.elem_bytes != e.values.size()) std::abort();
  return e;
}

// A dense tensor whose elements are non-zero with probability `density`
// (a random one per row when negative). One non-zero in 16 is a bare sign
// bit (-0.0 in every float format), the others random bits (NaN payloads
// included) with at least one bit set.
inline std::vector<std::byte> RandomDense(const BitmaskShape& s, double density,
                                          std::mt19937_64& rng) {
  std::vector<std::byte> dense(s.dense_bytes());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const uint32_t w = s.elem_bytes;
  for (uint64_t r = 0; r < s.rows; ++r) {
    const double d = density < 0 ? unit(rng) : density;
    for (uint64_t c = 0; c < s.cols; ++c) {
      std::byte* e = dense.data() + (r * s.cols + c) * w;
      if (unit(rng) >= d) continue;
      if (rng() % 16 == 0) {
        e[w - 1] = std::byte{0x80};
        continue;
      }
      uint64_t bits = rng();
      for (uint32_t b = 0; b < w; ++b) e[b] = static_cast<std::byte>(bits >> (8 * b));
      if (w < 8) bits &= (1ull << (8 * w)) - 1;
      if (bits == 0) e[0] = std::byte{1};
    }
  }
  return dense;
}

}  // namespace tensorlift::sparse::test
