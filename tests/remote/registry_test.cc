// Registry against a real etcd (started per test on free ports in a temporary
// directory; the tests skip when no etcd binary is installed).
#include "remote/registry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"

namespace tensorlift::remote {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr char kDigest[] = "0123456789abcdef";
constexpr milliseconds kTimeout{2000};

// A port nothing listens on right now (bound, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string FindEtcd() {
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t begin = 0;
    while (begin <= dirs.size()) {
      size_t end = dirs.find(':', begin);
      if (end == std::string::npos) end = dirs.size();
      const std::string candidate = dirs.substr(begin, end - begin) + "/etcd";
      if (end > begin && access(candidate.c_str(), X_OK) == 0) return candidate;
      begin = end + 1;
    }
  }
  if (access("/usr/bin/etcd", X_OK) == 0) return "/usr/bin/etcd";
  return "";
}

std::string B64(std::string_view in) {
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    if (i + 1 < in.size()) v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
    if (i + 2 < in.size()) v |= static_cast<uint8_t>(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kB64[v & 63] : '=';
  }
  return out;
}

// A minimal HTTP/1.0 POST to 127.0.0.1:port (the test's own client, so that
// the tests do not depend on the code under test to set etcd up). Returns the
// whole reply (status line, headers, body), or "" on failure.
std::string RawPost(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "POST " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" +
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    size_t sent = 0;
    while (sent < request.size()) {
      const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

// Extracts the string value of "field" from a small JSON text.
std::string JsonField(const std::string& json, const std::string& field) {
  const std::string needle = "\"" + field + "\":\"";
  const size_t at = json.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = at + needle.size();
  return json.substr(begin, json.find('"', begin) - begin);
}

SeedInfo Seed(std::string url, double load, int rank = 0, int world = 1) {
  SeedInfo seed;
  seed.key_digest = kDigest;
  seed.url = std::move(url);
  seed.rank = rank;
  seed.world = world;
  seed.load = load;
  return seed;
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string etcd = FindEtcd();
    if (etcd.empty()) GTEST_SKIP() << "etcd is not installed (not on PATH, no /usr/bin/etcd)";
    scratch_ = std::make_unique<test::ScratchDir>("tl_registry_test");
    dir_ = scratch_->path();
    port_ = FreePort();
    const int peer_port = FreePort();
    ASSERT_GT(port_, 0);
    ASSERT_GT(peer_port, 0);
    url_ = "http://127.0.0.1:" + std::to_string(port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
    const std::string data_dir = dir_ + "/data";
    const std::string log = dir_ + "/etcd.log";
    std::vector<std::string> args = {etcd,
                                     "--data-dir",
                                     data_dir,
                                     "--listen-client-urls",
                                     url_,
                                     "--advertise-client-urls",
                                     url_,
                                     "--listen-peer-urls",
                                     peer_url,
                                     "--initial-advertise-peer-urls",
                                     peer_url,
                                     "--initial-cluster",
                                     "default=" + peer_url};
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Ready when a range answers (a watchdog of 60 s: a loaded machine starts it slowly).
    const auto deadline = steady_clock::now() + std::chrono::seconds(60);
    while (RawPost(port_, "/v3/kv/range", "{\"key\":\"AA==\"}").rfind("HTTP/1.0 200", 0) != 0) {
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "etcd exited; see " << log;
      ASSERT_LT(steady_clock::now(), deadline) << "etcd did not answer within 60 s; see " << log;
      std::this_thread::sleep_for(milliseconds(50));
    }
    auto registry = Registry::Connect(url_, kTimeout);
    ASSERT_OK(registry);
    registry_ = std::move(*registry);
  }

  void TearDown() override {
    registry_.reset();
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    scratch_.reset();
  }

  std::vector<SeedInfo> ListOrDie() {
    auto seeds = registry_->List(kDigest);
    EXPECT_OK(seeds);
    return seeds.ok() ? *seeds : std::vector<SeedInfo>{};
  }

  // Puts key -> value straight through the gateway, without a lease.
  void RawPut(const std::string& key, const std::string& value) {
    const std::string reply = RawPost(
        port_, "/v3/kv/put", "{\"key\":\"" + B64(key) + "\",\"value\":\"" + B64(value) + "\"}");
    ASSERT_EQ(reply.rfind("HTTP/1.0 200", 0), 0u) << reply;
  }

  // The range reply for the entries under kDigest, straight from the gateway.
  std::string RawRange() {
    const std::string prefix = std::string("/tensorlift/seeds/") + kDigest + "/";
    return RawPost(port_, "/v3/kv/range",
                   "{\"key\":\"" + B64(prefix) + "\",\"range_end\":\"" +
                       B64(prefix.substr(0, prefix.size() - 1) + "0") + "\"}");
  }

  // Revokes the lease of the one entry under kDigest, behind the registry's
  // back; `revoked`: its ID.
  void RevokeTheOnlyLease(std::string* revoked = nullptr) {
    const std::string range = RawRange();
    const std::string lease = JsonField(range, "lease");
    ASSERT_FALSE(lease.empty()) << range;
    const std::string reply = RawPost(port_, "/v3/lease/revoke", "{\"ID\":\"" + lease + "\"}");
    ASSERT_EQ(reply.rfind("HTTP/1.0 200", 0), 0u) << reply;
    if (revoked) *revoked = lease;
  }

  std::unique_ptr<test::ScratchDir> scratch_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string url_;
  std::unique_ptr<Registry> registry_;
};

TEST_F(RegistryTest, RegisterThenList) {
  SeedInfo mine = Seed("http://10.0.0.1:8000", 0, 1, 2);
  mine.content = "0123456789abcdef0123456789abcdef";  // A content root round trips.
  auto reg = registry_->Register(mine, 10);
  ASSERT_OK(reg);
  const std::vector<SeedInfo> seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 1u);
  EXPECT_EQ(seeds[0].content, mine.content);
  EXPECT_EQ(seeds[0].key_digest, kDigest);
  EXPECT_EQ(seeds[0].url, "http://10.0.0.1:8000");
  EXPECT_EQ(seeds[0].rank, 1);
  EXPECT_EQ(seeds[0].world, 2);
  EXPECT_EQ(seeds[0].load, 0);
  EXPECT_EQ(seeds[0].id.size(), 16u);
  EXPECT_EQ(seeds[0].id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_OK((*reg)->health());
  // Another digest sees nothing.
  auto other = registry_->List("fedcba9876543210");
  ASSERT_OK(other);
  EXPECT_TRUE(other->empty());
}

TEST_F(RegistryTest, SortedByLoadAndUpdateLoadReorders) {
  auto busy = registry_->Register(Seed("http://busy:1", 3.5), 10);
  auto idle = registry_->Register(Seed("http://idle:1", 0.25), 10);
  ASSERT_OK(busy);
  ASSERT_OK(idle);
  std::vector<SeedInfo> seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 2u);
  EXPECT_EQ(seeds[0].url, "http://idle:1");
  EXPECT_EQ(seeds[0].load, 0.25);
  EXPECT_EQ(seeds[1].url, "http://busy:1");
  EXPECT_EQ(seeds[1].load, 3.5);
  EXPECT_NE(seeds[0].id, seeds[1].id);

  ASSERT_OK((*idle)->UpdateLoad(7));
  seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 2u);
  EXPECT_EQ(seeds[0].url, "http://busy:1");
  EXPECT_EQ(seeds[1].url, "http://idle:1");
  EXPECT_EQ(seeds[1].load, 7);
  EXPECT_EQ((*idle)->UpdateLoad(-1).code(), StatusCode::kInvalidArgument);

  // Equal loads: ties by id.
  ASSERT_OK((*busy)->UpdateLoad(7));
  seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 2u);
  EXPECT_LT(seeds[0].id, seeds[1].id);
}

// With a TTL of 600 s the entry would outlive the test unless revoked, and a
// destructor that waited out the renewal thread's sleep (TTL/3: 200 s) would
// take that long at least: the 60 s bound is a watchdog that such a wait
// cannot pass, not a measure (the destructor wakes the thread at once).
TEST_F(RegistryTest, DestroyingTheRegistrationRemovesTheEntry) {
  auto reg = registry_->Register(Seed("http://a:1", 0), 600);
  ASSERT_OK(reg);
  ASSERT_EQ(ListOrDie().size(), 1u);
  const auto start = steady_clock::now();
  reg->reset();  // Revokes the lease.
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_TRUE(ListOrDie().empty());
}

TEST_F(RegistryTest, RenewalKeepsTheEntryPastItsTtl) {
  auto reg = registry_->Register(Seed("http://a:1", 0), 2);
  ASSERT_OK(reg);
  std::this_thread::sleep_for(milliseconds(4500));
  EXPECT_EQ(ListOrDie().size(), 1u);
  EXPECT_OK((*reg)->health());
}

TEST_F(RegistryTest, ReRegistersWhenTheLeaseIsRevokedUnderIt) {
  auto reg = registry_->Register(Seed("http://a:1", 0), 2);
  ASSERT_OK(reg);
  std::string revoked;
  ASSERT_NO_FATAL_FAILURE(RevokeTheOnlyLease(&revoked));
  // The renewal thread (every TTL/3) finds the lease gone and puts the entry
  // back, under a new lease: the revoke took the old one's entry with it, so
  // an entry seen now is the new one, whether or not the thread came before
  // the look (a watchdog of 60 s, not a measure).
  const auto deadline = steady_clock::now() + std::chrono::seconds(60);
  std::string lease;
  while ((lease = JsonField(RawRange(), "lease")).empty() && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_NE(lease, "");
  EXPECT_NE(lease, revoked);
  ASSERT_EQ(ListOrDie().size(), 1u);
  EXPECT_OK((*reg)->health());
  // UpdateLoad works on the new lease, and re-registers itself when it finds
  // the lease gone before the renewal thread does.
  ASSERT_NO_FATAL_FAILURE(RevokeTheOnlyLease());
  Status status = (*reg)->UpdateLoad(2);
  ASSERT_OK(status);
  const std::vector<SeedInfo> seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 1u);
  EXPECT_EQ(seeds[0].load, 2);
}

TEST_F(RegistryTest, HealthReportsRenewalFailuresAndDestructionStaysBounded) {
  auto reg = registry_->Register(Seed("http://a:1", 0), 2);
  ASSERT_OK(reg);
  EXPECT_OK((*reg)->health());
  kill(pid_, SIGKILL);  // etcd goes away under the renewal thread.
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  // The renewal thread's next renewal (TTL/3) fails: a watchdog of 60 s.
  const auto deadline = steady_clock::now() + std::chrono::seconds(60);
  while ((*reg)->health().ok() && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  const Status health = (*reg)->health();
  EXPECT_EQ(health.code(), StatusCode::kUnavailable) << health.ToString();
  EXPECT_NE(health.message().find("/v3/lease/keepalive"), std::string::npos) << health.ToString();
  EXPECT_EQ((*reg)->UpdateLoad(1).code(), StatusCode::kUnavailable);
  const auto start = steady_clock::now();
  reg->reset();  // The revoke fails (refused); the wait is bounded by kTimeout.
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(60));  // A watchdog.
}

TEST_F(RegistryTest, EntryOfADeadProcessExpiresAfterItsTtl) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    char ok = 0;
    if (auto registry = Registry::Connect(url_, kTimeout); registry.ok()) {
      auto reg = (*registry)->Register(Seed("http://dead:1", 0), 2);
      ok = reg.ok() ? 1 : 0;
      if (reg.ok()) reg->release();  // Never destroyed: no revoke.
    }
    if (write(pipe_fds[1], &ok, 1) != 1) _exit(2);
    _exit(0);  // No destructors run; the lease is left to expire.
  }
  close(pipe_fds[1]);
  char ok = 0;
  ASSERT_EQ(read(pipe_fds[0], &ok, 1), 1);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(ok, 1);
  ASSERT_EQ(ListOrDie().size(), 1u);
  // etcd expires the lease after 2 s: a watchdog of 60 s, not a measure.
  const auto start = steady_clock::now();
  while (!ListOrDie().empty() && steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(ListOrDie().empty()) << "entry still present 60 s after its owner died (TTL 2 s)";
}

TEST_F(RegistryTest, InvalidEntriesAreSkipped) {
  const std::string p = std::string("/tensorlift/seeds/") + kDigest + "/";
  // One valid entry written by hand, and one per failure class.
  RawPut(p + "0/aa", R"({"url":"http://ok:1","rank":0,"world":1,"load":1,"id":"aa"})");
  RawPut(p + "0/b1", "not json");
  RawPut(p + "0/b2", R"([1,2])");
  RawPut(p + "0/b3", R"({"url":"http://x:1","rank":0,"world":1,"id":"b3"})");            // No load.
  RawPut(p + "0/b4", R"({"url":"https://x:1","rank":0,"world":1,"load":0,"id":"b4"})");  // Scheme.
  RawPut(p + "2/b5", R"({"url":"http://x:1","rank":2,"world":2,"load":0,"id":"b5"})");   // Rank.
  RawPut(p + "0/b6", R"({"url":"http://x:1","rank":0,"world":0,"load":0,"id":"b6"})");   // World.
  RawPut(p + "0/b7", R"({"url":"http://x:1","rank":0,"world":70000,"load":0,"id":"b7"})");
  RawPut(p + "0/b8", R"({"url":"http://x:1","rank":0,"world":1,"load":-1,"id":"b8"})");  // Load.
  RawPut(p + "0/b9", R"({"url":"http://x:1","rank":0,"world":1,"load":1e999,"id":"b9"})");
  RawPut(p + "0/zz", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"zz"})");    // Id.
  RawPut(p + "0/ba", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"bb"})");    // Key.
  RawPut(p + "0/bc", R"({"url":"http://x:1","rank":"0","world":1,"load":0,"id":"bc"})");  // Type.
  RawPut(p + "0/bd", R"({"url":"http://)" + std::string(2000, 'x') +
                         R"(:1","rank":0,"world":1,"load":0,"id":"bd"})");  // Url size.
  RawPut(p + "0/be", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"be","pad":")" +
                         std::string(5000, ' ') + "\"}");  // Value size.
  RawPut(p + "0/" + std::string(66, 'c'),
         R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":")" + std::string(66, 'c') +
             "\"}");  // Id size.
  RawPut(p + "bad-key", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"bf"})");
  // Content: a valid root is kept; upper case, short, empty or not a string is skipped.
  const std::string root(32, 'e');
  RawPut(p + "0/ac", R"({"url":"http://ok:2","rank":0,"world":1,"load":2,"id":"ac","content":")" +
                         root + "\"}");
  RawPut(p + "0/c1", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"c1","content":")" +
                         std::string(32, 'E') + "\"}");
  RawPut(p + "0/c2",
         R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"c2","content":"abc"})");
  RawPut(p + "0/c3", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"c3","content":""})");
  RawPut(p + "0/c4", R"({"url":"http://x:1","rank":0,"world":1,"load":0,"id":"c4","content":7})");
  auto reg = registry_->Register(Seed("http://mine:1", 0.5), 10);
  ASSERT_OK(reg);
  const std::vector<SeedInfo> seeds = ListOrDie();
  ASSERT_EQ(seeds.size(), 3u);
  EXPECT_EQ(seeds[0].url, "http://mine:1");
  EXPECT_EQ(seeds[0].content, "");
  EXPECT_EQ(seeds[1].url, "http://ok:1");
  EXPECT_EQ(seeds[1].id, "aa");
  EXPECT_EQ(seeds[2].url, "http://ok:2");
  EXPECT_EQ(seeds[2].content, root);
}

TEST_F(RegistryTest, RejectsBadArguments) {
  SeedInfo seed = Seed("http://a:1", 0);
  seed.key_digest = "xyz";
  EXPECT_EQ(registry_->Register(seed, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->List("0123").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->List("0123456789ABCDEF").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Register(Seed("ftp://a:1", 0), 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Register(Seed("http://a:1", -2), 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Register(Seed("http://a:1", 0, 2, 2), 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Register(Seed("http://a:1", 0), 0).status().code(),
            StatusCode::kInvalidArgument);
  seed = Seed("http://a:1", 0);
  seed.id = "not hex";
  EXPECT_EQ(registry_->Register(seed, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListOrDie().empty());
}

TEST(RegistryConnectTest, RejectsMalformedUrls) {
  for (const char* url :
       {"", "127.0.0.1:2379", "https://127.0.0.1:2379", "http://127.0.0.1", "http://:2379",
        "http://127.0.0.1:0", "http://127.0.0.1:65536", "http://127.0.0.1:23x9",
        "http://127.0.0.1:2379/v3", "http://a b:1", "http://[::1:1"}) {
    auto registry = Registry::Connect(url, kTimeout);
    EXPECT_EQ(registry.status().code(), StatusCode::kInvalidArgument) << url;
  }
  EXPECT_EQ(Registry::Connect("http://127.0.0.1:2379", milliseconds(0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(Registry::Connect("http://127.0.0.1:2379", kTimeout));
  EXPECT_OK(Registry::Connect("http://etcd-0.example:2379/", kTimeout));
  EXPECT_OK(Registry::Connect("http://[::1]:2379", kTimeout));
}

TEST(RegistryConnectTest, EtcdDownIsUnavailableQuickly) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto registry = Registry::Connect(url, kTimeout);  // Nothing is sent yet.
  ASSERT_OK(registry);
  const auto start = steady_clock::now();
  auto reg = (*registry)->Register(Seed("http://a:1", 0), 10);
  EXPECT_EQ(reg.status().code(), StatusCode::kUnavailable);
  std::cout << "etcd down: " << reg.status().ToString() << "\n";
  EXPECT_NE(reg.status().message().find("etcd " + url), std::string::npos)
      << reg.status().ToString();
  EXPECT_NE(reg.status().message().find("/v3/lease/grant"), std::string::npos)
      << reg.status().ToString();
  auto seeds = (*registry)->List(kDigest);
  EXPECT_EQ(seeds.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(seeds.status().message().find("/v3/kv/range"), std::string::npos)
      << seeds.status().ToString();
  // Refused connections, no retries: well under a second; a watchdog of 60 s.
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(60));
}

}  // namespace
}  // namespace tensorlift::remote
