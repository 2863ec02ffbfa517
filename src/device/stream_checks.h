// Argument checks shared by the device streams (CUDA, emulated), so that both
// refuse the same calls with the same messages at enqueue time.
#ifndef TENSORLIFT_DEVICE_STREAM_CHECKS_H_
#define TENSORLIFT_DEVICE_STREAM_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/checked_math.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Null / zero / wrap-around checks of a copy of `bytes` from src to dst.
inline Status CheckCopyArgs(const char* op, const std::byte* dst, const std::byte* src, uint64_t bytes) {
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

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_STREAM_CHECKS_H_
