// Checked arithmetic on untrusted 64-bit quantities. Each returns false on
// overflow and leaves *out unspecified.
#ifndef TENSORLIFT_COMMON_CHECKED_MATH_H_
#define TENSORLIFT_COMMON_CHECKED_MATH_H_

#include <cstdint>

namespace tensorlift {

inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// v rounded up to a multiple of a (a > 0; the caller knows it cannot overflow).
inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMON_CHECKED_MATH_H_
