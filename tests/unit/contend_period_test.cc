#include "simba/contend_period.h"

#include <gtest/gtest.h>

#include "testing/virtual_time_test.h"

#include <algorithm>
#include <memory>

namespace simba {
namespace {

using std::chrono::milliseconds;

using testing::FixedRandom;

MutexOwner owner(std::string id, std::int64_t ttl_at, std::int64_t transition_at) {
  MutexOwner owner;
  owner.owner_id = std::move(id);
  owner.acquired_at = milliseconds(0);
  owner.ttl_at = milliseconds(ttl_at);
  owner.transition_at = milliseconds(transition_at);
  owner.fencing_token = 1;
  return owner;
}

// JVM Simba's ContendPeriod test numbers.
TEST(ContendPeriodTest, OwnerRenewsWhenItsTtlEnds) {
  ContendPeriod period("me", std::make_shared<FixedRandom>(0));
  EXPECT_EQ(period.next_delay(owner("me", 1400, 2000), milliseconds(1000)), milliseconds(400));
}

TEST(ContendPeriodTest, ContenderWaitsForTheTransitionEndWithJitter) {
  for (std::int64_t pin : {-100000, 0, 100000}) {
    auto random = std::make_shared<FixedRandom>(pin);
    ContendPeriod period("me", random);
    const auto delay = period.next_delay(owner("other", 1400, 2000), milliseconds(1000));
    EXPECT_GE(delay, milliseconds(800));
    EXPECT_LT(delay, milliseconds(2000));
    EXPECT_EQ(random->last_lo, ContendPeriod::kJitterMin);
    EXPECT_EQ(random->last_hi, ContendPeriod::kJitterMax);
  }
  ContendPeriod lowest("me", std::make_shared<FixedRandom>(-100000));
  EXPECT_EQ(lowest.next_delay(owner("other", 1400, 2000), milliseconds(1000)), milliseconds(800));
  ContendPeriod highest("me", std::make_shared<FixedRandom>(100000));
  EXPECT_EQ(highest.next_delay(owner("other", 1400, 2000), milliseconds(1000)), milliseconds(1999));
}

TEST(ContendPeriodTest, ZeroTransitionOnlyJittersForward) {
  auto random = std::make_shared<FixedRandom>(-100000);
  ContendPeriod period("me", random);
  const auto delay = period.next_delay(owner("other", 2000, 2000), milliseconds(1000));
  EXPECT_EQ(delay, milliseconds(1000));
  EXPECT_EQ(random->last_lo, 0);
  EXPECT_EQ(random->last_hi, 1000);
  ContendPeriod highest("me", std::make_shared<FixedRandom>(100000));
  EXPECT_EQ(highest.next_delay(owner("other", 2000, 2000), milliseconds(1000)), milliseconds(1999));
}

TEST(ContendPeriodTest, NoOwnerMeansTryNow) {
  ContendPeriod period("me", std::make_shared<FixedRandom>(500));
  // MutexOwner::none() has all times 0: the delay is negative, clamped to 0.
  EXPECT_LT(period.next_delay(MutexOwner::none(), milliseconds(1000)), milliseconds(0));
  EXPECT_EQ(period.ensure_next_delay(MutexOwner::none(), milliseconds(1000)), milliseconds(0));
}

TEST(ContendPeriodTest, EnsureNextDelayClampsAtZero) {
  ContendPeriod period("me", std::make_shared<FixedRandom>(0));
  EXPECT_EQ(period.ensure_next_delay(owner("me", 900, 2000), milliseconds(1000)), milliseconds(0));
  EXPECT_EQ(period.ensure_next_delay(owner("me", 1400, 2000), milliseconds(1000)),
            milliseconds(400));
}

// A lease that ends within |kJitterMin|: an attempt before its end would
// only be told the same end again (and draw again, and land early again),
// so the jitter is drawn forward: at most one early attempt per lease.
TEST(ContendPeriodTest, LeaseEndingWithinTheNegativeJitterOnlyJittersForward) {
  auto random = std::make_shared<FixedRandom>(-100000);
  ContendPeriod period("me", random);
  EXPECT_EQ(period.next_delay(owner("other", 1000, 1150), milliseconds(1000)), milliseconds(150));
  EXPECT_EQ(random->last_lo, 0);
  EXPECT_EQ(random->last_hi, ContendPeriod::kJitterMax);
  // The boundary: 200 ms left is "within", 201 ms is not.
  EXPECT_EQ(period.next_delay(owner("other", 1000, 1200), milliseconds(1000)), milliseconds(200));
  EXPECT_EQ(random->last_lo, 0);
  EXPECT_EQ(period.next_delay(owner("other", 1000, 1201), milliseconds(1000)), milliseconds(1));
  EXPECT_EQ(random->last_lo, ContendPeriod::kJitterMin);
}

OwnerRecord unknown_times(std::int64_t now, std::int64_t ask_again_at) {
  OwnerRecord record;
  record.owner.owner_id = "other";
  record.owner.fencing_token = 1;
  record.store_now = milliseconds(now);
  record.ask_again_at = milliseconds(ask_again_at);
  return record;
}

// The store could not tell when the owner's hold ends and must be asked
// again by ask_again_at: come back before it, by a margin and a forward
// jitter that a short time left shrinks (never at once, never late).
TEST(ContendPeriodTest, UnknownOwnerTimesAskAgainBeforeTheStoresTime) {
  auto lowest = std::make_shared<FixedRandom>(-100000);
  auto highest = std::make_shared<FixedRandom>(100000);
  ContendPeriod early("me", highest);
  ContendPeriod late("me", lowest);
  // 10 s left: 750 ms margin, jitter in [0, 1000).
  EXPECT_EQ(late.ensure_next_delay(unknown_times(5000, 15000)), milliseconds(9250));
  EXPECT_EQ(early.ensure_next_delay(unknown_times(5000, 15000)), milliseconds(8251));
  EXPECT_EQ(highest->last_lo, 0);
  EXPECT_EQ(highest->last_hi, ContendPeriod::kJitterMax);
  // 1 s left: a quarter of it is both the margin and the jitter's range.
  EXPECT_EQ(late.ensure_next_delay(unknown_times(5000, 6000)), milliseconds(750));
  EXPECT_EQ(early.ensure_next_delay(unknown_times(5000, 6000)), milliseconds(501));
  EXPECT_EQ(highest->last_hi, 250);
  // Next to nothing left: no draw, never negative.
  EXPECT_EQ(early.ensure_next_delay(unknown_times(5000, 5003)), milliseconds(3));
  EXPECT_EQ(early.ensure_next_delay(unknown_times(5000, 4000)), milliseconds(0));
  // Without ask_again_at the record is timed by its owner, as before.
  OwnerRecord known;
  known.owner = owner("other", 1400, 2000);
  known.store_now = milliseconds(1000);
  EXPECT_EQ(late.ensure_next_delay(known), milliseconds(800));
  EXPECT_EQ(early.ensure_next_delay(known), milliseconds(1999));
}

TEST(ContendPeriodTest, DefaultRandomStaysInRange) {
  auto random = Random::standard();
  for (int i = 0; i < 10000; ++i) {
    const auto v = random->uniform(-200, 1000);
    ASSERT_GE(v, -200);
    ASSERT_LT(v, 1000);
  }
}

}  // namespace
}  // namespace simba
