// LoadStriped against real sources at once: the local files, a real S3 server
// (rclone serve s3 on loopback) and an in-process peer (UCX): byte-exact
// against a local load when every source works, when the bucket or the peer
// dies mid-load, and when a peer lies; the clear errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "../objstore/s3_server.h"
#include "../objstore/scoped_env.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "remote/peer_faults.h"
#include "remote/ucx_transport.h"
#include "tensorlift/sparsify.h"
#include "tensorlift/striped.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::Random;
using testing::RawTensor;
using testing::RcloneS3Server;
using testing::ScopedEnv;
using testing::WriteRaw;

// `tensorlift serve PATH` in a child process (a peer that can be killed
// mid-load as a real one dies), stopped by PID.
class PeerProcess {
 public:
  // `rate_mb_s`: the most it serves per second (tensorlift serve --rate-limit).
  PeerProcess(const std::string& path, const std::string& ready_file, const char* rate_mb_s) {
    pid_ = fork();
    if (pid_ == 0) {
      execl(TENSORLIFT_CLI, TENSORLIFT_CLI, "serve", path.c_str(), "--ready-file",
            ready_file.c_str(), "--rate-limit", rate_mb_s, "--chunk-bytes", "65536",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    // Until it says where it serves: a watchdog of 60 s (a loaded machine
    // starts it slowly), not a measure.
    for (int i = 0; i < 1200 && pid_ > 0; ++i) {
      std::ifstream f(ready_file);
      std::string url;
      if (f >> url && url.rfind("http://", 0) == 0) {
        url_ = url;
        return;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~PeerProcess() { Kill(); }
  const std::string& url() const { return url_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  std::string url_;
};

constexpr const char* kBucketDir = "models/striped-checkpoint";

class StripedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two shards with an index: many tensors of every size class, some of
    // several chunks, one empty.
    const std::string dir = root_.File(std::string("s3/") + kBucketDir);
    std::filesystem::create_directories(dir);
    std::vector<RawTensor> a, b;
    for (int i = 0; i < 40; ++i) {
      a.push_back(Random("a." + std::to_string(100 + i) + ".w", Dtype::kBF16,
                         {64, static_cast<uint64_t>(256 + i)}, i));
    }
    a.push_back(Random("a.big", Dtype::kF32, {1 << 20}, 77));  // 4 MiB: 16 chunks.
    a.push_back(Random("a.empty", Dtype::kF16, {0, 3}, 78));
    for (int i = 0; i < 30; ++i) {
      b.push_back(Random("b." + std::to_string(100 + i) + ".w", Dtype::kF16, {100, 333}, 200 + i));
    }
    b.push_back(Random("b.odd", Dtype::kU8, {12345}, 300));
    WriteRaw(dir + "/model-00001-of-00002.safetensors", a, 3);
    WriteRaw(dir + "/model-00002-of-00002.safetensors", b);
    std::ofstream index(dir + "/model.safetensors.index.json");
    index << R"({"metadata": {}, "weight_map": {)";
    bool first = true;
    for (auto* list : {&a, &b}) {
      const char* file =
          list == &a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
      for (const RawTensor& t : *list) {
        index << (first ? "" : ", ") << '"' << t.name << "\": \"" << file << '"';
        first = false;
      }
    }
    index << "}}";
    index.close();
    path_ = dir;
    url_ = std::string("s3://") + kBucketDir + "/";
  }

  void StartBucket() {
    server_ = std::make_unique<RcloneS3Server>(root_.File("s3"));
    if (!server_->ok()) GTEST_SKIP() << server_->error();
    options_.store.endpoint = server_->endpoint();
    options_.store.region = "us-east-1";
    options_.store.retries = 1;
    options_.object_url = url_;
  }

  void StartPeer() {
    if (!remote::UcxBuilt()) GTEST_SKIP() << remote::UcxVersion();
    auto key = PeerKeyForCheckpoint(path_);
    ASSERT_OK(key);
    ServeOptions so;
    so.chunk_bytes = 256 << 10;
    // Its memory writable: CorruptServedForTesting then changes the bytes it serves
    // (a handed-over seed's sealed memory cannot change: there the manifest's
    // checksum is flipped instead, which would fail every source's ranges).
    so.handover = false;
    auto s = PeerServer::ServeCheckpoint(path_, *key, so);
    ASSERT_OK(s);
    peer_ = std::move(s).value();
    options_.peers = {peer_->url()};
    options_.request_timeout_ms = 3000;
    options_.connect_timeout_ms = 3000;
    options_.stall_timeout_ms = 3000;
  }

  StripeOptions Defaults() {
    options_.path = path_;
    options_.range_bytes = 512 << 10;
    options_.use_page_cache = false;  // The files are in the page cache: stripe anyway.
    return options_;
  }

  // Every tensor of `got` equals the local copy's loaded with `options` on the host.
  void ExpectSameAsLocal(const LoadedCheckpoint& got, const LoadOptions& options = {},
                         const std::string& local = "") {
    LoadOptions host = options;
    host.device = DeviceId::Cpu();
    auto want = Load(local.empty() ? path_ : local, host);
    ASSERT_OK(want);
    ASSERT_EQ(got.tensors().size(), want->tensors().size());
    for (const LoadedTensor& w : want->tensors()) {
      SCOPED_TRACE(w.name);
      const LoadedTensor* g = got.Find(w.name);
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->dtype, w.dtype);
      EXPECT_EQ(g->shape, w.shape);
      ASSERT_EQ(g->nbytes, w.nbytes);
      std::vector<std::byte> bytes(g->nbytes);
      ASSERT_OK(got.CopyToHost(w.name, bytes.data()));
      if (w.nbytes) {
        EXPECT_EQ(std::memcmp(bytes.data(), w.data, w.nbytes), 0);
      }
    }
  }

  static const StripeSourceReport* SourceNamed(const StripeReport& r, const std::string& prefix) {
    for (const auto& s : r.sources) {
      if (s.name.rfind(prefix, 0) == 0) return &s;
    }
    return nullptr;
  }

  static uint64_t Delivered(const StripeReport& r) {
    uint64_t n = 0;
    for (const auto& s : r.sources) n += s.bytes;
    return n;
  }

  ScratchDir root_{"tl_striped"};
  std::string path_, url_;
  std::unique_ptr<RcloneS3Server> server_;
  std::unique_ptr<PeerServer> peer_;
  StripeOptions options_;
  ScopedEnv key_{"AWS_ACCESS_KEY_ID", testing::kS3AccessKey};
  ScopedEnv secret_{"AWS_SECRET_ACCESS_KEY", testing::kS3SecretKey};
  ScopedEnv token_{"AWS_SESSION_TOKEN", nullptr};
  ScopedEnv profile_{"AWS_PROFILE", nullptr};
  ScopedEnv endpoint_{"AWS_ENDPOINT_URL", nullptr};
};

TEST_F(StripedLoadTest, DiskAloneIsByteExactAndUnchecked) {
  StripeReport report;
  auto got = LoadStriped(Defaults(), &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  ASSERT_EQ(report.sources.size(), 1u);
  EXPECT_EQ(report.sources[0].name, "disk:" + path_);
  EXPECT_FALSE(report.checked);
  EXPECT_EQ(report.bytes, got->total_bytes());
  EXPECT_EQ(Delivered(report), report.bytes);
  EXPECT_EQ(report.refetched, 0u);
}

TEST_F(StripedLoadTest, ACachedLocalCopyIsLoadedFromAlone) {
  StartBucket();
  StripeOptions o = Defaults();
  o.use_page_cache = true;
  auto warm = Load(path_);  // Every page in the cache.
  ASSERT_OK(warm);
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  ASSERT_EQ(report.sources.size(), 1u);
  EXPECT_EQ(report.sources[0].name, "disk:" + path_);
  EXPECT_THAT(report.note, HasSubstr("in the page cache"));
}

TEST_F(StripedLoadTest, DiskAndBucketShareTheRanges) {
  StartBucket();
  StripeReport report;
  auto got = LoadStriped(Defaults(), &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  ASSERT_EQ(report.sources.size(), 2u);
  const StripeSourceReport* bucket = SourceNamed(report, "s3://");
  ASSERT_NE(bucket, nullptr);
  // Its workers each take a range as the load starts.
  EXPECT_GT(bucket->bytes, 0u);
  EXPECT_EQ(Delivered(report), report.bytes);
  EXPECT_THAT(report.failures, ::testing::IsEmpty());
}

TEST_F(StripedLoadTest, TheBucketAloneGivesTheHeadersAndTheBytes) {
  StartBucket();
  StripeOptions o = Defaults();
  o.path.clear();
  o.load.filter = TensorFilter::Predicate([](std::string_view n) { return n.rfind("b.", 0) == 0; });
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  EXPECT_EQ(got->tensors().size(), 31u);
  auto want = Load(path_, [] {
    LoadOptions l;
    l.filter = TensorFilter::Predicate([](std::string_view n) { return n.rfind("b.", 0) == 0; });
    return l;
  }());
  ASSERT_OK(want);
  for (const LoadedTensor& w : want->tensors()) {
    const LoadedTensor* g = got->Find(w.name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes), 0) << w.name;
  }
  ASSERT_EQ(report.sources.size(), 1u);
  EXPECT_EQ(report.sources[0].bytes, got->total_bytes());
}

TEST_F(StripedLoadTest, DiskPeerAndBucketEveryChunkChecked) {
  StartBucket();
  StartPeer();
  StripeOptions o = Defaults();
  o.range_bytes = 64 << 10;
  o.object_threads = 2;
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  ASSERT_EQ(report.sources.size(), 3u);
  EXPECT_TRUE(report.checked);
  EXPECT_GT(SourceNamed(report, "http://")->bytes, 0u);
  EXPECT_EQ(Delivered(report), report.bytes);
  for (const auto& s : report.sources) EXPECT_EQ(s.failure, "") << s.name;
}

TEST_F(StripedLoadTest, TheBucketDiesMidLoadAndTheOthersTakeItsRanges) {
  StartBucket();
  StartPeer();
  StripeOptions o = Defaults();
  o.range_bytes = 32 << 10;  // Hundreds of ranges: most are queued at the kill.
  o.object_threads = 4;
  bool killed = false;
  // As the first range lands, the bucket's workers hold ranges in flight or
  // take the next ones: the server is killed under them.
  o.on_range = [&](const std::string&, uint64_t) {
    if (!killed) {
      killed = true;
      server_->Stop();
    }
  };
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ASSERT_TRUE(killed);
  ExpectSameAsLocal(*got);
  const StripeSourceReport* bucket = SourceNamed(report, "s3://");
  ASSERT_NE(bucket, nullptr);
  EXPECT_NE(bucket->failure, "");
  EXPECT_GT(report.refetched, 0u);
  EXPECT_TRUE(report.checked);
  EXPECT_EQ(Delivered(report), report.bytes);
}

TEST_F(StripedLoadTest, ThePeerProcessDiesMidLoadAndTheOthersTakeItsRanges) {
  if (!remote::UcxBuilt()) GTEST_SKIP() << remote::UcxVersion();
  StartBucket();
  // Slow (1 MB/s): its first batch is still in flight when the kill comes.
  PeerProcess peer(path_, root_.File("peer.url"), "1");
  ASSERT_NE(peer.url(), "") << "tensorlift serve did not start";
  StripeOptions o = Defaults();
  o.peers = {peer.url()};
  o.stall_timeout_ms = 3000;
  o.range_bytes = 64 << 10;
  o.object_threads = 2;
  bool killed = false;
  // When the first piece from the disk or the bucket lands, the peer has its
  // first batch (4 chunks of 64 KiB, paced at 1 MB/s: 65 ms a chunk) in flight
  // or not yet begun; either way it then reads from a process that is gone.
  o.on_range = [&](const std::string& source, uint64_t) {
    if (!killed && source.rfind("http://", 0) != 0) {
      killed = true;
      peer.Kill();
    }
  };
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ASSERT_TRUE(killed);
  ExpectSameAsLocal(*got);
  const StripeSourceReport* p = SourceNamed(report, "http://");
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p->failure, "");
  EXPECT_GT(report.refetched, 0u);
  // Its manifest still checks what the others fetch.
  EXPECT_TRUE(report.checked);
  EXPECT_EQ(Delivered(report), report.bytes);
}

TEST_F(StripedLoadTest, APeerThatLiesIsDroppedAndItsRangesRefetched) {
  StartPeer();
  // Every tensor's first chunk differs from the manifest: whatever the peer
  // takes first is caught.
  auto want = Load(path_);
  ASSERT_OK(want);
  for (const LoadedTensor& t : want->tensors()) {
    if (t.nbytes) {
      ASSERT_OK(remote::CorruptServedForTesting(*peer_, t.name, 0));
    }
  }
  StripeReport report;
  auto got = LoadStriped(Defaults(), &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  const StripeSourceReport* peer = SourceNamed(report, "http://");
  ASSERT_NE(peer, nullptr);
  EXPECT_THAT(peer->failure, HasSubstr("XXH3"));
  EXPECT_THAT(peer->failure, HasSubstr("the peer manifest says"));
  EXPECT_EQ(peer->bytes, 0u);
  EXPECT_GT(report.refetched, 0u);
}

TEST_F(StripedLoadTest, EverySourceFailingIsOneErrorNamingThem) {
  StartBucket();
  StripeOptions o = Defaults();
  o.path.clear();
  bool killed = false;
  o.on_range = [&](const std::string&, uint64_t) {
    if (!killed) {
      killed = true;
      server_->Stop();
    }
  };
  auto got = LoadStriped(o, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("every source failed"));
  EXPECT_THAT(got.status().message(), HasSubstr(url_));
}

TEST_F(StripedLoadTest, SourcesThatCannotJoinAreListed) {
  StartPeer();
  // A peer of another model, and a bucket path that is not a URL.
  PeerKey other;
  other.model = "another-model";
  other.revision = "r9";
  auto wrong = PeerServer::ServeCheckpoint(path_, other, {});
  ASSERT_OK(wrong);
  StripeOptions o = Defaults();
  o.peers.push_back((*wrong)->url());
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  EXPECT_EQ(report.sources.size(), 2u);
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("incompatible"));
  EXPECT_THAT(report.failures[0], HasSubstr("another-model"));

  StripeOptions none;
  EXPECT_THAT(LoadStriped(none).status().message(),
              HasSubstr("needs a local path or an object URL"));
  StripeOptions bad = Defaults();
  bad.object_url = "/not/a/bucket";
  EXPECT_THAT(LoadStriped(bad).status().message(), HasSubstr("must be s3:// or gs://"));
  StripeOptions threads = Defaults();
  threads.load.threads = 3;
  EXPECT_THAT(LoadStriped(threads).status().message(), HasSubstr("disk_threads"));
  StripeOptions slices = Defaults();
  slices.store.parallel.size = 2;
  EXPECT_THAT(LoadStriped(slices).status().message(), HasSubstr("tensor-parallel"));
}

TEST_F(StripedLoadTest, ABucketWithOtherHeadersDoesNotJoin) {
  // The bucket holds a different model under the same name.
  std::vector<RawTensor> other = {Random("x", Dtype::kF32, {10}, 1)};
  std::filesystem::create_directories(root_.File("s3/models/other-checkpoint"));
  WriteRaw(root_.File("s3/models/other-checkpoint/model-00001-of-00002.safetensors"), other);
  StartBucket();
  StripeOptions o = Defaults();
  o.object_url = "s3://models/other-checkpoint/";
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("s3://models/other-checkpoint/"));
  EXPECT_EQ(report.sources.size(), 1u);
}

// The striped load is the one loader over a store of many sources: every
// option of LoadOptions gives what it gives on the local copy, on the host
// and on a device (through the GPU pipeline's staging slots, whose blocks cut
// the peer's checksum chunks: each chunk is still checked whole).
TEST_F(StripedLoadTest, EveryLoadOptionGivesTheLocalCopysTensors) {
  StartBucket();
  const bool peer = remote::UcxBuilt();
  if (peer) StartPeer();
  for (const char* where : {"cpu", "emulated:0"}) {
    struct Case {
      const char* name;
      LoadOptions options;
    };
    std::vector<Case> cases(5);
    cases[0].name = "as stored";
    cases[1].name = "dtype";
    cases[1].options.dtype = Dtype::kF16;
    cases[2].name = "filter";
    cases[2].options.filter =
        TensorFilter::Predicate([](std::string_view n) { return n.substr(0, 2) == "b."; });
    cases[3].name = "small staging, arena pool";
    cases[3].options.staging_bytes = 300 << 10;
    cases[3].options.staging_buffers = 2;
    cases[3].options.arena_pool = std::make_shared<ArenaPool>();
    cases[4].name = "a tensor-parallel rank's slices";  // Rows of a.*.w, columns of b.*.w.
    cases[4].options.parallel = {3, 2};
    cases[4].options.layout = "^a\\..*\\.w$=0;^b\\..*\\.w$=1";
    for (Case& c : cases) {
      SCOPED_TRACE(std::string(where) + ": " + c.name);
      StripeOptions o = Defaults();
      o.load = c.options;
      o.load.device = *ParseDevice(where);
      if (!o.load.device.on_host()) o.load.arena_pool = nullptr;  // Host loads alone.
      std::vector<std::string> handed;
      o.load.on_tensor = [&](const StreamedTensor& t) {
        handed.push_back(t.tensor().name);
        return Status::Ok();
      };
      StripeReport report;
      auto got = LoadStriped(o, &report);
      ASSERT_OK(got);
      ExpectSameAsLocal(*got, c.options);
      EXPECT_EQ(handed.size(), got->tensors().size());
      EXPECT_EQ(report.checked, peer);
      EXPECT_EQ(report.refetched, 0u);
      EXPECT_GE(report.sources.size(), 2u);
      for (const auto& s : report.sources) EXPECT_EQ(s.failure, "") << s.name;
      for (const LoadedTensor& t : got->tensors()) {
        EXPECT_EQ(t.device, std::string(where) == "cpu" ? DeviceType::kCpu : DeviceType::kEmulated);
      }
      ASSERT_FALSE(got->files().empty());
      EXPECT_THAT(got->files()[0].reason, HasSubstr("striped over"));
    }
  }
}

TEST_F(StripedLoadTest, ASparseCheckpointIsDecodedAsFromTheLocalCopy) {
  std::vector<RawTensor> dense = {Random("l.0.weight", Dtype::kF16, {256, 512}, 31),
                                  Random("l.0.bias", Dtype::kF16, {256}, 32),
                                  Random("l.1.weight", Dtype::kBF16, {512, 256}, 33)};
  std::filesystem::create_directories(root_.File("dense"));
  WriteRaw(root_.File("dense/model.safetensors"), dense);
  sparse::SparsifyOptions sparsify;
  sparsify.prune = 0.6;
  const std::string dir = root_.File("s3/models/sparse");
  ASSERT_OK(sparse::Sparsify(root_.File("dense/model.safetensors"), dir, sparsify));
  StartBucket();
  for (const char* where : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(where);
    StripeOptions o;
    o.path = dir;
    o.object_url = "s3://models/sparse/";
    o.store = options_.store;
    o.range_bytes = 64 << 10;
    o.use_page_cache = false;
    o.load.device = *ParseDevice(where);
    StripeReport report;
    auto got = LoadStriped(o, &report);
    ASSERT_OK(got);
    ASSERT_NE(got->Find("l.0.weight"), nullptr);  // Dense names: decoded.
    ExpectSameAsLocal(*got, {}, dir);
    EXPECT_EQ(report.sources.size(), 2u);
  }
}

// Every source failing mid-load: the load fails and frees what it took, on
// the host and on a device.
TEST_F(StripedLoadTest, EverySourceFailingMidLoadFreesEverything) {
  auto device = OpenDevice(DeviceType::kEmulated, 0);
  ASSERT_OK(device);
  auto before = GetEmulatedDeviceCounts(**device);
  ASSERT_OK(before);
  for (const char* where : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(where);
    StartBucket();
    StripeOptions o = Defaults();
    o.path.clear();
    o.load.device = *ParseDevice(where);
    o.load.staging_bytes = 256 << 10;
    bool killed = false;
    o.on_range = [&](const std::string&, uint64_t) {
      if (!killed) {
        killed = true;
        server_->Stop();
      }
    };
    auto got = LoadStriped(o, nullptr);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
    EXPECT_THAT(got.status().message(), HasSubstr("every source failed"));
  }
  auto after = GetEmulatedDeviceCounts(**device);
  ASSERT_OK(after);
  EXPECT_EQ(after->live_bytes, before->live_bytes);
  EXPECT_EQ(after->live_allocations, before->live_allocations);
}

// A lying peer on the device path: its chunks are checked in the staging
// slots (whole, where a slot cuts one) and it is dropped.
TEST_F(StripedLoadTest, APeerThatLiesIsDroppedOnTheDevicePathToo) {
  StartPeer();
  auto want = Load(path_);
  ASSERT_OK(want);
  for (const LoadedTensor& t : want->tensors()) {
    if (t.nbytes) {
      ASSERT_OK(remote::CorruptServedForTesting(*peer_, t.name, 0));
    }
  }
  StripeOptions o = Defaults();
  o.load.device = DeviceId::Emulated();
  o.load.staging_bytes = 300 << 10;
  StripeReport report;
  auto got = LoadStriped(o, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got);
  const StripeSourceReport* peer = SourceNamed(report, "http://");
  ASSERT_NE(peer, nullptr);
  EXPECT_THAT(peer->failure, HasSubstr("XXH3"));
  EXPECT_EQ(peer->bytes, 0u);
}

}  // namespace
}  // namespace tensorlift
