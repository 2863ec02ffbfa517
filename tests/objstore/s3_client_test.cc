// The S3 client against a real S3 server (rclone serve s3, see s3_server.h):
// listings, HEAD, GET, parallel ranged GETs byte for byte, key and query
// encoding, and every failure class (bad signature, missing key, short
// object, a server that died). Skips when rclone is not installed.
#include "objstore/s3_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "s3_server.h"

namespace tensorlift::objstore {

void SetS3ListPageKeysForTesting(int keys);  // s3_client.cc

namespace {

using ::tensorlift::testing::kS3AccessKey;
using ::tensorlift::testing::kS3SecretKey;
using ::tensorlift::testing::RcloneS3Server;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

// Writes `bytes` to <root>/<bucket>/<key>, making the folders.
void PutObject(const std::string& root, const std::string& bucket, const std::string& key,
               const std::string& bytes) {
  const std::filesystem::path p = std::filesystem::path(root) / bucket / key;
  std::filesystem::create_directories(p.parent_path());
  FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr) << p;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  ASSERT_EQ(std::fclose(f), 0);
}

Result<S3Settings> SettingsFor(const RcloneS3Server& server, const std::string& secret,
                               int max_connections = 16) {
  S3Overrides o;
  o.endpoint = server.endpoint();
  o.region = "us-east-1";
  o.access_key = kS3AccessKey;
  o.secret_key = secret;
  TL_ASSIGN_OR_RETURN(S3Settings s, ResolveS3Settings("s3", o));
  s.max_connections = max_connections;
  s.retry_base_ms = 10;
  return s;
}

std::vector<std::string> Keys(const std::vector<ObjectInfo>& objects) {
  std::vector<std::string> out;
  for (const auto& o : objects) out.push_back(o.key);
  std::sort(out.begin(), out.end());
  return out;
}

// Keys that need percent-encoding in paths and queries.
std::vector<std::string> SpecialKeys() {
  return {"special/with space/a+b=c&d.bin", "special/unicode-\xc3\xa9\xe6\xbc\xa2.txt",
          "special/punct ~!$'()*,;@%25[].bin"};
}

class S3ClientTest : public ::testing::Test {
 protected:
  static constexpr size_t kBigBytes = 20 * 1000 * 1000 + 17;

  static void SetUpTestSuite() {
    dir_ = new test::ScratchDir("s3_client");
    root_ = dir_->File("root");
    std::filesystem::create_directories(root_ + "/bucket");
    big_ = new std::string(RandomBytes(kBigBytes, 42));
    PutObject(root_, "bucket", "big.bin", *big_);
    PutObject(root_, "bucket", "models/a.bin", "aaaa");
    PutObject(root_, "bucket", "models/b.bin", "bbbbbbbb");
    PutObject(root_, "bucket", "models/sub/c.bin", "c");
    PutObject(root_, "bucket", "other/x.bin", "xx");
    PutObject(root_, "bucket", "small.bin", RandomBytes(100, 7));
    // rclone caches directory listings: every object is written before it starts.
    for (const std::string& key : SpecialKeys()) PutObject(root_, "bucket", key, "payload-" + key);
    for (int i = 0; i < 7; ++i) {
      PutObject(root_, "bucket", "many/f" + std::to_string(i), std::string(i, 'm'));
    }
    server_ = new RcloneS3Server(root_);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete big_;
    delete dir_;
  }
  void SetUp() override {
    if (!server_->ok()) GTEST_SKIP() << server_->error();
    auto settings = SettingsFor(*server_, kS3SecretKey);
    ASSERT_OK(settings);
    auto client = S3Client::Create(*settings);
    ASSERT_OK(client);
    client_ = std::move(*client);
  }

  static test::ScratchDir* dir_;
  static std::string root_;
  static std::string* big_;
  static RcloneS3Server* server_;
  std::unique_ptr<S3Client> client_;
};

test::ScratchDir* S3ClientTest::dir_ = nullptr;
std::string S3ClientTest::root_;
std::string* S3ClientTest::big_ = nullptr;
RcloneS3Server* S3ClientTest::server_ = nullptr;

TEST_F(S3ClientTest, ListPrefix) {
  auto objects = client_->List("bucket", "models/");
  ASSERT_OK(objects);
  EXPECT_THAT(Keys(*objects),
              ::testing::ElementsAre("models/a.bin", "models/b.bin", "models/sub/c.bin"));
  for (const auto& o : *objects) {
    if (o.key == "models/b.bin") {
      EXPECT_EQ(o.size, 8u);
    }
    EXPECT_FALSE(o.etag.empty());
    EXPECT_EQ(o.etag.find('"'), std::string::npos);
  }
  // A delimiter leaves the sub-prefixes out.
  objects = client_->List("bucket", "models/", "/");
  ASSERT_OK(objects);
  EXPECT_THAT(Keys(*objects), ::testing::ElementsAre("models/a.bin", "models/b.bin"));
  // The whole bucket.
  objects = client_->List("bucket", "");
  ASSERT_OK(objects);
  EXPECT_GE(objects->size(), 13u);
  // Nothing under a prefix is no error.
  objects = client_->List("bucket", "nothing/");
  ASSERT_OK(objects);
  EXPECT_TRUE(objects->empty());
}

TEST_F(S3ClientTest, ListPages) {
  SetS3ListPageKeysForTesting(2);
  auto objects = client_->List("bucket", "many/");
  SetS3ListPageKeysForTesting(1000);
  ASSERT_OK(objects);
  ASSERT_EQ(objects->size(), 7u);
  for (const auto& o : *objects) {
    EXPECT_EQ(o.size, static_cast<uint64_t>(o.key.back() - '0')) << o.key;
  }
}

TEST_F(S3ClientTest, ListMissingBucket) {
  auto objects = client_->List("nobucket", "x/");
  ASSERT_FALSE(objects.ok());
  EXPECT_EQ(objects.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(objects.status().message(), HasSubstr("nobucket"));
  EXPECT_FALSE(client_->List("Bad..Name", "").ok());
}

TEST_F(S3ClientTest, HeadAndGet) {
  auto info = client_->Head("bucket", "models/b.bin");
  ASSERT_OK(info);
  EXPECT_EQ(info->key, "models/b.bin");
  EXPECT_EQ(info->size, 8u);
  EXPECT_FALSE(info->etag.empty());

  const uint64_t before = client_->bytes_received();
  auto body = client_->Get("bucket", "models/b.bin", 100);
  ASSERT_OK(body);
  EXPECT_EQ(*body, "bbbbbbbb");
  EXPECT_EQ(client_->bytes_received() - before, 8u);

  body = client_->Get("bucket", "models/b.bin", 8);
  ASSERT_OK(body);
  body = client_->Get("bucket", "models/b.bin", 7);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(body.status().message(), HasSubstr("8 bytes"));
  EXPECT_THAT(body.status().message(), HasSubstr("limit of 7"));
}

TEST_F(S3ClientTest, MissingKey) {
  auto info = client_->Head("bucket", "models/nope.bin");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(info.status().message(), HasSubstr("s3://bucket/models/nope.bin"));

  auto body = client_->Get("bucket", "models/nope.bin", 100);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(body.status().message(), HasSubstr("s3://bucket/models/nope.bin"));

  std::string dst(10, '\0');
  RangeRequest r{"bucket", "models/nope.bin", 0, 10, reinterpret_cast<std::byte*>(dst.data())};
  const Status st = client_->GetRanges({&r, 1});
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("s3://bucket/models/nope.bin"));
}

// Ranges of the big object at odd offsets and lengths, all byte-exact.
void CheckManyRanges(S3Client& client, const std::string& big) {
  std::mt19937_64 rng(1234);
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 1}, {big.size() - 1, 1}, {0, big.size()}, {1, 3}, {12345, 1 << 20}};
  for (int i = 0; i < 200; ++i) {
    const uint64_t len = 1 + rng() % (i % 10 == 0 ? 2000000 : 70001);
    const uint64_t off = rng() % (big.size() - len + 1);
    ranges.emplace_back(off, len);
  }
  std::vector<std::string> dsts;
  std::vector<RangeRequest> requests;
  uint64_t total = 0;
  for (const auto& [off, len] : ranges) dsts.emplace_back(len, '\xee');
  for (size_t i = 0; i < ranges.size(); ++i) {
    requests.push_back({"bucket", "big.bin", ranges[i].first, ranges[i].second,
                        reinterpret_cast<std::byte*>(dsts[i].data())});
    total += ranges[i].second;
  }
  std::vector<int> done(ranges.size(), 0);
  const uint64_t before = client.bytes_received();
  ASSERT_OK(client.GetRanges(requests, [&](size_t i) { ++done[i]; }));
  EXPECT_GE(client.bytes_received() - before, total);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(done[i], 1) << i;
    ASSERT_TRUE(dsts[i] == big.substr(ranges[i].first, ranges[i].second))
        << "range " << i << " [" << ranges[i].first << ", +" << ranges[i].second << ")";
  }
}

TEST_F(S3ClientTest, GetRangesByteExact) {
  for (int connections : {4, 16}) {
    SCOPED_TRACE(connections);
    auto settings = SettingsFor(*server_, kS3SecretKey, connections);
    ASSERT_OK(settings);
    auto client = S3Client::Create(*settings);
    ASSERT_OK(client);
    CheckManyRanges(**client, *big_);
    // Again on the kept-alive connections.
    CheckManyRanges(**client, *big_);
    EXPECT_EQ((*client)->retries(), 0u);
  }
}

TEST_F(S3ClientTest, ConcurrentCalls) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        std::vector<std::string> dsts(16, std::string(50000, '\0'));
        std::vector<RangeRequest> rs;
        for (size_t i = 0; i < dsts.size(); ++i) {
          rs.push_back({"bucket", "big.bin", (t * 1000003 + i * 777777 + round) % 19000000,
                        dsts[i].size(), reinterpret_cast<std::byte*>(dsts[i].data())});
        }
        if (!client_->GetRanges(rs).ok()) ++failures;
        for (size_t i = 0; i < rs.size(); ++i) {
          if (dsts[i] != big_->substr(rs[i].offset, rs[i].bytes)) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(S3ClientTest, ZeroBytesAndBadRequests) {
  int done = 0;
  RangeRequest zero{"bucket", "small.bin", 5, 0, nullptr};
  EXPECT_OK(client_->GetRanges({&zero, 1}, [&](size_t) { ++done; }));
  EXPECT_EQ(done, 1);
  RangeRequest no_dst{"bucket", "small.bin", 0, 5, nullptr};
  EXPECT_EQ(client_->GetRanges({&no_dst, 1}).code(), StatusCode::kInvalidArgument);
  char buf[4];
  RangeRequest overflow{"bucket", "small.bin", UINT64_MAX - 1, 4,
                        reinterpret_cast<std::byte*>(buf)};
  EXPECT_EQ(client_->GetRanges({&overflow, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Head("bucket", "").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(S3ClientTest, RangePastTheEnd) {
  std::string dst(20, '\0');
  // Starts inside, ends past the end (the server answers with less).
  RangeRequest r{"bucket", "small.bin", 90, 20, reinterpret_cast<std::byte*>(dst.data())};
  Status st = client_->GetRanges({&r, 1});
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("short object"));
  EXPECT_THAT(st.message(), HasSubstr("s3://bucket/small.bin"));
  EXPECT_THAT(st.message(), HasSubstr("100 bytes"));
  EXPECT_THAT(st.message(), HasSubstr("[90, 110)"));
  // Starts past the end (416).
  r.offset = 200;
  st = client_->GetRanges({&r, 1});
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("short object"));
  EXPECT_THAT(st.message(), HasSubstr("[200, 220)"));
  EXPECT_THAT(st.message(), HasSubstr("100 bytes"));
  // One bad range among good ones fails the call.
  std::vector<std::string> dsts(8, std::string(1000, '\0'));
  std::vector<RangeRequest> rs;
  for (size_t i = 0; i < dsts.size(); ++i) {
    rs.push_back({"bucket", i == 5 ? "small.bin" : "big.bin", i * 1000, 1000,
                  reinterpret_cast<std::byte*>(dsts[i].data())});
  }
  st = client_->GetRanges(rs);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("small.bin"));
}

TEST_F(S3ClientTest, WrongSecret) {
  auto settings = SettingsFor(*server_, "not-the-secret");
  ASSERT_OK(settings);
  auto client = S3Client::Create(*settings);
  ASSERT_OK(client);
  auto info = (*client)->Head("bucket", "models/a.bin");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(info.status().message(), HasSubstr("given"));
  EXPECT_THAT(info.status().message(), HasSubstr(server_->endpoint()));

  std::string dst(4, '\0');
  RangeRequest r{"bucket", "models/a.bin", 0, 4, reinterpret_cast<std::byte*>(dst.data())};
  const Status st = (*client)->GetRanges({&r, 1});
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(st.message(), HasSubstr("SignatureDoesNotMatch"));
  EXPECT_THAT(st.message(), HasSubstr("credentials from given"));
  EXPECT_THAT(st.message(), HasSubstr(server_->endpoint()));
  EXPECT_EQ((*client)->retries(), 0u);  // Permanent: not retried.

  // Unsigned requests to a server that wants signatures.
  S3Overrides o;
  o.endpoint = server_->endpoint();
  o.anonymous = true;
  auto anon_settings = ResolveS3Settings("s3", o);
  ASSERT_OK(anon_settings);
  auto anon = S3Client::Create(*anon_settings);
  ASSERT_OK(anon);
  auto listed = (*anon)->List("bucket", "");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(listed.status().message(), HasSubstr("none (unsigned)"));
}

TEST_F(S3ClientTest, SpecialCharactersInKeys) {
  const std::vector<std::string> keys = SpecialKeys();
  for (const std::string& key : keys) {
    SCOPED_TRACE(key);
    const std::string payload = "payload-" + key;
    auto info = client_->Head("bucket", key);
    ASSERT_OK(info);
    EXPECT_EQ(info->size, payload.size());
    auto body = client_->Get("bucket", key, 1000);
    ASSERT_OK(body);
    EXPECT_EQ(*body, payload);
    std::string dst(5, '\0');
    RangeRequest r{"bucket", key, 6, 5, reinterpret_cast<std::byte*>(dst.data())};
    ASSERT_OK(client_->GetRanges({&r, 1}));
    EXPECT_EQ(dst, payload.substr(6, 5));
  }
  // Listing decodes the keys; prefixes with ' ', '/', '+' are encoded in the query.
  auto listed = client_->List("bucket", "special/");
  ASSERT_OK(listed);
  auto sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(Keys(*listed), sorted);
  listed = client_->List("bucket", "special/with space/a+b");
  ASSERT_OK(listed);
  EXPECT_THAT(Keys(*listed), ::testing::ElementsAre(keys[0]));
  listed = client_->List("bucket", "special/", "/");
  ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 2u);
  // Dot segments are sent as they are, not squashed to "special/with space/...".
  auto info = client_->Head("bucket", "special/x/../with space/a+b=c&d.bin");
  EXPECT_FALSE(info.ok());
}

// A server that died: every request fails to connect, is retried, then the
// call returns a clear error (no hang).
TEST(S3ClientDeadServerTest, FailsAfterRetries) {
  test::ScratchDir dir("s3_dead");
  const std::string root = dir.File("root");
  PutObject(root, "bucket", "obj.bin", std::string(4096, 'o'));
  RcloneS3Server server(root);
  if (!server.ok()) GTEST_SKIP() << server.error();
  auto settings = SettingsFor(server, kS3SecretKey, 4);
  ASSERT_OK(settings);
  settings->retries = 1;
  settings->retry_base_ms = 10;
  settings->connect_timeout_ms = 2000;
  auto client = S3Client::Create(*settings);
  ASSERT_OK(client);
  ASSERT_OK((*client)->Head("bucket", "obj.bin"));  // A kept-alive connection now.
  server.Stop();

  std::vector<std::string> dsts(6, std::string(100, '\0'));
  std::vector<RangeRequest> rs;
  for (size_t i = 0; i < dsts.size(); ++i) {
    rs.push_back({"bucket", "obj.bin", i * 100, 100, reinterpret_cast<std::byte*>(dsts[i].data())});
  }
  const auto start = std::chrono::steady_clock::now();
  const Status st = (*client)->GetRanges(rs);
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("s3://bucket/obj.bin"));
  EXPECT_THAT(st.message(), HasSubstr(server.endpoint()));
  EXPECT_THAT(st.message(), HasSubstr("failed 2 times"));
  EXPECT_GE((*client)->retries(), 1u);
  // Refused connections and a 10 ms backoff end it in well under a second; a
  // watchdog of 60 s, not a measure.
  EXPECT_LT(seconds.count(), 60.0);
}

TEST(S3ClientCreateTest, RejectsBadSettings) {
  S3Settings s;
  s.endpoint = "ftp://x";
  EXPECT_EQ(S3Client::Create(s).status().code(), StatusCode::kInvalidArgument);
  s.endpoint = "http://127.0.0.1:1";
  s.anonymous = true;
  s.max_connections = 0;
  EXPECT_EQ(S3Client::Create(s).status().code(), StatusCode::kInvalidArgument);
  s.max_connections = 4;
  EXPECT_OK(S3Client::Create(s));
  s.anonymous = false;  // Signed, but no keys.
  EXPECT_EQ(S3Client::Create(s).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensorlift::objstore
