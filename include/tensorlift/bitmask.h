// The sparse-bitmask codec (Endor; compressed-tensors' "sparse-bitmask"
// layout, ../../docs/sparse.md): a [rows, cols] tensor of elem_bytes-wide
// elements is stored as
//   values      the non-zero elements in row-major order (nnz x elem_bytes),
//   bitmask     uint8 [rows, ceil(cols / 8)], row-wise, least-significant bit
//               first, each row padded to whole bytes (padding bits are 0),
//   row_offsets int64 [rows], the exclusive prefix sum of the rows' non-zeros.
// An element is zero only when all its bits are zero (so -0.0 is kept and
// decoding is bit-exact; compressed-tensors turns -0.0 into +0.0).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensorlift/status.h"

namespace tensorlift::sparse {

struct BitmaskShape {
  uint64_t rows = 0;
  uint64_t cols = 0;
  uint32_t elem_bytes = 0;  // 1, 2, 4 or 8.

  uint64_t mask_row_bytes() const { return (cols + 7) / 8; }
  uint64_t mask_bytes() const { return rows * mask_row_bytes(); }
  uint64_t dense_bytes() const { return rows * cols * elem_bytes; }
};

// InvalidArgument unless elem_bytes is 1, 2, 4 or 8 and rows * cols *
// elem_bytes (and the mask) fit in 64 bits.
Status CheckShape(const BitmaskShape& shape);

// Non-zero elements of `dense` (rows * cols elements).
uint64_t CountNonZero(const std::byte* dense, const BitmaskShape& shape);

// Encodes `dense` into values (CountNonZero elements), bitmask
// (shape.mask_bytes()) and row_offsets (rows). Returns nnz.
uint64_t Encode(const std::byte* dense, const BitmaskShape& shape, std::byte* values,
                uint8_t* bitmask, int64_t* row_offsets);

// Checks an untrusted encoding before any decode: padding bits are zero,
// row_offsets[0] == 0, each row_offsets[r + 1] - row_offsets[r] equals the
// popcount of mask row r, and the last row ends exactly at nnz. Decoding
// validated input never reads or writes out of bounds.
Status Validate(const uint8_t* bitmask, const int64_t* row_offsets, const BitmaskShape& shape,
                uint64_t nnz);

// The decoders: scalar (branchless, portable), AVX2 (pshufb lookup tables)
// and AVX-512 (VBMI2 expand-loads; needs AVX-512 F, BW and VBMI2). All give
// the same bytes; docs/sparse.md ("Decode") has their speeds.
enum class DecodeIsa : uint8_t { kScalar, kAvx2, kAvx512 };

// The fastest decoder this CPU runs. The environment variable
// TL_SPARSE_ISA=scalar|avx2|avx512 caps it (read at every call; other values
// are ignored).
DecodeIsa BestDecodeIsa();
// Whether this CPU (and OS) can run `isa`.
bool Supported(DecodeIsa isa);
// "scalar", "avx2", "avx512".
const char* IsaName(DecodeIsa isa);

// Decodes rows [row_begin, row_end) of a validated encoding into `dense`
// (the whole tensor's buffer; only those rows are written, zeros included).
// `values` is read only inside those rows' values, so it may be exactly nnz
// elements long, and several threads may decode disjoint row ranges of one
// tensor at once. No alignment is required. An `isa` this CPU cannot run is
// lowered to the best one it can.
void DecodeRows(DecodeIsa isa, const std::byte* values, const uint8_t* bitmask,
                const int64_t* row_offsets, const BitmaskShape& shape, uint64_t row_begin,
                uint64_t row_end, std::byte* dense);

// Validates, then decodes the whole tensor on up to `threads` threads
// (0: the CPU count), split into contiguous row ranges of equal size; a
// tensor under 1 MiB of dense bytes per thread uses fewer threads (one below
// 2 MiB). InvalidArgument for a bad shape, a null buffer, negative threads or
// an `isa` this CPU cannot run; Validate's Corruption for a bad encoding.
// On error nothing is written.
Status Decode(const std::byte* values, uint64_t nnz, const uint8_t* bitmask,
              const int64_t* row_offsets, const BitmaskShape& shape, std::byte* dense,
              int threads = 0, DecodeIsa isa = BestDecodeIsa());

}  // namespace tensorlift::sparse
