// The fatal-signal report (include/tensorlift/crash.h). The handler uses only
// write(2), backtrace/backtrace_symbols_fd (glibc; their one allocation, the
// loading of libgcc's unwinder, is done at installation) and sigaction/raise.
// The context lines are fixed-size slots written under a mutex before any
// crash and read without it by the handler, which only reads published slots.
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tensorlift/crash.h"
#include "tensorlift/version.h"

namespace tensorlift {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kSlots = 8;
constexpr size_t kKeyBytes = 32;
constexpr size_t kValueBytes = 256;
constexpr size_t kAltStackBytes = 256 * 1024;
constexpr int kMaxFrames = 64;

struct ContextSlot {
  std::atomic<bool> published{false};
  char key[kKeyBytes] = {};
  char value[kValueBytes] = {};
};

ContextSlot g_context[kSlots];
std::mutex g_context_mu;  // Writers only; the handler reads published slots.
struct sigaction g_previous[NSIG];
std::atomic<bool> g_installed{false};
std::atomic<int> g_reporting{0};

void Write(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void WriteNumber(uint64_t v, int base) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  do {
    const int d = static_cast<int>(v % base);
    buf[--i] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
    v /= base;
  } while (v != 0 && i > 0);
  Write(buf + i);
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

void Report(int sig, const siginfo_t* info) {
  Write("\n*** tensorlift: fatal signal ");
  WriteNumber(static_cast<uint64_t>(sig), 10);
  Write(" (");
  Write(SignalName(sig));
  Write(")");
  const bool sent = info != nullptr && info->si_code <= 0;  // kill(2), raise(3), abort(3).
  if (info != nullptr && !sent &&
      (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE)) {
    Write(" at address 0x");
    WriteNumber(reinterpret_cast<uintptr_t>(info->si_addr), 16);
  }
  if (sent) {
    Write(", sent by pid ");  // Not a fault: si_addr means nothing.
    WriteNumber(static_cast<uint64_t>(info->si_pid), 10);
  }
  Write(", in pid ");
  WriteNumber(static_cast<uint64_t>(::getpid()), 10);
  Write("\n*** tensorlift ");
  Write(kVersion);
  Write("\n");
  for (const ContextSlot& slot : g_context) {
    if (!slot.published.load(std::memory_order_acquire)) continue;
    Write("*** ");
    Write(slot.key);
    Write(": ");
    Write(slot.value);
    Write("\n");
  }
  Write(
      "*** native stack, innermost first (a frame FILE(+OFFSET): addr2line -Cfe FILE OFFSET "
      "names it):\n");
  void* frames[kMaxFrames];
  const int n = ::backtrace(frames, kMaxFrames);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  Write("*** end of tensorlift's report (TENSORLIFT_CRASH_HANDLER=0 turns it off)\n");
}

void Handle(int sig, siginfo_t* info, void* context) {
  // One report per process, even when several threads fault at once or the
  // report itself faults.
  if (g_reporting.fetch_add(1) == 0) Report(sig, info);
  // Hand the signal on: the previous handler, or the default action.
  const struct sigaction previous = g_previous[sig];
  ::sigaction(sig, &previous, nullptr);
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  }
  // Still alive (no previous handler, or it returned): die by the signal.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t unblock;
  ::sigemptyset(&unblock);
  ::sigaddset(&unblock, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  ::raise(sig);
}

void CopyCut(char* dst, size_t size, std::string_view src) {
  const size_t n = std::min(size - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

bool InstallCrashHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("TENSORLIFT_CRASH_HANDLER");
    if (env != nullptr && std::strcmp(env, "0") == 0) return;
    // backtrace() loads libgcc's unwinder on its first call (an allocation):
    // do that now, not in the handler.
    void* warm[2];
    (void)::backtrace(warm, 2);
    // An alternate stack, so that a stack overflow of this thread still
    // reports; unless the thread has one already (Python's faulthandler and
    // the sanitizers set their own, and own it).
    stack_t current{};
    const bool has_one = ::sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE);
    void* stack = has_one ? MAP_FAILED
                          : ::mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack != MAP_FAILED) {
      stack_t ss{};
      ss.ss_sp = stack;
      ss.ss_size = kAltStackBytes;
      if (::sigaltstack(&ss, nullptr) != 0) ::munmap(stack, kAltStackBytes);
    }
    for (int sig : kSignals) {
      struct sigaction action {};
      action.sa_sigaction = Handle;
      action.sa_flags = SA_SIGINFO | SA_ONSTACK;
      ::sigemptyset(&action.sa_mask);
      ::sigaction(sig, &action, &g_previous[sig]);
    }
    g_installed.store(true);
  });
  return g_installed.load();
}

bool CrashHandlerInstalled() { return g_installed.load(); }

void SetCrashContext(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> lock(g_context_mu);
  const std::string_view cut_key = key.substr(0, kKeyBytes - 1);
  ContextSlot* slot = nullptr;
  for (ContextSlot& s : g_context) {
    if (s.published.load(std::memory_order_relaxed) && cut_key == s.key) {
      slot = &s;
      break;
    }
  }
  if (slot == nullptr) {
    for (ContextSlot& s : g_context) {
      if (!s.published.load(std::memory_order_relaxed)) {
        slot = &s;
        break;
      }
    }
  }
  if (slot == nullptr) return;  // Full: the ninth key is dropped.
  // Unpublished while it changes: a crash meanwhile leaves this line out.
  slot->published.store(false, std::memory_order_release);
  CopyCut(slot->key, kKeyBytes, cut_key);
  CopyCut(slot->value, kValueBytes, value);
  slot->published.store(true, std::memory_order_release);
}

}  // namespace tensorlift
