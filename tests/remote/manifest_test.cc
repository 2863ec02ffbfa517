// ParseManifest: a round trip, one hand-built bad manifest per rejection
// class, and a mutation loop over a valid one.
#include "remote/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "tensorlift/checksum.h"

namespace tensorlift::remote {
namespace {

using ::testing::HasSubstr;

// A valid two-rank manifest with four tensors (one sharded, one 4-bit, one
// empty) in two regions, listed out of name order.
Manifest ValidManifest() {
  Manifest m;
  m.key.model = "llama-7b";
  m.key.revision = "abc123";
  m.key.layout = "q_proj=0";
  m.parallel = {2, 1};
  m.chunk_bytes = 4096;
  m.worker_address = std::string("\x00\x01\xfe\xff worker", 11);
  m.rate_limit = 1000000;
  m.regions = {{0x7f0000001000ull, 16384, std::string("\x10\x20\x00rkey", 7)},
               {0x7f0000100000ull, 64, ""}};
  ManifestTensor q;
  q.name = "layers.0.q_proj.weight";
  q.dtype = Dtype::kBF16;
  q.shape = {32, 64};  // 4096 bytes
  q.nbytes = 4096;
  q.region = 0;
  q.offset = 8192;
  q.shard_dim = 0;
  q.shard_start = 32;
  q.full_shape = {64, 64};
  q.chunk_xxh3 = {0x0123456789abcdefull};
  ManifestTensor e;
  e.name = "embed \"tokens\"\n\xc3\xa9";
  e.dtype = Dtype::kF32;
  e.shape = {1500, 2};  // 12000 bytes: 3 chunks
  e.nbytes = 12000;
  e.region = 0;
  e.offset = 0;
  e.full_shape = e.shape;
  e.chunk_xxh3 = {1, 2, 0xffffffffffffffffull};
  ManifestTensor f4;
  f4.name = "a.scales";
  f4.dtype = Dtype::kF4;
  f4.shape = {2, 3, 5};  // 30 elements: 15 bytes
  f4.nbytes = 15;
  f4.region = 1;
  f4.offset = 49;
  f4.full_shape = f4.shape;
  f4.chunk_xxh3 = {42};
  ManifestTensor z;
  z.name = "zero";
  z.dtype = Dtype::kI64;
  z.shape = {0, 7};
  z.nbytes = 0;
  z.region = 1;
  z.offset = 64;
  z.full_shape = z.shape;
  m.tensors = {q, e, f4, z};
  m.total_bytes = 4096 + 12000 + 15;
  return m;
}

void ExpectEqual(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.key.protocol, b.key.protocol);
  EXPECT_EQ(a.parallel.size, b.parallel.size);
  EXPECT_EQ(a.parallel.rank, b.parallel.rank);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.worker_address, b.worker_address);
  EXPECT_EQ(a.rate_limit, b.rate_limit);
  ASSERT_EQ(a.regions.size(), b.regions.size());
  for (size_t i = 0; i < a.regions.size(); ++i) {
    EXPECT_EQ(a.regions[i].address, b.regions[i].address);
    EXPECT_EQ(a.regions[i].bytes, b.regions[i].bytes);
    EXPECT_EQ(a.regions[i].rkey, b.regions[i].rkey);
  }
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const ManifestTensor& x = a.tensors[i];
    const ManifestTensor& y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.nbytes, y.nbytes);
    EXPECT_EQ(x.region, y.region);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(x.shard_dim, y.shard_dim);
    EXPECT_EQ(x.shard_start, y.shard_start);
    EXPECT_EQ(x.full_shape, y.full_shape);
    EXPECT_EQ(x.chunk_xxh3, y.chunk_xxh3);
  }
}

// Replaces the first occurrence of `from` (which must exist) with `to`.
std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// Parses `json` and expects kCorruption with every one of `parts` in it.
void ExpectCorrupt(const std::string& json, std::vector<std::string> parts,
                   const ManifestLimits& limits = {}) {
  auto r = ParseManifest(json, limits);
  ASSERT_FALSE(r.ok()) << json;
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  for (const auto& p : parts) EXPECT_THAT(r.status().message(), HasSubstr(p));
  EXPECT_THAT(r.status().message(), HasSubstr("manifest: "));
}

TEST(ManifestTest, RoundTrip) {
  const Manifest m = ValidManifest();
  const std::string json = m.ToJson();
  auto parsed = ParseManifest(json);
  ASSERT_OK(parsed) << json;
  // Parse sorts by name.
  Manifest sorted = m;
  std::sort(sorted.tensors.begin(), sorted.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  ExpectEqual(*parsed, sorted);
  // And serializing again gives the same sorted document.
  EXPECT_EQ(parsed->ToJson(), sorted.ToJson());
  EXPECT_EQ(ParseManifest(parsed->ToJson()).ok(), true);
}

TEST(ManifestTest, JsonShape) {
  Manifest m;
  m.key.model = "m";
  m.key.revision = "r";
  m.chunk_bytes = 4096;
  m.worker_address = "\xab\x01";
  m.regions = {{16, 8, "\x02"}};
  ManifestTensor t;
  t.name = "w";
  t.dtype = Dtype::kU8;
  t.shape = {8};
  t.nbytes = 8;
  t.chunk_xxh3 = {0xabc};
  m.tensors = {t};  // full_shape left empty: written as the shape.
  m.total_bytes = 8;
  EXPECT_EQ(m.ToJson(),
            "{\"protocol\":1,\"key\":{\"model\":\"m\",\"revision\":\"r\",\"dtype\":\"as-stored\","
            "\"quantization\":\"none\",\"layout\":\"\"},\"parallel\":{\"size\":1,\"rank\":0},"
            "\"chunk_bytes\":4096,\"worker_address\":\"ab01\",\"rate_limit\":0,"
            "\"regions\":[{\"address\":16,\"bytes\":8,\"rkey\":\"02\"}],\"total_bytes\":8,"
            "\"tensors\":[{\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[8],\"nbytes\":8,\"region\":0,"
            "\"offset\":0,\"shard_dim\":-1,\"shard_start\":0,\"full_shape\":[8],"
            "\"xxh3\":[\"0000000000000abc\"]}]}");
  auto parsed = ParseManifest(m.ToJson());
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->tensors[0].full_shape, std::vector<int64_t>{8});
}

TEST(ManifestTest, Find) {
  auto parsed = ParseManifest(ValidManifest().ToJson());
  ASSERT_OK(parsed);
  const ManifestTensor* t = parsed->Find("layers.0.q_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 4096u);
  ASSERT_NE(parsed->Find("zero"), nullptr);
  ASSERT_NE(parsed->Find("a.scales"), nullptr);
  EXPECT_EQ(parsed->Find("layers.0"), nullptr);
  EXPECT_EQ(parsed->Find(""), nullptr);
  EXPECT_EQ(parsed->Find("zzz"), nullptr);
}

TEST(ManifestTest, ChunkChecksums) {
  std::vector<unsigned char> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7);
  auto sums = ChunkChecksums(data.data(), data.size(), 4096);
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[0], Xxh3_64(data.data(), 4096));
  EXPECT_EQ(sums[1], Xxh3_64(data.data() + 4096, 4096));
  EXPECT_EQ(sums[2], Xxh3_64(data.data() + 8192, 10000 - 8192));
  EXPECT_EQ(ChunkChecksums(data.data(), 8192, 4096).size(), 2u);
  EXPECT_TRUE(ChunkChecksums(data.data(), 0, 4096).empty());
}

TEST(ManifestTest, RejectsBadJson) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(json.substr(0, json.size() - 1), {"invalid JSON"});
  ExpectCorrupt("", {"invalid JSON"});
  ExpectCorrupt("[1,2]", {"must be an object"});
  ExpectCorrupt(Replace(json, "\"rate_limit\":1000000,", "\"rate_limit\":1000000,,"),
                {"invalid JSON"});
  ExpectCorrupt(json + "x", {"invalid JSON"});
  ExpectCorrupt(Replace(json, "\"llama-7b\"", "\"llama\xff\""), {"invalid JSON"});
  // Nesting deeper than any manifest.
  ExpectCorrupt(Replace(json, "\"rate_limit\":1000000", "\"rate_limit\":[[[[[[[[[[1]]]]]]]]]]"),
                {"invalid JSON"});
}

// Same-host handover is optional: offered, it round-trips; its values are
// bounded and printable.
TEST(ManifestTest, HandoverIsOptionalAndChecked) {
  Manifest m = ValidManifest();
  ASSERT_OK(ParseManifest(m.ToJson()));
  EXPECT_EQ(m.ToJson().find("handover"), std::string::npos);
  m.handover_host = "0f4c2a8e-1b2d-4c3e-9f00-123456789abc";
  m.handover_socket = "@tensorlift/123/0011223344556677";
  const std::string json = m.ToJson();
  auto parsed = ParseManifest(json);
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->handover_host, m.handover_host);
  EXPECT_EQ(parsed->handover_socket, m.handover_socket);
  ExpectCorrupt(Replace(json, "\"socket\":\"@tensorlift/123/0011223344556677\"", "\"socket\":\"\""),
                {"handover: socket must be 1 to 200 printable"});
  ExpectCorrupt(Replace(json, "\"host\":\"0f4c", "\"host\":\"a b"), {"handover: host must be"});
  ExpectCorrupt(Replace(json, "\"socket\":\"@", "\"port\":1,\"socket\":\"@"),
                {"handover: unknown field 'port'"});
  ExpectCorrupt(Replace(json, ",\"socket\":\"@tensorlift/123/0011223344556677\"", ""),
                {"handover: missing field `socket`"});
  ExpectCorrupt(Replace(json, "\"host\":\"0f4c2a8e-1b2d-4c3e-9f00-123456789abc\"", "\"host\":7"),
                {"handover: host must be a string"});
}

TEST(ManifestTest, RejectsMissingAndUnknownFields) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"rate_limit\":1000000,", ""), {"missing field `rate_limit`"});
  ExpectCorrupt(Replace(json, "\"nbytes\":4096,", ""), {"tensors[", "missing field `nbytes`"});
  ExpectCorrupt(Replace(json, "\"revision\":\"abc123\",", ""), {"key: missing field `revision`"});
  ExpectCorrupt(Replace(json, "\"rank\":1", "\"rank\":1,\"extra\":2"),
                {"parallel: unknown field 'extra'"});
  ExpectCorrupt(Replace(json, "\"protocol\":1,", "\"protocol\":1,\"protocol\":1,"),
                {"duplicate field `protocol`"});
  ExpectCorrupt(Replace(json, "\"region\":0,", "\"region\":0,\"colour\":\"red\","),
                {"unknown field 'colour'"});
  ExpectCorrupt(Replace(json, "\"rkey\":\"\"", "\"rkey\":\"\",\"x\":null"),
                {"regions[1]: unknown field 'x'"});
}

TEST(ManifestTest, RejectsWrongTypes) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"nbytes\":4096", "\"nbytes\":\"4096\""),
                {"nbytes must be a non-negative integer"});
  ExpectCorrupt(Replace(json, "\"nbytes\":4096", "\"nbytes\":4096.0"),
                {"found a floating point number"});
  ExpectCorrupt(Replace(json, "\"nbytes\":4096", "\"nbytes\":-4096"), {"found -4096"});
  ExpectCorrupt(Replace(json, "\"shape\":[32,64]", "\"shape\":[32,-64]"), {"shape entry -64"});
  ExpectCorrupt(Replace(json, "\"shape\":[32,64]", "\"shape\":32"), {"shape must be an array"});
  ExpectCorrupt(Replace(json, "\"model\":\"llama-7b\"", "\"model\":7"),
                {"key: model must be a string"});
  ExpectCorrupt(Replace(json, "\"tensors\":[", "\"tensors\":[1,"),
                {"tensors[0]: the tensor must be an object"});
  ExpectCorrupt(Replace(json, "\"regions\":[", "\"regions\":{\"a\":"), {"invalid JSON"});
  ExpectCorrupt(Replace(json, "\"protocol\":1", "\"protocol\":0"), {"protocol 0 is not in [1,"});
}

TEST(ManifestTest, RejectsBadKeyAndParallel) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"model\":\"llama-7b\"", "\"model\":\"\""),
                {"model must not be empty"});
  ExpectCorrupt(Replace(json, "\"revision\":\"abc123\"", "\"revision\":\"a\\nb\""),
                {"control character"});
  ExpectCorrupt(Replace(json, "\"rank\":1", "\"rank\":2"), {"parallel: rank 2 is not in [0, 1]"});
  ExpectCorrupt(Replace(json, "\"size\":2", "\"size\":0"),
                {"parallel: size 0 is not in [1, 65536]"});
  ManifestLimits small;
  small.max_world = 1;
  ExpectCorrupt(json, {"parallel: size 2 is not in [1, 1]"}, small);
}

TEST(ManifestTest, RejectsUnknownDtype) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"BF16\"", "\"BF17\""),
                {"tensor 'layers.0.q_proj.weight'", "unknown dtype 'BF17'"});
  ExpectCorrupt(Replace(json, "\"BF16\"", "\"bf16\""), {"unknown dtype 'bf16'"});
}

TEST(ManifestTest, RejectsBadNames) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"zero\"", "\"a.scales\""),
                {"tensor 'a.scales' appears more than once"});
  ExpectCorrupt(Replace(json, "\"name\":\"zero\"", "\"name\":\"\""),
                {"tensors[3]: name must not be empty"});
  ManifestLimits small;
  small.max_name_bytes = 8;
  ExpectCorrupt(json, {"name of ", "longer than the limit of 8"}, small);
  // A lone surrogate escape is not UTF-8 in any spelling.
  auto r = ParseManifest(Replace(json, "\"name\":\"zero\"", "\"name\":\"\\ud800\""));
  EXPECT_FALSE(r.ok());
}

TEST(ManifestTest, RejectsNbytesMismatch) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(
      Replace(json, "\"nbytes\":4096", "\"nbytes\":4095"),
      {"tensor 'layers.0.q_proj.weight': BF16 [32, 64] needs 4096 bytes but nbytes is 4095"});
  // 4-bit elements that are not whole bytes.
  ExpectCorrupt(Replace(json, "\"shape\":[2,3,5]", "\"shape\":[1,3,5]"),
                {"not a whole number of bytes"});
}

TEST(ManifestTest, RejectsRegionOutOfRange) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"region\":1", "\"region\":2"),
                {"region 2 is out of range", "2 regions"});
  ExpectCorrupt(Replace(json, "\"region\":1", "\"region\":4294967296"),
                {"region 4294967296 is out of range"});
  ManifestLimits small;
  small.max_regions = 1;
  ExpectCorrupt(json, {"2 regions, more than the limit of 1"}, small);
}

TEST(ManifestTest, RejectsOffsetPastRegion) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"offset\":49", "\"offset\":50"),
                {"tensor 'a.scales': offset 50 + nbytes 15 past region 1's 64 bytes"});
  ExpectCorrupt(Replace(json, "\"offset\":64", "\"offset\":65"),
                {"tensor 'zero': offset 65 + nbytes 0 past"});
  // offset + nbytes wraps around 2^64.
  ExpectCorrupt(Replace(json, "\"offset\":8192", "\"offset\":18446744073709551615"),
                {"offset 18446744073709551615 + nbytes 4096 past region 0"});
  ExpectCorrupt(Replace(json, "\"address\":139637976731648", "\"address\":18446744073709551615"),
                {"regions[0]: address 18446744073709551615 + bytes 16384 overflows"});
}

TEST(ManifestTest, RejectsChunkCount) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"xxh3\":[\"000000000000002a\"]", "\"xxh3\":[]"),
                {"tensor 'a.scales': xxh3 has 0 checksums but nbytes 15", "needs 1"});
  ExpectCorrupt(Replace(json, "\"xxh3\":[]", "\"xxh3\":[\"0000000000000000\"]"),
                {"tensor 'zero': xxh3 has 1 checksums", "needs 0"});
  ExpectCorrupt(Replace(json, "\"chunk_bytes\":4096", "\"chunk_bytes\":4095"),
                {"chunk_bytes 4095 is not in [4096, 1073741824]"});
  ExpectCorrupt(Replace(json, "\"chunk_bytes\":4096", "\"chunk_bytes\":1073741825"),
                {"chunk_bytes 1073741825"});
  // A bigger chunk changes the count.
  ExpectCorrupt(Replace(json, "\"chunk_bytes\":4096", "\"chunk_bytes\":8192"),
                {"xxh3 has 3 checksums", "needs 2"});
}

TEST(ManifestTest, RejectsBadChecksums) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"000000000000002a\"", "\"00000000000002a\""),
                {"xxh3[0] must be 16 lowercase hex digits"});
  ExpectCorrupt(Replace(json, "\"000000000000002a\"", "\"000000000000002A\""),
                {"xxh3[0] must be 16 lowercase"});
  ExpectCorrupt(Replace(json, "\"000000000000002a\"", "42"), {"xxh3[0] must be a string"});
}

TEST(ManifestTest, RejectsShardOutOfBounds) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"shard_start\":32", "\"shard_start\":33"),
                {"shard_start 33 + shape[0] 32 is past full_shape[0] 64"});
  ExpectCorrupt(Replace(json, "\"shard_start\":32", "\"shard_start\":9223372036854775807"),
                {"is past full_shape[0]"});
  ExpectCorrupt(Replace(json, "\"shard_dim\":0", "\"shard_dim\":2"),
                {"shard_dim 2 is not in [-1, 1]"});
  ExpectCorrupt(Replace(json, "\"shard_dim\":0", "\"shard_dim\":-2"),
                {"shard_dim -2 is not in [-1, 1]"});
  ExpectCorrupt(Replace(json, "\"full_shape\":[64,64]", "\"full_shape\":[64,65]"),
                {"differs from full_shape [64, 65] in dim 1"});
  ExpectCorrupt(Replace(json, "\"full_shape\":[64,64]", "\"full_shape\":[64]"),
                {"has 1 dims but shape [32, 64] has 2"});
  ExpectCorrupt(Replace(json, "\"full_shape\":[2,3,5]", "\"full_shape\":[2,3,6]"),
                {"must equal shape"});
  ExpectCorrupt(Replace(json,
                        "\"shape\":[0,7],\"nbytes\":0,\"region\":1,\"offset\":64,\"shard_dim\":-1,"
                        "\"shard_start\":0",
                        "\"shape\":[0,7],\"nbytes\":0,\"region\":1,\"offset\":64,\"shard_dim\":-1,"
                        "\"shard_start\":1"),
                {"shard_start 1 must be 0 for a whole tensor"});
}

TEST(ManifestTest, RejectsTotalBytes) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"total_bytes\":16111", "\"total_bytes\":16112"),
                {"total_bytes 16112 != 16111"});
  ManifestLimits small;
  small.max_total_bytes = 16000;
  ExpectCorrupt(json, {"exceed the limit of 16000"}, small);
}

TEST(ManifestTest, RejectsTooMany) {
  const std::string json = ValidManifest().ToJson();
  ManifestLimits small;
  small.max_tensors = 3;
  ExpectCorrupt(json, {"4 tensors, more than the limit of 3"}, small);
  small = {};
  small.max_dims = 2;
  ExpectCorrupt(json, {"shape has 3 dims, more than the limit of 2"}, small);
  small = {};
  small.max_json_bytes = 100;
  ExpectCorrupt(json, {"more than the limit of 100"}, small);
}

TEST(ManifestTest, RejectsHugeNumbers) {
  const std::string json = ValidManifest().ToJson();
  // Elements overflow 64 bits.
  ExpectCorrupt(Replace(json, "\"shape\":[1500,2]", "\"shape\":[4611686018427387904,8]"),
                {"the element count of shape [4611686018427387904, 8] overflows 64 bits"});
  // Elements fit, bits do not.
  ExpectCorrupt(Replace(json, "\"shape\":[1500,2]", "\"shape\":[4611686018427387904,1]"),
                {"elements of F32 overflow"});
  // Beyond 2^64: not a number simdjson or we accept.
  ExpectCorrupt(Replace(json, "\"nbytes\":4096", "\"nbytes\":18446744073709551616"),
                {"manifest: "});
  ExpectCorrupt(Replace(json, "\"nbytes\":4096", "\"nbytes\":1e400"), {"manifest: "});
  // Shape entries beyond int64.
  ExpectCorrupt(Replace(json, "\"shape\":[32,64]", "\"shape\":[9223372036854775808,64]"),
                {"shape entry 9223372036854775808 is not in"});
  // The sum of nbytes cannot overflow before the chunk counts bound it; a
  // total_bytes of 2^64-1 is just wrong.
  ManifestLimits big;
  big.max_total_bytes = UINT64_MAX;
  ExpectCorrupt(Replace(json, "\"total_bytes\":16111", "\"total_bytes\":18446744073709551615"),
                {"total_bytes 18446744073709551615 != 16111"}, big);
}

TEST(ManifestTest, RejectsBadHex) {
  const std::string json = ValidManifest().ToJson();
  ExpectCorrupt(Replace(json, "\"rkey\":\"\"", "\"rkey\":\"abc\""),
                {"regions[1]: rkey: hex string of odd length 3"});
  ExpectCorrupt(Replace(json, "\"rkey\":\"\"", "\"rkey\":\"zz\""),
                {"rkey: not lowercase hex at character 0"});
  ExpectCorrupt(Replace(json, "\"rkey\":\"\"", "\"rkey\":\"AB\""), {"not lowercase hex"});
  ExpectCorrupt(Replace(json, "\"worker_address\":\"", "\"worker_address\":\"g0"),
                {"worker_address: not lowercase hex"});
  ExpectCorrupt(Replace(json, "\"rkey\":\"\"", "\"rkey\":5"), {"rkey must be a string"});
}

TEST(ManifestTest, RejectsOversizeBinary) {
  const std::string json = ValidManifest().ToJson();
  ManifestLimits small;
  small.max_binary_bytes = 10;  // The worker address has 11 bytes.
  ExpectCorrupt(json, {"worker_address: 11 bytes, more than the limit of 10"}, small);
  ExpectCorrupt(
      Replace(json, "\"rkey\":\"\"", "\"rkey\":\"" + std::string(2 * (64 << 10) + 2, 'a') + "\""),
      {"rkey: 65537 bytes, more than the limit of 65536"});
}

// Flips, inserts and deletes bytes of a valid manifest: Parse must never
// crash, and whatever it accepts must survive a round trip.
TEST(ManifestTest, MutationsNeverCrash) {
  const std::string valid = ValidManifest().ToJson();
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0:
          s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8)));
          break;
        case 1:
          s[pos] = "0123456789-\"[]{},:eE."[rng() % 21];
          break;
        case 2:
          s.erase(pos, 1 + rng() % 3);
          break;
        case 3:
          s.insert(pos, 1, "019\"[,-"[rng() % 7]);
          break;
        case 4:
          s[pos] = static_cast<char>(rng());
          break;
      }
      if (s.empty()) s = "{";
    }
    auto r = ParseManifest(s);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
      continue;
    }
    ++accepted;
    auto again = ParseManifest(r->ToJson());
    ASSERT_OK(again) << "from: " << s;
    ExpectEqual(*r, *again);
    EXPECT_OK(r->key.Validate());
    for (size_t i = 1; i < r->tensors.size(); ++i)
      EXPECT_LT(r->tensors[i - 1].name, r->tensors[i].name);
  }
  // Some mutations (in names, checksums, the rate limit) stay valid.
  EXPECT_GT(accepted, 0);
}

TEST(PeerKeyTest, CanonicalDigestMismatch) {
  PeerKey a;
  a.model = "llama-7b";
  a.revision = "abc";
  EXPECT_EQ(a.Canonical(),
            "tensorlift-peer\nprotocol=1\nmodel=llama-7b\nrevision=abc\ndtype=as-stored\n"
            "quantization=none\nlayout=\n");
  const std::string canonical = a.Canonical();
  EXPECT_EQ(a.Digest(), HexU64(Xxh3_64(canonical.data(), canonical.size())));
  EXPECT_EQ(a.Digest().size(), 16u);
  PeerKey b = a;
  EXPECT_EQ(a.Mismatch(b), "");
  EXPECT_TRUE(a == b);
  b.revision = "abd";
  EXPECT_EQ(a.Mismatch(b), "revision: 'abc' (ours) != 'abd' (peer's)");
  EXPECT_FALSE(a == b);
  EXPECT_NE(a.Digest(), b.Digest());
  b.protocol = 2;
  EXPECT_EQ(a.Mismatch(b), "protocol: 1 (ours) != 2 (peer's)");
  b = a;
  b.layout = "q=0";
  EXPECT_EQ(a.Mismatch(b), "layout: '' (ours) != 'q=0' (peer's)");
}

TEST(PeerKeyTest, Validate) {
  PeerKey k;
  k.model = "m";
  k.revision = "r";
  EXPECT_OK(k.Validate());
  k.model = "";
  EXPECT_EQ(k.Validate().code(), StatusCode::kInvalidArgument);
  k.model = "m";
  k.revision = "a\nb";
  EXPECT_THAT(k.Validate().message(), HasSubstr("revision"));
  k.revision = std::string(5000, 'r');
  EXPECT_THAT(k.Validate().message(), HasSubstr("5000 bytes"));
  k.revision = "r";
  k.quantization = std::string("a\x7f");
  EXPECT_FALSE(k.Validate().ok());
  k.quantization = "none";
  k.protocol = 0;
  EXPECT_FALSE(k.Validate().ok());
}

// A key's dtype is typed: one parser takes the safetensors and torch
// spellings, so keys made from either are the same key (digest and all); its
// text on the wire and in the canonical form is "as-stored" or the
// safetensors name, and anything else is refused where it is parsed.
TEST(ManifestTest, AKeysDtypeHasOneSpellingWhateverItWasGivenAs) {
  for (const char* text : {"BF16", "bf16", "bfloat16", "torch.bfloat16"}) {
    auto d = ParsePeerKeyDtype(text);
    ASSERT_OK(d);
    EXPECT_EQ(*d, Dtype::kBF16) << text;
  }
  EXPECT_EQ(*ParsePeerKeyDtype("half"), Dtype::kF16);
  EXPECT_EQ(*ParsePeerKeyDtype("float8_e4m3fn"), Dtype::kF8_E4M3);
  EXPECT_EQ(*ParsePeerKeyDtype("as-stored"), std::nullopt);
  for (const char* bad : {"", "b16", "torch.", "auto", "as_stored", "torch.BF16"}) {
    auto d = ParsePeerKeyDtype(bad);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  PeerKey a, b;
  a.model = b.model = "m";
  a.dtype = *ParsePeerKeyDtype("bfloat16");
  b.dtype = *ParsePeerKeyDtype("BF16");
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_THAT(a.Canonical(), HasSubstr("\ndtype=BF16\n"));
  b.dtype.reset();
  EXPECT_THAT(b.Canonical(), HasSubstr("\ndtype=as-stored\n"));
  EXPECT_EQ(a.Mismatch(b), "dtype: 'BF16' (ours) != 'as-stored' (peer's)");
  Manifest m = ValidManifest();
  m.key.dtype = Dtype::kF16;
  auto back = ParseManifest(m.ToJson());
  ASSERT_OK(back);
  EXPECT_EQ(back->key.dtype, Dtype::kF16);
  std::string json = m.ToJson();
  json.replace(json.find("\"dtype\":\"F16\""), 13, "\"dtype\":\"F17\"");
  auto refused = ParseManifest(json);
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(refused.status().message(), HasSubstr("'F17' is not a dtype"));
}

// The content identity is optional (old sources have none), and checked: a
// root with every tensor's xxh128, and the root over them.
TEST(ManifestTest, ContentIsOptionalRoundTripsAndIsChecked) {
  Manifest m = ValidManifest();
  const std::string plain = m.ToJson();
  EXPECT_EQ(plain.find("xxh128"), std::string::npos);
  auto old = ParseManifest(plain);
  ASSERT_OK(old);
  EXPECT_FALSE(old->content.has_value());
  std::vector<TensorContent> contents;
  uint64_t n = 0;
  for (ManifestTensor& t : m.tensors) {
    t.xxh128 = Hash128{0x1111 * ++n, 0xabcdef00 + n};
    contents.push_back({t.name, t.dtype, t.shape, t.nbytes, *t.xxh128});
  }
  m.content = ContentRoot(contents);
  const std::string json = m.ToJson();
  auto parsed = ParseManifest(json);
  ASSERT_OK(parsed) << json;
  ASSERT_TRUE(parsed->content.has_value());
  EXPECT_EQ(*parsed->content, *m.content);
  for (const ManifestTensor& t : m.tensors) {
    const ManifestTensor* p = parsed->Find(t.name);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->xxh128.has_value());
    EXPECT_EQ(*p->xxh128, *t.xxh128);
  }
  EXPECT_EQ(parsed->ToJson(), ParseManifest(parsed->ToJson())->ToJson());
  // A root that is not its tensors'; a root without the tensors' hashes; hashes
  // without a root; a malformed hash.
  const std::string root = m.content->Hex();
  std::string other = root;
  other[0] = other[0] == '0' ? '1' : '0';
  ExpectCorrupt(Replace(json, "\"content\":\"" + root, "\"content\":\"" + other),
                {"is not the root of its tensors' xxh128", root});
  ExpectCorrupt(plain.substr(0, plain.size() - 1) + ",\"content\":\"" + root + "\"}",
                {"content is given but 4 of the 4 tensors have no xxh128"});
  ExpectCorrupt(Replace(json, ",\"content\":\"" + root + "\"", ""),
                {"4 tensors have an xxh128 but there is no content"});
  const std::string h0 = m.tensors[0].xxh128->Hex();
  ExpectCorrupt(Replace(json, h0, h0.substr(0, 31) + "Z"), {"xxh128 must be 32 lowercase hex"});
  ExpectCorrupt(Replace(json, "\"content\":\"" + root, "\"content\":\"" + root.substr(2)),
                {"content must be 32 lowercase hex"});
}

// PeerKey::content: validated, and no part of the key's digest or mismatch.
TEST(ManifestTest, KeyContentIsValidatedAndNotInTheDigest) {
  PeerKey key;
  key.model = "m";
  const std::string digest = key.Digest();
  PeerKey with = key;
  with.content = std::string(32, 'a');
  EXPECT_OK(with.Validate());
  EXPECT_EQ(with.Digest(), digest);
  EXPECT_EQ(with.Canonical(), key.Canonical());
  EXPECT_EQ(with.Mismatch(key), "");
  with.content = std::string(32, 'A');
  EXPECT_THAT(with.Validate().message(), HasSubstr("32 lowercase hex"));
  with.content = "abc";
  EXPECT_EQ(with.Validate().code(), StatusCode::kInvalidArgument);
}
}  // namespace
}  // namespace tensorlift::remote
