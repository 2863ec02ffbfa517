// A report of a fatal signal, for crashes on machines nobody can log into.
//
// InstallCrashHandler() catches SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT
// and writes one report to stderr: the signal (and the faulting address), the
// process, tensorlift's version, what tensorlift has loaded (SetCrashContext:
// UCX's version and file, CUDA's runtime and driver, ...), and the native
// stack (glibc's backtrace_symbols_fd). Then it hands the signal on: to the
// handler that was installed before it (Python's faulthandler then prints the
// Python stack), else to the default action, so the process still dies by that
// signal (with a core dump where they are enabled). The CLI installs it in
// main(); the Python module when it is imported. TENSORLIFT_CRASH_HANDLER=0
// turns it off.
#ifndef TENSORLIFT_CRASH_H_
#define TENSORLIFT_CRASH_H_

#include <string_view>

namespace tensorlift {

// Installs the handlers once per process (later calls do nothing) on an
// alternate signal stack of the calling thread. False, with nothing
// installed, when TENSORLIFT_CRASH_HANDLER is "0".
bool InstallCrashHandler();

// Whether InstallCrashHandler() installed the handlers in this process.
bool CrashHandlerInstalled();

// Sets or replaces one line of the report's context, e.g. ("UCX", "1.22.0
// (/usr/lib/libucp.so.0)"). Thread-safe. At most 8 keys (a ninth is
// dropped); keys are cut to 31 bytes, values to 255.
void SetCrashContext(std::string_view key, std::string_view value);

}  // namespace tensorlift

#endif  // TENSORLIFT_CRASH_H_
