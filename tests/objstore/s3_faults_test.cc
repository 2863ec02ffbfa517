// The S3 client and LoadFromObjectStore against a real S3 server that
// misbehaves: moto's S3 server on loopback with faults injected into its
// ranged GETs (tests/objstore/moto_faults.py, moto_server.h): 503 SlowDown,
// 500 InternalError, short bodies, connection resets and stalls are retried
// and the load is byte-exact; more faults than retries is one clear error
// naming the object and the cause; a server killed mid-load is an error in
// bounded time, never a hang. Skips when moto is not installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "moto_server.h"
#include "objstore/s3_client.h"
#include "s3_server.h"
#include "scoped_env.h"
#include "tensorlift/objstore.h"

namespace tensorlift {
namespace {

using objstore::RangeRequest;
using objstore::S3Client;
using test::ScratchDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MotoFaultServer;
using testing::Random;
using testing::RawTensor;
using testing::ScopedEnv;
using testing::WriteRaw;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

constexpr const char* kModel = "s3://models/mixed/model.safetensors";

class S3FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::MotoAvailable()) {
      GTEST_SKIP() << "moto is not installed (.venv-s3 with moto and boto3; scripts/setup.sh)";
    }
    std::filesystem::create_directories(root_.File("s3/models/mixed"));
    // ~1 MB in several runs (a misaligned tensor gets its own).
    WriteRaw(root_.File("s3/models/mixed/model.safetensors"), testing::MixedTensors(11), 3);
    store_.region = "us-east-1";
    store_.request_bytes = 64 << 10;            // Many ranged GETs...
    store_.max_in_flight_bytes = 4 * 64 << 10;  // ...over 4 connections.
  }

  // Starts the server with `plan` (the test fails when it cannot start).
  void Serve(const std::string& plan, double slow_seconds = 5) {
    server_ = std::make_unique<MotoFaultServer>(root_.File("s3"), plan, slow_seconds);
    ASSERT_TRUE(server_->ok()) << server_->error();
    store_.endpoint = server_->endpoint();
  }

  // A raw client of the server: quick retries.
  std::unique_ptr<S3Client> Client(int retries, int max_connections = 4,
                                   int low_speed_timeout_s = 30,
                                   uint64_t min_rate = objstore::S3Settings{}.min_rate) {
    objstore::S3Overrides o;
    o.endpoint = server_->endpoint();
    o.region = "us-east-1";
    o.access_key = testing::kS3AccessKey;
    o.secret_key = testing::kS3SecretKey;
    auto settings = objstore::ResolveS3Settings("s3", o);
    EXPECT_OK(settings);
    if (!settings.ok()) return nullptr;
    settings->retries = retries;
    settings->retry_base_ms = 1;
    settings->max_connections = max_connections;
    settings->low_speed_timeout_s = low_speed_timeout_s;
    settings->min_rate = min_rate;
    auto client = S3Client::Create(*settings);
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }

  // One ranged GET of mixed/model.safetensors, timed.
  struct TimedGet {
    Status status;
    std::string bytes;
    double seconds;
  };
  static TimedGet Get(S3Client& client, uint64_t offset, size_t size) {
    TimedGet got{Status::Ok(), std::string(size, '\0'), 0};
    RangeRequest r{"models", "mixed/model.safetensors", offset, size,
                   reinterpret_cast<std::byte*>(got.bytes.data())};
    const auto start = Clock::now();
    got.status = client.GetRanges({&r, 1});
    got.seconds = SecondsSince(start);
    return got;
  }

  // Loads kModel and checks it byte for byte against the local file.
  void LoadByteExact(ObjectStoreReport* report) {
    auto got = LoadFromObjectStore(kModel, {}, store_, report);
    ASSERT_OK(got);
    loaded_bytes_ = got->total_bytes();
    LoadOptions host;
    host.device = DeviceId::Cpu();
    auto want = Load(root_.File("s3/models/mixed/model.safetensors"), host);
    ASSERT_OK(want);
    ASSERT_EQ(got->tensors().size(), want->tensors().size());
    for (const LoadedTensor& w : want->tensors()) {
      SCOPED_TRACE(w.name);
      const LoadedTensor* g = got->Find(w.name);
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->dtype, w.dtype);
      EXPECT_EQ(g->shape, w.shape);
      ASSERT_EQ(g->nbytes, w.nbytes);
      if (w.nbytes) {
        EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes), 0);
      }
    }
  }

  // A load through faults `kind` x `count` after the header probe (the plan
  // lets the first ranged GET, the header's, by): it succeeds byte-exact
  // with one retry per fault, and the server counts the faults.
  ObjectStoreReport ExpectRetriedThrough(const std::string& kind, int count) {
    ObjectStoreReport report;
    Serve("ok:1," + kind + ":" + std::to_string(count));
    if (!server_->ok()) return report;
    const auto start = Clock::now();
    LoadByteExact(&report);
    const double seconds = SecondsSince(start);
    const auto stats = server_->Stats();
    EXPECT_EQ(stats.at("fault_" + kind), static_cast<uint64_t>(count));
    EXPECT_EQ(stats.at("faults"), static_cast<uint64_t>(count));
    EXPECT_GE(report.retries, stats.at("faults"));
    EXPECT_EQ(report.retries, static_cast<uint64_t>(count));  // One retry per fault, no more.
    EXPECT_GT(report.requests, 4u);
    // Every data GET, plus the header's, plus the faulted ones again.
    EXPECT_EQ(stats.at("ranged_gets"), 1 + report.requests + count);
    RecordProperty("load_seconds", std::to_string(seconds));
    std::printf("[ info ] %s x%d: %llu requests, %llu retries, %.2f s\n", kind.c_str(), count,
                static_cast<unsigned long long>(report.requests),
                static_cast<unsigned long long>(report.retries), seconds);
    return report;
  }

  ScratchDir root_{"tl_s3_faults"};
  std::unique_ptr<MotoFaultServer> server_;
  ObjectStoreOptions store_;
  uint64_t loaded_bytes_ = 0;  // By LoadByteExact.
  ScopedEnv key_{"AWS_ACCESS_KEY_ID", testing::kS3AccessKey};
  ScopedEnv secret_{"AWS_SECRET_ACCESS_KEY", testing::kS3SecretKey};
  ScopedEnv token_{"AWS_SESSION_TOKEN", nullptr};
  ScopedEnv profile_{"AWS_PROFILE", nullptr};
  ScopedEnv endpoint_{"AWS_ENDPOINT_URL", nullptr};
  ScopedEnv region_{"AWS_REGION", nullptr};
};

TEST_F(S3FaultsTest, SlowDown503ThenSuccess) { ExpectRetriedThrough("503", 3); }

TEST_F(S3FaultsTest, InternalError500ThenSuccess) { ExpectRetriedThrough("500", 2); }

TEST_F(S3FaultsTest, ShortBodiesThenSuccess) {
  const ObjectStoreReport report = ExpectRetriedThrough("short", 2);
  // The half bodies were received (and counted) before the retries.
  EXPECT_GT(report.bytes, loaded_bytes_);
}

TEST_F(S3FaultsTest, ResetsThenSuccess) { ExpectRetriedThrough("reset", 2); }

// Every kind of fault, mixed, through the raw client: one retry each, every
// range byte-exact, over one connection and over several.
TEST_F(S3FaultsTest, RawClientRetriesEveryKindByteExact) {
  const std::string bytes = ReadFile(root_.File("s3/models/mixed/model.safetensors"));
  ASSERT_GT(bytes.size(), 600000u);
  for (int connections : {1, 4}) {
    SCOPED_TRACE(connections);
    Serve("503:2,500:2,short:2,reset:2");
    // A retry goes first once its backoff is over, so over one connection one
    // range can meet every fault in turn: enough retries for that.
    auto client = Client(/*retries=*/8, connections);
    ASSERT_NE(client, nullptr);
    const uint64_t piece = 50000;
    std::vector<std::string> got(12, std::string(piece, '\0'));
    std::vector<RangeRequest> requests;
    for (size_t i = 0; i < got.size(); ++i) {
      requests.push_back({"models", "mixed/model.safetensors", 1 + i * piece, piece,
                          reinterpret_cast<std::byte*>(got[i].data())});
    }
    const auto start = Clock::now();
    ASSERT_OK(client->GetRanges(requests));
    const double seconds = SecondsSince(start);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], bytes.substr(1 + i * piece, piece)) << "range " << i;
    }
    EXPECT_EQ(client->retries(), 8u);
    EXPECT_EQ(server_->Stat("faults"), 8u);
    EXPECT_EQ(server_->Stat("ranged_gets"), 20u);
    // The short and reset bodies' bytes were received too.
    EXPECT_GT(client->bytes_received(), got.size() * piece);
    std::printf("[ info ] %d connection(s): 12 ranges through 8 faults in %.2f s\n", connections,
                seconds);
  }
}

// A transfer that stalls under the low-speed limit times out and is retried.
// Waited out, the stall would end in the whole body at the first attempt: the
// one retry shows it was cut short (the seconds are printed, not asserted).
TEST_F(S3FaultsTest, AStalledTransferTimesOutAndIsRetried) {
  Serve("slow:1", /*slow_seconds=*/6);
  auto client = Client(/*retries=*/2, 1, /*low_speed_timeout_s=*/1);
  ASSERT_NE(client, nullptr);
  const std::string bytes = ReadFile(root_.File("s3/models/mixed/model.safetensors"));
  std::string got(100000, '\0');
  RangeRequest r{"models", "mixed/model.safetensors", 1000, got.size(),
                 reinterpret_cast<std::byte*>(got.data())};
  const auto start = Clock::now();
  ASSERT_OK(client->GetRanges({&r, 1}));
  const double seconds = SecondsSince(start);
  EXPECT_EQ(got, bytes.substr(1000, got.size()));
  EXPECT_EQ(client->retries(), 1u);
  EXPECT_EQ(server_->Stat("fault_slow"), 1u);
  std::printf("[ info ] stalled transfer retried after %.2f s\n", seconds);
}

// A slowloris body (2 KiB/s, over curl's old floor of 1 KiB/s) is cut off by the minimum
// rate (64 KiB/s by default) instead of holding the range for as long as it trickles: 100 KB
// would take 50 s, and end in the whole range, not "Operation too slow". Below a floor of
// 1 KiB/s the same trickle is waited out, which shows that the bytes really come a piece at a
// time: 6,000 bytes cannot come in under 2.9 s (the server sleeps 0.1 s after each 204), a
// lower bound the trickle forces. There the low-speed window is 10 s, longer than the whole
// trickle, so that a server slowed down by a loaded machine is not cut off.
TEST_F(S3FaultsTest, ASlowlorisBodyIsCutOffAtTheMinimumRate) {
  Serve("trickle:2");
  EXPECT_EQ(objstore::S3Settings{}.min_rate, 64u << 10);
  EXPECT_EQ(ObjectStoreOptions{}.min_rate, 64u << 10);
  const std::string bytes = ReadFile(root_.File("s3/models/mixed/model.safetensors"));
  {
    auto client = Client(/*retries=*/0, 1, /*low_speed_timeout_s=*/10, /*min_rate=*/1024);
    ASSERT_NE(client, nullptr);
    const TimedGet got = Get(*client, 1000, 6000);
    ASSERT_OK(got.status);
    EXPECT_EQ(got.bytes, bytes.substr(1000, 6000));
    EXPECT_GT(got.seconds, 2.0);  // 6,000 bytes at 2 KiB/s.
    std::printf("[ info ] 6000 bytes trickled in %.2f s\n", got.seconds);
  }
  auto client = Client(/*retries=*/0, 1, /*low_speed_timeout_s=*/1);
  ASSERT_NE(client, nullptr);
  const TimedGet got = Get(*client, 1000, 100000);
  ASSERT_FALSE(got.status.ok());
  EXPECT_EQ(got.status.code(), StatusCode::kUnavailable) << got.status.ToString();
  EXPECT_THAT(got.status.message(),
              AllOf(HasSubstr("Operation too slow"), HasSubstr("65536 bytes/sec")));
  EXPECT_EQ(server_->Stat("fault_trickle"), 2u);
  std::printf("[ info ] a 2 KiB/s slowloris cut off after %.2f s: %s\n", got.seconds,
              got.status.ToString().c_str());
}

// A slowloris head (a byte of the status line and headers every 100 ms) is cut off after
// the low-speed window, then retried, and a clear error once the retries are spent. Not cut
// off, each attempt would end in the server's reset after 20 s ("Failure when receiving
// data"), not "Operation too slow".
TEST_F(S3FaultsTest, ASlowlorisHeadIsCutOffAndRetried) {
  Serve("slowheaders:2", /*slow_seconds=*/20);
  auto client = Client(/*retries=*/1, 1, /*low_speed_timeout_s=*/1);
  ASSERT_NE(client, nullptr);
  const TimedGet got = Get(*client, 1000, 100000);
  ASSERT_FALSE(got.status.ok());
  EXPECT_EQ(got.status.code(), StatusCode::kUnavailable) << got.status.ToString();
  EXPECT_THAT(got.status.message(), HasSubstr("Operation too slow"));
  EXPECT_EQ(client->retries(), 1u);
  EXPECT_EQ(server_->Stat("fault_slowheaders"), 2u);
  std::printf("[ info ] a slowloris head cut off twice in %.2f s: %s\n", got.seconds,
              got.status.ToString().c_str());
}

// With no retries, each fault is the error itself, naming the object, the
// range and the HTTP status or the curl error.
TEST_F(S3FaultsTest, EachFaultNamedWhenNotRetried) {
  Serve("503:1,500:1,short:1,reset:1,slow:1", /*slow_seconds=*/4);
  auto client = Client(/*retries=*/0, 1, /*low_speed_timeout_s=*/1);
  ASSERT_NE(client, nullptr);
  const std::vector<std::vector<std::string>> expected = {
      {"HTTP 503 SlowDown", "Please reduce your request rate"},
      {"HTTP 500 InternalError"},
      {"Transferred a partial file", "transfer closed with"},
      {"Failure when receiving data from the peer", "Connection reset by peer"},
      {"Timeout was reached", "Operation too slow"},
  };
  std::string got(100000, '\0');
  for (const auto& want : expected) {
    RangeRequest r{"models", "mixed/model.safetensors", 4096, got.size(),
                   reinterpret_cast<std::byte*>(got.data())};
    const Status st = client->GetRanges({&r, 1});
    ASSERT_FALSE(st.ok()) << want[0];
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_THAT(st.message(),
                AllOf(HasSubstr("GET s3://models/mixed/model.safetensors bytes [4096, 104096)"),
                      HasSubstr(server_->endpoint()), HasSubstr("failed 1 time")));
    for (const auto& w : want) EXPECT_THAT(st.message(), HasSubstr(w));
    std::printf("[ info ] %s\n", st.message().c_str());
  }
  EXPECT_EQ(client->retries(), 0u);
  EXPECT_EQ(server_->Stat("faults"), 5u);
}

// More faults than retries: one clear error naming the object and the
// cause, and no tensors.
TEST_F(S3FaultsTest, MoreFaultsThanRetriesIsAClearError) {
  struct Case {
    const char* plan;
    const char* cause;
  };
  for (const Case& c : {Case{"ok:1,503:20", "HTTP 503 SlowDown"},
                        Case{"ok:1,reset:20", "Failure when receiving data from the peer"}}) {
    SCOPED_TRACE(c.plan);
    Serve(c.plan);
    ObjectStoreOptions few = store_;
    few.retries = 1;
    few.max_in_flight_bytes = few.request_bytes;  // One connection: the faults hit one range.
    ObjectStoreReport report;
    const auto start = Clock::now();
    auto got = LoadFromObjectStore(kModel, {}, few, &report);
    const double seconds = SecondsSince(start);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr(kModel), HasSubstr("failed 2 times"),
                                              HasSubstr(c.cause), HasSubstr(server_->endpoint())));
    // Other ranges run while a failed one waits out its backoff, so more than
    // the two attempts of the range named may have met faults.
    EXPECT_GE(server_->Stat("faults"), 2u);
    EXPECT_EQ(server_->Stat("served"), 1u);  // Only the header probe got through.
    std::printf("[ info ] %.2f s: %s\n", seconds, got.status().ToString().c_str());
  }
}

// The server killed while a 64 MB object is being fetched (1 MB requests,
// 2 connections): an error naming the endpoint, never a hang. The kill comes
// from the progress callback, on the thread that drives the transfers, so
// nothing is fetched between the first bytes and the kill. Both first data
// GETs stall for 1 s after their first 1,000 bytes: no request completes
// before then, so the first progress report (at most one every 100 ms, on a
// completed request) comes while 62 of the 64 requests are still to go.
TEST_F(S3FaultsTest, AServerKilledMidLoadIsAnErrorNotAHang) {
  const std::string big = root_.File("s3/models/big.safetensors");
  WriteRaw(big, {Random("w", Dtype::kU8, {64ull << 20}, 5)});
  Serve("ok:1,slow:2", /*slow_seconds=*/1);  // The header probe, then the two stalls.
  ObjectStoreOptions store = store_;
  store.request_bytes = 1 << 20;
  store.max_in_flight_bytes = 2 << 20;

  LoadOptions options;
  uint64_t killed_at = 0, last_done = 0;
  options.progress = [&](const Progress& p) {
    last_done = p.bytes_done;
    if (p.bytes_done == 0 || killed_at != 0) return;
    killed_at = p.bytes_done;
    server_->Kill();
  };
  const auto start = Clock::now();
  auto got = LoadFromObjectStore("s3://models/big.safetensors", options, store);
  const double seconds = SecondsSince(start);
  ASSERT_NE(killed_at, 0u) << "no progress before the load ended: " << got.status().ToString();
  EXPECT_LT(killed_at, 64ull << 20);
  ASSERT_FALSE(got.ok()) << "the load finished after the kill (" << last_done << " bytes)";
  EXPECT_LT(last_done, 64ull << 20);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr("s3://models/big.safetensors"), HasSubstr(server_->endpoint())));
  // Retries of refused connections (5, backing off from 100 ms) end it in
  // seconds; a watchdog of 60 s, not a measure, for an error that never came.
  EXPECT_LT(seconds, 60.0);
  std::printf("[ info ] killed after %llu bytes; error after %.2f s: %s\n",
              static_cast<unsigned long long>(killed_at), seconds, got.status().ToString().c_str());
}

}  // namespace
}  // namespace tensorlift
