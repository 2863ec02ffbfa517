#include "corrupt/corpus.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>
#include <utility>

namespace tensorlift::testing {
namespace {

using namespace std::string_literals;

constexpr std::string_view kU64Max = "18446744073709551615";  // 2^64 - 1
constexpr std::string_view k2Pow64 = "18446744073709551616";

// The 22 dtypes in the reference's enum order, with their bit sizes; spelled
// out here so that the corpus does not depend on src/format/dtype.cc.
struct DtypeRow {
  std::string_view name;
  int bits;
};
constexpr DtypeRow kDtypes[] = {
    {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
    {"I64", 64},        {"U64", 64},
};

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file: the length of `header`, `header`, `data`.
std::string File(std::string_view header, std::string_view data = {}) {
  std::string out = Le64(header.size());
  out += header;
  out += data;
  return out;
}

// `n` bytes 0, 1, 2, ... (mod 251), so that misplaced data is visible.
std::string Data(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i % 251);
  return out;
}

// One header entry; `name` is JSON string content (already escaped).
std::string T(std::string_view name, std::string_view dtype, std::string_view shape, uint64_t begin,
              uint64_t end) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":[" +
         std::string(shape) + "],\"data_offsets\":[" + std::to_string(begin) + "," +
         std::to_string(end) + "]}";
}

// A tensor "a" of one U8 whose info object also holds `extra` (a member list
// such as "\"x\":1").
std::string WithExtra(std::string_view extra) {
  return "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]," + std::string(extra) +
         "}}";
}

std::string Repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// A one-U8 file whose tensor carries an unknown field nested so that the
// deepest JSON container is at `depth` (the root object is depth 1, the tensor
// info object depth 2). `inner` goes inside the deepest container.
std::string Deep(int depth, bool objects, std::string_view inner) {
  const int k = depth - 2;
  std::string v;
  if (objects) {
    v = Repeat("{\"b\":", k - 1) + "{" + std::string(inner) + "}" + Repeat("}", k - 1);
  } else {
    v = Repeat("[", k) + std::string(inner) + Repeat("]", k);
  }
  return File(WithExtra("\"x\":" + v), Data(1));
}

class Builder {
 public:
  // A case whose reference verdict follows from the expected one.
  void Add(std::string name, std::string bytes, std::string expected) {
    std::string reference = expected == "ok" ? "ok" : "error";
    AddDiff(std::move(name), std::move(bytes), std::move(expected), std::move(reference));
  }
  void AddDiff(std::string name, std::string bytes, std::string expected, std::string reference,
               std::string known_bug = "") {
    cases_.push_back({std::move(name), std::move(bytes), std::move(expected), std::move(reference),
                      std::move(known_bug)});
  }
  // A case that tensorlift currently gets wrong; `expected` is the right verdict.
  void AddKnownBug(std::string name, std::string bytes, std::string expected,
                   std::string known_bug) {
    std::string reference = expected == "ok" ? "ok" : "error";
    AddDiff(std::move(name), std::move(bytes), std::move(expected), std::move(reference),
            std::move(known_bug));
  }
  std::vector<CorpusCase> Take() { return std::move(cases_); }

 private:
  std::vector<CorpusCase> cases_;
};

constexpr char kJson[] = "InvalidHeaderDeserialization";

void AddLengthCases(Builder& b) {
  // Rule 1: fewer than 8 bytes.
  b.Add("too_small_empty", "", "HeaderTooSmall");
  b.Add("too_small_7_bytes", "\x02\0\0\0\0\0\0"s, "HeaderTooSmall");

  // Rule 2: N over 100,000,000 (inclusive limit), checked before the file size.
  b.Add("header_len_100000001", Le64(100'000'001) + "{}", "HeaderTooLarge");
  b.Add("header_len_200000000", Le64(200'000'000) + "{}", "HeaderTooLarge");
  b.Add("header_len_u64_max", Le64(UINT64_MAX) + "{}", "HeaderTooLarge");
  b.Add("header_len_2pow63", Le64(uint64_t{1} << 63), "HeaderTooLarge");

  // Rule 3: 8 + N past the end of the file.
  b.Add("header_len_past_eof", Le64(3) + "{}", "InvalidHeaderLength");
  b.Add("header_len_60_no_header", Le64(60), "InvalidHeaderLength");
  // N at the limit itself passes rule 2 and fails rule 3.
  b.Add("header_len_100000000_past_eof", Le64(100'000'000) + "{}      ", "InvalidHeaderLength");
}

void AddUtf8Cases(Builder& b) {
  // Rule 4: the header is not UTF-8 (anywhere in it, even in padding).
  b.Add("utf8_invalid_byte_ff", File("{\"\xff\":1}"), "InvalidHeader");
  b.Add("utf8_overlong_slash", File("{\"a\xc0\xaf\":1}"), "InvalidHeader");
  b.Add("utf8_encoded_surrogate", File("{\"\xed\xa0\x80\":1}"), "InvalidHeader");
  b.Add("utf8_above_u10ffff", File("{\"\xf4\x90\x80\x80\":1}"), "InvalidHeader");
  b.Add("utf8_truncated_sequence", File("{}   \xc3"), "InvalidHeader");
  b.Add("utf8_invalid_in_padding", File("{}  \xff   "), "InvalidHeader");
  b.Add("utf8_invalid_only_byte", Le64(1) + "\xff", "InvalidHeader");
}

void AddJsonSyntaxCases(Builder& b) {
  const std::string a = T("a", "U8", "1", 0, 1);
  const std::string one = Data(1);
  // Rule 5, syntax.
  b.Add("json_empty_header", File(""), kJson);
  b.Add("json_only_open_brace", File("{"), kJson);
  b.Add("json_only_spaces", File("        "), kJson);
  b.Add("json_root_array", File("[]"), kJson);
  b.Add("json_root_string", File("\"{}\""), kJson);
  b.Add("json_root_null", File("null"), kJson);
  b.Add("json_root_number", File("0"), kJson);
  b.Add("json_unclosed_object", File("{" + a, one), kJson);
  b.Add("json_extra_close_brace", File("{" + a + "}}", one), kJson);
  b.Add("json_two_roots", File("{}{}"), kJson);
  b.Add("json_trailing_comma", File("{" + a + ",}", one), kJson);
  b.Add("json_trailing_comma_in_shape",
        File("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,],"
             "\"data_offsets\":[0,1]}}",
             one),
        kJson);
  b.Add("json_block_comment", File("{/*c*/" + a + "}", one), kJson);
  b.Add("json_line_comment", File("{" + a + "}//", one), kJson);
  b.Add("json_utf8_bom", File("\xef\xbb\xbf{" + a + "}", one), kJson);
  b.Add("json_nul_padding", File("{" + a + "}\0\0\0"s, one), kJson);
  b.Add("json_nbsp_padding", File("{" + a + "}\xc2\xa0", one), kJson);
  b.Add("json_form_feed_leading", File("\x0c{" + a + "}", one), kJson);
  b.Add("json_vertical_tab_trailing", File("{" + a + "}\x0b", one), kJson);
  b.Add("json_raw_tab_in_name", File("{\"a\tb\":" + T("x", "U8", "1", 0, 1).substr(4) + "}", one),
        kJson);
  b.Add("json_raw_control_in_field", File(WithExtra("\"x\":\"\x01\""), one), kJson);
  b.Add("json_raw_newline_in_metadata", File("{\"__metadata__\":{\"k\":\"\n\"}," + a + "}", one),
        kJson);
  b.Add("json_invalid_escape", File(WithExtra("\"x\":\"\\a\""), one), kJson);
  b.Add("json_invalid_unicode_escape", File(WithExtra("\"x\":\"\\u00zz\""), one), kJson);
  b.Add("json_lone_high_surrogate", File(WithExtra("\"x\":\"\\ud800\""), one), kJson);
  b.Add("json_lone_low_surrogate", File(WithExtra("\"x\":\"\\udc00\""), one), kJson);
  b.Add("json_number_plus", File(WithExtra("\"x\":+1"), one), kJson);
  b.Add("json_number_leading_dot", File(WithExtra("\"x\":.5"), one), kJson);
  b.Add("json_number_trailing_dot", File(WithExtra("\"x\":1."), one), kJson);
  b.Add("json_number_nan", File(WithExtra("\"x\":NaN"), one), kJson);
  b.Add("json_number_infinity", File(WithExtra("\"x\":Infinity"), one), kJson);
  b.Add("json_leading_zero_in_unknown_field", File(WithExtra("\"x\":01"), one), kJson);
  // serde_json rejects a float literal that overflows f64, even where ignored.
  b.Add("json_float_out_of_range", File(WithExtra("\"x\":1e999"), one), kJson);
  b.Add("json_bad_literal", File(WithExtra("\"x\":tru"), one), kJson);
}

void AddSchemaCases(Builder& b) {
  const std::string one = Data(1);
  const std::string a = T("a", "U8", "1", 0, 1);
  auto info = [](std::string_view dtype, std::string_view shape, std::string_view offsets) {
    return "{\"a\":{\"dtype\":" + std::string(dtype) + ",\"shape\":" + std::string(shape) +
           ",\"data_offsets\":" + std::string(offsets) + "}}";
  };
  // dtype.
  b.Add("dtype_unknown", File(info("\"F8_E4M3FN\"", "[1]", "[0,1]"), one), kJson);
  b.Add("dtype_lowercase_f32", File(info("\"f32\"", "[1]", "[0,4]"), Data(4)), kJson);
  b.Add("dtype_torch_name", File(info("\"float32\"", "[1]", "[0,4]"), Data(4)), kJson);
  b.Add("dtype_not_string", File(info("5", "[1]", "[0,1]"), one), kJson);
  b.Add("dtype_null", File(info("null", "[1]", "[0,1]"), one), kJson);
  b.Add("dtype_empty", File(info("\"\"", "[1]", "[0,1]"), one), kJson);
  // serde also reads an enum from its map form {"VARIANT": null}, so the
  // reference takes this dtype as U8; tensorlift requires the string.
  b.AddDiff("dtype_as_enum_map", File(info("{\"U8\":null}", "[1]", "[0,1]"), one), kJson, "ok");
  b.Add("dtype_as_enum_map_with_value", File(info("{\"U8\":[]}", "[1]", "[0,1]"), one), kJson);
  b.Add("dtype_with_space", File(info("\"U8 \"", "[1]", "[0,1]"), one), kJson);
  // Missing fields.
  b.Add("missing_dtype", File("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", one), kJson);
  b.Add("missing_shape", File("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", one), kJson);
  b.Add("missing_data_offsets", File("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", one), kJson);
  b.Add("missing_all_fields", File("{\"a\":{}}", one), kJson);
  // data_offsets: exactly two non-negative integers.
  b.Add("offsets_empty", File(info("\"U8\"", "[1]", "[]"), one), kJson);
  b.Add("offsets_one_element", File(info("\"U8\"", "[1]", "[1]"), one), kJson);
  b.Add("offsets_three_elements", File(info("\"U8\"", "[1]", "[0,1,1]"), one), kJson);
  b.Add("offsets_object", File(info("\"U8\"", "[1]", "{\"0\":0,\"1\":1}"), one), kJson);
  b.Add("offsets_null", File(info("\"U8\"", "[1]", "null"), one), kJson);
  b.Add("offsets_string", File(info("\"U8\"", "[1]", "\"0,1\""), one), kJson);
  b.Add("offsets_negative", File(info("\"U8\"", "[0]", "[-1,0]"), ""), kJson);
  b.Add("offsets_float", File(info("\"F32\"", "[4]", "[0,16.0]"), Data(16)), kJson);
  b.Add("offsets_exponent", File(info("\"F32\"", "[4]", "[0,1.6e1]"), Data(16)), kJson);
  b.Add("offsets_integer_exponent", File(info("\"U8\"", "[1]", "[0,1e0]"), one), kJson);
  b.Add("offsets_negative_zero", File(info("\"U8\"", "[1]", "[-0,1]"), one), kJson);
  b.Add("offsets_leading_zero", File(info("\"U8\"", "[1]", "[00,1]"), one), kJson);
  b.Add("offsets_leading_zero_01", File(info("\"U8\"", "[1]", "[0,01]"), one), kJson);
  b.Add("offsets_string_number", File(info("\"F32\"", "[4]", "[0,\"16\"]"), Data(16)), kJson);
  b.Add("offsets_2pow64", File(info("\"U8\"", "[0]", "[0," + std::string(k2Pow64) + "]"), ""),
        kJson);
  b.Add("offsets_nested", File(info("\"U8\"", "[1]", "[[0],[1]]"), one), kJson);
  // shape: an array of non-negative integers.
  b.Add("shape_negative", File(info("\"U8\"", "[-1]", "[0,1]"), one), kJson);
  b.Add("shape_float", File(info("\"U8\"", "[1.0]", "[0,1]"), one), kJson);
  b.Add("shape_negative_zero", File(info("\"U8\"", "[-0]", "[0,0]"), ""), kJson);
  b.Add("shape_leading_zero", File(info("\"U8\"", "[01]", "[0,1]"), one), kJson);
  b.Add("shape_string", File(info("\"U8\"", "[\"1\"]", "[0,1]"), one), kJson);
  b.Add("shape_null_entry", File(info("\"U8\"", "[null]", "[0,1]"), one), kJson);
  b.Add("shape_bool_entry", File(info("\"U8\"", "[true]", "[0,1]"), one), kJson);
  b.Add("shape_nested", File(info("\"U8\"", "[[1]]", "[0,1]"), one), kJson);
  b.Add("shape_2pow64", File(info("\"U8\"", "[0," + std::string(k2Pow64) + "]", "[0,0]"), ""),
        kJson);
  b.Add("shape_not_array", File(info("\"U8\"", "1", "[0,1]"), one), kJson);
  b.Add("shape_object", File(info("\"U8\"", "{}", "[0,1]"), one), kJson);
  b.Add("shape_null", File(info("\"U8\"", "null", "[0,1]"), one), kJson);
  // The tensor value itself.
  b.Add("tensor_null", File("{\"a\":null}"), kJson);
  b.Add("tensor_number", File("{\"a\":1}"), kJson);
  b.Add("tensor_string", File("{\"a\":\"x\"}"), kJson);
  b.Add("tensor_empty_array", File("{\"a\":[]}"), kJson);
  // serde accepts a struct as a sequence of its fields in order, so the
  // reference reads ["U8",[1],[0,1]] as a tensor. tensorlift requires an
  // object: no writer produces this form and other readers reject it.
  b.AddDiff("tensor_info_as_array", File("{\"a\":[\"U8\",[1],[0,1]]}", one), kJson, "ok");
  // Duplicate fields inside one tensor (also when spelled with an escape).
  b.Add(
      "duplicate_field_dtype",
      File("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"dtype\":\"U8\"}}", one),
      kJson);
  b.Add("duplicate_field_shape",
        File("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"shape\":[1]}}", one),
        kJson);
  b.Add("duplicate_field_data_offsets",
        File("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
             "\"data_offsets\":[0,1]}}",
             one),
        kJson);
  b.Add("duplicate_field_escaped",
        File("{\"a\":{\"\\u0064type\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
             "\"data_offsets\":[0,1]}}",
             one),
        kJson);
  // __metadata__.
  b.Add("metadata_duplicate",
        File("{\"__metadata__\":{\"k\":\"v\"}," + a + ",\"__metadata__\":{\"k\":\"v\"}}", one),
        kJson);
  b.Add("metadata_duplicate_null",
        File("{\"__metadata__\":null," + a + ",\"__metadata__\":null}", one), kJson);
  b.Add("metadata_duplicate_escaped",
        File("{\"__metadata__\":{}," + a + ",\"\\u005f_metadata__\":{}}", one), kJson);
  b.Add("metadata_integer_value", File("{\"__metadata__\":{\"k\":1}," + a + "}", one), kJson);
  b.Add("metadata_null_value", File("{\"__metadata__\":{\"k\":null}," + a + "}", one), kJson);
  b.Add("metadata_bool_value", File("{\"__metadata__\":{\"k\":true}," + a + "}", one), kJson);
  b.Add("metadata_nested_object", File("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}," + a + "}", one),
        kJson);
  b.Add("metadata_array_value", File("{\"__metadata__\":{\"k\":[\"v\"]}," + a + "}", one), kJson);
  b.Add("metadata_array", File("{\"__metadata__\":[]," + a + "}", one), kJson);
  b.Add("metadata_string", File("{\"__metadata__\":\"x\"," + a + "}", one), kJson);
  // A tensor named __metadata__ is read as the metadata map.
  b.Add("tensor_named_metadata", File("{" + T("__metadata__", "U8", "1", 0, 1) + "}", one), kJson);
  // Case matters: __METADATA__ is a tensor, and not a valid one.
  b.Add("metadata_uppercase_is_tensor", File("{\"__METADATA__\":{}," + a + "}", one), kJson);

  // Nesting: serde_json's recursion limit lets depth 127 through and stops
  // 128 (measured against the reference package; the root object is depth 1).
  b.Add("deep_128_arrays", Deep(128, false, ""), kJson);
  b.Add("deep_128_objects", Deep(128, true, ""), kJson);
  b.Add("deep_128_arrays_with_scalar", Deep(128, false, "0"), kJson);
  b.Add("deep_200_arrays", Deep(200, false, ""), kJson);
  b.Add("deep_100000_arrays", Deep(100000, false, ""), kJson);
  b.Add(
      "deep_in_metadata",
      File("{\"__metadata__\":{\"k\":" + Repeat("[", 200) + Repeat("]", 200) + "}," + a + "}", one),
      kJson);
}

void AddDuplicateCases(Builder& b) {
  const std::string a_f32 = T("a", "F32", "2,2", 0, 16);
  // The reference keeps the last entry silently: identical duplicates load.
  b.AddDiff("duplicate_name_identical", File("{" + a_f32 + "," + a_f32 + "}", Data(16)),
            "DuplicateTensor", "ok");
  // ... and the last one wins even when they disagree (a parser differential).
  b.AddDiff("duplicate_name_last_wins",
            File("{" + T("a", "I8", "1", 0, 1) + "," + a_f32 + "}", Data(16)), "DuplicateTensor",
            "ok");
  // The same name spelled with an escape.
  b.AddDiff("duplicate_name_escaped",
            File("{" + a_f32 + "," + T("\\u0061", "F32", "2,2", 0, 16) + "}", Data(16)),
            "DuplicateTensor", "ok");
  // Here the dropped entry leaves a hole: the reference fails with
  // InvalidOffset, for the wrong reason.
  b.AddDiff("duplicate_name_hole",
            File("{" + a_f32 + "," + T("a", "F32", "2,2", 16, 32) + "}", Data(32)),
            "DuplicateTensor", "error");
  b.AddDiff("duplicate_name_among_others",
            File("{" + T("x", "U8", "2", 0, 2) + "," + T("a", "U8", "1", 2, 3) + "," +
                     T("y", "U8", "1", 3, 4) + "," + T("a", "U8", "1", 2, 3) + "}",
                 Data(4)),
            "DuplicateTensor", "ok");
  // Two empty names.
  b.AddDiff("duplicate_name_empty",
            File("{" + T("", "U8", "0", 0, 0) + "," + T("", "U8", "0", 0, 0) + "}"),
            "DuplicateTensor", "ok");
}

void AddOffsetCases(Builder& b) {
  // Rule 6: the tensors tile the data section from 0, in offset order.
  b.Add("offset_gap",
        File("{" + T("a", "F32", "1", 0, 4) + "," + T("b", "F32", "1", 8, 12) + "}", Data(12)),
        "InvalidOffset");
  b.Add("offset_overlap",
        File("{" + T("a", "F32", "2", 0, 8) + "," + T("b", "F32", "2", 4, 12) + "}", Data(12)),
        "InvalidOffset");
  b.Add("offset_shared_range",
        File("{" + T("a", "F32", "1", 0, 4) + "," + T("b", "F32", "1", 0, 4) + "}", Data(4)),
        "InvalidOffset");
  b.Add("offset_first_not_at_zero", File("{" + T("a", "F32", "1", 4, 8) + "}", Data(8)),
        "InvalidOffset");
  b.Add("offset_end_before_begin", File("{" + T("a", "U8", "0", 4, 0) + "}", Data(4)),
        "InvalidOffset");
  b.Add("offset_end_before_begin_after_tensor",
        File("{" + T("a", "U8", "4", 0, 4) + "," + T("b", "U8", "0", 4, 2) + "}", Data(4)),
        "InvalidOffset");
  b.Add("offset_zero_size_dangling", File("{" + T("a", "U8", "0", 5, 5) + "}", Data(5)),
        "InvalidOffset");
  // 10 tensors at [0,16] (the reference's test_json_attack).
  std::string many = "{";
  for (int i = 0; i < 10; ++i) {
    if (i) many += ",";
    many += T("weight_" + std::to_string(i), "F32", "2,2", 0, 16);
  }
  b.Add("offset_json_attack", File(many + "}", Data(16)), "InvalidOffset");
  // Offsets near 2^64 that are not contiguous.
  b.Add("offset_huge_begin", File("{" + T("a", "U8", "0", UINT64_MAX, UINT64_MAX) + "}"),
        "InvalidOffset");
}

void AddSizeCases(Builder& b) {
  const std::string u64max(kU64Max);
  auto one = [](std::string_view dtype, std::string_view shape, uint64_t end) {
    return "{" + T("a", dtype, shape, 0, end) + "}";
  };
  // Rule 7: checked element count (left to right) and bit count.
  b.Add("overflow_shape_product_huge_first", File(one("F64", u64max + "," + u64max + ",0", 0)),
        "ValidationOverflow");
  b.Add("overflow_shape_product", File(one("U8", "4294967296,4294967296", 0)),
        "ValidationOverflow");
  b.Add("overflow_bits_i32_2x2pow63m1", File(one("I32", "2,9223372036854775807", 16), Data(16)),
        "ValidationOverflow");
  b.Add("overflow_shape_i32_2x2pow64m2", File(one("I32", "2,18446744073709551614", 16), Data(16)),
        "ValidationOverflow");
  b.Add("overflow_bits_f64_2pow62", File(one("F64", "4611686018427387904", 0)),
        "ValidationOverflow");
  b.Add("overflow_bits_u8_u64max", File(one("U8", u64max, UINT64_MAX)), "ValidationOverflow");
  b.Add("overflow_bits_f4_2pow62", File(one("F4", "4611686018427387904", 0)), "ValidationOverflow");
  // Sub-byte sizes must be whole bytes.
  b.Add("misaligned_f4_3", File(one("F4", "3", 2), Data(2)), "MisalignedSlice");
  b.Add("misaligned_f4_scalar", File(one("F4", "", 0)), "MisalignedSlice");
  b.Add("misaligned_f6_e3m2_1", File(one("F6_E3M2", "1", 1), Data(1)), "MisalignedSlice");
  b.Add("misaligned_f6_e2m3_2x3", File(one("F6_E2M3", "2,3", 5), Data(5)), "MisalignedSlice");
  // Byte size must match end - begin.
  b.Add("size_mismatch_short", File(one("F32", "2,2", 12), Data(12)), "TensorInvalidInfo");
  b.Add("size_mismatch_long", File(one("F32", "2,2", 20), Data(20)), "TensorInvalidInfo");
  b.Add("size_mismatch_scalar_8_bytes", File(one("I32", "", 8), Data(8)), "TensorInvalidInfo");
  b.Add("size_mismatch_zero_size_with_bytes", File(one("U8", "0", 1), Data(1)),
        "TensorInvalidInfo");
  b.Add("size_mismatch_f4_2_two_bytes", File(one("F4", "2", 2), Data(2)), "TensorInvalidInfo");
  b.Add("size_mismatch_second_tensor",
        File("{" + T("a", "U8", "2", 0, 2) + "," + T("b", "I16", "2", 2, 5) + "}", Data(5)),
        "TensorInvalidInfo");
  // Wrong size on a tensor placed later in the header than a valid one.
  b.Add("size_mismatch_reference_test_invalid_info",
        File("{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0, 4]}}", Data(4)),
        "TensorInvalidInfo");
}

void AddBufferCases(Builder& b) {
  const std::string a = "{" + T("test", "I32", "2,2", 0, 16) + "}";
  // Rule 8: the data section ends exactly at the end of the file.
  b.Add("buffer_trailing_byte_no_tensors", File("{}", "\0"s), "MetadataIncompleteBuffer");
  b.Add("buffer_trailing_polyglot", File(a, Data(16) + "extra_bogus_data_for_polyglot_file"),
        "MetadataIncompleteBuffer");
  b.Add("buffer_truncated_data", File(a, Data(14)), "MetadataIncompleteBuffer");
  b.Add("buffer_no_data", File(a), "MetadataIncompleteBuffer");
  b.Add("buffer_metadata_only_trailing", File("{\"__metadata__\":{}}", "x"),
        "MetadataIncompleteBuffer");
  // Eight U8 tensors of 2^61 - 1 bytes end at 2^64 - 8: adding 8 + N to that
  // overflows (the reference's unchecked sum panics in a debug build).
  std::string h = "{";
  const uint64_t s = (uint64_t{1} << 61) - 1;
  for (uint64_t i = 0; i < 8; ++i) {
    if (i) h += ",";
    h += T("t" + std::to_string(i), "U8", std::to_string(s), i * s, (i + 1) * s);
  }
  b.Add("buffer_sizes_sum_overflows", File(h + "}"), "MetadataIncompleteBuffer");
}

// Files that break several rules: the first rule in the reader's order wins,
// and tensors are checked one at a time in offset order.
void AddOrderCases(Builder& b) {
  b.Add("order_length_before_utf8", Le64(10) + "{\"\xff\":1}", "InvalidHeaderLength");
  b.Add("order_size_error_before_later_gap",
        File("{" + T("b", "U8", "1", 8, 9) + "," + T("a", "F32", "2", 0, 4) + "}", Data(9)),
        "TensorInvalidInfo");
  b.Add("order_gap_before_later_overflow",
        File("{" + T("a", "U8", "4", 0, 4) + "," + T("b", "U8", "0", 6, 6) + "," +
                 T("c", "F64", "4611686018427387904", 6, 6) + "}",
             Data(6)),
        "InvalidOffset");
  b.Add(
      "order_overflow_before_later_misaligned",
      File("{" + T("a", "U8", "4294967296,4294967296", 0, 0) + "," + T("b", "F4", "3", 0, 2) + "}",
           Data(2)),
      "ValidationOverflow");
  b.Add("order_size_error_before_trailing_bytes",
        File("{" + T("a", "F32", "2", 0, 4) + "}", Data(4) + "trailing"), "TensorInvalidInfo");
  b.Add("order_json_error_before_offsets",
        File("{" + T("a", "U8", "1", 4, 5) + "," + T("b", "u8", "1", 0, 4) + "}", Data(5)), kJson);
  b.Add("order_duplicate_before_offsets",
        File("{" + T("a", "U8", "1", 4, 5) + "," + T("a", "U8", "1", 7, 8) + "}", Data(5)),
        "DuplicateTensor");
}

void AddValidCases(Builder& b) {
  // No tensors.
  b.Add("valid_empty_object", File("{}"), "ok");
  b.Add("valid_empty_padded", File("{}      "), "ok");
  b.Add("valid_metadata_only", File("{\"__metadata__\":{\"framework\":\"pt\"}}"), "ok");
  b.Add("valid_metadata_null",
        File("{\"__metadata__\":null," + T("a", "U8", "1", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_metadata_empty",
        File("{\"__metadata__\":{}," + T("a", "U8", "1", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_metadata_values",
        File("{" + T("a", "U8", "1", 0, 1) +
                 ",\"__metadata__\":{\"format\":\"pt\",\"\":\"\",\"esc\":\"q\\\"b\\\\n\\n\\u0000"
                 "\\u00e9\",\"utf8\":\"caf\xc3\xa9\"}}",
             Data(1)),
        "ok");
  // Duplicate keys inside the metadata map: the last one wins.
  b.Add("valid_metadata_duplicate_key", File("{\"__metadata__\":{\"x\":\"1\",\"x\":\"2\"}}"), "ok");
  // An escaped spelling of __metadata__ is the metadata key.
  b.Add("valid_metadata_escaped_key",
        File("{\"\\u005f_metadata__\":{\"k\":\"v\"}," + T("a", "U8", "1", 0, 1) + "}", Data(1)),
        "ok");

  // Zero-size tensors: several at one offset, and between tensors.
  b.Add("valid_zero_size_tensors",
        File("{" + T("z0", "U8", "0", 0, 0) + "," + T("z1", "I32", "2,0", 0, 0) + "," +
                 T("a", "F32", "1", 0, 4) + "," + T("z2", "F16", "0,3", 4, 4) + "," +
                 T("z3", "U8", "0", 4, 4) + "," + T("b", "U8", "2", 4, 6) + "," +
                 T("z4", "F64", "0", 6, 6) + "}",
             Data(6)),
        "ok");
  b.Add("valid_zero_size_only", File("{" + T("a", "I32", "2,0", 0, 0) + "}"), "ok");
  b.Add("valid_zero_first_huge_dims",
        File("{" + T("a", "F64", "0," + std::string(kU64Max) + "," + std::string(kU64Max), 0, 0) +
             "}"),
        "ok");
  // Rank-0 scalars.
  b.Add("valid_scalars",
        File("{" + T("f", "F32", "", 0, 4) + "," + T("i", "I64", "", 4, 12) + "," +
                 T("b", "BOOL", "", 12, 13) + "}",
             Data(13)),
        "ok");
  // Sub-byte dtypes in whole bytes.
  b.Add("valid_f4_2", File("{" + T("a", "F4", "2", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_f4_1x2", File("{" + T("attn.0", "F4", "1,2", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_f6_e2m3_4", File("{" + T("a", "F6_E2M3", "4", 0, 3) + "}", Data(3)), "ok");
  b.Add("valid_f6_e3m2_2x4", File("{" + T("a", "F6_E3M2", "2,4", 0, 6) + "}", Data(6)), "ok");
  // Every dtype, in enum order, two elements each (four for F6).
  {
    std::string h = "{";
    uint64_t off = 0;
    for (const DtypeRow& d : kDtypes) {
      const int n = d.bits == 6 ? 4 : 2;
      const uint64_t bytes = static_cast<uint64_t>(n * d.bits / 8);
      if (off) h += ",";
      h += T("t_" + std::string(d.name), d.name, std::to_string(n), off, off + bytes);
      off += bytes;
    }
    b.Add("valid_all_dtypes", File(h + "}", Data(off)), "ok");
  }
  // JSON whitespace around the object (but nothing else).
  const std::string a = "{" + T("a", "U8", "1", 0, 1) + "}";
  b.Add("valid_trailing_spaces", File(a + "       ", Data(1)), "ok");
  b.Add("valid_leading_whitespace", File("\t\n " + a, Data(1)), "ok");
  b.Add("valid_trailing_json_whitespace", File(a + "\r \t\n", Data(1)), "ok");
  b.Add("valid_whitespace_inside",
        File("{ \"a\" :\n{\t\"dtype\" : \"U8\" ,\r\n\"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , "
             "1 ] } }",
             Data(1)),
        "ok");
  // Unknown fields are ignored, whatever they hold.
  b.Add("valid_unknown_fields",
        File(WithExtra("\"foo\":[1,{\"b\":null}],\"bar\":\"x\",\"baz\":{\"dtype\":5},"
                       "\"n\":-12.5e-3,\"t\":true,\"dup\":1,\"dup\":2"),
             Data(1)),
        "ok");
  b.Add("valid_negative_zero_in_unknown_field",
        File(WithExtra("\"x\":-0,\"y\":[-0,-0.0,-0e1,\"-0\"],\"-0\":{\"-0\":-0}"), Data(1)), "ok");
  b.Add("valid_float_underflow_in_unknown_field", File(WithExtra("\"x\":1e-999"), Data(1)), "ok");
  b.Add("valid_escaped_strings_in_unknown_field",
        File(WithExtra("\"x\":\"\\ud83d\\ude00\\/\\b\\f\\n\\r\\t\\\"\\\\\""), Data(1)), "ok");
  b.Add("valid_escaped_field_names",
        File("{\"a\":{\"\\u0064type\":\"F\\u0033\\u0032\",\"sha\\u0070e\":[1],"
             "\"data_offsets\":[0,4]}}",
             Data(4)),
        "ok");
  // Integers beyond 64 bits are valid JSON; serde_json reads them as floats,
  // which an ignored field does not care about.
  // (simdjson alone rejects these; the parser's number pass makes them floats.)
  b.Add("valid_integer_2pow64_in_unknown_field",
        File(WithExtra("\"x\":" + std::string(k2Pow64)), Data(1)), "ok");
  b.Add("valid_integer_below_i64_min_in_unknown_field",
        File(WithExtra("\"x\":-9223372036854775809"), Data(1)), "ok");
  // serde_json reads -0e999 as -0.0; only a bare "-0" is an integer token.
  b.Add("valid_negative_zero_huge_exponent_in_unknown_field",
        File(WithExtra("\"x\":-0e999,\"y\":[-0.0E+400]"), Data(1)), "ok");
  // An integer too large even for a double is refused, as serde_json does.
  b.Add("integer_beyond_double_range_in_unknown_field",
        File(WithExtra("\"x\":1" + std::string(320, '0')), Data(1)), kJson);
  // Nesting up to depth 127.
  b.Add("valid_deep_127_arrays", Deep(127, false, ""), "ok");
  b.Add("valid_deep_127_objects", Deep(127, true, ""), "ok");
  b.Add("valid_deep_127_arrays_with_scalar", Deep(127, false, "0"), "ok");
  b.Add("valid_deep_127_objects_with_scalar", Deep(127, true, "\"b\":0"), "ok");
  // Names.
  b.Add("valid_name_empty", File("{" + T("", "U8", "1", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_name_with_nul", File("{" + T("a\\u0000b", "U8", "1", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_name_utf8",
        File("{" + T("caf\xc3\xa9", "U8", "1", 0, 1) + "," + T("caf\\u00e9s", "U8", "1", 1, 2) +
                 "," + T("\xf0\x9f\x98\x80", "U8", "1", 2, 3) + "}",
             Data(3)),
        "ok");
  b.Add("valid_name_escapes",
        File("{" + T("q\\\"b\\\\s\\/\\n\\t\\u001f\x7f", "U8", "1", 0, 1) + "}", Data(1)), "ok");
  b.Add("valid_name_long", File("{" + T(std::string(1000, 'n'), "U8", "1", 0, 1) + "}", Data(1)),
        "ok");
  // Entries in any order: the reader sorts by offset.
  b.Add("valid_out_of_order",
        File("{" + T("c", "U8", "2", 6, 8) + "," + T("a", "F32", "1", 0, 4) + "," +
                 T("b", "I16", "1", 4, 6) + "}",
             Data(8)),
        "ok");
  // The reference's own test files.
  b.Add("valid_reference_test_deserialization",
        File("{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", Data(16)),
        "ok");
  b.Add("valid_reference_test_zero_sized",
        File("{\"test\":{\"dtype\":\"I32\",\"shape\":[2,0],\"data_offsets\":[0, 0]}}"), "ok");
  b.Add("valid_reference_test_whitespace_padded", Le64(6) + "{}\x0d\x20\x09\x0a", "ok");
  // A file as the reference writer makes it (metadata first, padded, aligned).
  b.Add("valid_writer_style",
        File("{\"__metadata__\":{\"format\":\"pt\"}," + T("w", "F32", "2", 0, 8) + "," +
                 T("m", "BOOL", "3", 8, 11) + "}   ",
             Data(11)),
        "ok");
}

// Where the reference itself is wrong, tensorlift does not copy it.
void AddReferenceQuirkCases(Builder& b) {
  // 1.7976931348623158e308 rounds to the largest double; serde_json's fast
  // (not correctly rounded) float parser overflows and rejects the file.
  b.AddDiff("reference_quirk_float_near_max_in_unknown_field",
            File(WithExtra("\"x\":1.7976931348623158e308"), Data(1)), "ok", "error");
}

void AddLargeCases(Builder& b) {
  // N exactly at the limit: "{}" and 99,999,998 spaces.
  std::string h = "{}";
  h.resize(100'000'000, ' ');
  b.Add("valid_header_len_100000000", File(h), "ok");
}

}  // namespace

std::vector<CorpusCase> MakeCorpus(const CorpusOptions& options) {
  Builder b;
  AddLengthCases(b);
  AddUtf8Cases(b);
  AddJsonSyntaxCases(b);
  AddSchemaCases(b);
  AddDuplicateCases(b);
  AddOffsetCases(b);
  AddSizeCases(b);
  AddBufferCases(b);
  AddOrderCases(b);
  AddValidCases(b);
  AddReferenceQuirkCases(b);
  if (options.include_large) AddLargeCases(b);
  return b.Take();
}

Status WriteCorpus(const std::string& dir, const std::vector<CorpusCase>& cases) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create " + dir + ": " + ec.message());
  std::set<std::string> names;
  std::ofstream manifest(dir + "/manifest.tsv", std::ios::binary | std::ios::trunc);
  std::ofstream bugs(dir + "/known_bugs.tsv", std::ios::binary | std::ios::trunc);
  for (const CorpusCase& c : cases) {
    if (!names.insert(c.name).second) return InternalError("duplicate case name " + c.name);
    const std::string path = dir + "/" + c.name + ".safetensors";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
    out.close();
    if (!out) return IOError("cannot write " + path);
    manifest << c.name << '\t' << c.expected << '\t' << c.reference << '\n';
    if (!c.known_bug.empty()) bugs << c.name << '\t' << c.known_bug << '\n';
  }
  manifest.close();
  bugs.close();
  if (!manifest || !bugs) return IOError("cannot write the manifest in " + dir);
  return Status::Ok();
}

}  // namespace tensorlift::testing
