// Locker on virtual time (memory store + ManualClock).
#include "simba/locker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "simba/backends/memory.h"
#include "testing/fault_injecting_backend.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/thread_recorder.h"
#include "testing/virtual_time_test.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::FaultInjectingBackend;
using testing::StatusIs;

class LockerTest : public testing::VirtualTimeTest {
 protected:
  void SetUp() override {
    VirtualTimeTest::SetUp();
    factory_ = make_factory(faults_);
    other_factory_ = make_factory(store_);
  }

  // Moves virtual time 100 ms at a time until `done` (a store retrying
  // through an outage waits on its backoff timers); false after 10 s of
  // real time.
  bool advance_until(const std::function<bool()>& done) {
    return eventually(
        [&] {
          clock_->advance(milliseconds(100));
          return done();
        },
        seconds(10));
  }

  std::unique_ptr<MutexContendServiceFactory> factory_;        // through faults_
  std::unique_ptr<MutexContendServiceFactory> other_factory_;  // straight to the store
};

TEST_F(LockerTest, AcquireHoldsAndTheDestructorReleases) {
  {
    auto locker = Locker::create(*factory_, "job").value();
    EXPECT_FALSE(locker->is_held());
    EXPECT_EQ(locker->fencing_token(), 0u);
    SIMBA_ASSERT_OK(locker->acquire());
    EXPECT_TRUE(locker->is_held());
    EXPECT_GT(locker->fencing_token(), 0u);
    EXPECT_FALSE(locker->lost_token().stop_requested());
  }
  auto again = Locker::create(*other_factory_, "job").value();
  auto attempt = again->try_acquire();
  SIMBA_ASSERT_OK(attempt);
  EXPECT_TRUE(*attempt) << "the destructor released the mutex";
}

TEST_F(LockerTest, AcquireWithTimeoutGivesUpOnTheVirtualClock) {
  auto holder = Locker::create(*other_factory_, "job").value();
  SIMBA_ASSERT_OK(holder->acquire());
  auto waiter = Locker::create(*factory_, "job").value();
  const auto give_up_at = clock_->now() + seconds(5);
  auto result = std::async(std::launch::async, [&] { return waiter->acquire(seconds(5)); });
  // Advance only once the waiter waits for its own deadline.
  ASSERT_TRUE(eventually([&] { return clock_->has_waiter_until(give_up_at); }, seconds(5)));
  EXPECT_EQ(result.wait_for(milliseconds(0)), std::future_status::timeout)
      << "gave up before virtual time passed";
  clock_->advance(seconds(5));
  ASSERT_EQ(result.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_THAT(result.get(),
              StatusIs(StatusCode::kDeadlineExceeded, ::testing::HasSubstr("5000ms")));
  EXPECT_FALSE(waiter->is_held());
  EXPECT_TRUE(holder->is_held());
}

TEST_F(LockerTest, AZeroTimeoutStillMakesOneAttempt) {
  auto locker = Locker::create(*factory_, "job").value();
  SIMBA_ASSERT_OK(locker->acquire(milliseconds(0)));
  EXPECT_TRUE(locker->is_held());
  auto other = Locker::create(*other_factory_, "job").value();
  EXPECT_THAT(other->acquire(milliseconds(0)), StatusIs(StatusCode::kDeadlineExceeded));
}

TEST_F(LockerTest, WaitingAcquireSucceedsWhenTheHolderReleases) {
  auto holder = Locker::create(*other_factory_, "job").value();
  SIMBA_ASSERT_OK(holder->acquire());
  const auto first = holder->fencing_token();
  auto waiter = Locker::create(*factory_, "job").value();
  auto result = std::async(std::launch::async, [&] { return waiter->acquire(); });
  std::this_thread::sleep_for(milliseconds(30));
  SIMBA_ASSERT_OK(holder->release());
  ASSERT_EQ(result.wait_for(seconds(5)), std::future_status::ready);
  SIMBA_ASSERT_OK(result.get());
  EXPECT_TRUE(waiter->is_held());
  EXPECT_GT(waiter->fencing_token(), first);
}

TEST_F(LockerTest, AcquireCanBeCancelled) {
  auto holder = Locker::create(*other_factory_, "job").value();
  SIMBA_ASSERT_OK(holder->acquire());
  auto waiter = Locker::create(*factory_, "job").value();
  std::stop_source cancel;
  auto result = std::async(std::launch::async, [&] { return waiter->acquire(cancel.get_token()); });
  std::this_thread::sleep_for(milliseconds(30));
  cancel.request_stop();
  ASSERT_EQ(result.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_THAT(result.get(), StatusIs(StatusCode::kCancelled));
  EXPECT_FALSE(waiter->is_held());
}

// acquire() would only wait for its first attempt: it runs on the caller's
// thread (one hop less), unless a cancel may end the wait before the store
// call does.
TEST_F(LockerTest, TheFirstAttemptRunsOnTheCallersThreadUnlessACancelMayEndTheWait) {
  auto locker = Locker::create(*factory_, "job").value();
  testing::ThreadRecorder asked;
  const auto record_thread = [&] { asked.record(); };
  faults_->set_before_next_acquire_reply(record_thread);
  SIMBA_ASSERT_OK(locker->acquire());
  EXPECT_TRUE(asked.recorded_here());
  SIMBA_ASSERT_OK(locker->release());
  faults_->set_before_next_acquire_reply(record_thread);
  ASSERT_THAT(locker->try_acquire(), testing::IsOkAndHolds(true));
  EXPECT_TRUE(asked.recorded_here());
  SIMBA_ASSERT_OK(locker->release());
  std::stop_source cancel;
  faults_->set_before_next_acquire_reply(record_thread);
  SIMBA_ASSERT_OK(locker->acquire(cancel.get_token()));
  EXPECT_FALSE(asked.recorded_here());
}

// A Locker acts only on a hold it loses: the other owner changes of an
// acquisition reach no callback, and a loss still does (the three signals).
TEST_F(LockerTest, OnlyALostHoldReachesTheLossCallback) {
  std::atomic<int> lost{0};
  LockerOptions options;
  options.on_lost = [&] { ++lost; };
  auto locker = Locker::create(*factory_, "job", options).value();
  auto other = Locker::create(*other_factory_, "job").value();
  for (int i = 0; i < 3; ++i) {
    SIMBA_ASSERT_OK(locker->acquire());
    SIMBA_ASSERT_OK(locker->release());
    SIMBA_ASSERT_OK(other->acquire());
    SIMBA_ASSERT_OK(other->release());
  }
  SIMBA_ASSERT_OK(locker->acquire());
  SIMBA_ASSERT_OK(store_->force_release("job", std::chrono::steady_clock::now() + seconds(5)));
  ASSERT_TRUE(eventually([&] { return lost.load() == 1; }, seconds(5)));
  EXPECT_FALSE(locker->is_held());
  EXPECT_TRUE(locker->lost_token().stop_requested());
}

TEST_F(LockerTest, TryAcquireIsOneAttempt) {
  auto holder = Locker::create(*other_factory_, "job").value();
  auto other = Locker::create(*factory_, "job").value();
  auto first = holder->try_acquire();
  SIMBA_ASSERT_OK(first);
  EXPECT_TRUE(*first);
  auto second = other->try_acquire();
  SIMBA_ASSERT_OK(second);
  EXPECT_FALSE(*second);
  EXPECT_FALSE(other->is_held());
  // A store error is reported, not mistaken for "busy".
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  EXPECT_THAT(other->try_acquire(), StatusIs(StatusCode::kUnavailable));
}

// A try takes the first answer and stops: the store is told it will not
// wait (a SQL store then gives it no place in its wait line, which on MySQL
// opened and closed a connection for a failed try). A waiting acquire,
// even with a zero timeout, is not a try.
TEST_F(LockerTest, OnlyATryTellsTheStoreItWillNotWait) {
  auto holder = Locker::create(*other_factory_, "job").value();
  SIMBA_ASSERT_OK(holder->acquire());
  auto other = Locker::create(*factory_, "job").value();
  auto tried = other->try_acquire();
  SIMBA_ASSERT_OK(tried);
  EXPECT_FALSE(*tried);
  EXPECT_GE(faults_->acquire_calls(), 1);
  EXPECT_EQ(faults_->once_acquire_calls(), faults_->acquire_calls());
  const int tries = faults_->acquire_calls();
  EXPECT_THAT(other->acquire(milliseconds(0)), StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_GT(faults_->acquire_calls(), tries);
  EXPECT_EQ(faults_->once_acquire_calls(), tries);
  SIMBA_ASSERT_OK(holder->release());
  tried = other->try_acquire();
  SIMBA_ASSERT_OK(tried);
  EXPECT_TRUE(*tried);
  EXPECT_TRUE(other->is_held());
}

TEST_F(LockerTest, LostLeaseIsSignalledThreeWays) {
  testing::Latch lost;
  LockerOptions options;
  options.on_lost = [&] { lost.set(); };
  auto locker = Locker::create(*factory_, "job", options).value();
  SIMBA_ASSERT_OK(locker->acquire());
  const std::stop_token token = locker->lost_token();
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  clock_->advance(seconds(16));
  EXPECT_FALSE(locker->is_held()) << "is_held() checks the lease deadline itself";
  ASSERT_TRUE(lost.wait(seconds(5)));
  EXPECT_TRUE(token.stop_requested());
  EXPECT_EQ(locker->fencing_token(), 0u);
  // The locker stopped contending: it does not silently take the mutex back.
  faults_->set_mode(FaultInjectingBackend::Mode::kPass);
  auto other = Locker::create(*other_factory_, "job").value();
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually(
      [&] {
        auto r = other->try_acquire();
        return r.ok() && *r;
      },
      seconds(5)));
  SIMBA_EXPECT_OK(locker->release());
}

// A stop_callback on lost_token() may ask the locker about itself, as code
// that logs its loss does: the token was once stopped under the locker's
// lock, and such a callback deadlocked the thread that reported the loss.
TEST_F(LockerTest, ALossCallbackMayAskTheLockerAboutItself) {
  auto locker = Locker::create(*factory_, "job").value();
  SIMBA_ASSERT_OK(locker->acquire());
  std::atomic<int> heard{0};
  std::atomic<bool> held_then{true};
  std::atomic<std::uint64_t> token_then{1};
  std::stop_callback on_lost(locker->lost_token(), [&] {
    held_then = locker->is_held();
    token_then = locker->fencing_token();
    ++heard;
  });
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  clock_->advance(seconds(16));
  ASSERT_TRUE(eventually([&] { return heard.load() == 1; }, seconds(5)))
      << "the loss callback did not finish";
  EXPECT_FALSE(held_then.load());
  EXPECT_EQ(token_then.load(), 0u);
  faults_->set_mode(FaultInjectingBackend::Mode::kPass);
  SIMBA_EXPECT_OK(locker->release());
}

TEST_F(LockerTest, DoubleAcquireIsAPreconditionError) {
  auto locker = Locker::create(*factory_, "job").value();
  SIMBA_ASSERT_OK(locker->acquire());
  EXPECT_THAT(locker->acquire(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(locker->try_acquire(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(locker->acquire(milliseconds(-1)), StatusIs(StatusCode::kInvalidArgument));
  SIMBA_ASSERT_OK(locker->release());
  SIMBA_ASSERT_OK(locker->acquire());  // reusable after release
}

// Regression: the hook counting a run's attempts could land after the next
// try_acquire() had started and be counted for it, so a free mutex was
// reported busy under CPU load. Hammer try_acquire/release on real time
// with busy threads competing for the CPU; every answer must be "acquired".
TEST(LockerRace, TryAcquireOfAFreeMutexAlwaysSucceeds) {
  auto factory = MutexContendServiceFactory::open("memory://locker-race").value();
  auto locker = Locker::create(*factory, "job").value();
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 2; ++i) {
    hogs.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  int wrong = 0;
  for (int i = 0; i < 2000; ++i) {
    auto acquired = locker->try_acquire();
    ASSERT_THAT(acquired, testing::IsOk());
    if (!*acquired) ++wrong;
    SIMBA_ASSERT_OK(locker->release());
  }
  stop = true;
  for (auto& hog : hogs) hog.join();
  EXPECT_EQ(wrong, 0) << "try_acquire() said a free mutex was held";
}

// ---- a store that cannot be reached, or refuses us (issue #34) ----------------------

TEST_F(LockerTest, AStoreThatCannotBeReachedYetIsWaitedForWithinTheTimeout) {
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  auto locker = Locker::create(*factory_, "job").value();
  auto result = std::async(std::launch::async, [&] { return locker->acquire(seconds(30)); });
  // Failed tries, retried with a backoff, none of them the caller's error.
  ASSERT_TRUE(advance_until([&] { return faults_->acquire_calls() >= 5; }));
  EXPECT_EQ(result.wait_for(milliseconds(0)), std::future_status::timeout)
      << "gave up although its timeout had not passed";
  faults_->set_mode(FaultInjectingBackend::Mode::kPass);  // the store is back
  ASSERT_TRUE(
      advance_until([&] { return result.wait_for(milliseconds(0)) == std::future_status::ready; }));
  SIMBA_EXPECT_OK(result.get());
  EXPECT_TRUE(locker->is_held());
}

TEST_F(LockerTest, AStoreStillUnreachableAtTheTimeoutIsTheErrorNotABusyMutex) {
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  auto locker = Locker::create(*factory_, "job").value();
  auto result = std::async(std::launch::async, [&] { return locker->acquire(seconds(5)); });
  ASSERT_TRUE(
      advance_until([&] { return result.wait_for(milliseconds(0)) == std::future_status::ready; }));
  const Status status = result.get();
  EXPECT_THAT(status, StatusIs(StatusCode::kUnavailable,
                               ::testing::AllOf(::testing::HasSubstr("within 5000ms"),
                                                ::testing::HasSubstr("could not be reached"),
                                                ::testing::HasSubstr("tries failed in a row"),
                                                ::testing::HasSubstr("injected failure"))));
  EXPECT_GE(faults_->acquire_calls(), 4) << "it did not keep trying until the timeout";
  EXPECT_FALSE(locker->is_held());
  // One try (no time to wait): that try's error.
  EXPECT_THAT(locker->try_acquire(),
              StatusIs(StatusCode::kUnavailable, ::testing::HasSubstr("injected failure")));
  EXPECT_THAT(locker->acquire(milliseconds(0)), StatusIs(StatusCode::kUnavailable));
}

TEST_F(LockerTest, AStoreThatRefusesUsFailsTheAcquireAtOnce) {
  faults_->set_failure_status(permission_denied_error("AUTH refused"));
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  auto locker = Locker::create(*factory_, "job").value();
  // No virtual time passes: the first answer ends the wait, with or
  // without a timeout.
  EXPECT_THAT(locker->acquire(seconds(30)),
              StatusIs(StatusCode::kPermissionDenied, ::testing::HasSubstr("AUTH refused")));
  EXPECT_THAT(locker->acquire(),
              StatusIs(StatusCode::kPermissionDenied, ::testing::HasSubstr("AUTH refused")));
  EXPECT_EQ(faults_->acquire_calls(), 2);
  EXPECT_FALSE(locker->is_held());
}

TEST_F(LockerTest, RetriesThroughAnOutageComeAtLeastEveryTwoSecondsAndAHalf) {
  // ttl 10 s: the doubling backoff stops at 2 s (+ up to a quarter of it
  // as jitter), not at the ttl, so a store back after a long failover is
  // found within 2.5 s.
  faults_->set_mode(FaultInjectingBackend::Mode::kFail);
  auto locker = Locker::create(*factory_, "job").value();
  auto result = std::async(std::launch::async, [&] { return locker->acquire(seconds(60)); });
  // Past the ramp: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s (+ jitter) < 5 s.
  ASSERT_TRUE(advance_until([&] { return faults_->acquire_calls() >= 6; }));
  for (int i = 0; i < 4; ++i) {
    settle();  // the failed try's retry timer is set
    const int calls = faults_->acquire_calls();
    clock_->advance(milliseconds(2500));
    ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() > calls; }, seconds(5)))
        << "retry " << i << " came later than 2.5 s";
  }
  faults_->set_mode(FaultInjectingBackend::Mode::kPass);
  ASSERT_TRUE(
      advance_until([&] { return result.wait_for(milliseconds(0)) == std::future_status::ready; }));
  SIMBA_EXPECT_OK(result.get());
}

}  // namespace
}  // namespace simba
