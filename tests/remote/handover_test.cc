// Same-host handover (remote/handover.h): a seed's sealed shared memory mapped
// by a client on the same host, no byte copied. Read-only and copy-on-write
// mappings, a seed that goes while its memory is mapped, a client that
// becomes a seed of the same memory, verification against the manifest, and
// what is refused (unsealed or short memory, no session, off). The
// two-process case (a seed killed with SIGKILL) is in
// tests/python/test_handover.py.
#include "remote/handover.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "device/host_buffer.h"
#include "remote/control.h"
#include "remote/manifest.h"
#include "remote/peer_faults.h"
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

class HandoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!remote::UcxBuilt()) GTEST_SKIP() << remote::UcxVersion();
    if (remote::HandoverHostId().empty()) GTEST_SKIP() << "no /proc/sys/kernel/random/boot_id";
    tensors_ = {Random("a", Dtype::kF32, {64, 33}, 1), Random("big", Dtype::kU8, {3 << 20}, 2),
                Random("c", Dtype::kBF16, {7, 5}, 3), Random("z.empty", Dtype::kF64, {0, 4}, 4)};
    path_ = dir_.File("model.safetensors");
    WriteRaw(path_, tensors_);
    key_.model = "test-model";
    key_.revision = "r1";
  }

  std::unique_ptr<PeerServer> Start(ServeOptions o = {}) {
    o.chunk_bytes = 1 << 20;
    auto s = PeerServer::ServeCheckpoint(path_, key_, o);
    EXPECT_OK(s);
    return s.ok() ? std::move(s).value() : nullptr;
  }

  PeerLoadOptions Pull(const std::string& url) {
    PeerLoadOptions o;
    o.peers = {url};
    o.request_timeout_ms = 3000;
    o.connect_timeout_ms = 3000;
    return o;
  }

  void ExpectSameAsFile(const LoadedCheckpoint& got) {
    ASSERT_EQ(got.tensors().size(), tensors_.size());
    for (const RawTensor& t : tensors_) {
      const LoadedTensor* g = got.Find(t.name);
      ASSERT_NE(g, nullptr) << t.name;
      ASSERT_EQ(g->nbytes, t.bytes.size()) << t.name;
      if (g->nbytes) {
        EXPECT_EQ(std::memcmp(g->data, t.bytes.data(), g->nbytes), 0) << t.name;
      }
    }
  }

  ScratchDir dir_;
  std::string path_;
  std::vector<RawTensor> tensors_;
  PeerKey key_;
};

TEST_F(HandoverTest, ASameHostSeedHandsItsMemoryOver) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull(server->url()), &report);
  ASSERT_OK(got);
  EXPECT_TRUE(report.handover);
  EXPECT_TRUE(report.failures.empty()) << report.failures[0];
  EXPECT_EQ(report.source, server->url());
  ASSERT_EQ(got->files().size(), 1u);
  EXPECT_THAT(got->files()[0].reason, HasSubstr("sealed shared memory mapped read-only"));
  ExpectSameAsFile(*got);
  // The client maps the seed's pages: the same memory, not a copy. mincore
  // sees them resident without the client having touched them.
  const LoadedTensor* big = got->Find("big");
  const auto page = reinterpret_cast<uintptr_t>(big->data) & ~uintptr_t{4095};
  unsigned char vec[4];
  ASSERT_EQ(::mincore(reinterpret_cast<void*>(page), 4 * 4096, vec), 0);
  for (unsigned char v : vec) EXPECT_TRUE(v & 1);
  // The session was closed and its bytes counted: the pull's DELETE is
  // answered once the server has done both, before LoadFromPeer returns.
  EXPECT_EQ(server->active_sessions(), 0);
  EXPECT_EQ(server->served_bytes(), got->total_bytes());
}

TEST_F(HandoverTest, HandedOverTensorsAreReadOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // The seed's threads run.
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto got = LoadFromPeer(key_, Pull(server->url()));
  ASSERT_OK(got);
  auto* p = static_cast<volatile unsigned char*>(got->Find("big")->data);
  EXPECT_DEATH({ p[100] = static_cast<unsigned char>(p[100] + 1); }, "");
}

TEST_F(HandoverTest, CopyOnWriteLeavesTheSeedsMemoryAlone) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto opts = Pull(server->url());
  opts.handover_copy_on_write = true;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  ASSERT_TRUE(report.handover);
  EXPECT_THAT(got->files()[0].reason, HasSubstr("copy-on-write"));
  auto* p = static_cast<unsigned char*>(got->Find("big")->data);
  const unsigned char before = p[100];
  p[100] = static_cast<unsigned char>(before + 1);  // This process's own page now.
  EXPECT_EQ(p[100], static_cast<unsigned char>(before + 1));
  auto again = LoadFromPeer(key_, Pull(server->url()));
  ASSERT_OK(again);
  EXPECT_EQ(static_cast<const unsigned char*>(again->Find("big")->data)[100], before);
  ExpectSameAsFile(*again);
}

TEST_F(HandoverTest, TheMemoryOutlivesTheSeedAndAClientHandsItOnAsASeed) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto opts = Pull(server->url());
  opts.become_seed = true;
  auto first = LoadFromPeerAndSeed(key_, opts);
  ASSERT_OK(first);
  ASSERT_TRUE(first->report.handover);
  ASSERT_NE(first->seed, nullptr);
  server.reset();  // The original seed goes: its memory stays while mapped.
  ExpectSameAsFile(*first->loaded);
  PeerLoadReport report;
  auto second = LoadFromPeer(key_, Pull(first->seed->url()), &report);
  ASSERT_OK(second);
  EXPECT_TRUE(report.handover) << (report.failures.empty() ? "" : report.failures[0]);
  ExpectSameAsFile(*second);
  // The same pages, mapped twice, not a copy made by the second seed.
  EXPECT_NE(second->Find("big")->data, first->loaded->Find("big")->data);
}

TEST_F(HandoverTest, VerifyCatchesMemoryThatDoesNotMatchTheManifest) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  ASSERT_OK(remote::CorruptServedForTesting(*server, "big", (1 << 20) + 5));
  auto opts = Pull(server->url());
  opts.handover_verify = true;
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  EXPECT_EQ(report.source, "disk:" + path_);
  ASSERT_GE(report.failures.size(), 2u);
  EXPECT_THAT(report.failures[0], HasSubstr("handed-over tensor 'big': chunk 1 does not match"));
  ExpectSameAsFile(*got);
}

TEST_F(HandoverTest, OffPullsOverUcx) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto opts = Pull(server->url());
  opts.handover = HandoverMode::kOff;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  ExpectSameAsFile(*got);
  auto bad = ParseHandoverMode("always");  // The one parser of its spelling.
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("handover \"always\" is not"));
  EXPECT_EQ(HandoverModeName(*ParseHandoverMode("off")), "off");
}

TEST_F(HandoverTest, ASeedWithoutHandoverOffersNone) {
  ServeOptions o;
  o.handover = false;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull(server->url()), &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  EXPECT_TRUE(report.failures.empty());
  ExpectSameAsFile(*got);
}

TEST_F(HandoverTest, WithATokenTheRequestMustBeSigned) {
  ServeOptions o;
  o.token = "s3cret-token";
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  auto opts = Pull(server->url());
  opts.token = o.token;
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, opts, &report);
  ASSERT_OK(got);
  EXPECT_TRUE(report.handover);
  // A session that is not open, and an unsigned request, are refused; so is a
  // session id asked without the token.
  auto c = remote::Control::Make(server->url(), o.token, 3000);
  ASSERT_OK(c);
  std::string session;
  auto body = c->Send("POST", "/v1/session", "", 256 << 20, &session);
  ASSERT_OK(body);
  auto m = remote::ParseManifest(*body);
  ASSERT_OK(m);
  ASSERT_FALSE(m->handover_socket.empty());
  auto unsigned_ask = remote::ReceiveHandover(m->handover_socket, session, "", 3000, 1);
  ASSERT_FALSE(unsigned_ask.ok());
  EXPECT_EQ(unsigned_ask.status().code(), StatusCode::kPermissionDenied);
  auto wrong = remote::ReceiveHandover(m->handover_socket, "0123456789abcdef", o.token, 3000, 1);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("no open session"));
  auto right =
      remote::ReceiveHandover(m->handover_socket, session, o.token, 3000, m->regions.size());
  ASSERT_OK(right);
  for (int fd : *right) ::close(fd);
  ASSERT_OK(c->Send("DELETE", "/v1/session/" + session, "0", 1024).status());
}

TEST_F(HandoverTest, SharedTensorsAreServedHandedOverAndTheirOwnersWritesStayTheirOwn) {
  // A process's own tensors (an inference server's parameters): copied once
  // into sealed shared memory, served with handover; the owner's
  // copy-on-write view of the same memory.
  std::vector<PeerServer::Tensor> mine;
  for (const RawTensor& t : tensors_) {
    PeerServer::Tensor s;
    s.name = t.name;
    s.dtype = t.dtype;
    s.shape.assign(t.shape.begin(), t.shape.end());
    s.data = t.bytes.data();
    mine.push_back(std::move(s));
  }
  auto shared = ShareTensors(mine, "handover-test");
  ASSERT_OK(shared);
  ExpectSameAsFile(*shared->sealed);
  ExpectSameAsFile(shared->copy_on_write);
  for (const LoadedTensor& t : shared->copy_on_write.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;
    EXPECT_NE(t.data, shared->sealed->Find(t.name)->data) << t.name;  // Two mappings.
  }
  auto server = PeerServer::Serve(shared->sealed, key_, ServeOptions{});
  ASSERT_OK(server);
  // The owner writes its view (post-processing in place): its page only.
  auto* own = static_cast<unsigned char*>(shared->copy_on_write.Find("big")->data);
  const unsigned char before = own[4096];
  own[4096] = static_cast<unsigned char>(before + 7);
  PeerLoadReport report;
  auto got = LoadFromPeer(key_, Pull((*server)->url()), &report);
  ASSERT_OK(got);
  EXPECT_TRUE(report.handover);
  ExpectSameAsFile(*got);
  EXPECT_EQ(static_cast<const unsigned char*>(got->Find("big")->data)[4096], before);
  EXPECT_EQ(static_cast<const unsigned char*>(shared->sealed->Find("big")->data)[4096], before);
  EXPECT_TRUE(report.failures.empty()) << report.failures[0];
  EXPECT_THAT(got->files()[0].reason, HasSubstr("sealed shared memory mapped read-only"));

  // Refused: a device tensor, a slice, a name given twice.
  std::vector<PeerServer::Tensor> bad = {mine[0]};
  bad[0].device = DeviceId::Emulated();
  EXPECT_THAT(ShareTensors(bad, "x").status().message(), HasSubstr("not in host memory"));
  bad[0].device = DeviceId::Cpu();
  bad[0].shard_dim = 0;
  EXPECT_THAT(ShareTensors(bad, "x").status().message(), HasSubstr("is a slice"));
  bad = {mine[0], mine[0]};
  EXPECT_THAT(ShareTensors(bad, "x").status().message(), HasSubstr("given twice"));
}

TEST(SharedMemoryTest, MapSharedRefusesUnsealedAndShortMemory) {
  auto shared = HostBuffer::AllocateShared(8192, "test");
  ASSERT_OK(shared);
  std::memset((*shared)->data(), 7, 8192);
  EXPECT_EQ((*shared)->shared_fd(), -1);  // Not sealed yet: nothing to hand over.
  // An unsealed memfd (anyone holding it could still write or shrink it).
  const int raw = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(raw, 0);
  ASSERT_EQ(::ftruncate(raw, 8192), 0);
  auto unsealed = HostBuffer::MapShared(raw, 8192, false);
  ASSERT_FALSE(unsealed.ok());
  EXPECT_EQ(unsealed.status().code(), StatusCode::kPermissionDenied);
  ASSERT_OK((*shared)->Seal());
  ASSERT_OK((*shared)->Seal());                                      // Once is enough.
  EXPECT_EQ(static_cast<unsigned char>((*shared)->data()[100]), 7);  // Same address, same bytes.
  auto short_map = HostBuffer::MapShared(::dup((*shared)->shared_fd()), 1 << 20, false);
  ASSERT_FALSE(short_map.ok());
  EXPECT_EQ(short_map.status().code(), StatusCode::kCorruption);
  auto map = HostBuffer::MapShared(::dup((*shared)->shared_fd()), 8192, false);
  ASSERT_OK(map);
  EXPECT_EQ(std::memcmp((*map)->data(), (*shared)->data(), 8192), 0);
  // Sealed memory cannot be mapped writable and shared by anyone.
  EXPECT_EQ(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, (*map)->shared_fd(), 0),
            MAP_FAILED);
  // A load into shared memory hands out sealed, read-only tensors.
  auto plain = HostBuffer::Allocate(4096);
  ASSERT_OK(plain);
  EXPECT_FALSE((*plain)->Seal().ok());
}

TEST(SharedMemoryTest, LoadsIntoSealedSharedMemoryAndRefusesWhatCannot) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const std::vector<RawTensor> tensors = {Random("x", Dtype::kF32, {300, 7}, 9),
                                          Random("y", Dtype::kBF16, {5000}, 10)};
  WriteRaw(path, tensors);
  for (IoMode mode : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect}) {
    LoadOptions o;
    o.shared_memory = true;
    o.mode = mode;
    auto got = Load(path, o);
    ASSERT_OK(got);
    for (const RawTensor& t : tensors) {
      const LoadedTensor* g = got->Find(t.name);
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(std::memcmp(g->data, t.bytes.data(), t.bytes.size()), 0);
    }
  }
  LoadOptions convert;
  convert.shared_memory = true;
  convert.dtype = Dtype::kF32;  // Converted tensors are moved into shared memory too.
  auto converted = Load(path, convert);
  ASSERT_OK(converted);
  EXPECT_EQ(converted->Find("y")->dtype, Dtype::kF32);
  LoadOptions mmap;
  mmap.shared_memory = true;
  mmap.mode = IoMode::kMmap;
  auto refused = Load(path, mmap);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("mode mmap"));
  LoadOptions device;
  device.shared_memory = true;
  device.device = DeviceId::Emulated();
  EXPECT_FALSE(Load(path, device).ok());
}

}  // namespace
}  // namespace tensorlift
