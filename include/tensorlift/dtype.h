// The element types of the safetensors format, in the reference's enum order
// ("increasing alignment order"), which is also the writer's sort key.
#ifndef TENSORLIFT_DTYPE_H_
#define TENSORLIFT_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace tensorlift {

enum class Dtype : uint8_t {
  kBool = 0,
  kF4,       // MXFP4 (E2M1): two elements per byte.
  kF6_E2M3,  // MXFP6: four elements per three bytes.
  kF6_E3M2,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,  // torch.float8_e4m3fn
  kF8_E8M0,  // exponent-only scale (torch.float8_e8m0fnu)
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

inline constexpr int kNumDtypes = 22;

// The JSON spelling, e.g. "BF16", "F8_E4M3".
std::string_view DtypeName(Dtype dtype);
// Parses the exact, case-sensitive JSON spelling; nullopt if unknown.
std::optional<Dtype> DtypeFromName(std::string_view name);
// Parses a dtype as safetensors spells it, in any case ("BF16", "bf16"), or
// as torch does ("bfloat16", "torch.bfloat16", "half", "float8_e4m3fn");
// nullopt if neither.
std::optional<Dtype> DtypeFromAnyName(std::string_view name);
// Bits per element: 4 for F4, 6 for F6_*, 8 for BOOL and the byte types, ...
int DtypeBits(Dtype dtype);

}  // namespace tensorlift

#endif  // TENSORLIFT_DTYPE_H_
