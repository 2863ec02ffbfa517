// Argument checks shared by the device streams (CUDA, emulated), so that both
// refuse the same calls with the same messages at enqueue time.
#ifndef TENSORLIFT_DEVICE_STREAM_CHECKS_H_
#define TENSORLIFT_DEVICE_STREAM_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/checked_math.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Null / zero / wrap-around checks of a copy of `bytes` from src to dst.
inline Status CheckCopyArgs(const char* op, const std::byte* dst, const std::byte* src,
                            uint64_t bytes) {
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError(std::string(op) + ": null address");
  }
  if (bytes == 0) return InvalidArgumentError(std::string(op) + ": zero bytes");
  uint64_t end = 0;
  if (!CheckedAdd(reinterpret_cast<uintptr_t>(dst), bytes, &end) ||
      !CheckedAdd(reinterpret_cast<uintptr_t>(src), bytes, &end)) {
    return InvalidArgumentError(std::string(op) + ": " + std::to_string(bytes) +
                                " bytes wrap around the address space");
  }
  return Status::Ok();
}

inline bool Overlap(const std::byte* a, uint64_t a_bytes, const std::byte* b, uint64_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

// The byte sizes of DecodeBitmask's operands (device.h).
struct DecodeBitmaskBytes {
  uint64_t dst = 0;
  uint64_t values = 0;
  uint64_t bitmask = 0;
  uint64_t row_offsets = 0;
};

// DecodeBitmask's argument checks: null, zero elements, element size,
// sizes that overflow or wrap around the address space, alignment of
// row_offsets, an output overlapping an input. `values` may be null when
// nnz is 0.
inline Result<DecodeBitmaskBytes> CheckDecodeBitmaskArgs(const std::byte* dst,
                                                         const std::byte* values, uint64_t nnz,
                                                         const uint8_t* bitmask,
                                                         const int64_t* row_offsets, uint64_t rows,
                                                         uint64_t cols, uint32_t elem_bytes) {
  const sparse::BitmaskShape shape{.rows = rows, .cols = cols, .elem_bytes = elem_bytes};
  if (Status s = sparse::CheckShape(shape); !s.ok()) return s.WithContext("DecodeBitmask");
  if (rows == 0 || cols == 0) return InvalidArgumentError("DecodeBitmask: zero elements");
  if (dst == nullptr || bitmask == nullptr || row_offsets == nullptr ||
      (nnz > 0 && values == nullptr)) {
    return InvalidArgumentError("DecodeBitmask: null address");
  }
  if (nnz > rows * cols) {
    return InvalidArgumentError("DecodeBitmask: " + std::to_string(nnz) + " non-zeros in " +
                                std::to_string(rows * cols) + " elements");
  }
  if (reinterpret_cast<uintptr_t>(row_offsets) % alignof(int64_t) != 0) {
    return InvalidArgumentError("DecodeBitmask: row_offsets is not 8-byte aligned");
  }
  DecodeBitmaskBytes bytes{.dst = shape.dense_bytes(),
                           .values = nnz * elem_bytes,
                           .bitmask = shape.mask_bytes(),
                           .row_offsets = 0};
  uint64_t end = 0;
  const auto* mask = reinterpret_cast<const std::byte*>(bitmask);
  const auto* offsets = reinterpret_cast<const std::byte*>(row_offsets);
  if (!CheckedMul(rows, uint64_t{sizeof(int64_t)}, &bytes.row_offsets) ||
      !CheckedAdd(reinterpret_cast<uintptr_t>(dst), bytes.dst, &end) ||
      !CheckedAdd(reinterpret_cast<uintptr_t>(values), bytes.values, &end) ||
      !CheckedAdd(reinterpret_cast<uintptr_t>(mask), bytes.bitmask, &end) ||
      !CheckedAdd(reinterpret_cast<uintptr_t>(offsets), bytes.row_offsets, &end)) {
    return InvalidArgumentError("DecodeBitmask: operands wrap around the address space");
  }
  if ((nnz > 0 && Overlap(dst, bytes.dst, values, bytes.values)) ||
      Overlap(dst, bytes.dst, mask, bytes.bitmask) ||
      Overlap(dst, bytes.dst, offsets, bytes.row_offsets)) {
    return InvalidArgumentError("DecodeBitmask: the output overlaps an input");
  }
  return bytes;
}

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_STREAM_CHECKS_H_
