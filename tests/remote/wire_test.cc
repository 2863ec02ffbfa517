// The peer wire decoders on their own, without a peer (the fuzz targets
// tests/fuzz/peer_wire_fuzz.cc and registry_fuzz.cc run the same functions on
// generated input): GET /v1/key's answer, the frames around UCX's blobs, and
// etcd's range replies. Every fuzz finding is replayed here from its input in
// tests/fuzz/seeds-*/regress-*.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "../common/assert_ok.h"
#include "remote/control.h"
#include "remote/frame.h"
#include "remote/registry.h"

namespace tensorlift::remote {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadSeed(const std::string& name) {
  std::ifstream in(std::string(TENSORLIFT_SOURCE_DIR) + "/tests/fuzz/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

constexpr const char* kKey =
    R"({"protocol":1,"key":{"model":"m","revision":"r","dtype":"as-stored","quantization":"none",)"
    R"("layout":"","protocol":1},"digest":"0123456789abcdef","parallel":{"size":2,"rank":1},)"
    R"("tensors":3,"total_bytes":100,"sessions":4})";

TEST(KeyJsonTest, AValidAnswer) {
  auto info_or = ParseKeyJson("http://h:1", kKey);
  ASSERT_OK(info_or);
  PeerInfo info = *std::move(info_or);
  EXPECT_EQ(info.key.model, "m");
  EXPECT_EQ(info.key.protocol, 1);
  EXPECT_EQ(info.parallel.size, 2);
  EXPECT_EQ(info.parallel.rank, 1);
  EXPECT_EQ(info.load, 4);
}

TEST(KeyJsonTest, FieldsInAnyOrder) {
  const std::string reordered =
      R"({"total_bytes":7,"parallel":{"rank":0,"size":1},"sessions":0,"key":{"protocol":1,)"
      R"("layout":"","quantization":"none","dtype":"float16","revision":"r","model":"m"},"tensors":2})";
  auto info_or = ParseKeyJson("http://h:1", reordered);
  ASSERT_OK(info_or);
  PeerInfo info = *std::move(info_or);
  EXPECT_EQ(info.parallel.size, 1);
  EXPECT_EQ(info.key.dtype, Dtype::kF16);  // torch's spelling, read as the dtype.
  EXPECT_EQ(info.tensors, 2u);
  EXPECT_EQ(info.total_bytes, 7u);
}

// What the manifest must then list (a million tensors where the key said 3 is a lie).
TEST(KeyJsonTest, TheTensorCountAndBytesAreRequired) {
  std::string no_count = kKey;
  no_count.replace(no_count.find(R"("tensors":3,)"), 12, "");
  for (const std::string& bad :
       {no_count, std::string(kKey).replace(std::string(kKey).find("100"), 3, "-1")}) {
    auto info = ParseKeyJson("http://h:1", bad);
    ASSERT_FALSE(info.ok()) << bad;
    EXPECT_THAT(info.status().message(), HasSubstr("tensors or total_bytes")) << bad;
  }
  auto info = ParseKeyJson("http://h:1", kKey);
  ASSERT_OK(info);
  Manifest m;
  m.total_bytes = 100;
  m.tensors.resize(3);
  EXPECT_OK(ManifestAgreesWithKey(*info, m));
  m.tensors.resize(1000000);
  Status lie = ManifestAgreesWithKey(*info, m);
  EXPECT_EQ(lie.code(), StatusCode::kCorruption);
  EXPECT_THAT(lie.message(), HasSubstr("the manifest lists 1000000 tensors of 100 bytes, GET "
                                       "/v1/key said 3 of 100"));
}

TEST(KeyJsonTest, MalformedAnswersAreCorruptionNamingThePeer) {
  for (const std::string& bad :
       {std::string(""), std::string("[]"), std::string(R"({"key":1})"),
        std::string(kKey).substr(0, 60),
        std::string(R"({"key":{"model":"m","revision":"r","dtype":"d","quantization":"q",)"
                    R"("layout":"","protocol":1},"parallel":{"size":2,"rank":2}})")}) {
    auto info = ParseKeyJson("http://h:1", bad);
    ASSERT_FALSE(info.ok()) << bad;
    EXPECT_EQ(info.status().code(), StatusCode::kCorruption) << bad;
    EXPECT_THAT(info.status().message(), HasSubstr("http://h:1: GET /v1/key: ")) << bad;
  }
}

// Fuzz finding (2026-11-27): malformed JSON whose fields were looked up out of
// order ran simdjson's On-Demand parser into an "unreachable" assumption
// (undefined behaviour; UBSan aborted). Now the DOM parser checks the whole
// document first: a Corruption error.
TEST(KeyJsonTest, FuzzFindingMalformedJsonLookedUpOutOfOrder) {
  const std::string seed = ReadSeed("seeds-peer-wire/regress-key-ondemand-unreachable.bin");
  ASSERT_GT(seed.size(), 1u);
  auto info = ParseKeyJson("http://h:1", seed.substr(1));  // The first byte picks the decoder.
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kCorruption);
}

TEST(FrameTest, RoundTripAndEveryRejection) {
  const std::string payload = "ucx worker address bytes";
  const std::string blob = Frame('A', payload.data(), payload.size());
  auto back_or = Unframe(blob, 'A', "address");
  ASSERT_OK(back_or);
  std::string back = *std::move(back_or);
  EXPECT_EQ(back, payload);
  EXPECT_THAT(Unframe(blob, 'K', "rkey").status().message(), HasSubstr("bad magic or kind"));
  EXPECT_THAT(Unframe(blob.substr(0, 10), 'A', "address").status().message(),
              HasSubstr("shorter than the 24-byte frame header"));
  EXPECT_THAT(Unframe(blob + "x", 'A', "address").status().message(),
              HasSubstr("does not match the"));
  std::string flipped = blob;
  flipped.back() ^= 1;
  EXPECT_THAT(Unframe(flipped, 'A', "address").status().message(), HasSubstr("checksum"));
  EXPECT_EQ(Unframe(Frame('A', "", 0), 'A', "address").status().code(),
            StatusCode::kInvalidArgument);
}

std::string B64(const std::string& in) {
  static constexpr char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= uint8_t(in[i + 2]);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? k[v & 63] : '=';
  }
  return out;
}

std::string Kv(const std::string& suffix, const std::string& value) {
  return R"({"key":")" + B64("/tensorlift/seeds/0123456789abcdef/" + suffix) + R"(","value":")" +
         B64(value) + R"("})";
}

TEST(RangePageTest, ValidEntriesAreKeptAndBadOnesSkipped) {
  const std::string good =
      R"({"url":"http://127.0.0.1:8470","rank":0,"world":2,"load":1,"id":"ab"})";
  const std::string reply =
      R"({"kvs":[)" + Kv("0/ab", good) + "," +
      Kv("1/ab", good) +  // The key's rank disagrees with the value's.
      "," + Kv("1/cd", R"({"url":"ftp://x","rank":1,"world":2,"load":0,"id":"cd"})") +
      R"(],"more":true})";
  auto page_or = ParseRangePage(reply, "0123456789abcdef", 500);
  ASSERT_OK(page_or);
  RangePage page = *std::move(page_or);
  ASSERT_EQ(page.seeds.size(), 1u);
  EXPECT_EQ(page.seeds[0].url, "http://127.0.0.1:8470");
  EXPECT_EQ(page.entries, 3u);
  EXPECT_EQ(page.skipped, 2u);
  EXPECT_TRUE(page.more);
  EXPECT_EQ(page.last_key, "/tensorlift/seeds/0123456789abcdef/1/cd");
}

TEST(RangePageTest, KeysOutsideTheRangeOrOutOfOrderOrTooManyAreCorruption) {
  const std::string v = R"({"url":"http://h:1","rank":0,"world":1,"load":0,"id":"ab"})";
  const std::string other = R"({"key":")" + B64("/tensorlift/seeds/fedcba9876543210/0/ab") +
                            R"(","value":")" + B64(v) + R"("})";
  for (const std::string& reply :
       {R"({"kvs":[)" + other + "]}", R"({"kvs":[)" + Kv("1/ab", v) + "," + Kv("0/ab", v) + "]}",
        std::string("not json"), std::string("[1]")}) {
    auto page = ParseRangePage(reply, "0123456789abcdef", 500);
    ASSERT_FALSE(page.ok()) << reply;
    EXPECT_EQ(page.status().code(), StatusCode::kCorruption) << reply;
  }
  auto page = ParseRangePage(R"({"kvs":[)" + Kv("0/ab", v) + "," + Kv("0/cd", v) + "]}",
                             "0123456789abcdef", 1);
  EXPECT_THAT(page.status().message(), HasSubstr("more entries than the limit"));
  // A key not after the previous page's last key.
  page = ParseRangePage(R"({"kvs":[)" + Kv("0/ab", v) + "]}", "0123456789abcdef", 500,
                        "/tensorlift/seeds/0123456789abcdef/0/ab");
  EXPECT_FALSE(page.ok());
}

// A relay's entry (docs/remote.md, "Relaying"): partial with its progress,
// written and read back; etcd's create_revision (a string in its JSON
// gateway) gives the order relays registered in; a bad progress is skipped.
TEST(RangePageTest, ARelaysEntryIsPartialWithItsProgressAndItsCreationOrder) {
  SeedInfo relay;
  relay.key_digest = "0123456789abcdef";
  relay.url = "http://10.77.0.3:9000";
  relay.id = "ef";
  relay.partial = true;
  relay.progress = 0.25;
  const std::string value = EntryValue(relay);
  EXPECT_THAT(value, HasSubstr(R"("partial":true,"progress":0.25)"));
  SeedInfo whole = relay;
  whole.partial = false;
  EXPECT_THAT(EntryValue(whole), Not(HasSubstr("partial")));
  const std::string kv = R"({"key":")" + B64("/tensorlift/seeds/0123456789abcdef/0/ef") +
                         R"(","create_revision":"42","value":")" + B64(value) + R"("})";
  const std::string bad = R"({"url":"http://h:1","rank":0,"world":1,"load":0,"id":"ff",)"
                          R"("partial":true,"progress":1.5})";
  auto page =
      ParseRangePage(R"({"kvs":[)" + kv + "," + Kv("0/ff", bad) + "]}", "0123456789abcdef", 500);
  ASSERT_OK(page);
  ASSERT_EQ(page->seeds.size(), 1u);
  EXPECT_TRUE(page->seeds[0].partial);
  EXPECT_EQ(page->seeds[0].progress, 0.25);
  EXPECT_EQ(page->seeds[0].created, 42);
  EXPECT_EQ(page->skipped, 1u);
}

// A relay behind a slower link says so (SeedInfo::behind, sources/relay.h
// BehindRule); the flag is written only when set, and one that is not a
// boolean makes the entry invalid.
TEST(RangePageTest, ARelayBehindASlowerLinkSaysSo) {
  SeedInfo relay;
  relay.key_digest = "0123456789abcdef";
  relay.url = "http://10.77.0.4:9000";
  relay.id = "ab";
  relay.partial = true;
  relay.progress = 0.5;
  EXPECT_THAT(EntryValue(relay), Not(HasSubstr("behind")));
  relay.behind = true;
  const std::string value = EntryValue(relay);
  EXPECT_THAT(value, HasSubstr(R"("behind":true)"));
  const std::string bad = R"({"url":"http://h:1","rank":0,"world":1,"load":0,"id":"ff",)"
                          R"("partial":true,"progress":0.5,"behind":"yes"})";
  auto page = ParseRangePage(R"({"kvs":[)" + Kv("0/ab", value) + "," + Kv("0/ff", bad) + "]}",
                             "0123456789abcdef", 500);
  ASSERT_OK(page);
  ASSERT_EQ(page->seeds.size(), 1u);
  EXPECT_TRUE(page->seeds[0].behind);
  EXPECT_TRUE(page->seeds[0].partial);
  EXPECT_EQ(page->skipped, 1u);
}

}  // namespace
}  // namespace tensorlift::remote
