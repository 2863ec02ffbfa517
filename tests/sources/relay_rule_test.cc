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

// BehindRule: a relay gaining chunks at less than half its parent's rate
// over the window, at two looks in a row, while behind it, is behind.
TEST(BehindRuleTest, ARelayGainingAtAQuarterOfItsParentsRateIsBehindAtTheSecondLook) {
  BehindRule rule(milliseconds(500));
  const Clock::time_point t0{};
  // Nothing in yet: no look counts.
  EXPECT_FALSE(rule.Behind(t0, "p", 40, 0));
  // Its parent gains 40 chunks per 200 ms, this relay 10.
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(200), "p", 80, 10));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(400), "p", 120, 20));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(600), "p", 160, 30));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(800), "p", 200, 40));  // Window full: once.
  EXPECT_TRUE(rule.Behind(t0 + milliseconds(1000), "p", 240, 50));  // Twice in a row.
  // For good, whatever comes after (a relay moves once).
  EXPECT_TRUE(rule.Behind(t0 + milliseconds(1200), "q", 240, 240));
}

TEST(BehindRuleTest, ARelayWaitingOnItsParentOrLaggingItAtItsRateIsNotBehind) {
  BehindRule rule(milliseconds(500));
  const Clock::time_point t0{};
  // A relay started late (or a hop behind) keeps the same gap: its rate is
  // the parent's.
  uint64_t parent = 100, mine = 1;
  for (int i = 0; i <= 20; ++i) {
    EXPECT_FALSE(rule.Behind(t0 + milliseconds(200 * i), "p", parent, mine)) << i;
    parent += 40;
    mine += 40;
  }
  // Its parent slow (a slow relay before it): this relay waits on it, its
  // gains the parent's, and it is not the one behind.
  for (int i = 21; i <= 30; ++i) {
    EXPECT_FALSE(rule.Behind(t0 + milliseconds(200 * i), "p", parent, mine)) << i;
    parent += 5;
    mine += 5;
  }
}

TEST(BehindRuleTest, OneSlowWindowIsNotEnoughNorANewParentsPast) {
  BehindRule rule(milliseconds(500));
  const Clock::time_point t0{};
  EXPECT_FALSE(rule.Behind(t0, "p", 50, 10));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(200), "p", 60, 11));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(700), "p", 100, 12));  // Slower: once.
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(900), "p", 140, 60));  // As fast again.
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(1100), "p", 150, 70));
  // Ahead of its parent (a parent behind it, as the chain's last relay is
  // for a relay that moved there): not behind, whatever the rates.
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(2000), "p", 160, 200));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(2600), "p", 170, 200));
  // A new parent: looks at the old one do not count, nor those before the
  // first chunk in after it came (the time to connect to it).
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(3000), "q", 400, 200));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(3200), "q", 440, 200));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(3400), "q", 480, 200));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(3600), "q", 520, 200));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(3800), "q", 560, 201));  // The first in.
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(4000), "q", 600, 202));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(4200), "q", 640, 203));
  EXPECT_FALSE(rule.Behind(t0 + milliseconds(4400), "q", 680, 204));  // Once.
  EXPECT_TRUE(rule.Behind(t0 + milliseconds(4600), "q", 720, 205));
}

// Big chunks for the rate (512 MiB in 4 MiB chunks at 200 Mbit/s: about 6
// a second): the parent's gains are judged once they are kMinChunks, over
// as long a window as that takes.
TEST(BehindRuleTest, WithBigChunksTheWindowGrowsUntilTheParentGainedEnough) {
  BehindRule rule(milliseconds(500));
  const Clock::time_point t0{};
  EXPECT_FALSE(rule.Behind(t0, "p", 10, 1));
  // The parent gains a chunk per 200 ms, this relay one per 800 ms.
  const uint64_t mine[] = {2, 2, 2, 2, 3, 3, 3};
  for (int i = 1; i <= 7; ++i) {
    EXPECT_FALSE(rule.Behind(t0 + milliseconds(200 * i), "p", 10 + i, mine[i - 1])) << i;
  }
  EXPECT_TRUE(rule.Behind(t0 + milliseconds(1600), "p", 18, 3));  // Twice in a row.
}

}  // namespace
}  // namespace tensorlift::sources
