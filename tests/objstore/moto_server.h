// A real S3 server that injects faults, for the fault-injection tests: moto's
// S3 server run by tests/objstore/moto_faults.py (in .venv-s3, made by
// scripts/setup.sh) on a free loopback port, holding every file of a
// directory (its top-level folders are the buckets) and answering the
// ranged GETs by a fault plan ("ok:1,503:3", "short:2", "reset:2", ...; see
// moto_faults.py). Started per test, waited for (its "READY <port>" line)
// with a deadline, stopped by PID; its counts are read from its stats file.
//
// The interpreter: $TENSORLIFT_TEST_MOTO_PYTHON, else
// <source>/.venv-s3/bin/python; MotoAvailable() says whether it has moto and
// boto3 (tests GTEST_SKIP without them).
#ifndef TENSORLIFT_TESTS_OBJSTORE_MOTO_SERVER_H_
#define TENSORLIFT_TESTS_OBJSTORE_MOTO_SERVER_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace tensorlift::testing {

// The Python with moto, or "" when there is none.
inline std::string FindMotoPython() {
  if (const char* env = std::getenv("TENSORLIFT_TEST_MOTO_PYTHON"); env && *env) return env;
#ifdef TENSORLIFT_SOURCE_DIR
  const std::string venv = std::string(TENSORLIFT_SOURCE_DIR) + "/.venv-s3/bin/python";
  if (access(venv.c_str(), X_OK) == 0) return venv;
#endif
  return "";
}

inline std::string MotoLauncher() {
#ifdef TENSORLIFT_SOURCE_DIR
  return std::string(TENSORLIFT_SOURCE_DIR) + "/tests/objstore/moto_faults.py";
#else
  return "tests/objstore/moto_faults.py";
#endif
}

// True when FindMotoPython() can import moto's server and boto3 (checked once).
inline bool MotoAvailable() {
  static const bool available = [] {
    const std::string python = FindMotoPython();
    if (python.empty() || access(MotoLauncher().c_str(), R_OK) != 0) return false;
    const std::string cmd =
        "'" + python + "' -c 'import moto.server, moto.s3.responses, boto3' >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }();
  return available;
}

class MotoFaultServer {
 public:
  // Serves the files under `root` (its folders are the buckets) with `plan`
  // armed once they are uploaded. Its log and stats files go next to `root`.
  // Check ok() (and error()) after construction.
  MotoFaultServer(std::string root, std::string plan, double slow_seconds = 5)
      : root_(std::move(root)) {
    const std::string python = FindMotoPython();
    if (python.empty()) {
      error_ = "moto is not installed (.venv-s3/bin/python; run scripts/setup.sh)";
      return;
    }
    static std::atomic<int> serial{0};
    const std::string tag = std::to_string(getpid()) + "-" + std::to_string(serial++);
    stats_ = root_ + "/../moto-" + tag + ".stats";
    log_ = root_ + "/../moto-" + tag + ".log";
    Start(python, plan, slow_seconds);
  }
  ~MotoFaultServer() { Stop(); }
  MotoFaultServer(const MotoFaultServer&) = delete;
  MotoFaultServer& operator=(const MotoFaultServer&) = delete;

  bool ok() const { return port_ > 0 && pid_ > 0; }
  const std::string& error() const { return error_; }
  const std::string& log() const { return log_; }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // SIGKILL now; safe from another thread while a load runs. Stop() reaps it.
  void Kill() {
    const pid_t pid = pid_.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  // Kills the server (SIGKILL) and reaps it.
  void Stop() {
    const pid_t pid = pid_.exchange(-1);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }

  // The server's counts: ranged_gets, served, faults, fault_503, fault_500,
  // fault_short, fault_reset, fault_slow (written after each ranged GET).
  std::map<std::string, uint64_t> Stats() const {
    std::map<std::string, uint64_t> out;
    std::ifstream in(stats_);
    std::string name;
    uint64_t value = 0;
    while (in >> name >> value) out[name] = value;
    return out;
  }
  uint64_t Stat(const std::string& name) const {
    const auto stats = Stats();
    const auto it = stats.find(name);
    return it == stats.end() ? 0 : it->second;
  }

 private:
  void Start(const std::string& python, const std::string& plan, double slow_seconds) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      error_ = "pipe failed";
      return;
    }
    std::vector<std::string> args = {
        python,    MotoLauncher(), "--port",         "0",
        "--plan",  plan,           "--root-objects", root_,
        "--stats", stats_,         "--slow-seconds", std::to_string(slow_seconds)};
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive a crashed test.
      const int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fds[1], 1);
      if (log >= 0) dup2(log, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
    if (pid < 0) {
      error_ = "fork failed";
      return;
    }
    pid_ = pid;
    // "READY <port>\n", within the deadline (moto's start and the uploads).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string line;
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{out_fd_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        error_ = "moto did not say READY within 60 s; see " + log_;
        Stop();
        return;
      }
      char buf[256];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) {
        error_ = "moto exited before READY; see " + log_;
        Stop();
        return;
      }
      line.append(buf, static_cast<size_t>(n));
    }
    if (line.rfind("READY ", 0) != 0 || (port_ = std::atoi(line.c_str() + 6)) <= 0) {
      error_ = "moto said '" + line.substr(0, line.find('\n')) + "', not READY <port>";
      Stop();
    }
  }

  std::string root_, stats_, log_;
  std::string error_;
  int port_ = -1;
  std::atomic<pid_t> pid_{-1};
  int out_fd_ = -1;
};

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_OBJSTORE_MOTO_SERVER_H_
