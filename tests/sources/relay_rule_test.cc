// The relay's rule for taking a parent's parent as a second source
// (sources/relay.h, BehindWatch), driven with chosen times and progress.
#include <gtest/gtest.h>

#include <chrono>

#include "sources/relay.h"

namespace tensorlift::sources {
namespace {

using std::chrono::milliseconds;
using Clock = BehindWatch::Clock;

TEST(BehindWatchTest, AParentBehindForAMomentOnlyIsNotHelped) {
  // Progress read a second late: the parent looks 19 % behind until its next
  // update, then level again; over and over, never for the whole hold.
  BehindWatch w(milliseconds(2000));
  const Clock::time_point t0{};
  for (int round = 0; round < 20; ++round) {
    const auto t = t0 + milliseconds(1000 * round);
    EXPECT_FALSE(w.Behind(t, "p", 0.30, 0.49, 0.30)) << round;
    EXPECT_FALSE(w.Behind(t + milliseconds(600), "p", 0.33, 0.52, 0.33)) << round;
    EXPECT_FALSE(w.Behind(t + milliseconds(800), "p", 0.50, 0.52, 0.49)) << round;
  }
}

TEST(BehindWatchTest, AParentThatStaysBehindIsHelpedOnceTheHoldHasPassed) {
  BehindWatch w(milliseconds(2000));
  const Clock::time_point t0{};
  EXPECT_FALSE(w.Behind(t0, "p", 0.10, 0.30, 0.10));
  EXPECT_FALSE(w.Behind(t0 + milliseconds(1000), "p", 0.13, 0.50, 0.12));
  EXPECT_FALSE(w.Behind(t0 + milliseconds(1999), "p", 0.16, 0.70, 0.16));
  EXPECT_TRUE(w.Behind(t0 + milliseconds(2000), "p", 0.16, 0.70, 0.16));
}

TEST(BehindWatchTest, NotWhileThisPullIsBehindItsParentNorOnLevelProgress) {
  BehindWatch w(milliseconds(0));
  const Clock::time_point t0{};
  // The parent is behind its parent, but this pull is further behind still:
  // the parent is not what holds it up.
  EXPECT_FALSE(w.Behind(t0, "p", 0.40, 0.80, 0.20));
  // Level (a chunk's lag per hop).
  EXPECT_FALSE(w.Behind(t0, "p", 0.40, 0.43, 0.39));
  EXPECT_TRUE(w.Behind(t0, "p", 0.40, 0.80, 0.39));
}

TEST(BehindWatchTest, ANewParentStartsItsHoldAfresh) {
  BehindWatch w(milliseconds(2000));
  const Clock::time_point t0{};
  EXPECT_FALSE(w.Behind(t0, "p", 0.10, 0.50, 0.10));
  // A closer relay registered: the rule's time starts again for it.
  EXPECT_FALSE(w.Behind(t0 + milliseconds(2500), "p2", 0.10, 0.50, 0.10));
  EXPECT_FALSE(w.Behind(t0 + milliseconds(4000), "p2", 0.10, 0.50, 0.10));
  EXPECT_TRUE(w.Behind(t0 + milliseconds(4500), "p2", 0.10, 0.50, 0.10));
}

}  // namespace
}  // namespace tensorlift::sources
