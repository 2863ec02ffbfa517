// The writer: golden bytes from the reference's own tests, ordering, JSON
// escaping, round trips through the reader, rejected inputs, and the atomic
// replacement of files.
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorlift/dtype.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

using ::tensorlift::test::ScratchDir;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::string_literals;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

std::string ToString(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Little-endian float32 bytes.
std::string F32Bytes(std::initializer_list<float> values) {
  std::string out;
  for (float f : values) {
    char b[4];
    std::memcpy(b, &f, 4);
    out.append(b, 4);
  }
  return out;
}

// WriteFile over a vector (a braced list does not convert to a span).
Status Write(const std::string& path, const std::vector<TensorView>& tensors,
             const std::optional<Metadata>& metadata) {
  return WriteFile(path, tensors, metadata);
}

// The whole file the writer makes, as a string.
std::string Written(const std::vector<TensorView>& tensors,
                    const std::optional<Metadata>& metadata = std::nullopt) {
  auto r = Serialize(tensors, metadata);
  EXPECT_OK(r);
  return r.ok() ? ToString(*r) : "";
}

// The header JSON (N bytes after the length) of a serialized file.
std::string HeaderJson(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  return file.substr(8, n);
}

// --- Golden bytes (reference tests, reference.md §1.11) ----------------------

TEST(WriterGoldenTest, ReferenceTestSerialization) {
  const std::string data = F32Bytes({0, 1, 2, 3, 4, 5});
  const std::string json =
      "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
  ASSERT_EQ(json.size(), 64u);
  EXPECT_EQ(Written({{"attn.0", Dtype::kF32, {1, 2, 3}, Bytes(data)}}), Le64(64) + json + data);
  // The exact bytes of the reference test's data section.
  EXPECT_EQ(data, "\0\0\0\0\0\0\x80\x3f\0\0\0\x40\0\0\x40\x40\0\0\x80\x40\0\0\xa0\x40"s);
}

TEST(WriterGoldenTest, ReferenceTestForcedAlignment) {
  const std::string data = F32Bytes({0, 1, 2, 3, 4, 5});
  const std::string json =
      "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}";
  ASSERT_EQ(json.size(), 65u);
  EXPECT_EQ(Written({{"attn0", Dtype::kF32, {1, 1, 2, 3}, Bytes(data)}}),
            Le64(72) + json + "       " + data);
}

TEST(WriterGoldenTest, ReferenceTestFp4) {
  const std::string data = "\x01";
  const std::string json = "{\"attn.0\":{\"dtype\":\"F4\",\"shape\":[1,2],\"data_offsets\":[0,1]}}";
  ASSERT_EQ(json.size(), 60u);
  EXPECT_EQ(Written({{"attn.0", Dtype::kF4, {1, 2}, Bytes(data)}}),
            Le64(64) + json + "    " + data);
}

TEST(WriterGoldenTest, ReferenceTestEmpty) {
  EXPECT_EQ(Written({}), Le64(8) + "{}      ");
  EXPECT_EQ(Written({}, Metadata{{"framework", "pt"}}),
            Le64(40) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
}

TEST(WriterGoldenTest, ReferencePythonTests) {
  const std::string zeros16(16, '\0');
  const std::string zeros8(8, '\0');
  EXPECT_EQ(Written({{"test", Dtype::kI32, {2, 2}, Bytes(zeros16)}}),
            Le64(64) +
                "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    " +
                zeros16);
  EXPECT_EQ(Written({{"test2", Dtype::kF16, {2, 2}, Bytes(zeros8)},
                     {"test1", Dtype::kI32, {2, 2}, Bytes(zeros16)}}),
            Le64(128) +
                "{\"test1\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                "\"test2\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[16,24]}}      " +
                zeros16 + zeros8);
  EXPECT_EQ(
      Written({{"test1", Dtype::kI32, {2, 2}, Bytes(zeros16)}}, Metadata{{"framework", "pt"}}),
      Le64(96) +
          "{\"__metadata__\":{\"framework\":\"pt\"},\"test1\":{\"dtype\":\"I32\",\"shape\":"
          "[2,2],\"data_offsets\":[0,16]}} " +
          zeros16);
}

// --- Order --------------------------------------------------------------------

TEST(WriterOrderTest, DtypeDescendingThenName) {
  const std::string b1 = "\x01", b2 = "\x02", b3 = "\x03";
  const std::string f32 = F32Bytes({7}), f64(8, '\x09');
  const std::vector<TensorView> tensors = {
      {"z_u8", Dtype::kU8, {1}, Bytes(b1)},    {"b_f64", Dtype::kF64, {1}, Bytes(f64)},
      {"a_f32", Dtype::kF32, {1}, Bytes(f32)}, {"c_bool", Dtype::kBool, {1}, Bytes(b3)},
      {"a_u8", Dtype::kU8, {1}, Bytes(b2)},
  };
  std::vector<size_t> order;
  auto header = SerializeHeader(tensors, std::nullopt, &order);
  ASSERT_OK(header);
  EXPECT_THAT(order, ElementsAre(1, 2, 4, 0, 3));
  // The reference writer's bytes (safetensors.numpy.save of the same dict).
  EXPECT_EQ(*header,
            Le64(296) +
                "{\"b_f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                "\"a_f32\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                "\"a_u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[12,13]},"
                "\"z_u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[13,14]},"
                "\"c_bool\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[14,15]}}     ");
  EXPECT_EQ(Written(tensors), *header + f64 + f32 + b2 + b1 + b3);
}

TEST(WriterOrderTest, AllDtypesInTheReferenceDataOrder) {
  std::vector<std::string> data;
  std::vector<TensorView> tensors;
  data.reserve(kNumDtypes);
  for (int i = 0; i < kNumDtypes; ++i) {
    const Dtype d = static_cast<Dtype>(i);
    const uint64_t n = DtypeBits(d) == 6 ? 4 : 2;
    data.push_back(std::string(n * DtypeBits(d) / 8, static_cast<char>(i)));
  }
  for (int i = 0; i < kNumDtypes; ++i) {
    const Dtype d = static_cast<Dtype>(i);
    tensors.push_back({"t", d, {DtypeBits(d) == 6 ? 4u : 2u}, Bytes(data[i])});
    tensors.back().name += std::to_string(i);
  }
  const std::string file = Written(tensors);
  auto h = Header::Parse(Bytes(file));
  ASSERT_OK(h);
  std::vector<std::string> dtypes;
  for (const TensorInfo& t : h->tensors()) dtypes.push_back(std::string(DtypeName(t.dtype)));
  EXPECT_THAT(dtypes, ElementsAre("U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16",
                                  "U16", "I16", "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3",
                                  "F8_E5M2", "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL"));
  // Each tensor starts at a file offset that is a multiple of its element size.
  for (const TensorInfo& t : h->tensors()) {
    const uint64_t align = std::max(1, DtypeBits(t.dtype) / 8);
    EXPECT_EQ((h->data_offset() + t.begin) % align, 0u) << t.name;
  }
}

TEST(WriterOrderTest, NamesCompareBytewise) {
  const std::vector<std::string> names = {"b", "B", "a", "\xc3\xa9", "a\0"s, "", "aa", "a"};
  std::vector<TensorView> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i == names.size() - 1) break;  // "a" is added below with another dtype.
    tensors.push_back({names[i], Dtype::kU8, {0}, {}});
  }
  tensors.push_back({"a", Dtype::kU16, {0}, {}});
  std::vector<size_t> order;
  ASSERT_OK(SerializeHeader(tensors, std::nullopt, &order));
  std::vector<std::string> sorted;
  for (size_t i : order) sorted.push_back(tensors[i].name);
  // U16 before U8; then "", "B", "a", "a\0", "aa", "b", "é".
  EXPECT_THAT(sorted, ElementsAre("a", "", "B", "a", "a\0"s, "aa", "b", "\xc3\xa9"));
}

// --- JSON ---------------------------------------------------------------------

TEST(WriterJsonTest, EscapesNamesAndMetadataLikeSerdeJson) {
  const std::string one = "\x05";
  const std::vector<TensorView> tensors = {
      {"a\"b\\c\n\t\x01\x1f\x7f\xc3\xa9\b\f\r", Dtype::kU8, {1}, Bytes(one)}};
  const Metadata meta = {{"k\"\n", "v\\\0\xe2\x82\xac"s}};
  // The reference writer's bytes for the same input.
  EXPECT_EQ(HeaderJson(Written(tensors, meta)),
            "{\"__metadata__\":{\"k\\\"\\n\":\"v\\\\\\u0000\xe2\x82\xac\"},"
            "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\x7f\xc3\xa9\\b\\f\\r\":{\"dtype\":\"U8\","
            "\"shape\":[1],\"data_offsets\":[0,1]}}    ");
  auto h = Header::Parse(Bytes(Written(tensors, meta)));
  ASSERT_OK(h);
  EXPECT_EQ(h->tensors()[0].name, tensors[0].name);
  EXPECT_EQ(h->metadata(), meta);
}

TEST(WriterJsonTest, MetadataKeysAreSortedAndFirst) {
  const std::string one = "\x05";
  const Metadata meta = {{"z", "1"}, {"a", "2"}, {"m", ""}};
  EXPECT_EQ(HeaderJson(Written({{"t", Dtype::kU8, {1}, Bytes(one)}}, meta)),
            "{\"__metadata__\":{\"a\":\"2\",\"m\":\"\",\"z\":\"1\"},\"t\":{\"dtype\":\"U8\","
            "\"shape\":[1],\"data_offsets\":[0,1]}}   ");
}

TEST(WriterJsonTest, NoTensorsAndEmptyMetadataIsValidJson) {
  // The reference writes the invalid `{},"__metadata__":{}}` here.
  const std::string file = Written({}, Metadata{});
  EXPECT_EQ(file, Le64(24) + "{\"__metadata__\":{}}     ");
  auto h = Header::Parse(Bytes(file));
  ASSERT_OK(h);
  ASSERT_TRUE(h->metadata().has_value());
  EXPECT_TRUE(h->metadata()->empty());
  EXPECT_TRUE(h->tensors().empty());
}

TEST(WriterJsonTest, EmptyMetadataWithTensors) {
  const std::string one = "\x05";
  EXPECT_EQ(HeaderJson(Written({{"t", Dtype::kU8, {1}, Bytes(one)}}, Metadata{})),
            "{\"__metadata__\":{},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} ");
}

TEST(WriterJsonTest, ShapesScalarsAndLargeNumbers) {
  const std::string four(4, '\0');
  EXPECT_EQ(HeaderJson(Written(
                {{"s", Dtype::kF32, {}, Bytes(four)}, {"z", Dtype::kF64, {0, UINT64_MAX, 7}, {}}})),
            "{\"z\":{\"dtype\":\"F64\",\"shape\":[0,18446744073709551615,7],\"data_offsets\":"
            "[0,0]},\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}       ");
}

TEST(TextTest, JsonStringQuoteNameShapeString) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("a\"\\/\x7f"), "\"a\\\"\\\\/\x7f\"");
  EXPECT_EQ(JsonString("\b\f\n\r\t\x0b\x1f\0"s), "\"\\b\\f\\n\\r\\t\\u000b\\u001f\\u0000\"");
  EXPECT_EQ(JsonString("\xc3\xa9\xf0\x9f\x98\x80"), "\"\xc3\xa9\xf0\x9f\x98\x80\"");
  std::string out = "x";
  AppendJsonString("y", &out);
  EXPECT_EQ(out, "x\"y\"");

  EXPECT_EQ(QuoteName("w.0"), "'w.0'");
  EXPECT_EQ(QuoteName("a\nb\x7f\0"s), "'a\\x0ab\\x7f\\x00'");
  EXPECT_EQ(QuoteName(std::string(200, 'n')), "'" + std::string(200, 'n') + "'");
  EXPECT_EQ(QuoteName(std::string(201, 'n')), "'" + std::string(200, 'n') + "...'");

  EXPECT_EQ(ShapeString({}), "[]");
  const std::vector<uint64_t> shape = {2, 3, UINT64_MAX};
  EXPECT_EQ(ShapeString(shape), "[2, 3, 18446744073709551615]");
}

// --- Round trips ----------------------------------------------------------------

struct Owned {
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
  std::string data;
};

std::vector<Owned> RoundTripTensors() {
  std::vector<Owned> out;
  for (int i = 0; i < kNumDtypes; ++i) {
    const Dtype d = static_cast<Dtype>(i);
    const std::vector<uint64_t> shape =
        DtypeBits(d) == 6 ? std::vector<uint64_t>{2, 4} : std::vector<uint64_t>{3, 2};
    uint64_t bytes = 1;
    for (uint64_t s : shape) bytes *= s;
    bytes = bytes * DtypeBits(d) / 8;
    std::string data(bytes, '\0');
    for (uint64_t j = 0; j < bytes; ++j) data[j] = static_cast<char>(i * 31 + j * 7);
    out.push_back({"layer." + std::string(DtypeName(d)) + ".weight", d, shape, data});
  }
  out.push_back({"scalar", Dtype::kF64, {}, std::string(8, '\x42')});
  out.push_back({"empty", Dtype::kF32, {4, 0}, ""});
  out.push_back({"empty_u8", Dtype::kU8, {0}, ""});
  out.push_back({"", Dtype::kI16, {1}, "\x01\x02"});
  out.push_back({"caf\xc3\xa9/\xf0\x9f\x98\x80", Dtype::kBF16, {2}, "abcd"});
  out.push_back({"nul\0name"s, Dtype::kU8, {1}, "z"});
  return out;
}

std::vector<TensorView> Views(const std::vector<Owned>& owned) {
  std::vector<TensorView> views;
  for (const Owned& t : owned) views.push_back({t.name, t.dtype, t.shape, Bytes(t.data)});
  return views;
}

void ExpectRoundTrip(const std::vector<Owned>& owned, const std::optional<Metadata>& metadata) {
  ScratchDir dir;
  const std::string path = dir / "model.safetensors";
  ASSERT_OK(WriteFile(path, Views(owned), metadata));
  auto h = Header::ReadFile(path);
  ASSERT_OK(h);
  EXPECT_EQ(h->metadata(), metadata);
  ASSERT_EQ(h->tensors().size(), owned.size());
  const std::string file = ReadAll(path);
  EXPECT_EQ(file.size(), h->file_size());
  EXPECT_EQ(h->header_size() % 8, 0u);
  for (const Owned& t : owned) {
    const TensorInfo* info = h->Find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    EXPECT_EQ(file.substr(h->data_offset() + info->begin, info->nbytes()), t.data) << t.name;
  }
  // WriteFile and Serialize make the same bytes.
  auto mem = Serialize(Views(owned), metadata);
  ASSERT_OK(mem);
  EXPECT_EQ(ToString(*mem), file);
  // Parsing the written file and writing it again gives the same bytes.
  std::vector<TensorView> again;
  for (const TensorInfo& t : h->tensors()) {
    again.push_back(
        {t.name, t.dtype, t.shape, Bytes(file).subspan(h->data_offset() + t.begin, t.nbytes())});
  }
  EXPECT_EQ(Written(again, h->metadata()), file);
  EXPECT_THAT(dir.List(), ElementsAre("model.safetensors"));
}

TEST(WriterRoundTripTest, EveryDtypeAndEdgeCaseWithoutMetadata) {
  ExpectRoundTrip(RoundTripTensors(), std::nullopt);
}

TEST(WriterRoundTripTest, WithMetadata) {
  ExpectRoundTrip(RoundTripTensors(), Metadata{{"format", "pt"},
                                               {"note", "line\nbreak \"quoted\" \\ \xc3\xa9"},
                                               {"", ""},
                                               {"nul", "a\0b"s}});
  ExpectRoundTrip(RoundTripTensors(), Metadata{});
}

TEST(WriterRoundTripTest, NoTensors) {
  ExpectRoundTrip({}, std::nullopt);
  ExpectRoundTrip({}, Metadata{});
  ExpectRoundTrip({}, Metadata{{"k", "v"}});
}

// --- Rejected inputs ------------------------------------------------------------

Status SerializeStatus(const std::vector<TensorView>& tensors) {
  std::vector<size_t> order;
  return SerializeHeader(tensors, std::nullopt, &order).status();
}

TEST(WriterRejectTest, DuplicateNames) {
  const std::string one = "\x01", two = "\x01\x02";
  Status s = SerializeStatus({{"a", Dtype::kU8, {1}, Bytes(one)},
                              {"b", Dtype::kU8, {1}, Bytes(one)},
                              {"a", Dtype::kI16, {1}, Bytes(two)}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  EXPECT_FALSE(SerializeStatus({{"", Dtype::kU8, {0}, {}}, {"", Dtype::kU8, {0}, {}}}).ok());
}

TEST(WriterRejectTest, ReservedName) {
  const std::string one = "\x01";
  Status s = SerializeStatus({{"__metadata__", Dtype::kU8, {1}, Bytes(one)}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("__metadata__"));
  // Other spellings are ordinary names.
  EXPECT_OK(SerializeStatus({{"__METADATA__", Dtype::kU8, {1}, Bytes(one)}}));
}

TEST(WriterRejectTest, SizeMismatches) {
  const std::string twelve(12, '\0');
  Status s = SerializeStatus({{"w", Dtype::kF32, {2, 2}, Bytes(twelve)}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'w'"), HasSubstr("16"), HasSubstr("12")));
  // A scalar needs one element.
  EXPECT_FALSE(SerializeStatus({{"s", Dtype::kF32, {}, {}}}).ok());
  // Zero elements need zero bytes.
  EXPECT_FALSE(SerializeStatus({{"z", Dtype::kU8, {0}, Bytes(twelve)}}).ok());
  // Sub-byte sizes must be whole bytes.
  const std::string two(2, '\0');
  EXPECT_FALSE(SerializeStatus({{"f4", Dtype::kF4, {3}, Bytes(two)}}).ok());
  EXPECT_FALSE(SerializeStatus({{"f6", Dtype::kF6_E3M2, {1}, Bytes(two)}}).ok());
  // Element counts that overflow 64 bits.
  EXPECT_FALSE(SerializeStatus({{"o", Dtype::kU8, {UINT64_MAX, 2}, {}}}).ok());
  EXPECT_FALSE(SerializeStatus({{"o", Dtype::kF64, {uint64_t{1} << 62}, {}}}).ok());
}

TEST(WriterRejectTest, HeaderOverTheLimit) {
  const std::string name(kMaxHeaderSize, 'n');
  Status s = SerializeStatus({{name, Dtype::kU8, {0}, {}}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("100000000"));
}

TEST(WriterRejectTest, FailedWriteLeavesNothingAndKeepsTheOldFile) {
  ScratchDir dir;
  const std::string path = dir / "m.safetensors";
  const std::string one = "\x01";
  ASSERT_OK(Write(path, {{"a", Dtype::kU8, {1}, Bytes(one)}}, std::nullopt));
  const std::string before = ReadAll(path);
  Status s = Write(path, {{"a", Dtype::kU8, {2}, Bytes(one)}}, std::nullopt);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), StartsWith(path + ": "));
  EXPECT_EQ(ReadAll(path), before);
  EXPECT_THAT(dir.List(), ElementsAre("m.safetensors"));
}

TEST(WriterRejectTest, MissingDirectory) {
  ScratchDir dir;
  const std::string path = dir / "no/such/dir/m.safetensors";
  Status s = WriteFile(path, {}, std::nullopt);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), StartsWith(path + ": "));
  EXPECT_TRUE(dir.List().empty());
}

// --- WriteFile: temporary file and rename ---------------------------------------

TEST(WriteFileTest, ReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  ScratchDir dir;
  const std::string path = dir / "model.safetensors";
  const std::string a(16, 'a'), b(32, 'b');
  ASSERT_OK(Write(path, {{"x", Dtype::kU8, {16}, Bytes(a)}}, std::nullopt));
  const std::string old_bytes = ReadAll(path);
  struct stat old_st;
  ASSERT_EQ(::stat(path.c_str(), &old_st), 0);

  // A reader of the old file keeps seeing the old bytes.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_OK(Write(path, {{"y", Dtype::kU8, {32}, Bytes(b)}}, Metadata{{"v", "2"}}));
  std::string seen(old_bytes.size(), '\0');
  EXPECT_EQ(::pread(fd, seen.data(), seen.size(), 0), static_cast<ssize_t>(seen.size()));
  EXPECT_EQ(seen, old_bytes);
  struct stat fd_st;
  ASSERT_EQ(::fstat(fd, &fd_st), 0);
  EXPECT_EQ(fd_st.st_size, static_cast<off_t>(old_bytes.size()));
  ::close(fd);

  // The path now names a new file with the new contents.
  struct stat new_st;
  ASSERT_EQ(::stat(path.c_str(), &new_st), 0);
  EXPECT_NE(new_st.st_ino, old_st.st_ino);
  auto h = Header::ReadFile(path);
  ASSERT_OK(h);
  ASSERT_NE(h->Find("y"), nullptr);
  EXPECT_EQ(h->Find("x"), nullptr);
  EXPECT_EQ(h->metadata(), (Metadata{{"v", "2"}}));
  EXPECT_THAT(dir.List(), ElementsAre("model.safetensors"));
}

TEST(WriteFileTest, NewFilesGetTheUsualPermissions) {
  ScratchDir dir;
  const mode_t old_mask = ::umask(022);
  Status s = WriteFile(dir / "p.safetensors", {}, std::nullopt);
  ::umask(old_mask);
  ASSERT_OK(s);
  struct stat st;
  ASSERT_EQ(::stat((dir / "p.safetensors").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST(WriteFileTest, RelativePathWithoutDirectory) {
  ScratchDir dir;
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  Status s = WriteFile("plain.safetensors", {}, Metadata{{"k", "v"}});
  std::filesystem::current_path(cwd);
  ASSERT_OK(s);
  EXPECT_THAT(dir.List(), ElementsAre("plain.safetensors"));
  auto h = Header::ReadFile(dir / "plain.safetensors");
  ASSERT_OK(h);
  EXPECT_EQ(h->metadata(), (Metadata{{"k", "v"}}));
}

}  // namespace
}  // namespace tensorlift
