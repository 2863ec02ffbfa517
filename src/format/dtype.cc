#include "tensorlift/dtype.h"

#include <array>
#include <cctype>
#include <string>
#include <utility>

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

// torch's spellings (and its aliases) of the dtypes it has.
constexpr std::pair<std::string_view, Dtype> kTorchNames[] = {
    {"bool", Dtype::kBool},
    {"uint8", Dtype::kU8},
    {"int8", Dtype::kI8},
    {"float8_e5m2", Dtype::kF8_E5M2},
    {"float8_e4m3fn", Dtype::kF8_E4M3},
    {"float8_e8m0fnu", Dtype::kF8_E8M0},
    {"float8_e4m3fnuz", Dtype::kF8_E4M3FNUZ},
    {"float8_e5m2fnuz", Dtype::kF8_E5M2FNUZ},
    {"float4_e2m1fn_x2", Dtype::kF4},
    {"int16", Dtype::kI16},
    {"short", Dtype::kI16},
    {"uint16", Dtype::kU16},
    {"float16", Dtype::kF16},
    {"half", Dtype::kF16},
    {"bfloat16", Dtype::kBF16},
    {"int32", Dtype::kI32},
    {"int", Dtype::kI32},
    {"uint32", Dtype::kU32},
    {"float32", Dtype::kF32},
    {"float", Dtype::kF32},
    {"complex64", Dtype::kC64},
    {"float64", Dtype::kF64},
    {"double", Dtype::kF64},
    {"int64", Dtype::kI64},
    {"long", Dtype::kI64},
    {"uint64", Dtype::kU64},
};

}  // namespace

std::string_view DtypeName(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].name; }

int DtypeBits(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].bits; }

std::optional<Dtype> DtypeFromName(std::string_view name) {
  for (int i = 0; i < kNumDtypes; ++i) {
    if (kDtypes[i].name == name) return static_cast<Dtype>(i);
  }
  return std::nullopt;
}

std::optional<Dtype> DtypeFromAnyName(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (auto d = DtypeFromName(upper)) return d;
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const auto& [torch_name, dtype] : kTorchNames) {
    if (torch_name == name) return dtype;
  }
  return std::nullopt;
}

}  // namespace tensorlift
