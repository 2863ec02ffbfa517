// Header parsing and validation: the reference reader's rules, in its order.
// Nothing here trusts a number from the file before bounding it, and nothing
// allocates in proportion to anything but the header's own (bounded) size.
#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "common/checked_math.h"
#include "common/posix_file.h"
#include "format/json.h"
#include "io/pread.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

using json::As;
using json::TypeName;

// serde_json's recursion limit lets 127 nested arrays/objects through
// (measured against the reference package). We measure depth ourselves;
// simdjson gets headroom (its limit counts a scalar inside the deepest
// container as one more level).
constexpr size_t kMaxJsonDepth = 127;
constexpr size_t kSimdjsonDepth = kMaxJsonDepth + 2;

uint64_t LoadLE64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

Status FormatError(std::string_view rule, std::string detail) {
  std::string msg(rule);
  msg += ": ";
  msg += detail;
  return CorruptionError(std::move(msg));
}

Status JsonError(std::string detail) {
  return FormatError("InvalidHeaderDeserialization", std::move(detail));
}

// A lexical pass over the header (outside strings) that makes simdjson judge
// numbers and nesting as serde_json, the reference's parser, does. It edits
// number tokens in place, never changing their length, so the document stays
// valid exactly when it was:
//  - "-0" (bare): simdjson reads the integer 0, serde_json the float -0.0,
//    which integer fields reject. It becomes "-1", which our integer checks
//    reject as negative, while an ignored field stays ignored.
//  - Integers outside [-2^63, 2^64): serde_json reads them as floats, simdjson
//    refuses them. The last two digits become "e2", the same magnitude as a
//    float token (so one beyond the double range is still refused, as serde
//    refuses it).
// It also returns the deepest nesting of arrays and objects, which the
// reference limits to 127 levels whatever the innermost value is.
size_t NormalizeNumbersAndMeasureDepth(char* p, size_t n) {
  static constexpr std::string_view kU64Max = "18446744073709551615";
  static constexpr std::string_view kI64MinAbs = "9223372036854775808";
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    } else if (c == '-' || is_digit(c)) {
      const size_t start = i;
      const bool negative = c == '-';
      size_t j = negative ? i + 1 : i;
      const size_t digits_start = j;
      while (j < n && is_digit(p[j])) ++j;
      const size_t digits = j - digits_start;
      const bool is_integer = digits > 0 && (j >= n || (p[j] != '.' && p[j] != 'e' && p[j] != 'E'));
      const bool leading_zero = digits > 1 && p[digits_start] == '0';
      if (is_integer && !leading_zero) {
        const std::string_view mag(p + digits_start, digits);
        const std::string_view limit = negative ? kI64MinAbs : kU64Max;
        if (negative && mag == "0") {
          p[digits_start] = '1';
        } else if (digits > limit.size() || (digits == limit.size() && mag > limit)) {
          p[j - 2] = 'e';
          p[j - 1] = '2';
        }
      }
      // Skip the rest of a float token (fraction, exponent) as one token.
      if (j < n && p[j] == '.') {
        ++j;
        while (j < n && is_digit(p[j])) ++j;
      }
      if (j < n && (p[j] == 'e' || p[j] == 'E')) {
        ++j;
        if (j < n && (p[j] == '+' || p[j] == '-')) ++j;
        while (j < n && is_digit(p[j])) ++j;
      }
      i = (j > start ? j : start + 1) - 1;
    }
  }
  return max_depth;
}

// Reads a JSON integer in [0, 2^64). `name` (the tensor) and `what` (the
// field) name it in messages, which are built only on failure.
Status GetU64(simdjson::dom::element el, std::string_view name, const char* what, uint64_t* out) {
  using simdjson::dom::element_type;
  switch (el.type()) {
    case element_type::UINT64:
      *out = As<uint64_t>(el);
      return Status::Ok();
    case element_type::INT64: {
      int64_t v = As<int64_t>(el);
      if (v >= 0) {
        *out = static_cast<uint64_t>(v);
        return Status::Ok();
      }
      return JsonError("tensor " + QuoteName(name) + ": " + what +
                       " must be a non-negative integer, found a negative number");
    }
    default:
      return JsonError("tensor " + QuoteName(name) + ": " + what +
                       " must be a non-negative integer, found " +
                       std::string(TypeName(el.type())));
  }
}

}  // namespace

// Builds Headers; a friend of Header.
class HeaderParser {
 public:
  // `json` points at N header bytes followed by at least SIMDJSON_PADDING
  // writable bytes owned by the caller; it is modified.
  static Result<Header> ParseJson(char* json, uint64_t n, uint64_t file_size);
  static Status Validate(Header& h, uint64_t file_size);
  static Status ParseTensor(std::string_view name, simdjson::dom::element value, TensorInfo* t);
  static Status ParseMetadata(simdjson::dom::element value, std::optional<Metadata>* out);
};

Status HeaderParser::ParseMetadata(simdjson::dom::element value, std::optional<Metadata>* out) {
  using simdjson::dom::element_type;
  if (value.type() == element_type::NULL_VALUE) {
    out->reset();
    return Status::Ok();
  }
  if (value.type() != element_type::OBJECT) {
    return JsonError("__metadata__ must be an object of strings, found " +
                     std::string(TypeName(value.type())));
  }
  Metadata m;
  for (auto field : As<simdjson::dom::object>(value)) {
    if (field.value.type() != element_type::STRING) {
      return JsonError("__metadata__ value of " + QuoteName(field.key) +
                       " must be a string, found " + std::string(TypeName(field.value.type())));
    }
    // Duplicate keys inside the map: the last one wins, as in the reference.
    m[std::string(field.key)] = std::string(As<std::string_view>(field.value));
  }
  *out = std::move(m);
  return Status::Ok();
}

Status HeaderParser::ParseTensor(std::string_view name, simdjson::dom::element value,
                                 TensorInfo* t) {
  using simdjson::dom::element_type;
  // Messages are built only on failure.
  auto who = [&] { return "tensor " + QuoteName(name); };
  if (value.type() != element_type::OBJECT) {
    return JsonError(who() + ": expected an object, found " + std::string(TypeName(value.type())));
  }
  t->name.assign(name);
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (auto field : As<simdjson::dom::object>(value)) {
    if (field.key == "dtype") {
      if (has_dtype) return JsonError(who() + ": duplicate field `dtype`");
      has_dtype = true;
      if (field.value.type() != element_type::STRING) {
        return JsonError(who() + ": dtype must be a string, found " +
                         std::string(TypeName(field.value.type())));
      }
      std::string_view s = As<std::string_view>(field.value);
      auto d = DtypeFromName(s);
      if (!d) return JsonError(who() + ": unknown dtype " + QuoteName(s));
      t->dtype = *d;
    } else if (field.key == "shape") {
      if (has_shape) return JsonError(who() + ": duplicate field `shape`");
      has_shape = true;
      if (field.value.type() != element_type::ARRAY) {
        return JsonError(who() + ": shape must be an array, found " +
                         std::string(TypeName(field.value.type())));
      }
      for (auto dim : As<simdjson::dom::array>(field.value)) {
        uint64_t v;
        TL_RETURN_IF_ERROR(GetU64(dim, name, "shape entry", &v));
        t->shape.push_back(v);
      }
    } else if (field.key == "data_offsets") {
      if (has_offsets) return JsonError(who() + ": duplicate field `data_offsets`");
      has_offsets = true;
      if (field.value.type() != element_type::ARRAY) {
        return JsonError(who() + ": data_offsets must be an array of 2 integers, found " +
                         std::string(TypeName(field.value.type())));
      }
      auto arr = As<simdjson::dom::array>(field.value);
      size_t count = arr.size();
      if (count != 2) {
        return JsonError(who() + ": data_offsets must have exactly 2 elements, found " +
                         std::to_string(count));
      }
      auto it = arr.begin();
      TL_RETURN_IF_ERROR(GetU64(*it, name, "data_offsets begin", &t->begin));
      ++it;
      TL_RETURN_IF_ERROR(GetU64(*it, name, "data_offsets end", &t->end));
    }
    // Unknown fields are ignored, as in the reference.
  }
  if (!has_dtype) return JsonError(who() + ": missing field `dtype`");
  if (!has_shape) return JsonError(who() + ": missing field `shape`");
  if (!has_offsets) return JsonError(who() + ": missing field `data_offsets`");
  return Status::Ok();
}

Result<Header> HeaderParser::ParseJson(char* json, uint64_t n, uint64_t file_size) {
  // Rule 4: UTF-8.
  if (!simdjson::validate_utf8(json, n)) {
    return FormatError("InvalidHeader",
                       "the header (" + std::to_string(n) + " bytes) is not valid UTF-8");
  }
  // Rule 5: JSON and schema.
  if (NormalizeNumbersAndMeasureDepth(json, n) > kMaxJsonDepth) {
    return JsonError("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  simdjson::dom::parser parser;
  if (parser.allocate(std::max<size_t>(n, 64), kSimdjsonDepth) != simdjson::SUCCESS) {
    return ResourceExhaustedError("cannot allocate a JSON parser for a header of " +
                                  std::to_string(n) + " bytes");
  }
  simdjson::dom::element root;
  if (auto err = parser.parse(json, n, /*realloc_if_needed=*/false).get(root)) {
    if (err == simdjson::DEPTH_ERROR) {
      return JsonError("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    return JsonError(std::string("invalid JSON: ") + simdjson::error_message(err));
  }
  if (root.type() != simdjson::dom::element_type::OBJECT) {
    return JsonError("the header must be a JSON object, found " +
                     std::string(TypeName(root.type())));
  }
  Header h;
  h.header_size_ = n;
  bool has_metadata = false;
  auto object = As<simdjson::dom::object>(root);
  // A tensor entry takes at least 48 bytes of JSON: never reserve more
  // entries than the header could hold, whatever its key count.
  h.tensors_.reserve(std::min<size_t>(object.size(), n / 48 + 1));
  for (auto field : object) {
    if (field.key == "__metadata__") {
      if (has_metadata) return JsonError("duplicate field `__metadata__`");
      has_metadata = true;
      TL_RETURN_IF_ERROR(ParseMetadata(field.value, &h.metadata_));
      continue;
    }
    TensorInfo t;
    TL_RETURN_IF_ERROR(ParseTensor(field.key, field.value, &t));
    h.tensors_.push_back(std::move(t));
  }
  if (h.tensors_.size() > UINT32_MAX) return JsonError("too many tensors");

  // Names: sorted index, and duplicates rejected (the reference keeps the
  // last silently; two readers disagreeing about a file is a vulnerability).
  h.by_name_.resize(h.tensors_.size());
  for (uint32_t i = 0; i < h.by_name_.size(); ++i) h.by_name_[i] = i;
  // stable_sort: std::sort degrades to heapsort on some real name orders.
  std::stable_sort(h.by_name_.begin(), h.by_name_.end(),
                   [&](uint32_t a, uint32_t b) { return h.tensors_[a].name < h.tensors_[b].name; });
  for (size_t i = 1; i < h.by_name_.size(); ++i) {
    if (h.tensors_[h.by_name_[i]].name == h.tensors_[h.by_name_[i - 1]].name) {
      return FormatError("DuplicateTensor", "tensor " + QuoteName(h.tensors_[h.by_name_[i]].name) +
                                                " appears more than once in the header");
    }
  }
  TL_RETURN_IF_ERROR(Validate(h, file_size));
  return h;
}

Status HeaderParser::Validate(Header& h, uint64_t file_size) {
  // Rule 6: sort by (begin, end); stable, so ties keep the header's order.
  std::vector<uint32_t> order(h.tensors_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const auto& x = h.tensors_[a];
    const auto& y = h.tensors_[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t start = 0;
  bool first = true;
  for (uint32_t idx : order) {
    TensorInfo& t = h.tensors_[idx];
    auto who = [&] { return "tensor " + QuoteName(t.name); };
    auto range = [&] {
      return "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    };
    if (t.end < t.begin)
      return FormatError("InvalidOffset", who() + ": " + range() + " end before they begin");
    if (t.begin != start) {
      return FormatError("InvalidOffset",
                         who() + ": " + range() +
                             (first ? std::string(" do not start at 0, the first byte of the data")
                                    : " do not start where the previous tensor ended (" +
                                          std::to_string(start) + ")"));
    }
    start = t.end;
    first = false;
    // Rule 7: checked element count and size, left to right like the reference.
    uint64_t nel = 1;
    for (uint64_t d : t.shape) {
      if (!CheckedMul(nel, d, &nel)) {
        return FormatError("ValidationOverflow", who() + ": the element count of shape " +
                                                     ShapeString(t.shape) + " overflows 64 bits");
      }
    }
    uint64_t nbits;
    const int bits = DtypeBits(t.dtype);
    if (!CheckedMul(nel, static_cast<uint64_t>(bits), &nbits)) {
      return FormatError("ValidationOverflow",
                         who() + ": " + std::to_string(nel) + " elements of " +
                             std::string(DtypeName(t.dtype)) + " overflow 64 bits");
    }
    if (nbits % 8 != 0) {
      return FormatError("MisalignedSlice", who() + ": " + std::to_string(nel) + " elements of " +
                                                std::string(DtypeName(t.dtype)) + " are " +
                                                std::to_string(nbits) +
                                                " bits, not a whole number of bytes");
    }
    if (nbits / 8 != t.end - t.begin) {
      return FormatError("TensorInvalidInfo",
                         who() + ": " + std::string(DtypeName(t.dtype)) + " " +
                             ShapeString(t.shape) + " needs " + std::to_string(nbits / 8) +
                             " bytes but " + range() + " hold " + std::to_string(t.end - t.begin));
    }
    t.num_elements = nel;
  }
  // Rule 8: the data section ends exactly at the end of the file.
  uint64_t expected;
  if (!CheckedAdd(start, h.data_offset(), &expected) || expected != file_size) {
    return FormatError("MetadataIncompleteBuffer",
                       "the tensors end at data offset " + std::to_string(start) +
                           ", so the file should have 8 + " + std::to_string(h.header_size_) +
                           " + " + std::to_string(start) + " bytes, but it has " +
                           std::to_string(file_size));
  }
  h.data_size_ = start;
  // Keep tensors in file order.
  std::vector<TensorInfo> sorted;
  sorted.reserve(order.size());
  for (uint32_t idx : order) sorted.push_back(std::move(h.tensors_[idx]));
  h.tensors_ = std::move(sorted);
  std::vector<uint32_t> rank(order.size());
  for (uint32_t pos = 0; pos < order.size(); ++pos) rank[order[pos]] = pos;
  for (uint32_t& i : h.by_name_) i = rank[i];
  return Status::Ok();
}

namespace {

// Rules 1-3, from the first bytes and the file size. Returns N.
Result<uint64_t> CheckLength(std::span<const std::byte> prefix, uint64_t file_size) {
  if (file_size < 8) {
    return FormatError("HeaderTooSmall", "the file has " + std::to_string(file_size) +
                                             " bytes, fewer than the 8 of the header length");
  }
  if (prefix.size() < 8) return InvalidArgumentError("fewer than 8 bytes given to parse");
  const uint64_t n = LoadLE64(prefix.data());
  if (n > kMaxHeaderSize) {
    return FormatError("HeaderTooLarge", "header length " + std::to_string(n) +
                                             " exceeds the limit of " +
                                             std::to_string(kMaxHeaderSize) + " bytes");
  }
  if (8 + n > file_size) {
    return FormatError("InvalidHeaderLength", "a header of " + std::to_string(n) +
                                                  " bytes ends at byte " + std::to_string(8 + n) +
                                                  ", past the end of the file (" +
                                                  std::to_string(file_size) + " bytes)");
  }
  return n;
}

std::unique_ptr<char[]> PaddedBuffer(uint64_t n) {
  return std::unique_ptr<char[]>(new (std::nothrow) char[n + simdjson::SIMDJSON_PADDING]);
}

}  // namespace

Result<Header> Header::ParsePrefix(std::span<const std::byte> prefix, uint64_t file_size) {
  TL_ASSIGN_OR_RETURN(uint64_t n, CheckLength(prefix, file_size));
  if (prefix.size() < 8 + n) {
    return InvalidArgumentError("the header needs " + std::to_string(8 + n) + " bytes but " +
                                std::to_string(prefix.size()) + " were given");
  }
  auto buf = PaddedBuffer(n);
  if (!buf)
    return ResourceExhaustedError("cannot allocate " + std::to_string(n) + " bytes for the header");
  std::memcpy(buf.get(), prefix.data() + 8, n);
  return HeaderParser::ParseJson(buf.get(), n, file_size);
}

Result<Header> Header::Parse(std::span<const std::byte> file_bytes) {
  return ParsePrefix(file_bytes, file_bytes.size());
}

Result<Header> Header::ReadFile(const std::string& path, FileIdentity* identity) {
  auto result = [&]() -> Result<Header> {
    TL_ASSIGN_OR_RETURN(PosixFile file, PosixFile::OpenForRead(path));
    TL_ASSIGN_OR_RETURN(FileIdentity id, file.Identity());
    if (identity != nullptr) *identity = id;
    const uint64_t size = id.size;
    std::byte len[8] = {};
    if (size >= 8) TL_RETURN_IF_ERROR(ReadExactlyAt(file.fd(), 0, len, 8));
    TL_ASSIGN_OR_RETURN(uint64_t n, CheckLength(std::span(len, size >= 8 ? 8 : 0), size));
    auto buf = PaddedBuffer(n);
    if (!buf)
      return ResourceExhaustedError("cannot allocate " + std::to_string(n) +
                                    " bytes for the header");
    TL_RETURN_IF_ERROR(ReadExactlyAt(file.fd(), 8, buf.get(), n));
    return HeaderParser::ParseJson(buf.get(), n, size);
  }();
  if (!result.ok()) return result.status().WithContext(path);
  return result;
}

const TensorInfo* Header::Find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

}  // namespace tensorlift
