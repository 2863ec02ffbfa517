// Relays (docs/remote.md, "Relaying"): the chunk map a relay answers GET
// /v1/have with, as written and as a child parses it (untrusted); a relay's
// server of memory still being filled, whose manifest carries the root's
// checksums and whose map grows as chunks are marked, and whose chunks a
// child gets as they are.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>

#include "../common/assert_ok.h"
#include "remote/availability.h"
#include "remote/control.h"
#include "remote/manifest.h"
#include "remote/peer_server.h"
#include "remote/peer_session.h"
#include "remote/ucx_transport.h"

namespace tensorlift::remote {
namespace {

using ::testing::HasSubstr;

Manifest TwoTensors(uint64_t chunk, uint64_t a_bytes, uint64_t b_bytes) {
  Manifest m;
  m.chunk_bytes = chunk;
  ManifestTensor a, b, z;
  a.name = "a";
  a.nbytes = a_bytes;
  b.name = "b";
  b.nbytes = b_bytes;
  z.name = "c.empty";
  m.tensors = {a, b, z};
  return m;
}

TEST(AvailabilityTest, TheMapIsEveryTensorsChunksInOrderAndAChildReadsItBack) {
  // a: 2.5 chunks -> 3; b: 6 chunks exactly; c.empty: none. 9 chunks: 2 bytes of map.
  const Manifest m = TwoTensors(4096, 10240, 6 * 4096);
  EXPECT_EQ(ChunkStarts(m), (std::vector<uint64_t>{0, 3, 9, 9}));
  Availability have(m);
  EXPECT_EQ(have.chunks(), 9u);
  EXPECT_EQ(have.Text(), R"({"version":0,"complete":false,"have":"0000"})");
  have.Mark(0, 2);  // a's last chunk (2048 bytes).
  have.Mark(1, 5);  // b's last: map chunk 8.
  have.Mark(1, 5);  // Again: no change.
  have.Mark(1, 6);  // Past b's chunks: ignored.
  have.Mark(7, 0);  // No such tensor: ignored.
  EXPECT_EQ(have.held(), 2u);
  EXPECT_EQ(have.held_bytes(), 2048u + 4096u);
  const std::string text = have.Wait(0, std::chrono::milliseconds(0));
  EXPECT_EQ(text, R"({"version":2,"complete":false,"have":"0401"})");
  auto held = ParseHeldChunks(text, 9);
  ASSERT_OK(held);
  for (uint64_t i = 0; i < 9; ++i) EXPECT_EQ(held->Has(i), i == 2 || i == 8) << i;
  have.MarkAll();
  held = ParseHeldChunks(have.Text(), 9);
  ASSERT_OK(held);
  EXPECT_TRUE(held->complete);
  EXPECT_EQ(held->version, 3u);
  EXPECT_EQ(have.held_bytes(), 10240u + 6 * 4096u);
}

TEST(AvailabilityTest, AMapThatIsNotTheManifestsIsCorruption) {
  for (const std::string& bad : {
           std::string("not json"),
           std::string(R"({"version":1,"complete":false})"),
           std::string(R"({"version":1,"complete":false,"have":"00"})"),    // 1 byte, 2 needed.
           std::string(R"({"version":1,"complete":false,"have":"00FF"})"),  // Upper case.
           std::string(R"({"version":1,"complete":false,"have":"0002"})"),  // Bit 9 of 9 chunks.
           std::string(R"({"version":1,"complete":false,"have":"0g00"})"),
       }) {
    auto h = ParseHeldChunks(bad, 9);
    ASSERT_FALSE(h.ok()) << bad;
    EXPECT_EQ(h.status().code(), StatusCode::kCorruption) << bad;
  }
  EXPECT_FALSE(ParseHeldChunks(std::string(1 << 20, ' '), 9).ok());  // Bounded before parsing.
}

class RelayServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!UcxBuilt()) GTEST_SKIP() << UcxVersion();
    key_.model = "relay-test";
    key_.revision = "r1";
    std::mt19937 rng(5);
    root_bytes_.resize(kA + kB);
    for (auto& b : root_bytes_) b = static_cast<uint8_t>(rng());
    relay_bytes_.assign(kA + kB, 0);
  }

  static constexpr uint64_t kChunk = 4096;
  static constexpr uint64_t kA = 3 * kChunk + 100, kB = kChunk;

  std::vector<PeerServer::Tensor> Over(std::vector<uint8_t>& bytes) const {
    PeerServer::Tensor a, b;
    a.name = "a";
    a.shape = {int64_t(kA)};
    a.data = bytes.data();
    b.name = "b";
    b.shape = {int64_t(kB)};
    b.data = bytes.data() + kA;
    return {a, b};
  }

  static std::vector<Served> AsServed(const std::vector<PeerServer::Tensor>& ts) {
    std::vector<Served> out;
    for (const auto& t : ts) {
      Served s;
      s.name = t.name;
      s.dtype = t.dtype;
      s.shape = t.shape;
      s.data = static_cast<std::byte*>(const_cast<void*>(t.data));
      s.nbytes = static_cast<uint64_t>(t.shape[0]);
      out.push_back(std::move(s));
    }
    return out;
  }

  PeerKey key_;
  std::vector<uint8_t> root_bytes_, relay_bytes_;
};

TEST_F(RelayServerTest, ARelayServesTheRootsChecksumsAndTheChunksItHoldsAsTheyAreMarked) {
  ServeOptions o;
  o.chunk_bytes = kChunk;
  o.handover = false;
  auto root = PeerServer::ServeBuffers(Over(root_bytes_), key_, o);
  ASSERT_OK(root);
  PeerSession::DialOptions dial;
  dial.whole_only = true;
  auto root_session = PeerSession::Dial((*root)->url(), key_, dial);
  ASSERT_OK(root_session);
  const Manifest& reference = (*root_session)->manifest;

  // The root's map: every chunk.
  auto root_control = Control::Make((*root)->url(), "", 5000);
  ASSERT_OK(root_control);
  auto root_map = root_control->Send("GET", "/v1/have", "", 1 << 20);
  ASSERT_OK(root_map);
  auto root_held = ParseHeldChunks(*root_map, ChunkStarts(reference).back());
  ASSERT_OK(root_held);
  EXPECT_TRUE(root_held->complete);

  auto have = std::make_shared<Availability>(reference);
  RelayOf relay{&reference, have};
  ServeOptions ro;
  ro.chunk_bytes = 1 << 20;  // The reference's wins.
  auto server =
      StartPeerServer(key_, ro, AsServed(Over(relay_bytes_)), {}, nullptr, nullptr, &relay);
  ASSERT_OK(server);
  auto control = Control::Make((*server)->url(), "", 5000);
  ASSERT_OK(control);
  const uint64_t chunks = ChunkStarts(reference).back();
  ASSERT_EQ(chunks, 5u);
  auto map = control->Send("GET", "/v1/have", "", 1 << 20);
  ASSERT_OK(map);
  auto held = ParseHeldChunks(*map, chunks);
  ASSERT_OK(held);
  EXPECT_FALSE(held->complete);
  for (uint64_t i = 0; i < chunks; ++i) EXPECT_FALSE(held->Has(i));

  // Its manifest: the root's chunk size, checksums and content root.
  auto session = PeerSession::Dial((*server)->url(), key_, dial);
  ASSERT_OK(session);
  const Manifest& m = (*session)->manifest;
  EXPECT_EQ(m.chunk_bytes, kChunk);
  ASSERT_EQ(m.tensors.size(), 2u);
  for (size_t t = 0; t < 2; ++t)
    EXPECT_EQ(m.tensors[t].chunk_xxh3, reference.tensors[t].chunk_xxh3);
  ASSERT_TRUE(m.content && reference.content);
  EXPECT_EQ(m.content->Hex(), reference.content->Hex());

  // Chunk 1 of "a" arrives (as a pull would land and check it) and is marked:
  // a child waiting on the map sees it, and gets its bytes.
  std::memcpy(relay_bytes_.data() + kChunk, root_bytes_.data() + kChunk, kChunk);
  have->Mark(0, 1);
  map = control->Send("GET", "/v1/have?after=0&wait_ms=2000", "", 1 << 20);
  ASSERT_OK(map);
  held = ParseHeldChunks(*map, chunks);
  ASSERT_OK(held);
  EXPECT_EQ(held->version, 1u);
  for (uint64_t i = 0; i < chunks; ++i) EXPECT_EQ(held->Has(i), i == 1) << i;
  ASSERT_OK((*session)->Connect("", 5000));
  std::vector<uint8_t> got(kChunk, 0);
  const ManifestTensor& a = m.tensors[0];
  ASSERT_OK((*session)->GetAll(
      {{(*session)->regions[a.region], a.offset + kChunk, kChunk, got.data()}}, {}));
  EXPECT_EQ(0, std::memcmp(got.data(), root_bytes_.data() + kChunk, kChunk));
  EXPECT_EQ(ChunkChecksums(got.data(), kChunk, kChunk)[0], reference.tensors[0].chunk_xxh3[1]);
}

TEST_F(RelayServerTest, ARelayOfOtherTensorsThanTheReferenceIsRefused) {
  ServeOptions o;
  o.chunk_bytes = kChunk;
  o.handover = false;
  auto root = PeerServer::ServeBuffers(Over(root_bytes_), key_, o);
  ASSERT_OK(root);
  PeerSession::DialOptions dial;
  auto root_session = PeerSession::Dial((*root)->url(), key_, dial);
  ASSERT_OK(root_session);
  const Manifest& reference = (*root_session)->manifest;
  auto have = std::make_shared<Availability>(reference);
  RelayOf relay{&reference, have};
  std::vector<Served> other = AsServed(Over(relay_bytes_));
  other[1].shape = {int64_t(kB / 2)};
  other[1].nbytes = kB / 2;
  auto server = StartPeerServer(key_, {}, std::move(other), {}, nullptr, nullptr, &relay);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("tensor 'b' is not the reference's"));
}

// A seed's rate grant holds across a session's runs (GetAll calls): a run
// paces its own gets from its start and lets its first go at once, so a
// striped load's or a relay's pull of one piece a run let every piece go at
// once (a seed at --rate-limit 60 MB/s sent a relaying pull 1 GB/s). A lower
// bound only, which the pacing forces: 8 runs of one get of tensor "a"
// (12,388 bytes) at 64 KiB/s, the last waiting for the 7 before (1.3 s).
TEST_F(RelayServerTest, ASeedsRateGrantHoldsAcrossASessionsRuns) {
  ServeOptions o;
  o.chunk_bytes = kChunk;
  o.handover = false;
  o.rate_limit = 64 << 10;
  auto root = PeerServer::ServeBuffers(Over(root_bytes_), key_, o);
  ASSERT_OK(root);
  PeerSession::DialOptions dial;
  auto session = PeerSession::Dial((*root)->url(), key_, dial);
  ASSERT_OK(session);
  const ManifestTensor& a = (*session)->manifest.tensors[0];
  std::vector<uint8_t> got(kA, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int run = 0; run < 8; ++run) {
    ASSERT_OK((*session)->GetAll({{(*session)->regions[a.region], a.offset, kA, got.data()}}, {}));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(0, std::memcmp(got.data(), root_bytes_.data(), kA));
  EXPECT_GT(s, 1.2);
}

TEST(AutoChunkTest, SmallCheckpointsAreCheckedInSmallerChunksSoAChainLagsLess) {
  EXPECT_EQ(AutoChunkBytes(0), 64u << 10);
  EXPECT_EQ(AutoChunkBytes(1 << 20), 64u << 10);
  EXPECT_EQ(AutoChunkBytes(32ull << 20), 256u << 10);
  EXPECT_EQ(AutoChunkBytes(128ull << 20), 1u << 20);
  EXPECT_EQ(AutoChunkBytes((128ull << 20) - 1), 512u << 10);
  EXPECT_EQ(AutoChunkBytes(512ull << 20), 4u << 20);
  EXPECT_EQ(AutoChunkBytes(16ull << 30), 4u << 20);
}

TEST_F(RelayServerTest, ASourceGivenNoChunkSizeUsesTheAutomaticOneAndAGivenOneIsKept) {
  // 16 MiB served: 128 chunks of 128 KiB.
  std::vector<uint8_t> bytes(16 << 20, 7);
  PeerServer::Tensor t;
  t.name = "w";
  t.shape = {int64_t(bytes.size())};
  t.data = bytes.data();
  ServeOptions o;
  o.handover = false;
  for (uint64_t given : {uint64_t{0}, uint64_t{1} << 20}) {
    o.chunk_bytes = given;
    auto server = PeerServer::ServeBuffers({t}, key_, o);
    ASSERT_OK(server);
    PeerSession::DialOptions dial;
    dial.whole_only = true;
    auto session = PeerSession::Dial((*server)->url(), key_, dial);
    ASSERT_OK(session);
    const uint64_t want = given ? given : 128u << 10;
    EXPECT_EQ((*session)->manifest.chunk_bytes, want);
    EXPECT_EQ((*session)->manifest.tensors[0].chunk_xxh3.size(), bytes.size() / want);
  }
  o.chunk_bytes = 1024;
  auto refused = PeerServer::ServeBuffers({t}, key_, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("chunk_bytes 1024 is outside"));
}

}  // namespace
}  // namespace tensorlift::remote
