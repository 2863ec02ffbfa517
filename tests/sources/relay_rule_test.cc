// The relay's rule for taking a second source for a slow parent
// (sources/relay.h, SlowParentRule), driven with chosen times, progress and
// rates.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "sources/relay.h"

namespace tensorlift::sources {

namespace {

using std::chrono::milliseconds;
using Clock = SlowParentRule::Clock;

TEST(SlowParentRuleTest, AProbeIsDueOnceThisPullHasWaitedOnItsParentForTheHold) {
  SlowParentRule rule(milliseconds(2000));
  const Clock::time_point t0{};
  EXPECT_FALSE(rule.CaughtUpFor(t0, "p", 0.10, 0.09));
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(1000), "p", 0.30, 0.27));
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(1999), "p", 0.40, 0.38));
  EXPECT_TRUE(rule.CaughtUpFor(t0 + milliseconds(2000), "p", 0.45, 0.41));
}

TEST(SlowParentRuleTest, NotWhileThisPullIsBehindItsParentAndAfreshForANewParent) {
  SlowParentRule rule(milliseconds(2000));
  const Clock::time_point t0{};
  EXPECT_FALSE(rule.CaughtUpFor(t0, "p", 0.10, 0.10));
  // Behind its parent by more than kCaughtUp: it is not waiting on the
  // parent, and the hold starts again once it is.
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(1500), "p", 0.40, 0.20));
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(2500), "p", 0.40, 0.39));
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(4000), "p", 0.50, 0.49));
  EXPECT_TRUE(rule.CaughtUpFor(t0 + milliseconds(4500), "p", 0.55, 0.53));
  // A closer relay registered: its own hold.
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(5000), "p2", 0.10, 0.53));
  EXPECT_FALSE(rule.CaughtUpFor(t0 + milliseconds(6000), "p2", 0.60, 0.58));
  EXPECT_TRUE(rule.CaughtUpFor(t0 + milliseconds(8000), "p2", 0.70, 0.69));
}

TEST(SlowParentRuleTest, TheProbedHolderIsKeptOnlyWhenClearlyFasterThanTheParent) {
  constexpr uint64_t kPiece = 4 << 20;
  // A chain at full speed (25 MB/s): the probe shares the holder's upload
  // with the parent and gets about half.
  EXPECT_EQ(SlowParentRule::KeepProbed(25e6, 2 * kPiece, 12.5e6, kPiece), false);
  EXPECT_EQ(SlowParentRule::KeepProbed(25e6, 2 * kPiece, 25e6, kPiece), false);
  // The parent behind a link at a quarter: the holder gives the rest.
  EXPECT_EQ(SlowParentRule::KeepProbed(6.25e6, 2 * kPiece, 18.75e6, kPiece), true);
}

TEST(SlowParentRuleTest, NothingIsJudgedUntilBothHaveDelivered) {
  constexpr uint64_t kPiece = 4 << 20;
  // The slow parent has had nothing to give yet (the probe came first):
  // judging now would keep no second source for good.
  EXPECT_EQ(SlowParentRule::KeepProbed(0, 0, 18.75e6, kPiece), std::nullopt);
  EXPECT_EQ(SlowParentRule::KeepProbed(6.25e6, kPiece, 0, 0), std::nullopt);
  EXPECT_EQ(SlowParentRule::KeepProbed(6.25e6, kPiece, 18.75e6, kPiece), true);
}

}  // namespace
}  // namespace tensorlift::sources
