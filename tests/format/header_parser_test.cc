// Header::Parse / ParsePrefix / ReadFile against the hand-built corpus, and
// the contents of parsed headers.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "corrupt/corpus.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorlift/dtype.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace testing {

// Test names carry the case name; print just that instead of the bytes.
void PrintTo(const CorpusCase& c, std::ostream* os) { *os << c.name; }

}  // namespace testing

namespace {

using ::tensorlift::test::ScratchDir;

using ::tensorlift::testing::CorpusCase;
using ::tensorlift::testing::MakeCorpus;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::string_literals;
using namespace std::string_view_literals;

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// "ok", or the rule name that starts a Corruption message (after `path` and
// ": " when a path is given), or "<Code>: msg" for any other status (which no
// corpus case expects).
std::string Verdict(const Result<Header>& r, const std::string& path = "") {
  if (r.ok()) return "ok";
  const Status& s = r.status();
  std::string_view m = s.message();
  if (!path.empty()) {
    if (!m.starts_with(path + ": ")) return "message without the path: " + s.message();
    m.remove_prefix(path.size() + 2);
  }
  if (s.code() != StatusCode::kCorruption) {
    return std::string(StatusCodeName(s.code())) + ": " + s.message();
  }
  return std::string(m.substr(0, m.find(':')));
}

const std::vector<CorpusCase>& Corpus() {
  static const auto* const kCorpus = new std::vector<CorpusCase>(MakeCorpus());
  return *kCorpus;
}

const CorpusCase& Case(std::string_view name) {
  for (const CorpusCase& c : Corpus()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no corpus case " << name;
  std::abort();
}

Header ParseCase(std::string_view name) {
  auto r = Header::Parse(Case(name).span());
  if (!r.ok()) {
    ADD_FAILURE() << name << ": " << r.status().ToString();
    std::abort();
  }
  return std::move(r).value();
}

std::string ParseError(std::string_view name) {
  auto r = Header::Parse(Case(name).span());
  EXPECT_FALSE(r.ok()) << name;
  return r.ok() ? "" : r.status().message();
}

void ExpectSameHeader(const Header& a, const Header& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorInfo& x = a.tensors()[i];
    const TensorInfo& y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.begin, y.begin);
    EXPECT_EQ(x.end, y.end);
    EXPECT_EQ(x.num_elements, y.num_elements);
  }
  EXPECT_EQ(a.by_name(), b.by_name());
  EXPECT_EQ(a.metadata(), b.metadata());
  EXPECT_EQ(a.header_size(), b.header_size());
  EXPECT_EQ(a.data_size(), b.data_size());
  EXPECT_EQ(a.file_size(), b.file_size());
}

// Invariants of every valid header.
void ExpectConsistent(const Header& h, uint64_t file_size) {
  EXPECT_EQ(h.data_offset(), 8 + h.header_size());
  EXPECT_EQ(h.file_size(), file_size);
  uint64_t pos = 0;
  for (const TensorInfo& t : h.tensors()) {
    EXPECT_EQ(t.begin, pos) << t.name;
    EXPECT_GE(t.end, t.begin) << t.name;
    pos = t.end;
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    EXPECT_EQ(t.num_elements, n) << t.name;
    EXPECT_EQ(t.nbytes(), t.num_elements * DtypeBits(t.dtype) / 8) << t.name;
    const TensorInfo* found = h.Find(t.name);
    ASSERT_NE(found, nullptr) << t.name;
    EXPECT_EQ(found, &t);
  }
  EXPECT_EQ(h.data_size(), pos);
  ASSERT_EQ(h.by_name().size(), h.tensors().size());
  for (size_t i = 1; i < h.by_name().size(); ++i) {
    EXPECT_LT(h.tensors()[h.by_name()[i - 1]].name, h.tensors()[h.by_name()[i]].name);
  }
}

// --- Every corpus case -------------------------------------------------------

class CorpusTest : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(CorpusTest, Verdict) {
  const CorpusCase& c = GetParam();
  auto parsed = Header::Parse(c.span());
  const std::string got = Verdict(parsed);
  if (!c.known_bug.empty() && got != c.expected) {
    GTEST_SKIP() << "known bug: " << c.known_bug << " (expected " << c.expected << ", got "
                 << (parsed.ok() ? "ok" : parsed.status().message()) << ")";
  }
  ASSERT_EQ(got, c.expected) << (parsed.ok() ? "" : parsed.status().message());
  if (parsed.ok()) {
    ExpectConsistent(*parsed, c.bytes.size());
  } else {
    EXPECT_THAT(parsed.status().message(), StartsWith(c.expected + ": "));
    // One line, for the CLI's "PATH: error" output.
    EXPECT_EQ(parsed.status().message().find('\n'), std::string::npos);
  }

  // The same from the first 8 + N bytes and the file size.
  if (c.bytes.size() >= 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(c.bytes[i]);
    if (n <= kMaxHeaderSize && 8 + n <= c.bytes.size()) {
      auto prefix = Header::ParsePrefix(c.span().first(8 + n), c.bytes.size());
      EXPECT_EQ(Verdict(prefix), got);
      if (parsed.ok() && prefix.ok()) ExpectSameHeader(*parsed, *prefix);
      if (!parsed.ok() && !prefix.ok()) {
        EXPECT_EQ(prefix.status().message(), parsed.status().message());
      }
    }
  }

  // The same from a file on disk, with the path prefixed once.
  ScratchDir dir;
  const std::string path = dir.Write(c.name + ".safetensors", c.bytes);
  auto read = Header::ReadFile(path);
  ASSERT_EQ(Verdict(read, path), got) << (read.ok() ? "" : read.status().message());
  if (parsed.ok()) {
    ExpectSameHeader(*parsed, *read);
  } else {
    EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
    EXPECT_EQ(read.status().message(), path + ": " + parsed.status().message());
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusTest, ::testing::ValuesIn(Corpus()),
                         [](const ::testing::TestParamInfo<CorpusCase>& info) {
                           return info.param.name;
                         });

TEST(CorpusShapeTest, CoversEveryRuleAndIsWellFormed) {
  std::set<std::string> names, verdicts;
  for (const CorpusCase& c : Corpus()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate name " << c.name;
    EXPECT_FALSE(c.name.empty());
    for (char ch : c.name) {
      EXPECT_TRUE((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_') << c.name;
    }
    EXPECT_TRUE(c.reference == "ok" || c.reference == "error") << c.name;
    const bool known_rule =
        c.expected == "ok" || std::find(testing::kRuleNames.begin(), testing::kRuleNames.end(),
                                        c.expected) != testing::kRuleNames.end();
    EXPECT_TRUE(known_rule) << c.name << ": " << c.expected;
    // The verdicts differ only where tensorlift is deliberately stricter
    // (duplicate names, serde's alternative forms of structs and enums) or
    // the reference is wrong.
    if ((c.expected == "ok") != (c.reference == "ok")) {
      EXPECT_TRUE(c.expected == "DuplicateTensor" || c.name == "tensor_info_as_array" ||
                  c.name == "dtype_as_enum_map" || c.name.starts_with("reference_quirk_"))
          << c.name;
    }
    verdicts.insert(c.expected);
  }
  for (std::string_view rule : testing::kRuleNames) {
    EXPECT_TRUE(verdicts.count(std::string(rule))) << "no case for " << rule;
  }
  EXPECT_TRUE(verdicts.count("ok"));
  // The large case is only there on request.
  EXPECT_FALSE(names.count("valid_header_len_100000000"));
}

// --- Contents of valid headers -----------------------------------------------

constexpr std::string_view kDtypeNames[] = {
    "BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
    "U32",     "F32",         "C64",         "F64",     "I64", "U64"};
constexpr int kDtypeBits[] = {8,  4,  6,  6,  8,  8,  8,  8,  8,  8,  8,
                              16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};

TEST(DtypeTest, NamesBitsAndOrderMatchTheReference) {
  ASSERT_EQ(kNumDtypes, 22);
  for (int i = 0; i < kNumDtypes; ++i) {
    const Dtype d = static_cast<Dtype>(i);
    EXPECT_EQ(DtypeName(d), kDtypeNames[i]);
    EXPECT_EQ(DtypeBits(d), kDtypeBits[i]) << kDtypeNames[i];
    EXPECT_EQ(DtypeFromName(kDtypeNames[i]), d);
  }
  for (std::string_view bad : {"f32"sv, "F8_E4M3FN"sv, "float32"sv, ""sv, "F32 "sv, "BOOL\0"sv,
                               "U4"sv, "F128"sv, "C128"sv, "bf16"sv}) {
    EXPECT_EQ(DtypeFromName(bad), std::nullopt) << bad;
  }
}

TEST(HeaderContentsTest, AllDtypesInFileOrder) {
  const Header h = ParseCase("valid_all_dtypes");
  ASSERT_EQ(h.tensors().size(), 22u);
  uint64_t pos = 0;
  for (int i = 0; i < kNumDtypes; ++i) {
    const TensorInfo& t = h.tensors()[i];
    EXPECT_EQ(t.name, "t_" + std::string(kDtypeNames[i]));
    EXPECT_EQ(t.dtype, static_cast<Dtype>(i));
    const uint64_t n = kDtypeBits[i] == 6 ? 4 : 2;
    EXPECT_THAT(t.shape, ElementsAre(n));
    EXPECT_EQ(t.num_elements, n);
    EXPECT_EQ(t.begin, pos);
    EXPECT_EQ(t.nbytes(), n * kDtypeBits[i] / 8);
    pos = t.end;
    const TensorInfo* f = h.Find(t.name);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->dtype, t.dtype);
  }
  EXPECT_EQ(h.data_size(), pos);
  EXPECT_EQ(h.Find("t_F8"), nullptr);
  EXPECT_EQ(h.Find("t_BOOLX"), nullptr);
  EXPECT_EQ(h.Find(""), nullptr);
  EXPECT_FALSE(h.metadata().has_value());
  // by_name() sorts bytewise: "t_BF16" < "t_BOOL" < "t_C64" < "t_F16" ...
  std::vector<std::string> sorted;
  for (uint32_t i : h.by_name()) sorted.push_back(h.tensors()[i].name);
  EXPECT_EQ(sorted[0], "t_BF16");
  EXPECT_EQ(sorted[1], "t_BOOL");
  EXPECT_EQ(sorted[2], "t_C64");
  EXPECT_EQ(sorted.back(), "t_U8");
}

TEST(HeaderContentsTest, SizesOfTheReferenceTestFile) {
  const Header h = ParseCase("valid_reference_test_deserialization");
  EXPECT_EQ(h.header_size(), 60u);
  EXPECT_EQ(h.data_offset(), 68u);
  EXPECT_EQ(h.data_size(), 16u);
  EXPECT_EQ(h.file_size(), 84u);
  ASSERT_EQ(h.tensors().size(), 1u);
  const TensorInfo& t = h.tensors()[0];
  EXPECT_EQ(t.name, "test");
  EXPECT_EQ(t.dtype, Dtype::kI32);
  EXPECT_THAT(t.shape, ElementsAre(2, 2));
  EXPECT_EQ(t.num_elements, 4u);
  EXPECT_EQ(t.begin, 0u);
  EXPECT_EQ(t.end, 16u);
  EXPECT_EQ(t.nbytes(), 16u);
}

TEST(HeaderContentsTest, ZeroSizeTensorsKeepHeaderOrderAtOneOffset) {
  const Header h = ParseCase("valid_zero_size_tensors");
  std::vector<std::string> order;
  for (const TensorInfo& t : h.tensors()) order.push_back(t.name);
  EXPECT_THAT(order, ElementsAre("z0", "z1", "a", "z2", "z3", "b", "z4"));
  // Names a, b, z0.. are at file positions 2, 5, 0, 1, 3, 4, 6.
  EXPECT_THAT(h.by_name(), ElementsAre(2, 5, 0, 1, 3, 4, 6));
  EXPECT_EQ(h.Find("z1")->num_elements, 0u);
  EXPECT_THAT(h.Find("z1")->shape, ElementsAre(2, 0));
  EXPECT_EQ(h.Find("z2")->begin, 4u);
  EXPECT_EQ(h.Find("z2")->end, 4u);
  EXPECT_EQ(h.Find("b")->begin, 4u);
  EXPECT_EQ(h.data_size(), 6u);
}

TEST(HeaderContentsTest, OutOfOrderEntriesAreSortedByOffset) {
  const Header h = ParseCase("valid_out_of_order");
  ASSERT_EQ(h.tensors().size(), 3u);
  EXPECT_EQ(h.tensors()[0].name, "a");
  EXPECT_EQ(h.tensors()[1].name, "b");
  EXPECT_EQ(h.tensors()[2].name, "c");
  EXPECT_EQ(h.tensors()[2].begin, 6u);
  EXPECT_THAT(h.by_name(), ElementsAre(0, 1, 2));
  EXPECT_EQ(h.Find("c")->dtype, Dtype::kU8);
  EXPECT_EQ(h.Find("b")->dtype, Dtype::kI16);
}

TEST(HeaderContentsTest, ScalarsAndHugeZeroSizeShapes) {
  const Header s = ParseCase("valid_scalars");
  for (const TensorInfo& t : s.tensors()) {
    EXPECT_TRUE(t.shape.empty()) << t.name;
    EXPECT_EQ(t.num_elements, 1u) << t.name;
  }
  EXPECT_EQ(s.Find("i")->nbytes(), 8u);
  EXPECT_EQ(s.Find("b")->dtype, Dtype::kBool);

  const Header z = ParseCase("valid_zero_first_huge_dims");
  EXPECT_THAT(z.tensors()[0].shape, ElementsAre(0, UINT64_MAX, UINT64_MAX));
  EXPECT_EQ(z.tensors()[0].num_elements, 0u);
}

TEST(HeaderContentsTest, SubByteDtypes) {
  const Header f4 = ParseCase("valid_f4_1x2");
  EXPECT_EQ(f4.tensors()[0].dtype, Dtype::kF4);
  EXPECT_EQ(f4.tensors()[0].num_elements, 2u);
  EXPECT_EQ(f4.tensors()[0].nbytes(), 1u);
  const Header f6 = ParseCase("valid_f6_e2m3_4");
  EXPECT_EQ(f6.tensors()[0].dtype, Dtype::kF6_E2M3);
  EXPECT_EQ(f6.tensors()[0].nbytes(), 3u);
}

TEST(HeaderContentsTest, MetadataAbsentNullEmptyAndValues) {
  EXPECT_FALSE(ParseCase("valid_empty_object").metadata().has_value());
  EXPECT_FALSE(ParseCase("valid_metadata_null").metadata().has_value());
  const Header empty = ParseCase("valid_metadata_empty");
  ASSERT_TRUE(empty.metadata().has_value());
  EXPECT_TRUE(empty.metadata()->empty());

  const Header only = ParseCase("valid_metadata_only");
  EXPECT_TRUE(only.tensors().empty());
  EXPECT_EQ(only.metadata(), (Metadata{{"framework", "pt"}}));

  const Header values = ParseCase("valid_metadata_values");
  EXPECT_EQ(
      values.metadata(),
      (Metadata{
          {"format", "pt"}, {"", ""}, {"esc", "q\"b\\n\n\0\xc3\xa9"s}, {"utf8", "caf\xc3\xa9"}}));
  ASSERT_EQ(values.tensors().size(), 1u);

  EXPECT_EQ(ParseCase("valid_metadata_duplicate_key").metadata(), (Metadata{{"x", "2"}}));
  const Header escaped = ParseCase("valid_metadata_escaped_key");
  EXPECT_EQ(escaped.metadata(), (Metadata{{"k", "v"}}));
  EXPECT_EQ(escaped.tensors().size(), 1u);
}

TEST(HeaderContentsTest, NamesAreDecodedStrings) {
  EXPECT_NE(ParseCase("valid_name_empty").Find(""), nullptr);
  const Header nul = ParseCase("valid_name_with_nul");
  EXPECT_EQ(nul.tensors()[0].name, "a\0b"s);
  EXPECT_NE(nul.Find("a\0b"s), nullptr);
  EXPECT_EQ(nul.Find("a"), nullptr);
  const Header utf8 = ParseCase("valid_name_utf8");
  EXPECT_NE(utf8.Find("caf\xc3\xa9"), nullptr);
  EXPECT_NE(utf8.Find("caf\xc3\xa9s"), nullptr);
  EXPECT_NE(utf8.Find("\xf0\x9f\x98\x80"), nullptr);
  EXPECT_EQ(ParseCase("valid_name_escapes").tensors()[0].name, "q\"b\\s/\n\t\x1f\x7f");
  EXPECT_EQ(ParseCase("valid_name_long").tensors()[0].name, std::string(1000, 'n'));
  const Header esc = ParseCase("valid_escaped_field_names");
  EXPECT_EQ(esc.tensors()[0].dtype, Dtype::kF32);
  EXPECT_THAT(esc.tensors()[0].shape, ElementsAre(1));
}

TEST(HeaderContentsTest, WhitespaceCountsInTheHeaderSize) {
  const Header h = ParseCase("valid_leading_whitespace");
  const std::string& bytes = Case("valid_leading_whitespace").bytes;
  EXPECT_EQ(h.data_offset(), bytes.size() - 1);
  EXPECT_EQ(h.tensors().size(), 1u);
  EXPECT_EQ(ParseCase("valid_reference_test_whitespace_padded").header_size(), 6u);
}

// --- Messages name the object and the numbers ---------------------------------

TEST(HeaderMessagesTest, SpotChecks) {
  EXPECT_EQ(ParseError("offset_gap"),
            "InvalidOffset: tensor 'b': data_offsets [8, 12] do not start where the previous "
            "tensor ended (4)");
  EXPECT_THAT(ParseError("offset_first_not_at_zero"),
              AllOf(StartsWith("InvalidOffset: tensor 'a'"), HasSubstr("[4, 8]")));
  EXPECT_THAT(ParseError("offset_end_before_begin"),
              AllOf(StartsWith("InvalidOffset: tensor 'a'"), HasSubstr("[4, 0]")));
  EXPECT_EQ(ParseError("size_mismatch_short"),
            "TensorInvalidInfo: tensor 'a': F32 [2, 2] needs 16 bytes but data_offsets [0, 12] "
            "hold 12");
  EXPECT_THAT(
      ParseError("header_len_100000001"),
      AllOf(StartsWith("HeaderTooLarge: "), HasSubstr("100000001"), HasSubstr("100000000")));
  EXPECT_THAT(ParseError("header_len_u64_max"), HasSubstr("18446744073709551615"));
  EXPECT_THAT(ParseError("header_len_past_eof"),
              AllOf(StartsWith("InvalidHeaderLength: "), HasSubstr(" 3 "), HasSubstr("10")));
  EXPECT_THAT(ParseError("too_small_7_bytes"),
              AllOf(StartsWith("HeaderTooSmall: "), HasSubstr("7")));
  // 8 + 60 + 14 bytes, where 8 + 60 + 16 are needed.
  EXPECT_THAT(ParseError("buffer_truncated_data"),
              AllOf(StartsWith("MetadataIncompleteBuffer: "), HasSubstr("16"), HasSubstr("60"),
                    HasSubstr("82")));
  EXPECT_THAT(ParseError("overflow_shape_product_huge_first"),
              AllOf(StartsWith("ValidationOverflow: tensor 'a'"),
                    HasSubstr("[18446744073709551615, 18446744073709551615, 0]")));
  EXPECT_THAT(ParseError("overflow_bits_f64_2pow62"),
              AllOf(StartsWith("ValidationOverflow: tensor 'a'"), HasSubstr("4611686018427387904"),
                    HasSubstr("F64")));
  EXPECT_THAT(ParseError("misaligned_f4_3"),
              AllOf(StartsWith("MisalignedSlice: tensor 'a'"), HasSubstr("F4"), HasSubstr("12")));
  EXPECT_THAT(ParseError("duplicate_name_hole"), StartsWith("DuplicateTensor: tensor 'a'"));
  EXPECT_THAT(
      ParseError("dtype_unknown"),
      AllOf(StartsWith("InvalidHeaderDeserialization: tensor 'a'"), HasSubstr("'F8_E4M3FN'")));
  EXPECT_THAT(ParseError("missing_dtype"), HasSubstr("dtype"));
  EXPECT_THAT(ParseError("missing_data_offsets"), HasSubstr("data_offsets"));
  EXPECT_THAT(ParseError("offsets_three_elements"), HasSubstr("3"));
  EXPECT_THAT(ParseError("metadata_duplicate"), HasSubstr("__metadata__"));
  EXPECT_THAT(ParseError("metadata_integer_value"), HasSubstr("'k'"));
  EXPECT_THAT(ParseError("utf8_invalid_byte_ff"), StartsWith("InvalidHeader: "));
}

TEST(HeaderMessagesTest, HostileNamesAreQuotedAndCut) {
  // A gap after a tensor whose name holds a newline and an escape sequence.
  const std::string header =
      "{\"a\\nb\\u001b[2J\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
  const std::string file = Le64(header.size()) + header + "xx";
  auto r = Header::Parse(Bytes(file));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), StartsWith("InvalidOffset: tensor 'a\\x0ab\\x1b[2J'"));
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  EXPECT_EQ(r.status().message().find('\x1b'), std::string::npos);

  const std::string long_name(5000, 'n');
  const std::string h2 =
      "{\"" + long_name + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
  auto r2 = Header::Parse(Bytes(Le64(h2.size()) + h2 + "xx"));
  ASSERT_FALSE(r2.ok());
  EXPECT_THAT(r2.status().message(), HasSubstr("..."));
  EXPECT_LT(r2.status().message().size(), 1000u);
}

// --- ParsePrefix and ReadFile -------------------------------------------------

TEST(ParsePrefixTest, NeedsTheWholeHeader) {
  const CorpusCase& c = Case("valid_reference_test_deserialization");
  // 8 + 60 bytes of prefix are enough; the rest of the file is not read.
  auto ok = Header::ParsePrefix(c.span().first(68), c.bytes.size());
  ASSERT_OK(ok);
  EXPECT_EQ(ok->file_size(), c.bytes.size());
  // A longer prefix is fine too.
  EXPECT_OK(Header::ParsePrefix(c.span().first(75), c.bytes.size()));
  auto short_prefix = Header::ParsePrefix(c.span().first(67), c.bytes.size());
  ASSERT_FALSE(short_prefix.ok());
  EXPECT_EQ(short_prefix.status().code(), StatusCode::kInvalidArgument);
  auto no_length = Header::ParsePrefix(c.span().first(4), c.bytes.size());
  ASSERT_FALSE(no_length.ok());
  EXPECT_EQ(no_length.status().code(), StatusCode::kInvalidArgument);
  // The file size decides rule 8.
  auto bigger = Header::ParsePrefix(c.span().first(68), c.bytes.size() + 1);
  EXPECT_EQ(Verdict(bigger), "MetadataIncompleteBuffer");
  auto smaller = Header::ParsePrefix(c.span().first(68), 70);
  EXPECT_EQ(Verdict(smaller), "MetadataIncompleteBuffer");
  auto tiny = Header::ParsePrefix(c.span().first(68), 7);
  EXPECT_EQ(Verdict(tiny), "HeaderTooSmall");
}

TEST(ReadFileTest, MissingFileIsNotFound) {
  ScratchDir dir;
  const std::string path = dir.path() + "/missing.safetensors";
  auto r = Header::ReadFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), StartsWith(path + ": "));
  // A missing directory on the way is NotFound too.
  auto r2 = Header::ReadFile(dir.path() + "/no/such/file.safetensors");
  EXPECT_EQ(r2.status().code(), StatusCode::kNotFound);
}

TEST(ReadFileTest, DirectoryIsAnError) {
  ScratchDir dir;
  auto r = Header::ReadFile(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(r.status().message(), StartsWith(dir.path() + ": "));
  EXPECT_THAT(r.status().message(), HasSubstr("directory"));
}

TEST(ReadFileTest, ReadsOnlyTheHeader) {
  // A 1 TiB tensor in a sparse file: validation needs only the header and the
  // file size.
  ScratchDir dir;
  const uint64_t size = uint64_t{1} << 40;
  const std::string header = "{\"big\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(size) +
                             "],\"data_offsets\":[0," + std::to_string(size) + "]}}";
  const std::string path = dir.Write("big.safetensors", Le64(header.size()) + header);
  if (::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + size)) != 0) {
    GTEST_SKIP() << "this file system cannot hold a sparse 1 TiB file";
  }
  auto r = Header::ReadFile(path);
  ASSERT_OK(r);
  EXPECT_EQ(r->data_size(), size);
  EXPECT_EQ(r->tensors()[0].num_elements, size);
}

TEST(ReadFileTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  ScratchDir dir;
  const std::string path = dir.Write("locked.safetensors", Case("valid_empty_object").bytes);
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  auto r = Header::ReadFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), StartsWith(path + ": "));
}

// --- The header length limit itself (100 MB, so not in the default corpus) ----

TEST(LargeHeaderTest, HeaderOfExactlyTheLimitIsValid) {
  const auto corpus = MakeCorpus({.include_large = true});
  const CorpusCase* large = nullptr;
  for (const CorpusCase& c : corpus) {
    if (c.name == "valid_header_len_100000000") large = &c;
  }
  ASSERT_NE(large, nullptr);
  ASSERT_EQ(large->bytes.size(), 8 + kMaxHeaderSize);
  EXPECT_EQ(large->expected, "ok");
  auto r = Header::Parse(large->span());
  ASSERT_OK(r);
  EXPECT_EQ(r->header_size(), kMaxHeaderSize);
  EXPECT_TRUE(r->tensors().empty());

  ScratchDir dir;
  const std::string path = dir.Write("large.safetensors", large->bytes);
  auto read = Header::ReadFile(path);
  ASSERT_OK(read);
  EXPECT_EQ(read->header_size(), kMaxHeaderSize);
  // One byte more of data is rule 8, not a header-size error.
  std::filesystem::resize_file(path, large->bytes.size() + 1);
  EXPECT_EQ(Verdict(Header::ReadFile(path), path), "MetadataIncompleteBuffer");
}

}  // namespace
}  // namespace tensorlift
