// Disk faults for tests (io/faults.h).
#include "io/faults.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

namespace tensorlift::io {
namespace {

enum class Op { kRead, kWrite };
enum class Kind { kEio, kEnospc, kShort };

struct Rule {
  Op op;
  Kind kind;
  uint64_t nth = 0;  // 0: every call.
};

struct Faults {
  std::mutex mu;
  std::vector<Rule> rules;
  std::atomic<bool> armed{false};
  std::atomic<uint64_t> calls[2] = {0, 0};  // Per Op, since arming.
};

Faults& State() {
  static Faults faults;
  return faults;
}

Result<std::vector<Rule>> Parse(const std::string& spec) {
  std::vector<Rule> rules;
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string text = spec.substr(start, end - start);
    start = end + 1;
    const size_t colon = text.find(':');
    if (colon == std::string::npos)
      return InvalidArgumentError("io faults: '" + text + "': no ':'");
    const std::string op = text.substr(0, colon);
    std::string kind = text.substr(colon + 1);
    Rule r{};
    if (op == "read") {
      r.op = Op::kRead;
    } else if (op == "write") {
      r.op = Op::kWrite;
    } else {
      return InvalidArgumentError("io faults: '" + text + "': the op is read or write");
    }
    const size_t at = kind.find('@');
    if (at != std::string::npos) {
      char* stop = nullptr;
      const std::string n = kind.substr(at + 1);
      r.nth = std::strtoull(n.c_str(), &stop, 10);
      if (n.empty() || *stop != '\0' || r.nth == 0) {
        return InvalidArgumentError("io faults: '" + text + "': @N needs N >= 1");
      }
      kind = kind.substr(0, at);
    }
    if (kind == "eio") {
      r.kind = Kind::kEio;
    } else if (kind == "enospc") {
      r.kind = Kind::kEnospc;
    } else if (kind == "short") {
      r.kind = Kind::kShort;
    } else {
      return InvalidArgumentError("io faults: '" + text + "': the kind is eio, enospc or short");
    }
    rules.push_back(r);
  }
  return rules;
}

void Arm(std::vector<Rule> rules) {
  Faults& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.rules = std::move(rules);
  f.calls[0] = 0;
  f.calls[1] = 0;
  f.armed.store(!f.rules.empty(), std::memory_order_release);
}

void ArmFromEnvironmentOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* spec = std::getenv("TENSORLIFT_IO_FAULTS");
    if (spec == nullptr || *spec == '\0') return;
    auto rules = Parse(spec);
    if (!rules.ok()) {
      std::fprintf(stderr, "tensorlift: TENSORLIFT_IO_FAULTS ignored: %s\n",
                   rules.status().message().c_str());
      return;
    }
    Arm(std::move(rules).value());
  });
}

// The fault for this call of `op`, if any: counts the call.
std::optional<Rule> Next(Op op) {
  ArmFromEnvironmentOnce();
  Faults& f = State();
  if (!f.armed.load(std::memory_order_acquire)) return std::nullopt;
  const uint64_t call = f.calls[static_cast<int>(op)].fetch_add(1) + 1;
  std::lock_guard<std::mutex> lock(f.mu);
  for (const Rule& r : f.rules) {
    if (r.op == op && (r.nth == 0 || r.nth == call)) return r;
  }
  return std::nullopt;
}

// Half of n (at least 1 byte). On an O_DIRECT descriptor, where a read must
// stay in whole 4 KiB blocks, half in whole blocks (n itself below 8 KiB): a
// real short O_DIRECT read ends on a block too.
size_t Shortened(int fd, size_t n) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags != -1 && (flags & O_DIRECT) != 0) {
    const size_t half = n / 2 / 4096 * 4096;
    return half > 0 ? half : n;
  }
  return n > 1 ? n / 2 : n;
}

int ErrnoOf(Kind kind) { return kind == Kind::kEnospc ? ENOSPC : EIO; }

}  // namespace

ssize_t Pread(int fd, void* buf, size_t n, off_t offset) {
  const std::optional<Rule> r = Next(Op::kRead);
  if (!r) return ::pread(fd, buf, n, offset);
  if (r->kind == Kind::kShort) return ::pread(fd, buf, Shortened(fd, n), offset);
  errno = ErrnoOf(r->kind);
  return -1;
}

ssize_t Write(int fd, const void* buf, size_t n) {
  const std::optional<Rule> r = Next(Op::kWrite);
  if (!r) return ::write(fd, buf, n);
  if (r->kind == Kind::kShort) return ::write(fd, buf, Shortened(fd, n));
  errno = ErrnoOf(r->kind);
  return -1;
}

ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) {
  const std::optional<Rule> r = Next(Op::kWrite);
  if (!r) return ::pwrite(fd, buf, n, offset);
  if (r->kind == Kind::kShort) return ::pwrite(fd, buf, Shortened(fd, n), offset);
  errno = ErrnoOf(r->kind);
  return -1;
}

int ReadResult(int fd, int res, size_t n) {
  const std::optional<Rule> r = Next(Op::kRead);
  if (!r || res < 0) return res;
  if (r->kind == Kind::kShort) {
    // The kernel read `res` bytes; report fewer (they are read again).
    return res > 1 ? static_cast<int>(Shortened(fd, static_cast<size_t>(res))) : res;
  }
  (void)n;
  return -ErrnoOf(r->kind);
}

}  // namespace tensorlift::io
