#include "tensorlift/dtype.h"

#include <array>

namespace tensorlift {
namespace {

struct DtypeEntry {
  std::string_view name;
  int bits;
};

// Indexed by the enum value; order is the reference's.
constexpr std::array<DtypeEntry, kNumDtypes> kDtypes = {{
    {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
    {"I64", 64},        {"U64", 64},
}};

}  // namespace

std::string_view DtypeName(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].name; }

int DtypeBits(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].bits; }

std::optional<Dtype> DtypeFromName(std::string_view name) {
  for (int i = 0; i < kNumDtypes; ++i) {
    if (kDtypes[i].name == name) return static_cast<Dtype>(i);
  }
  return std::nullopt;
}

}  // namespace tensorlift
