// PeerServer + LoadFromPeer in one process (UCX over loopback): pulls that
// match a disk load byte for byte, every fallback (wrong key, wrong token,
// corrupt chunk, dead peer, malformed manifest, no peer), layout translation
// between tensor-parallel sizes, rate limits and becoming a seed. The
// two-process, CLI and registry cases are in tests/python/test_cli_remote.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "device/device.h"
#include "format/tp_layout.h"
#include "load/checkpoint_builder.h"
#include "remote/control.h"
#include "remote/peer_faults.h"
#include "remote/peer_session.h"
#include "remote/ucx_transport.h"
#include "tensorlift/checksum.h"
#include "tensorlift/remote.h"

namespace tensorlift {
namespace {

using tensorlift::test::ScratchDir;
using tensorlift::testing::Random;
using tensorlift::testing::RawTensor;
using tensorlift::testing::WriteRaw;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kLayout = "w0=0;w1=1;w3=2";

std::vector<RawTensor> Tensors() {
  return {
      Random("w0", Dtype::kF32, {10, 6}, 1),      // dim 0: TP 4 gets 3,3,2,2 rows.
      Random("w1", Dtype::kBF16, {4, 9}, 2),      // dim 1.
      Random("w2", Dtype::kF16, {5, 3, 7}, 3),    // whole.
      Random("w3", Dtype::kF32, {2, 3, 5}, 4),    // dim 2.
      Random("big", Dtype::kU8, {3 << 20}, 5),    // several chunks (1 MiB each below).
      Random("h.f4", Dtype::kF4, {2, 6}, 6),      // sub-byte, whole.
      Random("z.empty", Dtype::kF64, {0, 4}, 7),  // no bytes.
  };
}

class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!remote::UcxBuilt()) GTEST_SKIP() << remote::UcxVersion();
    tensors_ = Tensors();
    path_ = dir_.File("model.safetensors");
    WriteRaw(path_, tensors_);
    key_.model = "test-model";
    key_.revision = "r1";
    key_.layout = kLayout;
  }

  ServeOptions Serve(int size = 1, int rank = 0) {
    ServeOptions o;
    o.chunk_bytes = 1 << 20;
    o.parallel = {size, rank};
    return o;
  }

  std::unique_ptr<PeerServer> Start(const ServeOptions& o, const PeerKey* key = nullptr) {
    auto s = PeerServer::ServeCheckpoint(path_, key ? *key : key_, o);
    EXPECT_OK(s);
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // path_ read buffered (every byte read, so hashed as it lands): the content
  // identity is there, else an error.
  Result<LoadedCheckpoint> LoadHashed() {
    LoadOptions lo;
    lo.mode = IoMode::kBuffered;
    Result<LoadedCheckpoint> loaded = Load(path_, lo);
    if (loaded.ok() && loaded->content() == nullptr)
      return InternalError("a buffered load computed no content identity");
    return loaded;
  }

  PeerLoadOptions Pull(std::vector<std::string> peers, int size = 1, int rank = 0) {
    PeerLoadOptions o;
    o.peers = std::move(peers);
    o.parallel = {size, rank};
    o.request_timeout_ms = 3000;
    o.connect_timeout_ms = 3000;
    o.stall_timeout_ms = 3000;
    o.batch_bytes = 256 << 10;  // Several gets per chunk.
    o.max_in_flight = 4;
    // These tests are about the UCX data plane: a same-host seed would hand
    // its memory over instead (tests/remote/handover_test.cc).
    o.handover = HandoverMode::kOff;
    return o;
  }

  // The bytes rank `rank` of `size` should hold of tensor t (element copy).
  static std::vector<uint8_t> Expected(const RawTensor& t, int size, int rank) {
    auto layout = ParallelLayout::Parse(kLayout);
    const int dim = layout->DimFor(t.name);
    if (dim < 0 || size == 1) return t.bytes;
    const uint64_t esize = static_cast<uint64_t>(DtypeBits(t.dtype)) / 8;
    auto r = ShardRange(static_cast<int64_t>(t.shape[dim]), rank, size);
    uint64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= t.shape[d];
    for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
    std::vector<uint8_t> out;
    for (uint64_t o = 0; o < outer; ++o) {
      for (int64_t x = r->start; x < r->start + r->length; ++x) {
        const uint64_t src = ((o * t.shape[dim] + x) * inner) * esize;
        out.insert(out.end(), t.bytes.begin() + src, t.bytes.begin() + src + inner * esize);
      }
    }
    return out;
  }

  void ExpectRank(const LoadedCheckpoint& got, int size, int rank) {
    ASSERT_EQ(got.tensors().size(), tensors_.size());
    for (const RawTensor& t : tensors_) {
      const LoadedTensor* g = got.Find(t.name);
      ASSERT_NE(g, nullptr) << t.name;
      const auto want = Expected(t, size, rank);
      ASSERT_EQ(g->nbytes, want.size()) << t.name << " rank " << rank << " of " << size;
      if (!want.empty()) {
        EXPECT_EQ(std::memcmp(g->data, want.data(), want.size()), 0)
            << t.name << " rank " << rank << " of " << size;
      }
    }
  }

  ScratchDir dir_;
  std::string path_;
  std::vector<RawTensor> tensors_;
  PeerKey key_;
};

TEST_F(PeerTest, PullsWhatADiskLoadGives) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull({server->url()}), &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, server->url());
  EXPECT_TRUE(report.failures.empty()) << report.failures[0];
  EXPECT_EQ(report.source_ranks, 1);
  auto disk = Load(path_);
  ASSERT_OK(disk);
  ASSERT_EQ(got->tensors().size(), disk->tensors().size());
  for (const LoadedTensor& d : disk->tensors()) {
    const LoadedTensor* g = got->Find(d.name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->dtype, d.dtype);
    EXPECT_EQ(g->shape, d.shape);
    ASSERT_EQ(g->nbytes, d.nbytes);
    EXPECT_EQ(Xxh3_64(g->data, g->nbytes), Xxh3_64(d.data, d.nbytes)) << d.name;
  }
  // The session was closed and its bytes counted: the pull's DELETE is
  // answered once the server has done both, before LoadFromPeer returns.
  EXPECT_EQ(server->active_sessions(), 0);
  EXPECT_EQ(server->served_bytes(), got->total_bytes());
}

TEST_F(PeerTest, WrongKeyFallsBackToDiskAndSaysWhy) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  PeerKey other = key_;
  other.revision = "r2";
  auto opts = Pull({server->url()});
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(other, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("revision: 'r2' (ours) != 'r1' (peer's)"));
  EXPECT_EQ(server->active_sessions(), 0);  // No session: nothing moved.
  EXPECT_EQ(server->served_bytes(), 0u);
  ExpectRank(*got, 1, 0);
}

// The bytes a client reports when it closes its session are parsed, never
// thrown over: a count above 2^64 - 1 (20 digits) made std::stoull throw
// inside the HTTP handler, after the session was erased and before the
// registry's load was updated. Such a count, or one that is not a number, is
// ignored; a count beyond the checkpoint counts as the checkpoint.
TEST_F(PeerTest, ASessionClosedWithAHugeByteCountIsClosedAndCountsNothing) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  auto c = remote::Control::Make(server->url(), "", 3000);
  ASSERT_OK(c);
  auto close_with = [&](const std::string& reported) {
    std::string session;
    auto opened = c->Send("POST", "/v1/session", "", 256 << 20, &session);
    ASSERT_OK(opened);
    ASSERT_EQ(server->active_sessions(), 1);
    auto closed = c->Send("DELETE", "/v1/session/" + session, reported, 1024);
    ASSERT_OK(closed) << reported;
    EXPECT_EQ(*closed, "closed") << reported;
    EXPECT_EQ(server->active_sessions(), 0) << reported;
  };
  for (const char* ignored : {"99999999999999999999", "18446744073709551616", "-1", "12x", "+5"}) {
    close_with(ignored);
    EXPECT_EQ(server->served_bytes(), 0u) << ignored;
  }
  close_with("18446744073709551615");  // 2^64 - 1: at most the whole checkpoint.
  const uint64_t whole = server->served_bytes();
  EXPECT_GT(whole, 0u);
  close_with("7");
  EXPECT_EQ(server->served_bytes(), whole + 7);
  // The server still serves.
  auto got = LoadFromPeer(key_, Pull({server->url()}));
  ASSERT_OK(got);
  ExpectRank(*got, 1, 0);
}

TEST_F(PeerTest, NoPeerAndNoFallbackIsUnavailableWithReasons) {
  auto got = LoadFromPeer(key_, Pull({"http://127.0.0.1:1"}));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("http://127.0.0.1:1"));
  auto bad_url = LoadFromPeer(key_, Pull({"ftp://x"}));
  ASSERT_FALSE(bad_url.ok());
  EXPECT_THAT(bad_url.status().message(), HasSubstr("not http://HOST:PORT"));
}

TEST_F(PeerTest, TokenIsRequiredAndChecked) {
  auto o = Serve();
  o.token = "s3cret";
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  // Unsigned and wrongly signed requests are refused, with the reason.
  auto opts = Pull({server->url()});
  PeerLoadReport report;
  auto none = LoadFromPeer(key_, opts, &report);
  ASSERT_FALSE(none.ok());
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("HTTP 401"));
  opts.token = "wrong";
  auto wrong = LoadFromPeer(key_, opts, &report);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(report.failures[0], HasSubstr("HTTP 401"));
  opts.token = "s3cret";
  auto right = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(right);
  ExpectRank(*right, 1, 0);
  // A raw request with a replayed signature is refused too.
  httplib::Client cli("127.0.0.1", server->port());
  auto res = cli.Get("/v1/key");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
}

TEST_F(PeerTest, CorruptChunkFailsOverToTheNextPeer) {
  auto bad = Start(Serve());
  auto good = Start(Serve());
  ASSERT_TRUE(bad && good);
  ASSERT_OK(remote::CorruptServedForTesting(*bad, "big", (2 << 20) + 12345));
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull({bad->url(), good->url()}), &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, good->url());
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' chunk 2"));
  EXPECT_THAT(report.failures[0], HasSubstr("XXH3"));
  ExpectRank(*got, 1, 0);
  // Only the corrupt peer: no fallback means an error, never the tensors.
  auto alone = LoadFromPeer(key_, Pull({bad->url()}));
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(alone.status().message(), HasSubstr("chunk 2"));
}

TEST_F(PeerTest, MalformedManifestIsRejectedLikeAFileHeader) {
  // A fake peer: a valid key, then a manifest that lies about its bytes.
  httplib::Server fake;
  const std::string key_json =
      R"({"protocol":1,"key":{"model":"test-model","revision":"r1","dtype":"as-stored","quantization":"none",)"
      R"("layout":"w0=0;w1=1;w3=2","protocol":1},"digest":"0","parallel":{"size":1,"rank":0},"tensors":1,)"
      R"("total_bytes":8,"sessions":0})";
  fake.Get("/v1/key", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(key_json, "application/json");
  });
  fake.Post("/v1/session", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("X-Tensorlift-Session", "ab");
    res.set_content(R"({"protocol":1,"tensors":[{"name":"w0","nbytes":18446744073709551615}]})",
                    "application/json");
  });
  fake.Delete(R"(/v1/session/(\w+))", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  std::thread t([&] { fake.listen_after_bind(); });
  auto opts = Pull({"http://127.0.0.1:" + std::to_string(port)});
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  fake.stop();
  t.join();
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_EQ(report.failures.size(), 2u);  // The manifest, then "no live endpoint".
  EXPECT_THAT(report.failures[0], HasSubstr("manifest"));
  ExpectRank(*got, 1, 0);
}

TEST_F(PeerTest, DeadPeerFailsOverWithinTheTimeOut) {
  std::string url;
  {
    auto gone = Start(Serve());
    ASSERT_NE(gone, nullptr);
    url = gone->url();
  }
  auto good = Start(Serve());
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull({url, good->url()}), &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, good->url());
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr(url));
  // Refused at once: the time-out never came into it (how soon is not asserted).
  EXPECT_THAT(report.failures[0], Not(HasSubstr("time-out")));
}

// A source of one size serving a destination of another: each destination
// rank reads its slices from the source ranks that hold them.
TEST_F(PeerTest, TranslatesBetweenTensorParallelSizes) {
  for (int src_size : {1, 2, 3}) {
    std::vector<std::unique_ptr<PeerServer>> servers;
    std::vector<std::string> urls;
    for (int r = 0; r < src_size; ++r) {
      servers.push_back(Start(Serve(src_size, r)));
      ASSERT_NE(servers.back(), nullptr);
      urls.push_back(servers.back()->url());
    }
    for (int dst_size : {1, 2, 4}) {
      for (int rank = 0; rank < dst_size; ++rank) {
        SCOPED_TRACE("source TP " + std::to_string(src_size) + ", destination rank " +
                     std::to_string(rank) + " of " + std::to_string(dst_size));
        PeerLoadReport report;
        auto got = LoadFromPeer(key_, Pull(urls, dst_size, rank), &report);
        ASSERT_OK(got);
        EXPECT_TRUE(report.failures.empty()) << report.failures[0];
        EXPECT_GE(report.source_ranks, 1);
        ExpectRank(*got, dst_size, rank);
        // The disk fallback gives the same slices.
        auto opts = Pull({}, dst_size, rank);
        opts.fallback_path = path_;
        auto disk = LoadFromPeer(key_, opts);
        ASSERT_OK(disk);
        ExpectRank(*disk, dst_size, rank);
      }
    }
  }
}

// PeerLoadOptions::device: pulled (and disk-loaded) tensors end up in the
// device's memory, byte for byte what a host pull gives, sliced or whole.
TEST_F(PeerTest, PullsOntoADevice) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  for (int size : {1, 2}) {
    for (bool from_disk : {false, true}) {
      SCOPED_TRACE(std::string(from_disk ? "disk" : "peer") + ", rank 1 of " +
                   std::to_string(size));
      const int rank = size - 1;
      auto opts =
          Pull(from_disk ? std::vector<std::string>{} : std::vector{server->url()}, size, rank);
      opts.fallback_path = path_;
      opts.device = DeviceId::Emulated();
      PeerLoadReport report;
      auto got = LoadFromPeer(key_, opts, &report);
      ASSERT_OK(got);
      EXPECT_EQ(report.source, from_disk ? "disk:" + path_ : server->url());
      if (!from_disk) {
        // Straight into the device's memory (UCX writes it through the host's
        // mapping of the emulated device), each chunk checked on a staged copy.
        ASSERT_FALSE(got->files().empty());
        EXPECT_THAT(got->files()[0].reason, HasSubstr("into emulated:0's memory"));
      }
      ASSERT_EQ(got->tensors().size(), tensors_.size());
      for (const RawTensor& t : tensors_) {
        const LoadedTensor* g = got->Find(t.name);
        ASSERT_NE(g, nullptr) << t.name;
        EXPECT_EQ(g->device, DeviceType::kEmulated) << t.name;
        const auto want = Expected(t, size, rank);
        ASSERT_EQ(g->nbytes, want.size()) << t.name;
        std::vector<uint8_t> host(want.size());
        ASSERT_OK(got->CopyToHost(t.name, host.data()));
        EXPECT_EQ(host, want) << t.name;
      }
    }
  }
}

// The device's free memory (the process's emulated device).
uint64_t EmulatedFree() {
  auto device = OpenDevice(DeviceType::kEmulated, 0);
  EXPECT_OK(device);
  auto free = (*device)->FreeMemory();
  EXPECT_OK(free);
  return free.ok() ? *free : 0;
}

// Every tensor of `got` (host memory) as rank `rank` of `size` should hold it.
void ExpectTensors(const LoadedCheckpoint& got, const std::vector<RawTensor>& tensors, int size,
                   int rank, std::vector<uint8_t> (*expected)(const RawTensor&, int, int)) {
  ASSERT_EQ(got.tensors().size(), tensors.size());
  for (const RawTensor& t : tensors) {
    const LoadedTensor* g = got.Find(t.name);
    ASSERT_NE(g, nullptr) << t.name;
    const auto want = expected(t, size, rank);
    ASSERT_EQ(g->nbytes, want.size()) << t.name;
    std::vector<uint8_t> host(want.size());
    ASSERT_OK(got.CopyToHost(t.name, host.data()));
    EXPECT_EQ(host, want) << t.name;
  }
}

// A host pull reads its file in ops of at most LoadOptions::block_size (64
// KiB here, against 1 MiB chunks): a chunk that several ops fill lands in
// place all the same, checked there; only a translation between
// tensor-parallel sizes splits chunks between places (got whole into host
// memory, checked, copied out), and the report says how many.
TEST_F(PeerTest, AChunkSeveralReadsFillLandsInPlace) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  for (int size : {1, 2}) {
    SCOPED_TRACE("destination rank 0 of " + std::to_string(size));
    auto opts = Pull({server->url()}, size, 0);
    opts.fallback_load.block_size = 64 << 10;
    PeerLoadReport report;
    auto got = LoadFromPeer(key_, opts, &report);
    ASSERT_OK(got);
    ASSERT_EQ(got->files().size(), 1u);
    if (size == 1) {
      EXPECT_THAT(got->files()[0].reason, Not(HasSubstr("split")));
      EXPECT_EQ(report.bytes, got->total_bytes());
    } else {
      EXPECT_THAT(got->files()[0].reason, HasSubstr("chunks split between places"));
    }
    ExpectRank(*got, size, 0);
  }
}

// A pull is a load of the store's file: onto a device, its blocks (here 192
// KiB, against the source's 1 MiB chunks; straight in, 256 MiB unless a test
// says otherwise) go straight into the device's memory, or through pinned
// staging when UCX cannot write it; either way a chunk that two blocks share
// is got once (kept, checked, until both have their parts), and LoadOptions
// of the fallback that do not shape the tensors (progress, staging) apply to
// the pull.
TEST_F(PeerTest, APullOntoADeviceGetsEachChunkOnceWhateverItsBlocks) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  // Straight in; through staging as UCX cannot write the device; through
  // staging as LoadOptions::gds is off.
  for (int how : {0, 1, 2}) {
    const bool straight = how == 0;
    SCOPED_TRACE(straight ? "straight into the device" : "through pinned staging");
    if (how == 0) remote::DirectPullBlocksForTesting(192 << 10);
    if (how == 1) remote::BounceDevicePullsForTesting(1 << 20);
    auto opts = Pull({server->url()});
    opts.device = DeviceId::Emulated();
    opts.fallback_load.gds = how != 2;
    opts.fallback_load.staging_bytes = 192 << 10;
    uint64_t last_progress = 0;
    opts.fallback_load.progress = [&](const Progress& p) { last_progress = p.bytes_done; };
    PeerLoadReport report;
    auto got = LoadFromPeer(key_, opts, &report);
    remote::BounceDevicePullsForTesting(0);
    remote::DirectPullBlocksForTesting(0);
    ASSERT_OK(got);
    ASSERT_EQ(got->files().size(), 1u);
    EXPECT_EQ(got->files()[0].gds, straight);
    EXPECT_EQ(report.bytes, got->total_bytes());
    EXPECT_EQ(got->files()[0].bytes, got->total_bytes());
    EXPECT_EQ(last_progress, got->total_bytes());
    EXPECT_EQ(got->files()[0].reason.find("through pinned host windows") == std::string::npos,
              straight);
    ExpectTensors(*got, tensors_, 1, 0, &PeerTest::Expected);
  }
}

// A read straight into the device checks its chunks with the store's lock
// released; a read planned meanwhile (held there until the next read's gets
// have landed) finds the chunks the first got whole for both of them kept,
// and gets none of them again.
TEST_F(PeerTest, AReadPlannedWhileAnotherChecksFindsTheChunksItKept) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  remote::BeforeDeviceChecksForTesting([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (++calls == 1) {
      // A watchdog, not a measure: the next read arrives unless the load failed.
      cv.wait_for(lock, std::chrono::seconds(60), [&] { return calls > 1; });
    } else {
      cv.notify_all();
    }
  });
  // Blocks of 1.5 MiB against 1 MiB chunks: each block's whole chunks are
  // checked on the device, the chunk across its edge is got whole for both.
  remote::DirectPullBlocksForTesting(1536 << 10);
  auto opts = Pull({server->url()});
  opts.device = DeviceId::Emulated();
  opts.fallback_load.staging_bytes = 1536 << 10;  // Blocks: the larger of the two.
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  remote::DirectPullBlocksForTesting(0);
  remote::BeforeDeviceChecksForTesting(nullptr);
  ASSERT_OK(got);
  EXPECT_GT(calls, 1);
  ASSERT_EQ(got->files().size(), 1u);
  EXPECT_TRUE(got->files()[0].gds);
  EXPECT_EQ(report.bytes, got->total_bytes());  // Each chunk got once.
  ExpectTensors(*got, tensors_, 1, 0, &PeerTest::Expected);
}

// LoadOptions::content_hash: a pull computes the content identity when asked
// (kOn), the same root as a disk load's; by default it does not (its chunks
// are checked against the manifest as they land).
TEST_F(PeerTest, APullHashesItsContentWhenAsked) {
  auto server = Start(Serve());
  ASSERT_NE(server, nullptr);
  auto disk = LoadHashed();
  ASSERT_OK(disk);
  auto opts = Pull({server->url()});
  auto plain = LoadFromPeer(key_, opts);
  ASSERT_OK(plain);
  EXPECT_EQ(plain->content(), nullptr);
  opts.fallback_load.content_hash = ContentHashMode::kOn;
  auto hashed = LoadFromPeer(key_, opts);
  ASSERT_OK(hashed);
  ASSERT_NE(hashed->content(), nullptr);
  EXPECT_EQ(hashed->content()->root.Hex(), disk->content()->root.Hex());
}

TEST_F(PeerTest, ServesFromADevicesMemory) {
  // Sources hold their tensors on the device (whole, or their slices cut in
  // host memory and copied up) and serve that memory; pulls, whole and
  // translated between sizes, match the file.
  LoadOptions on_device;
  on_device.device = DeviceId::Emulated();
  const uint64_t free_before = EmulatedFree();
  for (int size : {1, 2}) {
    SCOPED_TRACE("sources: " + std::to_string(size));
    std::vector<std::unique_ptr<PeerServer>> sources;
    std::vector<std::string> urls;
    for (int r = 0; r < size; ++r) {
      auto s = PeerServer::ServeCheckpoint(path_, key_, Serve(size, r), on_device);
      ASSERT_OK(s);
      urls.push_back((*s)->url());
      sources.push_back(std::move(s).value());
    }
    // The served tensors are the device's: its memory is taken while they serve.
    EXPECT_LT(EmulatedFree(), free_before);
    for (int dst_size : {1, 2}) {
      const int rank = dst_size - 1;
      SCOPED_TRACE("destination rank " + std::to_string(rank) + " of " + std::to_string(dst_size));
      PeerLoadReport report;
      auto got = LoadFromPeer(key_, Pull(urls, dst_size, rank), &report);
      ASSERT_OK(got);
      EXPECT_THAT(report.source, HasSubstr(urls[0]));  // Every source rank's URL.
      ExpectTensors(*got, tensors_, dst_size, rank, &PeerTest::Expected);
    }
    // A bit flipped in the device's copy after the manifest was made fails
    // its chunk's check: the checksums are those of the device's bytes.
    ASSERT_OK(remote::CorruptServedForTesting(*sources[0], "big", 12345));
    PeerLoadReport report;
    auto bad = LoadFromPeer(key_, Pull(urls, size, 0), &report);
    EXPECT_FALSE(bad.ok());
    ASSERT_FALSE(report.failures.empty());
    EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' chunk 0")) << bad.status().ToString();
  }
  EXPECT_EQ(EmulatedFree(), free_before);  // Released with the servers.
}

// A device whose memory UCX cannot write (a GPU with a UCX built without
// CUDA): the pull lands in two windows of pinned host memory, is checked
// there and copied up window after window (1 MiB windows here: the 3 MiB
// tensor takes three, the first half reused); whole and translated between
// tensor-parallel sizes, byte for byte; a flipped bit is caught in a window,
// and the failed pull's device memory is freed.
TEST_F(PeerTest, PullsOntoADeviceUcxCannotWriteThroughHostWindows) {
  struct Bounce {
    Bounce() { remote::BounceDevicePullsForTesting(1 << 20); }
    ~Bounce() { remote::BounceDevicePullsForTesting(0); }
  } bounce;
  auto whole = Start(Serve());
  auto half0 = Start(Serve(2, 0)), half1 = Start(Serve(2, 1));
  ASSERT_TRUE(whole && half0 && half1);
  const uint64_t free_before = EmulatedFree();
  for (bool split_sources : {false, true}) {
    const std::vector<std::string> urls =
        split_sources ? std::vector{half0->url(), half1->url()} : std::vector{whole->url()};
    for (int size : {1, 2}) {
      const int rank = size - 1;
      SCOPED_TRACE(std::to_string(urls.size()) + " source rank(s), destination rank " +
                   std::to_string(rank) + " of " + std::to_string(size));
      auto opts = Pull(urls, size, rank);
      opts.device = DeviceId::Emulated();
      PeerLoadReport report;
      auto got = LoadFromPeer(key_, opts, &report);
      ASSERT_OK(got);
      EXPECT_TRUE(report.failures.empty()) << report.failures[0];
      ASSERT_FALSE(got->files().empty());
      EXPECT_THAT(got->files()[0].reason,
                  HasSubstr("into emulated:0's memory through pinned host windows"));
      EXPECT_EQ(got->tensors().front().device, DeviceType::kEmulated);
      ExpectTensors(*got, tensors_, size, rank, &PeerTest::Expected);
    }
  }
  EXPECT_EQ(EmulatedFree(), free_before);
  ASSERT_OK(remote::CorruptServedForTesting(*whole, "big", (2 << 20) + 5));
  auto opts = Pull({whole->url()});
  opts.device = DeviceId::Emulated();
  PeerLoadReport report;
  EXPECT_FALSE(LoadFromPeer(key_, opts, &report).ok());
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' chunk 2"));
  EXPECT_EQ(EmulatedFree(), free_before);
}

TEST_F(PeerTest, DeviceChecksumsSpanSeveralStagingWindows) {
  // A tensor larger than the staging windows (the source's 8 MiB, the
  // destination's 16 MiB) and not a whole number of chunks: its checksums come
  // from several staged copies on both sides.
  std::vector<RawTensor> big = {Random("big", Dtype::kU8, {(33u << 20) + 4097}, 41),
                                Random("small", Dtype::kU8, {3}, 42)};
  const std::string path = dir_.File("big.safetensors");
  WriteRaw(path, big);
  PeerKey key = key_;
  key.layout = "";
  LoadOptions on_device;
  on_device.device = DeviceId::Emulated();
  ServeOptions o = Serve();
  o.chunk_bytes = 1 << 20;
  auto server = PeerServer::ServeCheckpoint(path, key, o, on_device);
  ASSERT_OK(server);
  for (const char* device : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(device);
    auto opts = Pull({(*server)->url()});
    opts.device = *ParseDevice(device);
    auto got = LoadFromPeer(key, opts);
    ASSERT_OK(got);
    for (const RawTensor& t : big) {
      const LoadedTensor* g = got->Find(t.name);
      ASSERT_NE(g, nullptr);
      ASSERT_EQ(g->nbytes, t.bytes.size());
      std::vector<uint8_t> host(g->nbytes);
      ASSERT_OK(got->CopyToHost(t.name, host.data()));
      EXPECT_EQ(host, t.bytes) << t.name;
    }
  }
  // The last chunk, in the source's fifth window and the destination's third,
  // corrupted on the source's device, is caught on either destination.
  ASSERT_OK(remote::CorruptServedForTesting(**server, "big", (33u << 20) + 4000));
  for (const char* device : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(device);
    auto opts = Pull({(*server)->url()});
    opts.device = *ParseDevice(device);
    PeerLoadReport report;
    auto bad = LoadFromPeer(key, opts, &report);
    EXPECT_FALSE(bad.ok());
    ASSERT_FALSE(report.failures.empty());
    EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' chunk 33")) << bad.status().ToString();
  }
}

TEST_F(PeerTest, ASeedOnADeviceServesItsDeviceMemory) {
  // A destination that pulls onto the device and becomes a seed serves the
  // device's copy: a third process pulls from it.
  auto origin = Start(Serve());
  ASSERT_NE(origin, nullptr);
  auto opts = Pull({origin->url()});
  opts.device = DeviceId::Emulated();
  opts.become_seed = true;
  auto seeded = LoadFromPeerAndSeed(key_, opts);
  ASSERT_OK(seeded);
  ASSERT_NE(seeded->seed, nullptr);
  EXPECT_EQ(seeded->loaded->tensors().front().device, DeviceType::kEmulated);
  origin.reset();  // Only the seed is left.
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull({seeded->seed->url()}), &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, seeded->seed->url());
  ExpectTensors(*got, tensors_, 1, 0, &PeerTest::Expected);
}

TEST_F(PeerTest, ACorruptChunkPulledOntoADeviceIsCaught) {
  // The staged check of device memory sees a flipped bit, whole and
  // translated, and the failed pull's device memory is freed.
  const uint64_t free_before = EmulatedFree();
  for (int size : {1, 2}) {
    auto bad = Start(Serve());
    ASSERT_NE(bad, nullptr);
    ASSERT_OK(remote::CorruptServedForTesting(*bad, "big", (1 << 20) + 5));
    auto opts = Pull({bad->url()}, size, 0);
    opts.device = DeviceId::Emulated();
    PeerLoadReport report;
    EXPECT_FALSE(LoadFromPeer(key_, opts, &report).ok());
    ASSERT_FALSE(report.failures.empty());
    EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' chunk 1"));
  }
  EXPECT_EQ(EmulatedFree(), free_before);
}

TEST_F(PeerTest, DeviceDestinationsSayWhatTheyCannotDo) {
  auto opts = Pull({});
  opts.fallback_path = path_;
  opts.device = DeviceId::Emulated();
  opts.fallback_load.device = DeviceId::Emulated();
  EXPECT_OK(LoadFromPeer(key_, opts).status());  // The same device twice is fine.
  opts.device = DeviceId::Cpu();
  auto conflicting = LoadFromPeer(key_, opts);
  EXPECT_EQ(conflicting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(conflicting.status().message(), HasSubstr("differs from PeerLoadOptions::device"));
  opts.fallback_load.device = DeviceId::Cpu();
  opts.device = DeviceId::Emulated(1);  // There is one emulated device, 0.
  EXPECT_EQ(LoadFromPeer(key_, opts).status().code(), StatusCode::kNotFound);
}

// The options that shape the tensors are the key's, from a peer or from disk:
// a key naming a dtype makes the fallback convert to it; a fallback dtype
// other than the key's, or a filter, is refused, never applied to one source
// and ignored on the other.
TEST_F(PeerTest, TheFallbackGivesTheTensorsAPeerWould) {
  PeerKey f16 = key_;
  f16.dtype = Dtype::kF16;
  auto opts = Pull({});
  opts.fallback_path = path_;
  auto got = LoadFromPeer(f16, opts);
  ASSERT_OK(got);
  LoadOptions convert;
  convert.dtype = Dtype::kF16;
  auto want = Load(path_, convert);
  ASSERT_OK(want);
  ASSERT_EQ(got->tensors().size(), want->tensors().size());
  for (const LoadedTensor& w : want->tensors()) {
    const LoadedTensor* g = got->Find(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->dtype, w.dtype) << w.name;
    ASSERT_EQ(g->nbytes, w.nbytes) << w.name;
    EXPECT_EQ(Xxh3_64(g->data, g->nbytes), Xxh3_64(w.data, w.nbytes)) << w.name;
  }
  opts.fallback_load.dtype = Dtype::kF16;
  EXPECT_OK(LoadFromPeer(f16, opts).status());  // The key's own dtype: fine.
  auto conflicting = LoadFromPeer(key_, opts);  // As stored on peers, F16 from disk: no.
  EXPECT_EQ(conflicting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(conflicting.status().message(), HasSubstr("differs from PeerKey::dtype"));
  opts.fallback_load.dtype.reset();
  opts.fallback_load.filter = TensorFilter::Names({tensors_.front().name});
  auto filtered = LoadFromPeer(key_, opts);
  EXPECT_EQ(filtered.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(filtered.status().message(), HasSubstr("fallback_load.filter"));
}

TEST_F(PeerTest, IncompleteSourceGroupFallsBack) {
  auto rank0 = Start(Serve(2, 0));  // Rank 1 of 2 is missing.
  ASSERT_NE(rank0, nullptr);
  auto opts = Pull({rank0->url()});
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures.back(), HasSubstr("no live endpoint for rank 1"));
}

// A lower bound only, which the pacing forces: the client issues no get
// before the bytes it issued so far are due at the granted rate, so the last
// 256 KiB get of the 3 MiB tensor waits at least 2.75 MiB / 8 MiB/s = 0.34 s.
TEST_F(PeerTest, RateLimitPacesThePull) {
  auto o = Serve();
  o.rate_limit = 8 << 20;  // 8 MiB/s, granted to the one client.
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  auto got = LoadFromPeer(key_, Pull({server->url()}));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_OK(got);
  EXPECT_GT(s, 0.25);
}

// A peer that dribbles its answer a byte at a time (a slowloris) never trips
// a per-read time-out: the whole request has a deadline.
TEST_F(PeerTest, ASlowlorisPeerIsDroppedAtTheRequestTimeOut) {
  httplib::Server fake;
  std::atomic<bool> stopping{false};
  fake.Get("/v1/key", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("application/json", [&](size_t, httplib::DataSink& sink) {
      if (stopping) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return sink.write("{", 1);  // Never a whole answer.
    });
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  std::thread t([&] { fake.listen_after_bind(); });
  auto opts = Pull({"http://127.0.0.1:" + std::to_string(port)});
  opts.request_timeout_ms = 1000;
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  stopping = true;
  fake.stop();
  t.join();
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_FALSE(report.failures.empty());
  // The request's deadline ended it: the peer never stops dribbling, so
  // nothing else would have (how soon is not asserted).
  EXPECT_THAT(report.failures[0], HasSubstr("no complete answer within 1000 ms"));
  ExpectRank(*got, 1, 0);
}

// A source whose rate limit grants this client less than min_rate would make
// the pull last as long as it likes: it is skipped before any byte moves.
TEST_F(PeerTest, ARateGrantBelowTheMinimumIsSkipped) {
  auto o = Serve();
  o.rate_limit = 100000;  // 100 KB/s: 30 s for the 3 MB tensor.
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  auto opts = Pull({server->url()});
  opts.fallback_path = path_;
  ASSERT_EQ(opts.min_rate, 1000000u);  // The default: 1 MB/s.
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("grants 100000 bytes/s, below the minimum"));
  EXPECT_EQ(server->served_bytes(), 0u);
  ExpectRank(*got, 1, 0);
}

// A peer whose bytes check out against its own manifest, but whose tensors
// are not the fallback checkpoint's (another model under the same key), is
// not used: the checksums only vouch for its bytes being its own.
TEST_F(PeerTest, APeerServingOtherShapesThanTheFallbackIsNotUsed) {
  ScratchDir other_dir;
  const std::string other = other_dir.File("model.safetensors");
  auto tensors = Tensors();
  tensors[4] = Random("big", Dtype::kU8, {2 << 20}, 5);  // 2 MiB where the fallback has 3.
  WriteRaw(other, tensors);
  auto s = PeerServer::ServeCheckpoint(other, key_, Serve());
  ASSERT_OK(s);
  auto opts = Pull({(*s)->url()});
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big' is U8 [2097152] there, U8 [3145728]"));
  ExpectRank(*got, 1, 0);
  // Without a fallback to compare with, its tensors are what it serves.
  opts.fallback_path.clear();
  auto alone = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(alone);
  EXPECT_EQ(alone->Find("big")->nbytes, 2u << 20);
}

TEST_F(PeerTest, MaxSessionsRefusesExtraClients) {
  auto o = Serve();
  o.max_sessions = 1;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  // The first client holds its session open until it is closed.
  auto first = remote::PeerSession::Dial(server->url(), key_, {});
  ASSERT_OK(first);
  ASSERT_EQ(server->active_sessions(), 1);
  PeerLoadReport report;
  auto second = LoadFromPeer(key_, Pull({server->url()}), &report);
  ASSERT_FALSE(second.ok());
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("HTTP 503"));
  // Once it is closed (its DELETE answered), the next client gets the session.
  first->reset();
  EXPECT_EQ(server->active_sessions(), 0);
  auto third = LoadFromPeer(key_, Pull({server->url()}));
  ASSERT_OK(third);
  ExpectRank(*third, 1, 0);
}

// UCX keeps an entry for every peer a worker has met until the worker goes,
// so a seed moves new sessions to a fresh worker every clients_per_worker
// sessions and destroys the old one once its last session closes.
TEST_F(PeerTest, SessionsMoveToAFreshWorkerAndTheOldOneGoesWithItsLastSession) {
  auto o = Serve();
  o.clients_per_worker = 2;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  const RawTensor& big = tensors_[4];
  ASSERT_EQ(big.name, "big");
  auto open = [&] { return remote::PeerSession::Dial(server->url(), key_, {}); };
  auto read_big = [&](remote::PeerSession& r) {
    const remote::ManifestTensor* t = r.manifest.Find("big");
    ASSERT_NE(t, nullptr);
    std::vector<uint8_t> got(big.bytes.size());
    ASSERT_OK(r.GetAll({{r.regions[t->region], t->offset, got.size(), got.data()}}, {}));
    EXPECT_TRUE(got == big.bytes);
  };
  // A worker whose last session closed is destroyed by the server's progress
  // thread, soon after: wait for it (60 s: a watchdog, not a measure).
  auto wait_for_workers = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (server->live_workers() != n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return server->live_workers();
  };
  auto a = open();
  auto b = open();
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ((*a)->manifest.worker_address, (*b)->manifest.worker_address);
  EXPECT_EQ(server->live_workers(), 1);
  auto c = open();  // The third session gets a fresh worker.
  ASSERT_OK(c);
  EXPECT_NE((*c)->manifest.worker_address, (*a)->manifest.worker_address);
  EXPECT_EQ(server->live_workers(), 2);
  read_big(**a);  // The old worker serves its sessions on,
  read_big(**c);  // the new one its own.
  a->reset();
  EXPECT_EQ(server->live_workers(), 2);  // b still uses the old one.
  read_big(**b);
  b->reset();
  EXPECT_EQ(wait_for_workers(1), 1);
  read_big(**c);
  c->reset();
  // Whole pulls, one session each: never more than two workers, every pull
  // right, and a retired worker goes once its pull is over. (Each pull starts
  // from one worker, so the one it may retire is never a third.)
  for (int i = 0; i < 7; ++i) {
    PeerLoadReport report;
    auto got = LoadFromPeer(key_, Pull({server->url()}), &report);
    ASSERT_OK(got);
    EXPECT_EQ(report.source, server->url());
    ExpectRank(*got, 1, 0);
    EXPECT_LE(server->live_workers(), 2);
    EXPECT_EQ(wait_for_workers(1), 1) << "pull " << i;
  }
}

TEST_F(PeerTest, ALoadedInstanceBecomesASeed) {
  auto origin = Start(Serve(2, 0));
  auto origin1 = Start(Serve(2, 1));
  ASSERT_TRUE(origin && origin1);
  auto opts = Pull({origin->url(), origin1->url()}, 2, 1);
  opts.become_seed = true;
  opts.seed.chunk_bytes = 64 << 10;
  auto seeded = LoadFromPeerAndSeed(key_, opts);
  ASSERT_OK(seeded);
  ASSERT_NE(seeded->seed, nullptr);
  ExpectRank(*seeded->loaded, 2, 1);
  origin1.reset();  // The seed now stands in for rank 1.
  auto got = LoadFromPeer(key_, Pull({origin->url(), seeded->seed->url()}, 1, 0));
  ASSERT_OK(got);
  ExpectRank(*got, 1, 0);
}

// A rank's disk fallback onto a device loads its slices straight there (the
// GPU pipeline, no whole host copy), and as a seed it serves them as the
// slices they are: with the origin's other rank, a whole load is made.
TEST_F(PeerTest, ASlicedDiskFallbackOntoADeviceSeedsItsSlices) {
  auto origin = Start(Serve(2, 0));
  ASSERT_NE(origin, nullptr);
  auto opts = Pull({}, 2, 1);
  opts.fallback_path = path_;
  opts.device = DeviceId::Emulated();
  opts.become_seed = true;
  opts.seed.chunk_bytes = 64 << 10;
  auto seeded = LoadFromPeerAndSeed(key_, opts);
  ASSERT_OK(seeded);
  ASSERT_NE(seeded->seed, nullptr);
  EXPECT_EQ(seeded->report.source, "disk:" + path_);
  ASSERT_FALSE(seeded->loaded->files().empty());
  // Planned as slices by the loader (not loaded whole and cut).
  EXPECT_THAT(seeded->loaded->files()[0].reason, HasSubstr("slice(s) for rank 1 of 2"));
  EXPECT_EQ(seeded->loaded->tensors().front().device, DeviceType::kEmulated);
  auto got = LoadFromPeer(key_, Pull({origin->url(), seeded->seed->url()}, 1, 0));
  ASSERT_OK(got);
  ExpectRank(*got, 1, 0);
}

TEST_F(PeerTest, ServesUserBuffers) {
  std::vector<float> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint16_t> b(77, 0xBEEF);
  std::vector<PeerServer::Tensor> tensors = {
      {"a", Dtype::kF32, {10, 100}, a.data(), -1, 0, {}, {}},
      {"b", Dtype::kU16, {77}, b.data(), -1, 0, {}, {}},
  };
  PeerKey key;
  key.model = "buffers";
  key.revision = "1";
  auto server = PeerServer::ServeBuffers(tensors, key, {});
  ASSERT_OK(server);
  auto got = LoadFromPeer(key, Pull({(*server)->url()}));
  ASSERT_OK(got);
  ASSERT_EQ(got->Find("a")->nbytes, a.size() * 4);
  EXPECT_EQ(std::memcmp(got->Find("a")->data, a.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got->Find("b")->data, b.data(), b.size() * 2), 0);
  // Bad requests are refused before anything is served.
  std::vector<PeerServer::Tensor> dup = {{"a", Dtype::kF32, {1}, a.data(), -1, 0, {}, {}},
                                         {"a", Dtype::kF32, {1}, a.data(), -1, 0, {}, {}}};
  EXPECT_FALSE(PeerServer::ServeBuffers(dup, key, {}).ok());
}

TEST_F(PeerTest, ServesUserBuffersInDeviceMemory) {
  // A framework's device tensors (a GPU's, here the emulated device's),
  // served by address from the device's memory: two tensors in one
  // allocation, the second at an offset.
  std::vector<float> a(3000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  std::vector<uint16_t> b(4097, 0xBEEF);
  auto device = OpenDevice(DeviceType::kEmulated, 0);
  ASSERT_OK(device);
  const uint64_t a_bytes = a.size() * 4, b_at = 16384, b_bytes = b.size() * 2;
  auto memory = (*device)->Allocate(b_at + b_bytes);
  ASSERT_OK(memory);
  {
    auto stream = (*device)->CreateStream();
    ASSERT_OK(stream);
    ASSERT_OK((*stream)->CopyToDevice((*memory)->data(), reinterpret_cast<std::byte*>(a.data()),
                                      a_bytes));
    ASSERT_OK((*stream)->CopyToDevice((*memory)->data() + b_at,
                                      reinterpret_cast<std::byte*>(b.data()), b_bytes));
    ASSERT_OK((*stream)->Synchronize());
  }
  std::vector<PeerServer::Tensor> tensors = {
      {"a", Dtype::kF32, {30, 100}, (*memory)->data(), -1, 0, {}, DeviceId::Emulated()},
      {"b", Dtype::kU16, {4097}, (*memory)->data() + b_at, -1, 0, {}, DeviceId::Emulated()},
  };
  PeerKey key;
  key.model = "device-buffers";
  key.revision = "1";
  ServeOptions o;
  o.chunk_bytes = 4096;  // Several chunks each, checksummed on staged copies.
  auto server = PeerServer::ServeBuffers(tensors, key, o, *memory);
  ASSERT_OK(server);
  for (const char* where : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(where);
    auto opts = Pull({(*server)->url()});
    opts.device = *ParseDevice(where);
    auto got = LoadFromPeer(key, opts);
    ASSERT_OK(got);
    std::vector<std::byte> ga(a_bytes), gb(b_bytes);
    ASSERT_OK(got->CopyToHost("a", ga.data()));
    ASSERT_OK(got->CopyToHost("b", gb.data()));
    EXPECT_EQ(std::memcmp(ga.data(), a.data(), a_bytes), 0);
    EXPECT_EQ(std::memcmp(gb.data(), b.data(), b_bytes), 0);
  }
  // The checksums are the device bytes': one flipped after the manifest fails.
  ASSERT_OK(remote::CorruptServedForTesting(**server, "b", 5000));
  PeerLoadReport report;
  EXPECT_FALSE(LoadFromPeer(key, Pull({(*server)->url()}), &report).ok());
  ASSERT_FALSE(report.failures.empty());
  EXPECT_THAT(report.failures[0], HasSubstr("tensor 'b' chunk 1"));
  server->reset();

  // What is not that device's memory is refused before anything is served.
  std::vector<PeerServer::Tensor> host = {
      {"a", Dtype::kF32, {1}, a.data(), -1, 0, {}, DeviceId::Emulated()}};
  auto refused = PeerServer::ServeBuffers(host, key, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("not device memory"));
  std::vector<PeerServer::Tensor> unknown = {
      {"a", Dtype::kF32, {1}, a.data(), -1, 0, {}, DeviceId::Emulated(1)}};  // Not here.
  auto bad = PeerServer::ServeBuffers(unknown, key, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor 'a'"));
}

TEST(PeerKeyTest, ForCheckpointIsStableAndNamesTheModel) {
  ScratchDir dir;
  const std::string sub = dir.path() + "/llama-tiny";
  std::filesystem::create_directory(sub);
  WriteRaw(sub + "/model.safetensors", Tensors());
  auto a = PeerKeyForCheckpoint(sub);
  auto b = PeerKeyForCheckpoint(sub + "/model.safetensors");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->model, "llama-tiny");
  EXPECT_EQ(b->model, "llama-tiny");
  EXPECT_EQ(a->revision, b->revision);
  EXPECT_EQ(a->revision.substr(0, 2), "h:");
  auto other = Tensors();
  other[0].name = "w0x";
  WriteRaw(sub + "/model.safetensors", other);
  auto c = PeerKeyForCheckpoint(sub);
  ASSERT_OK(c);
  EXPECT_NE(a->revision, c->revision);
}

// PeerKey::content: a seed with another root is refused before any byte moves;
// a seed that publishes the right root over tampered bytes (chunk checksums
// recomputed to match) is refused by the hashes of what arrived, naming the
// tensor; the disk fallback must match it too; the key's digest ignores it.
TEST_F(PeerTest, ContentRefusesAnotherRootAndTamperedBytes) {
  auto disk = LoadHashed();
  ASSERT_OK(disk);
  const std::string root = disk->content()->root.Hex();
  ServeOptions o = Serve();
  o.handover = false;  // Private, writable memory for the liar.
  auto liar = Start(o);
  auto good = Start(o);
  ASSERT_TRUE(liar && good);
  EXPECT_EQ(good->content(), root);
  ASSERT_OK(remote::CorruptServedForTesting(*liar, "big", (2 << 20) + 7, /*lie=*/true));
  // Without content the liar's bytes pass its own chunk checksums.
  auto fooled = LoadFromPeer(key_, Pull({liar->url()}));
  ASSERT_OK(fooled);

  PeerKey want = key_;
  want.content = root;
  EXPECT_EQ(want.Digest(), key_.Digest());
  PeerLoadReport report;
  auto got = LoadFromPeer(want, Pull({liar->url(), good->url()}), &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, good->url());
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("tensor 'big'"));
  EXPECT_THAT(report.failures[0], HasSubstr("the seed published"));
  ExpectRank(*got, 1, 0);

  PeerKey other = key_;
  other.content = std::string(32, '0');
  PeerLoadReport refused_report;
  auto refused = LoadFromPeer(other, Pull({good->url()}), &refused_report);
  ASSERT_FALSE(refused.ok());
  ASSERT_FALSE(refused_report.failures.empty());
  EXPECT_THAT(refused_report.failures[0], HasSubstr("content differs: expected " + other.content));
  EXPECT_THAT(refused_report.failures[0], HasSubstr(root));

  PeerLoadOptions disk_only = Pull({});
  disk_only.local = false;
  disk_only.fallback_path = path_;
  auto wrong_disk = LoadFromPeer(other, disk_only);
  ASSERT_FALSE(wrong_disk.ok());
  EXPECT_THAT(wrong_disk.status().message(), HasSubstr("expected " + other.content));
  ASSERT_OK(LoadFromPeer(want, disk_only));

  // Handed over on this host (when it can be): the mapped bytes are hashed too.
  auto sealed = Start(Serve());
  ASSERT_TRUE(sealed);
  PeerLoadOptions near = Pull({sealed->url()});
  near.handover = HandoverMode::kAuto;
  PeerLoadReport near_report;
  auto taken = LoadFromPeer(want, near, &near_report);
  ASSERT_OK(taken);
  ExpectRank(*taken, 1, 0);
}

// A seed publishes the content hashes its load computed (no second pass over
// those bytes): a made-up hash in the load's identity is what it publishes.
// Without an identity from the load it hashes the bytes itself.
TEST_F(PeerTest, ASeedTakesTheContentIdentityOfItsLoad) {
  auto disk = LoadHashed();
  ASSERT_OK(disk);
  const std::string root = disk->content()->root.Hex();
  ContentIdentity told = *disk->content();
  told.tensors[0].hash = Hash128{1, 2};
  told.root = ContentRoot(told.tensors);
  CheckpointBuilder b(std::move(disk).value());
  b.set_content(std::make_shared<const ContentIdentity>(told));
  auto loaded = std::make_shared<const LoadedCheckpoint>(std::move(b).Finish(0));
  ServeOptions o = Serve();
  o.handover = false;
  auto told_seed = PeerServer::Serve(loaded, key_, o);
  ASSERT_OK(told_seed);
  EXPECT_EQ((*told_seed)->content(), told.root.Hex());
  EXPECT_NE(told.root.Hex(), root);

  LoadOptions off;
  off.mode = IoMode::kBuffered;
  off.content_hash = ContentHashMode::kOff;
  auto plain = Load(path_, off);
  ASSERT_OK(plain);
  ASSERT_EQ(plain->content(), nullptr);
  auto hashed_seed = PeerServer::Serve(
      std::make_shared<const LoadedCheckpoint>(std::move(plain).value()), key_, o);
  ASSERT_OK(hashed_seed);
  EXPECT_EQ((*hashed_seed)->content(), root);
}
}  // namespace
}  // namespace tensorlift
