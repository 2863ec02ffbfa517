// The fatal-signal report (include/tensorlift/crash.h), in death tests: each
// runs in a forked child, which installs the handler and dies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <string>

#include "tensorlift/crash.h"
#include "tensorlift/version.h"

namespace tensorlift {
namespace {

class CrashHandlerTest : public ::testing::Test {
 protected:
  // "threadsafe": the child re-runs the test binary up to the death test, so
  // that no other thread's state is copied half-way.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CrashHandlerTest, AFaultReportsTheSignalTheAddressTheContextAndTheStackThenDiesByIt) {
  EXPECT_EXIT(
      {
        ::unsetenv("TENSORLIFT_CRASH_HANDLER");
        if (!InstallCrashHandler()) std::exit(3);
        SetCrashContext("UCX", "1.22.0 (/opt/ucx/libucp.so.0)");
        SetCrashContext("CUDA", "runtime 13.0");
        SetCrashContext("UCX", "1.13.1 (/lib/libucp.so.0)");  // Replaces the first.
        volatile int* nowhere = nullptr;
        *nowhere = 1;
      },
      ::testing::KilledBySignal(SIGSEGV),
      "\\*\\*\\* tensorlift: fatal signal 11 \\(SIGSEGV\\) at address 0x0, in pid [0-9]+\n"
      "\\*\\*\\* tensorlift " TENSORLIFT_VERSION_STRING
      "\n"
      "\\*\\*\\* UCX: 1\\.13\\.1 \\(/lib/libucp\\.so\\.0\\)\n"
      "\\*\\*\\* CUDA: runtime 13\\.0\n"
      "\\*\\*\\* native stack, innermost first.*\n"
      "(.*\n)+"
      "\\*\\*\\* end of tensorlift's report");
}

TEST_F(CrashHandlerTest, ASignalSentToTheProcessSaysWhoSentIt) {
  EXPECT_EXIT(
      {
        ::unsetenv("TENSORLIFT_CRASH_HANDLER");
        InstallCrashHandler();
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT),
      "fatal signal 6 \\(SIGABRT\\), sent by pid [0-9]+, in pid [0-9]+\n");
}

TEST_F(CrashHandlerTest, ThePreviousHandlerRunsAfterTheReport) {
  EXPECT_EXIT(
      {
        ::unsetenv("TENSORLIFT_CRASH_HANDLER");
        struct sigaction before {};
        before.sa_handler = [](int) {
          static const char kLine[] = "the previous handler ran\n";
          (void)!::write(2, kLine, sizeof kLine - 1);
          std::_Exit(7);
        };
        ::sigemptyset(&before.sa_mask);
        ::sigaction(SIGABRT, &before, nullptr);
        InstallCrashHandler();
        std::abort();
      },
      ::testing::ExitedWithCode(7), "end of tensorlift's report.*\nthe previous handler ran\n");
}

TEST_F(CrashHandlerTest, ContextValuesAreCutAndANinthKeyIsDropped) {
  EXPECT_EXIT(
      {
        ::unsetenv("TENSORLIFT_CRASH_HANDLER");
        InstallCrashHandler();
        for (int i = 0; i < 9; ++i) SetCrashContext("key" + std::to_string(i), "v");
        SetCrashContext("key0", std::string(400, 'x'));
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT),
      "\\*\\*\\* key0: x{255}\n(\\*\\*\\* key[1-7]: v\n){7}\\*\\*\\* native stack");
}

TEST_F(CrashHandlerTest, OffWhenTheEnvironmentSaysSo) {
  EXPECT_EXIT(
      {
        ::setenv("TENSORLIFT_CRASH_HANDLER", "0", 1);
        if (InstallCrashHandler() || CrashHandlerInstalled()) std::exit(3);
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT), "^$");
}

}  // namespace
}  // namespace tensorlift
