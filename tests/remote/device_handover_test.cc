// Same-host handover of device memory (remote/handover.h, Device::Export and
// Import): a seed's device allocations mapped by a client on the same device,
// no byte copied, or copied once device to device. Tested on the emulated
// device (its allocations are memfds once exported) across two processes
// (this binary re-run as the seed: DeviceHandoverSeed.Run) and within one;
// on a GPU (CUDA IPC) when there is one.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "remote/handover.h"
#include "remote/manifest.h"
#include "remote/peer_faults.h"
#include "remote/ucx_transport.h"
#include "tensorlift/remote.h"

extern char** environ;

namespace tensorlift {
namespace {

using tensorlift::test::ScratchDir;
using tensorlift::testing::Random;
using tensorlift::testing::RawTensor;
using tensorlift::testing::WriteRaw;
using ::testing::HasSubstr;

constexpr uint64_t kPokeOffset = 100;
constexpr std::byte kPoke{0x5A};

PeerKey TestKey() {
  PeerKey key;
  key.model = "test-model";
  key.revision = "r1";
  return key;
}

// The bytes of `bytes` at `p` on `device`, through a stream.
std::vector<std::byte> DeviceBytes(Device& device, const void* p, uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  if (bytes == 0) return out;
  auto stream = device.CreateStream();
  EXPECT_OK(stream);
  if (!stream.ok()) return out;
  EXPECT_OK((*stream)->CopyToHost(out.data(), static_cast<const std::byte*>(p), bytes));
  EXPECT_OK((*stream)->Synchronize());
  return out;
}

bool SameBytes(const std::vector<std::byte>& got, const std::vector<unsigned char>& want) {
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size()) == 0;
}

// `path` loaded onto `device` (into `*loaded`) and served.
Result<std::unique_ptr<PeerServer>> ServeOnDevice(const std::string& path,
                                                  const std::string& device,
                                                  std::shared_ptr<const LoadedCheckpoint>* loaded) {
  LoadOptions lo;
  lo.device = *ParseDevice(device);
  lo.copy = true;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint got, Load(path, lo));
  *loaded = std::make_shared<const LoadedCheckpoint>(std::move(got));
  ServeOptions so;
  so.chunk_bytes = 1 << 20;
  return PeerServer::Serve(*loaded, TestKey(), so);
}

// The seed's side, run in a child process (SeedProcess): serves the
// checkpoint TL_DH_SEED_PATH loaded onto TL_DH_SEED_DEVICE, writes its URL
// to descriptor TL_DH_URL_FD, then obeys lines on TL_DH_CMD_FD: "poke"
// writes kPoke at kPokeOffset of tensor "big" (through the device) and
// answers "ok"; "exit" (or end of input) ends it, freeing everything.
TEST(DeviceHandoverSeed, Run) {
  const char* path = std::getenv("TL_DH_SEED_PATH");
  if (path == nullptr) GTEST_SKIP() << "the seed of the two-process tests, run by them";
  const int url_fd = std::atoi(std::getenv("TL_DH_URL_FD"));
  const int cmd_fd = std::atoi(std::getenv("TL_DH_CMD_FD"));
  const std::string device_name = std::getenv("TL_DH_SEED_DEVICE");
  std::shared_ptr<const LoadedCheckpoint> shared;
  auto server = ServeOnDevice(path, device_name, &shared);
  ASSERT_OK(server);
  const std::string url = (*server)->url() + "\n";
  ASSERT_EQ(::write(url_fd, url.data(), url.size()), static_cast<ssize_t>(url.size()));
  const LoadedTensor* big = shared->Find("big");
  ASSERT_NE(big, nullptr);
  auto where = ParseDevice(device_name);
  ASSERT_OK(where);
  auto device = OpenDevice(where->type, where->index);
  ASSERT_OK(device);
  std::string line;
  for (char c; ::read(cmd_fd, &c, 1) == 1;) {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line == "exit") break;
    if (line == "poke") {
      auto stream = (*device)->CreateStream();
      ASSERT_OK(stream);
      const std::byte b = kPoke;
      ASSERT_OK((*stream)->CopyToDevice(static_cast<std::byte*>(big->data) + kPokeOffset, &b, 1));
      ASSERT_OK((*stream)->Synchronize());
      ASSERT_EQ(::write(url_fd, "ok\n", 3), 3);
    }
    line.clear();
  }
}

// This test binary run as the seed (DeviceHandoverSeed.Run) in a child
// process, with `env` added to the environment.
class SeedProcess {
 public:
  SeedProcess(const std::string& path, const std::string& device,
              const std::vector<std::string>& env = {}) {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) return;
    std::vector<std::string> vars = {"TL_DH_SEED_PATH=" + path, "TL_DH_SEED_DEVICE=" + device,
                                     "TL_DH_URL_FD=" + std::to_string(up[1]),
                                     "TL_DH_CMD_FD=" + std::to_string(down[0])};
    vars.insert(vars.end(), env.begin(), env.end());
    for (char** e = environ; *e; ++e) vars.push_back(*e);
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=DeviceHandoverSeed.Run";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(up[0]);
      ::close(down[1]);
      ::execve(exe.c_str(), argv, envp.data());
      ::_exit(127);
    }
    ::close(up[1]);
    ::close(down[0]);
    from_ = up[0];
    to_ = down[1];
    url_ = ReadLine(60000);
    if (url_.compare(0, 7, "http://") != 0) url_.clear();
  }
  ~SeedProcess() {
    Exit();
    if (from_ >= 0) ::close(from_);
  }
  const std::string& url() const { return url_; }
  // Asks the seed to write kPoke into its "big"; true once it did.
  bool Poke() { return Send("poke\n") && ReadLine(20000) == "ok"; }
  // Ends the seed; its exit status (-1 when it did not exit normally).
  int Exit() {
    if (pid_ <= 0) return -1;
    Send("exit\n");
    if (to_ >= 0) ::close(to_);
    to_ = -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  bool Send(const std::string& line) {
    return to_ >= 0 && ::write(to_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  }
  std::string ReadLine(int timeout_ms) {
    std::string line;
    for (;;) {
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return line;
      char c;
      if (::read(from_, &c, 1) != 1 || c == '\n') return line;
      line += c;
    }
  }
  pid_t pid_ = -1;
  int from_ = -1, to_ = -1;
  std::string url_;
};

class DeviceHandoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!remote::UcxBuilt()) GTEST_SKIP() << remote::UcxVersion();
    if (remote::HandoverHostId().empty()) GTEST_SKIP() << "no /proc/sys/kernel/random/boot_id";
    tensors_ = {Random("a", Dtype::kF32, {64, 33}, 1), Random("big", Dtype::kU8, {3 << 20}, 2),
                Random("c", Dtype::kBF16, {7, 5}, 3), Random("z.empty", Dtype::kF64, {0, 4}, 4)};
    path_ = dir_.File("model.safetensors");
    WriteRaw(path_, tensors_);
    auto device = OpenDevice(DeviceType::kEmulated, 0);
    ASSERT_OK(device);
    emulated_ = *device;
  }

  PeerLoadOptions Pull(const std::string& url, const std::string& device = "emulated:0") {
    PeerLoadOptions o;
    o.peers = {url};
    o.device = *ParseDevice(device);
    o.request_timeout_ms = 5000;
    o.connect_timeout_ms = 5000;
    o.local = false;
    return o;
  }

  void ExpectSameAsFile(const LoadedCheckpoint& got, Device* device) {
    ASSERT_EQ(got.tensors().size(), tensors_.size());
    for (const RawTensor& t : tensors_) {
      const LoadedTensor* g = got.Find(t.name);
      ASSERT_NE(g, nullptr) << t.name;
      ASSERT_EQ(g->nbytes, t.bytes.size()) << t.name;
      if (!g->nbytes) continue;
      if (device) {
        EXPECT_EQ(g->device, device->kind()) << t.name;
        EXPECT_TRUE(SameBytes(DeviceBytes(*device, g->data, g->nbytes), t.bytes)) << t.name;
      } else {
        EXPECT_EQ(std::memcmp(g->data, t.bytes.data(), g->nbytes), 0) << t.name;
      }
    }
  }

  std::byte PokedByte(const LoadedCheckpoint& got) {
    return DeviceBytes(*emulated_,
                       static_cast<const std::byte*>(got.Find("big")->data) + kPokeOffset, 1)[0];
  }

  uint64_t Imported() {
    auto counts = GetEmulatedDeviceCounts(*emulated_);
    EXPECT_OK(counts);
    return counts.ok() ? counts->imported_allocations : 0;
  }

  ScratchDir dir_;
  std::string path_;
  std::vector<RawTensor> tensors_;
  std::shared_ptr<Device> emulated_;
};

TEST_F(DeviceHandoverTest, AnotherProcessMapsTheSeedsDeviceMemory) {
  SeedProcess seed(path_, "emulated:0");
  ASSERT_FALSE(seed.url().empty());
  const uint64_t before = Imported();
  PeerLoadReport report;
  {
    auto got = LoadFromPeer(TestKey(), Pull(seed.url()), &report);
    ASSERT_OK(got);
    ASSERT_TRUE(report.handover) << (report.failures.empty() ? "" : report.failures[0]);
    EXPECT_TRUE(report.failures.empty());
    ASSERT_EQ(got->files().size(), 1u);
    EXPECT_THAT(got->files()[0].reason, HasSubstr("of emulated:0 mapped, no byte copied"));
    ExpectSameAsFile(*got, emulated_.get());
    // The tensors lie in memory imported from the seed, not copies.
    EXPECT_GE(Imported(), before + 1);
    const std::byte original = PokedByte(*got);
    ASSERT_NE(original, kPoke);
    // The seed writes its memory: the client sees it (the same pages).
    ASSERT_TRUE(seed.Poke());
    EXPECT_EQ(PokedByte(*got), kPoke);
    // The seed exits (its allocations freed and poisoned): the client's
    // mapping keeps the bytes.
    EXPECT_EQ(seed.Exit(), 0);
    EXPECT_EQ(PokedByte(*got), kPoke);
    for (const RawTensor& t : tensors_) {
      if (t.name == "big" || t.bytes.empty()) continue;
      const LoadedTensor* g = got->Find(t.name);
      EXPECT_TRUE(SameBytes(DeviceBytes(*emulated_, g->data, g->nbytes), t.bytes)) << t.name;
    }
  }
  EXPECT_EQ(Imported(), before);  // Unmapped with the last tensor.
}

TEST_F(DeviceHandoverTest, CopyOnWriteOwnsOneDeviceCopy) {
  SeedProcess seed(path_, "emulated:0");
  ASSERT_FALSE(seed.url().empty());
  const uint64_t before = Imported();
  auto opts = Pull(seed.url());
  opts.handover_copy_on_write = true;
  PeerLoadReport report;
  auto got = LoadFromPeer(TestKey(), opts, &report);
  ASSERT_OK(got);
  ASSERT_TRUE(report.handover) << (report.failures.empty() ? "" : report.failures[0]);
  EXPECT_THAT(got->files()[0].reason, HasSubstr("copied once on the device"));
  EXPECT_EQ(Imported(), before);  // The seed's memory let go after the copy.
  ASSERT_TRUE(seed.Poke());
  EXPECT_NE(PokedByte(*got), kPoke);  // Its own memory: the seed's write is not seen.
  EXPECT_EQ(seed.Exit(), 0);
  ExpectSameAsFile(*got, emulated_.get());
}

TEST_F(DeviceHandoverTest, AnotherDeviceIsRefusedAndTheClientPulls) {
  SeedProcess seed(path_, "emulated:0", {"TENSORLIFT_EMULATED_DEVICE_ID=emulated:other-gpu"});
  ASSERT_FALSE(seed.url().empty());
  PeerLoadReport report;
  auto got = LoadFromPeer(TestKey(), Pull(seed.url()), &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("no handover"));
  EXPECT_THAT(report.failures[0], HasSubstr("on device emulated:other-gpu"));
  EXPECT_THAT(report.failures[0], HasSubstr("pulled over UCX"));
  ExpectSameAsFile(*got, emulated_.get());
}

TEST_F(DeviceHandoverTest, AHostDestinationPulls) {
  SeedProcess seed(path_, "emulated:0");
  ASSERT_FALSE(seed.url().empty());
  PeerLoadReport report;
  auto got = LoadFromPeer(TestKey(), Pull(seed.url(), "cpu"), &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  ASSERT_EQ(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("this load goes to host memory"));
  ExpectSameAsFile(*got, nullptr);
}

// One process: the seed's and the client's emulated device are one device;
// importing its own export maps the memfd a second time.
TEST_F(DeviceHandoverTest, InOneProcessAndTheSeedGoes) {
  std::shared_ptr<const LoadedCheckpoint> shared;
  auto server = ServeOnDevice(path_, "emulated:0", &shared);
  ASSERT_OK(server);
  PeerLoadReport report;
  auto got = LoadFromPeer(TestKey(), Pull((*server)->url()), &report);
  ASSERT_OK(got);
  ASSERT_TRUE(report.handover) << (report.failures.empty() ? "" : report.failures[0]);
  EXPECT_NE(got->Find("big")->data, shared->Find("big")->data);  // A second mapping.
  ExpectSameAsFile(*got, emulated_.get());
  // The seed's memory is written through its own address: seen through the client's.
  {
    auto stream = emulated_->CreateStream();
    ASSERT_OK(stream);
    const std::byte b = kPoke;
    ASSERT_OK((*stream)->CopyToDevice(
        static_cast<std::byte*>(shared->Find("big")->data) + kPokeOffset, &b, 1));
    ASSERT_OK((*stream)->Synchronize());
  }
  EXPECT_EQ(PokedByte(*got), kPoke);
  server->reset();
  shared.reset();  // Freed: detached, then poisoned; the client keeps the bytes.
  EXPECT_EQ(PokedByte(*got), kPoke);
  const LoadedTensor* a = got->Find("a");
  EXPECT_TRUE(SameBytes(DeviceBytes(*emulated_, a->data, a->nbytes), tensors_[0].bytes));
}

TEST_F(DeviceHandoverTest, VerifyCatchesMemoryThatDoesNotMatchTheManifest) {
  SeedProcess seed(path_, "emulated:0");
  ASSERT_FALSE(seed.url().empty());
  // A manifest checksum changed in this process's own seed of the same file.
  std::shared_ptr<const LoadedCheckpoint> shared;
  auto server = ServeOnDevice(path_, "emulated:0", &shared);
  ASSERT_OK(server);
  ASSERT_OK(remote::CorruptServedForTesting(**server, "big", (1 << 20) + 5));
  auto opts = Pull((*server)->url());
  opts.handover_verify = true;
  opts.fallback_path = path_;
  PeerLoadReport report;
  auto got = LoadFromPeer(TestKey(), opts, &report);
  ASSERT_OK(got);
  EXPECT_FALSE(report.handover);
  ASSERT_GE(report.failures.size(), 1u);
  EXPECT_THAT(report.failures[0], HasSubstr("handed-over tensor 'big': chunk 1 does not match"));
  ExpectSameAsFile(*got, emulated_.get());
  // The healthy seed in the other process passes the same check.
  opts = Pull(seed.url());
  opts.handover_verify = true;
  PeerLoadReport ok_report;
  auto verified = LoadFromPeer(TestKey(), opts, &ok_report);
  ASSERT_OK(verified);
  EXPECT_TRUE(ok_report.handover);
  EXPECT_THAT(verified->files()[0].reason, HasSubstr("every chunk checked"));
}

TEST(EmulatedExportTest, ExportImportAndWhatIsRefused) {
  auto device = MakeEmulatedDevice();
  auto buffer = device->Allocate(10000);
  ASSERT_OK(buffer);
  std::vector<std::byte> bytes(10000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7);
  auto stream = device->CreateStream();
  ASSERT_OK(stream);
  ASSERT_OK((*stream)->CopyToDevice((*buffer)->data(), bytes.data(), bytes.size()));
  ASSERT_OK((*stream)->Synchronize());
  auto exported = device->Export(**buffer);
  ASSERT_OK(exported);
  EXPECT_GE(exported->fd, 0);
  EXPECT_EQ(exported->bytes, 10000u);
  EXPECT_EQ(exported->device_id, device->identity());
  EXPECT_THAT(device->identity(), HasSubstr("emulated:0@"));
  // Its bytes moved into shared memory at the same address.
  EXPECT_TRUE(DeviceBytes(*device, (*buffer)->data(), bytes.size()) == bytes);
  // Another device of the same "GPU" imports it.
  auto other = MakeEmulatedDevice();
  ExportedMemory copy;
  copy.device_id = exported->device_id;
  copy.fd = ::fcntl(exported->fd, F_DUPFD_CLOEXEC, 0);
  copy.bytes = exported->bytes;
  auto imported = other->Import(std::move(copy));
  ASSERT_OK(imported);
  EXPECT_TRUE(DeviceBytes(*other, (*imported)->data(), bytes.size()) == bytes);
  // Another device's memory, and a memfd not sealed against shrinking.
  EmulatedDeviceOptions elsewhere;
  elsewhere.id = "emulated:elsewhere";
  auto far = MakeEmulatedDevice(elsewhere);
  ExportedMemory wrong;
  wrong.device_id = exported->device_id;
  wrong.fd = ::fcntl(exported->fd, F_DUPFD_CLOEXEC, 0);
  wrong.bytes = 10000;
  auto refused = far->Import(std::move(wrong));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("this device is 'emulated:elsewhere'"));
  ExportedMemory unsealed;
  unsealed.device_id = device->identity();
  unsealed.fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed.fd, 16384), 0);
  unsealed.bytes = 16384;
  auto bad = device->Import(std::move(unsealed));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  // A short memfd (a seed claiming more than it sent).
  ExportedMemory big;
  big.device_id = device->identity();
  big.fd = ::fcntl(exported->fd, F_DUPFD_CLOEXEC, 0);
  big.bytes = 1 << 20;
  auto short_map = device->Import(std::move(big));
  ASSERT_FALSE(short_map.ok());
  EXPECT_EQ(short_map.status().code(), StatusCode::kCorruption);
  // Host memory is not exported this way.
  auto host = MakeHostDevice();
  auto plain = host->Allocate(4096);
  ASSERT_OK(plain);
  EXPECT_EQ(host->Export(**plain).status().code(), StatusCode::kUnimplemented);
  // Freeing the exporter's buffer leaves the importer's bytes.
  buffer->reset();
  EXPECT_TRUE(DeviceBytes(*other, (*imported)->data(), bytes.size()) == bytes);
}

TEST(DeviceHandoverManifestTest, TheDeviceFieldIsOptionalAndChecked) {
  remote::Manifest m;
  m.key = TestKey();
  m.handover_host = "host-id";
  m.handover_socket = "@tensorlift/1/abc";
  auto plain = remote::ParseManifest(m.ToJson());
  ASSERT_OK(plain);
  EXPECT_EQ(plain->handover_device, "");
  m.handover_device = "GPU-01234567-89ab-cdef-0123-456789abcdef";
  auto parsed = remote::ParseManifest(m.ToJson());
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->handover_device, m.handover_device);
  std::string json = m.ToJson();
  const std::string field = "\"device\":\"" + m.handover_device + "\"";
  for (const std::string& bad :
       {std::string("\"device\":\"two words\""), std::string("\"device\":\"\""),
        std::string("\"device\":7"), std::string("\"device\":\"") + std::string(201, 'x') + "\""}) {
    std::string j = json;
    j.replace(j.find(field), field.size(), bad);
    auto r = remote::ParseManifest(j);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << bad;
  }
  std::string unknown = json;
  unknown.replace(unknown.find(field), field.size(), field + ",\"pci\":\"x\"");
  EXPECT_FALSE(remote::ParseManifest(unknown).ok());
}

// A fake seed's handover socket: answers one request with "OK 1" and then
// `record`, `fds` descriptors attached.
class FakeDeviceSeed {
 public:
  FakeDeviceSeed(std::string record, int fds) {
    name_ = "@tensorlift-test/" + std::to_string(::getpid()) + "/" + std::to_string(++count_);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name_.data() + 1, name_.size() - 1);
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    listen_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listen_, 4) != 0)
      return;
    thread_ = std::thread([this, record, fds] {
      const int conn = ::accept(listen_, nullptr, nullptr);
      if (conn < 0) return;
      char buf[1024];
      (void)!::recv(conn, buf, sizeof buf, 0);
      (void)!::send(conn, "OK 1", 4, MSG_NOSIGNAL);
      std::vector<int> memfds;
      for (int i = 0; i < fds; ++i) memfds.push_back(::memfd_create("fake", MFD_CLOEXEC));
      std::string text = record;
      iovec iov{text.data(), text.size()};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (fds > 0) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds);
        std::memcpy(CMSG_DATA(c), memfds.data(), sizeof(int) * fds);
      }
      (void)!::sendmsg(conn, &msg, MSG_NOSIGNAL);
      for (int fd : memfds) ::close(fd);
      (void)!::recv(conn, buf, sizeof buf, 0);  // Until the client is done.
      ::close(conn);
    });
  }
  ~FakeDeviceSeed() {
    if (thread_.joinable()) thread_.join();
    if (listen_ >= 0) ::close(listen_);
  }
  const std::string& name() const { return name_; }

 private:
  static inline int count_ = 0;
  std::string name_;
  int listen_ = -1;
  std::thread thread_;
};

TEST(DeviceHandoverProtocolTest, RecordsAreParsedStrictly) {
  {
    FakeDeviceSeed seed("D 4096 123 " + std::string(128, 'a'), 1);
    auto got = remote::ReceiveDeviceHandover(seed.name(), "abcd", "", 3000, 1);
    ASSERT_OK(got);
    EXPECT_EQ((*got)[0].bytes, 4096u);
    EXPECT_EQ((*got)[0].pid, 123);
    EXPECT_EQ((*got)[0].handle, std::string(64, '\xaa'));
    EXPECT_GE((*got)[0].fd, 0);
  }
  for (const auto& [record, fds] :
       std::vector<std::pair<std::string, int>>{{"D 4096 123", 0},
                                                {"D 4096 123 - extra", 0},
                                                {"X 4096 123 -", 0},
                                                {"D -1 123 -", 0},
                                                {"D 99999999999999999999999 123 -", 0},
                                                {"D 4096 99999999999 -", 0},
                                                {"D 4096 123 abc", 0},
                                                {"D 4096 123 zz", 0},
                                                {"D 4096 123 " + std::string(514, 'a'), 0},
                                                {"D 4096 123 -", 2}}) {
    FakeDeviceSeed seed(record, fds);
    auto got = remote::ReceiveDeviceHandover(seed.name(), "abcd", "", 3000, 1);
    ASSERT_FALSE(got.ok()) << record;
    EXPECT_EQ(got.status().code(), StatusCode::kCorruption) << record;
    EXPECT_THAT(got.status().message(), HasSubstr("malformed record for region 0")) << record;
  }
}

// A GPU: CUDA IPC between two processes on it (skipped without one).
TEST_F(DeviceHandoverTest, CudaIpcBetweenTwoProcesses) {
  auto gpu = OpenDevice(DeviceType::kCuda, 0);
  if (!gpu.ok()) GTEST_SKIP() << gpu.status().message();
  EXPECT_THAT((*gpu)->identity(), HasSubstr("GPU-"));
  // Not in the process that exported it.
  auto mine = (*gpu)->Allocate(1 << 20);
  ASSERT_OK(mine);
  auto exported = (*gpu)->Export(**mine);
  ASSERT_OK(exported);
  EXPECT_EQ(exported->handle.size(), 64u);
  auto self = (*gpu)->Import(std::move(exported).value());
  ASSERT_FALSE(self.ok());
  EXPECT_THAT(self.status().message(), HasSubstr("process that exported it"));
  SeedProcess seed(path_, "cuda:0");
  ASSERT_FALSE(seed.url().empty());
  for (bool copy : {false, true}) {
    auto opts = Pull(seed.url(), "cuda:0");
    opts.handover_copy_on_write = copy;
    PeerLoadReport report;
    auto got = LoadFromPeer(TestKey(), opts, &report);
    ASSERT_OK(got);
    EXPECT_TRUE(report.handover) << (report.failures.empty() ? "" : report.failures[0]);
    ExpectSameAsFile(*got, gpu->get());
  }
  EXPECT_EQ(seed.Exit(), 0);
}

}  // namespace
}  // namespace tensorlift
