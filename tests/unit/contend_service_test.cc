// The contend loop on virtual time: the memory backend and the factory share
// a ManualClock, so lease expiry, renewal and jitter are driven by the test.
// Waits for effects use real time (Eventually) because the loop runs on the
// factory's threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/renewal_batcher.h"
#include "core/runtime.h"
#include "simba/backends/memory.h"
#include "simba/contend_service.h"
#include "testing/fault_injecting_backend.h"
#include "testing/forwarding_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/virtual_time_test.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::FaultInjectingBackend;
using Mode = FaultInjectingBackend::Mode;
using ::testing::HasSubstr;
using ::testing::Not;

// Records callbacks in order.
class Events {
 public:
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  std::vector<std::string> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int count(const std::string& e) const {
    auto all = get();
    return static_cast<int>(std::count(all.begin(), all.end(), e));
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

class ContendServiceTest : public testing::VirtualTimeTest {
 protected:
  void SetUp() override {
    VirtualTimeTest::SetUp();
    a_factory_ = make_factory(faults_, pin_jitter);
    b_factory_ = make_factory(store_, pin_jitter);
  }

  // Jitter pinned at +1 ms: deterministic, and never a retry at the very
  // instant a lease ends (which the store still counts as held). Store calls
  // may hang long (the hang tests release them themselves).
  static void pin_jitter(FactoryOptions& options) {
    options.random = std::make_shared<testing::FixedRandom>(1);
    options.contend.operation_timeout = seconds(30);
  }

  std::shared_ptr<MutexContender> contender(const std::string& name, Events* events) {
    return make_contender(
        "m", [events, name](const MutexState&) { events->add(name + " acquired"); },
        [events, name](const MutexState&) { events->add(name + " released"); });
  }

  std::string store_owner() {
    return store_->read("m", std::chrono::steady_clock::now() + seconds(1))->owner.owner_id;
  }

  std::unique_ptr<MutexContendServiceFactory> a_factory_;  // through faults_
  std::unique_ptr<MutexContendServiceFactory> b_factory_;  // straight to the store
  Events events_;
};

TEST_F(ContendServiceTest, AcquiresAtOnceAndRenewsExactlyAtTtl) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return events_.count("A acquired") == 1; }, seconds(5)));
  EXPECT_EQ(faults_->acquire_calls(), 1);
  const auto token = a->fencing_token();
  const auto first_deadline = *a->lease_deadline();
  // The deadline is the hard lease (16 s) from the send time, less the margin.
  EXPECT_EQ(first_deadline, clock_->now() + seconds(16) - milliseconds(200));

  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(10) - milliseconds(1));
  settle();
  EXPECT_EQ(faults_->acquire_calls(), 1) << "renewed before ttl";
  clock_->advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return *a->lease_deadline() > first_deadline; }, seconds(5)));
  EXPECT_EQ(a->fencing_token(), token);
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired"));
  SIMBA_ASSERT_OK(a->stop());
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released"));
  EXPECT_EQ(store_owner(), "");
}

TEST_F(ContendServiceTest, StopHandsOverByPushWithoutWaitingForAPoll) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  auto b = b_factory_->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(5)));
  const auto a_token = a->fencing_token();
  SIMBA_ASSERT_OK(a->stop());
  // No clock movement at all: only the push can wake B.
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  EXPECT_GT(b->fencing_token(), a_token);
  SIMBA_ASSERT_OK(b->stop());
}

// A backend that already holds a waiter's answer (a PostgreSQL wait line's
// grant) says so in its push: the waiter asks on the pushing thread, no hop
// to the I/O pool; any other release is asked about there.
TEST_F(ContendServiceTest, AReleaseWithTheAnswerAtHandIsAskedOnTheDeliveringThread) {
  auto b = b_factory_->create_contend_service(contender("B", &events_)).value();
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(
      eventually([&] { return a->after_owner().owner_id == b->contender_id(); }, seconds(5)));
  settle();
  std::mutex mu;
  std::thread::id asked_on;
  const auto record_thread = [&] {
    std::lock_guard<std::mutex> lock(mu);
    asked_on = std::this_thread::get_id();
  };
  // A plain release (B still holds, so A asks and waits on).
  faults_->set_before_next_acquire_reply(record_thread);
  const int calls = faults_->acquire_calls();
  faults_->push(MutexEvent{MutexEvent::Kind::kReleased, "m", b->contender_id(), 0});
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() > calls; }, seconds(5)));
  settle();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(asked_on, std::this_thread::get_id()) << "a plain release was asked about here";
  }
  // B lets go without A hearing it; then the push with A's answer at hand.
  faults_->set_store_pushes_lost(true);
  SIMBA_ASSERT_OK(b->stop());
  faults_->set_store_pushes_lost(false);
  faults_->set_before_next_acquire_reply(record_thread);
  MutexEvent at_hand{MutexEvent::Kind::kReleased, "m", b->contender_id(), 0};
  at_hand.answered_for = a->contender_id();
  faults_->push(at_hand);
  // Asked and applied before push() returned.
  EXPECT_TRUE(a->is_owner());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(asked_on, std::this_thread::get_id());
  }
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, AStoreThatSaysTheHoldIsLostRevokesAtOnce) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const auto token = a->fencing_token();
  // Events for another contender or another tenure change nothing.
  faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", "someone-else", 0});
  faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", a->contender_id(), token + 1});
  faults_->push(MutexEvent{MutexEvent::Kind::kReleased, "m", "", 0});
  settle();
  EXPECT_TRUE(a->is_owner());
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired"));
  // No clock movement: the loss itself revokes, and the service contends
  // again at once (here the store still has A, so A holds it again).
  const int calls = faults_->acquire_calls();
  faults_->set_acquire_mode(testing::FaultInjectingBackend::Mode::kFail);
  faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", a->contender_id(), token});
  EXPECT_FALSE(a->is_owner());
  EXPECT_EQ(a->fencing_token(), 0u);
  ASSERT_TRUE(eventually([&] { return events_.count("A released") == 1; }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() > calls; }, seconds(5)));
  // (The failed retry has scheduled the next one before the clock moves.)
  ASSERT_TRUE(waiting(milliseconds(101)));
  faults_->set_acquire_mode(testing::FaultInjectingBackend::Mode::kPass);
  // "" names every owner (a connection lost for all of them).
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  // (Store calls fail meanwhile, so the revoked owner cannot win it back
  // before we look.)
  faults_->set_acquire_mode(testing::FaultInjectingBackend::Mode::kFail);
  faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", "", 0});
  EXPECT_FALSE(a->is_owner());
  faults_->set_acquire_mode(testing::FaultInjectingBackend::Mode::kPass);
  SIMBA_ASSERT_OK(a->stop());
}

// A release naming nobody is a store's "look again" (its push channel just
// came up, so a push may have been missed): the owner renews at once, which
// is how it learns of a forced release it was not told of; a release naming
// another contender is no news to it.
TEST_F(ContendServiceTest, AReleaseNamingNobodyMakesTheOwnerRenewAtOnce) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  settle();
  const int calls = faults_->acquire_calls();
  faults_->push(MutexEvent{MutexEvent::Kind::kReleased, "m", "someone-else", 0});
  settle();
  EXPECT_EQ(faults_->acquire_calls(), calls) << "an owner renewed on another's release";
  // The store ends A's hold without a word reaching A (a forced release
  // pushed before A's subscription was up), and B holds it now.
  faults_->set_store_pushes_lost(true);
  SIMBA_ASSERT_OK(store_->force_release("m", std::chrono::steady_clock::now() + seconds(5)));
  ASSERT_THAT(store_->acquire_or_renew(AcquireRequest{"m", "B", seconds(10), seconds(6)},
                                       std::chrono::steady_clock::now() + seconds(5)),
              testing::IsOk());
  settle();
  EXPECT_TRUE(a->is_owner()) << "A heard of the force although its pushes were lost";
  // No clock movement: only the "look again" can make A ask the store.
  faults_->set_store_pushes_lost(false);
  faults_->push(MutexEvent{MutexEvent::Kind::kReleased, "m", "", 0});
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() > calls; }, seconds(5)))
      << "the owner did not renew on a release naming nobody";
  ASSERT_TRUE(eventually([&] { return events_.count("A released") == 1; }, seconds(5)));
  EXPECT_FALSE(a->is_owner());
  EXPECT_EQ(a->after_owner().owner_id, "B");
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, AnAnswerThatMayPredateALossIsAskedAgain) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  // A loss reaches the service while its first acquire's answer ("you own
  // it") is on the way, and the store fails from then on: the answer may be
  // older than the loss, so it must not make A the owner.
  faults_->set_before_next_acquire_reply([&] {
    faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", "", 0});
    faults_->set_acquire_mode(Mode::kFail);
  });
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() >= 2; }, seconds(5)))
      << "the doubtful answer is asked again at once";
  ASSERT_TRUE(waiting(milliseconds(101)));  // the retry after that failure
  EXPECT_FALSE(a->is_owner());
  EXPECT_TRUE(events_.get().empty());
  faults_->set_acquire_mode(Mode::kPass);
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return events_.count("A acquired") == 1; }, seconds(5)));
  // The same for an owner whose renewal is out when its loss arrives.
  const auto token = a->fencing_token();
  const int calls = faults_->acquire_calls();
  faults_->set_before_next_acquire_reply([&] {
    faults_->push(MutexEvent{MutexEvent::Kind::kLost, "m", a->contender_id(), token});
    faults_->set_acquire_mode(Mode::kFail);
  });
  clock_->advance(seconds(10));  // the renewal
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() >= calls + 2; }, seconds(5)));
  settle();
  EXPECT_FALSE(a->is_owner());
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released"));
  faults_->set_acquire_mode(Mode::kPass);
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, WaiterPollsAtTheEndOfTheTransitionPlusJitter) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  auto b = b_factory_->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(5)));
  // A dies silently (every call fails from now on, so it cannot renew).
  faults_->set_mode(Mode::kFail);
  clock_->advance(seconds(16) - milliseconds(200));
  ASSERT_TRUE(eventually([&] { return events_.count("A released") == 1; }, seconds(5)))
      << "A is revoked locally at its lease deadline";
  EXPECT_FALSE(a->is_owner());
  settle();
  EXPECT_FALSE(b->is_owner()) << "B must not acquire before the store's lease ends";
  clock_->advance(milliseconds(201));  // transition_at + 1 ms jitter
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  // Ownership is decided before its callback runs: wait for the callback.
  ASSERT_TRUE(eventually([&] { return events_.count("B acquired") == 1; }, seconds(5)));
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released", "B acquired"));
  faults_->set_mode(Mode::kPass);
  SIMBA_ASSERT_OK(b->stop());
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, OwnerRetriesAFailedRenewalInsideTheTransitionWindow) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const auto token = a->fencing_token();
  faults_->set_acquire_mode(Mode::kFail);
  clock_->advance(seconds(10));  // renewal due: fails
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  // First retry: a quarter of what is left of the lease, at most 1 s.
  ASSERT_TRUE(waiting(seconds(1)));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 3; }, seconds(5)));
  EXPECT_TRUE(a->is_owner()) << "still inside the lease";
  faults_->set_acquire_mode(Mode::kPass);
  ASSERT_TRUE(waiting(seconds(1)));
  clock_->advance(seconds(1));  // next retry succeeds
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 4; }, seconds(5)));
  ASSERT_TRUE(
      eventually([&] { return *a->lease_deadline() > clock_->now() + seconds(15); }, seconds(5)));
  // Well past where the first lease would have ended.
  clock_->advance(seconds(5));
  EXPECT_TRUE(a->is_owner());
  EXPECT_EQ(a->fencing_token(), token);
  settle();
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired"));
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, HangingRenewalIsRevokedAtTheDeadlineWhileTheCallStillHangs) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  faults_->set_acquire_mode(Mode::kHang);
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  clock_->advance(seconds(6) - milliseconds(201));
  settle();
  EXPECT_TRUE(a->is_owner());
  clock_->advance(milliseconds(1));
  EXPECT_FALSE(a->is_owner()) << "is_owner() checks the deadline itself";
  ASSERT_TRUE(eventually([&] { return events_.count("A released") == 1; }, seconds(5)));
  EXPECT_EQ(faults_->acquire_calls(), 2) << "the renewal is still hanging";
  faults_->set_acquire_mode(Mode::kPass);
  SIMBA_ASSERT_OK(a->stop());
}

// DESIGN §2: every acquisition's token is above every earlier one's. A hold
// that ended here at its deadline is still alive at the store for the lease
// margin (and longer on a store that restarts leases): the renewal that hung
// through the deadline lands there and the store grants the hold back under
// its old token. That grant is given back and the mutex asked for anew.
TEST_F(ContendServiceTest, AHoldThatEndedHereIsNeverTakenBackUnderItsToken) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const auto token = a->fencing_token();
  faults_->set_acquire_mode(Mode::kHang);
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  clock_->advance(seconds(6) - milliseconds(200));  // the local deadline
  ASSERT_TRUE(eventually([&] { return events_.count("A released") == 1; }, seconds(5)));
  EXPECT_EQ(store_owner(), a->contender_id()) << "the store's lease still runs";
  faults_->set_acquire_mode(Mode::kPass);  // the hung renewal reaches the store
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  EXPECT_GT(a->fencing_token(), token);
  settle();
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released", "A acquired"));
  SIMBA_ASSERT_OK(a->stop());
}

// Found by the fault runs (issue #9): a worker letting go called stop(), its
// release reached the store (which handed the mutex to another worker) but
// the answer was held up, and the old owner heard on_released only when the
// release gave up, a second after the new owner had started. The owner must
// hear it before the release leaves.
TEST_F(ContendServiceTest, StopTellsTheOwnerBeforeTheReleaseLeaves) {
  std::atomic<int> releases_sent_before_on_released{-1};
  auto a = a_factory_
               ->create_contend_service(make_contender(
                   "m", [](const MutexState&) {},
                   [&](const MutexState&) {
                     releases_sent_before_on_released = faults_->release_calls();
                     events_.add("A released");
                   }))
               .value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const std::uint64_t token = a->fencing_token();
  faults_->set_mode(Mode::kHang);
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    (void)a->stop();
    stopped = true;
  });
  ASSERT_TRUE(eventually([&] { return faults_->release_calls() == 1; }, seconds(5)));
  EXPECT_EQ(events_.count("A released"), 1) << "told at once, with no time passing";
  EXPECT_EQ(releases_sent_before_on_released, 0) << "on_released ran before the release left";
  EXPECT_FALSE(a->is_owner());
  EXPECT_FALSE(stopped) << "the release is still hanging";
  EXPECT_EQ(faults_->last_release_token(), token)
      << "the release names the ownership it ends: should it reach the store late, it cannot "
         "end a later one";
  faults_->set_mode(Mode::kPass);
  stopper.join();
  EXPECT_EQ(events_.count("A released"), 1) << "and only once";
  EXPECT_EQ(a->status(), ServiceStatus::kInitial);
  EXPECT_EQ(store_owner(), "") << "released at the store once it answered";
}

TEST_F(ContendServiceTest, AReplyThatOutlivedItsLeaseIsNotTrusted) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_acquire_mode(Mode::kHang);
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 1; }, seconds(5)));
  // The store grants 16 s from when it runs the call; the call was sent 20 s
  // earlier, so locally that lease may already be over.
  clock_->advance(seconds(20));
  faults_->set_acquire_mode(Mode::kPass);
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return events_.count("A acquired") == 1; }, seconds(5)));
  settle();
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired"));
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, AnAcquisitionLandingAfterStopIsReleasedAndNeverReported) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_acquire_mode(Mode::kHang);
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 1; }, seconds(5)));
  SIMBA_ASSERT_OK(a->stop());
  // Owning nothing it knows of, stop() only left the wait.
  EXPECT_EQ(faults_->release_calls(), 0);
  EXPECT_EQ(faults_->leave_calls(), 1);
  faults_->set_acquire_mode(Mode::kPass);  // the stale call now acquires...
  // ...and the compensating release gives it back, by its token.
  ASSERT_TRUE(eventually([&] { return faults_->release_calls() == 1; }, seconds(5)));
  EXPECT_NE(faults_->last_release_token(), 0u);
  EXPECT_EQ(store_owner(), "");
  settle();
  EXPECT_THAT(events_.get(), ::testing::IsEmpty());
  EXPECT_FALSE(a->is_owner());
}

// The same race for a waiter: its attempt, out when stop() left the wait,
// queues it again when it lands (a store that queues its waiters would
// later grant that entry the mutex, held by nobody for a lease). The
// stopped core leaves again when the stale answer comes. etcd's late-leave
// conformance case caught the entry once under ASan.
TEST_F(ContendServiceTest, AWaitLandingAfterStopIsLeftAgain) {
  auto b = b_factory_->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_acquire_mode(Mode::kHang);
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 1; }, seconds(5)));
  SIMBA_ASSERT_OK(a->stop());
  EXPECT_EQ(faults_->leave_calls(), 1);
  faults_->set_acquire_mode(Mode::kPass);  // the stale call now lands: B owns, A waits
  EXPECT_TRUE(eventually([&] { return faults_->leave_calls() == 2; }, seconds(5)))
      << "the stopped waiter did not leave again";
  EXPECT_EQ(faults_->release_calls(), 0);
  EXPECT_EQ(store_owner(), b->contender_id());
  EXPECT_FALSE(a->is_owner());
  SIMBA_ASSERT_OK(b->stop());
}

// A store that can hand a hold over before its lease ends (PostgreSQL's and
// MySQL's session-backed tenures) bounds believing it by a HoldBound. The
// owner stops believing the moment the bound passes, before any callback or
// renewal, and never believes that tenure again: its next answer, though it
// still names the owner with the old token, is given back for a new token.
TEST_F(ContendServiceTest, AHoldIsBelievedOnlyWhileTheStoresBoundHolds) {
  auto bound = std::make_shared<HoldBound>();
  bound->set_until(std::chrono::steady_clock::now() + std::chrono::hours(1));
  faults_->set_hold_bound(bound);
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const std::uint64_t token = a->fencing_token();
  ASSERT_NE(token, 0U);

  bound->set_until(std::chrono::steady_clock::now() - milliseconds(1));
  EXPECT_FALSE(a->is_owner()) << "believed past the store's bound";
  EXPECT_EQ(a->fencing_token(), 0U);
  EXPECT_FALSE(a->lease_deadline().has_value());

  // The next tenure gets a bound of its own; the renewal finds the old one
  // named, which is over: given back, asked anew.
  auto fresh = std::make_shared<HoldBound>();
  fresh->set_until(std::chrono::steady_clock::now() + std::chrono::hours(1));
  faults_->set_hold_bound(fresh);
  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return a->is_owner() && a->fencing_token() > token; }, seconds(5)));
  EXPECT_GE(faults_->release_calls(), 1);
  EXPECT_EQ(faults_->last_release_token(), token);
  // (Callbacks run on the strand, after is_owner() says so.)
  ASSERT_TRUE(eventually([&] { return events_.get().size() >= 3; }, seconds(5)));
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released", "A acquired"));
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, RestartWhileAnOldAttemptIsInFlightStillAcquires) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_acquire_mode(Mode::kHang);
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 1; }, seconds(5)));
  SIMBA_ASSERT_OK(a->stop());
  SIMBA_ASSERT_OK(a->start());
  settle();
  faults_->set_acquire_mode(Mode::kPass);
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  // The stale result was not compensated away: the new lifecycle owns it.
  EXPECT_EQ(store_owner(), a->contender_id());
  EXPECT_EQ(faults_->release_calls(), 0);
  EXPECT_EQ(faults_->leave_calls(), 1);
  SIMBA_ASSERT_OK(a->stop());
}

// Keyed leases and clustered locks run each hold on a core of its own under
// one contender id. A stopped core's acquisition still in flight and the
// next core's first attempt reach the store together (a partition heals):
// the store grants the first and counts the second as its renewal, one
// token for both. The stopped core's late grant must not be given back: the
// running core holds it. It once was, and the running core went on
// believing in a hold the store had freed and given to another (the
// clustered fault runs on PostgreSQL: two owners after every healed
// partition of all workers).
TEST_F(ContendServiceTest, AStoppedCoreNeverGivesBackWhatARunningCoreOfItsContenderHolds) {
  auto node = [this] {
    return make_contender(
        "m", [this](const MutexState&) { events_.add("A acquired"); },
        [this](const MutexState&) { events_.add("A released"); }, "node-a");
  };
  auto old_core = a_factory_->create_contend_service(node()).value();
  faults_->set_acquire_mode(Mode::kHang);
  SIMBA_ASSERT_OK(old_core->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 1; }, seconds(5)));
  SIMBA_ASSERT_OK(old_core->stop());
  auto new_core = a_factory_->create_contend_service(node()).value();
  SIMBA_ASSERT_OK(new_core->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  faults_->set_acquire_mode(Mode::kPass);  // both reach the store now
  ASSERT_TRUE(eventually([&] { return new_core->is_owner(); }, seconds(5)));
  settle();
  // The old core's stop() only left the wait (before either acquisition
  // reached the store), and nothing was released.
  EXPECT_EQ(faults_->release_calls(), 0) << "the stopped core gave the running core's hold back";
  EXPECT_EQ(faults_->leave_calls(), 1);
  EXPECT_EQ(store_owner(), new_core->contender_id());
  EXPECT_TRUE(new_core->is_owner());
  SIMBA_ASSERT_OK(new_core->stop());
  EXPECT_EQ(store_owner(), "");
}

// The clustered fault runs on PostgreSQL (2026-11-28): a waiter core of a
// node gave up during a black hole of every worker, and its stop() released,
// naming no token. That request reached the store after the heal, when the
// node's next core had acquired the mutex, and ended that ownership while
// the node still worked under it. A waiter that gives up now only leaves the
// wait, which leaves an ownership alone however late it arrives.
TEST_F(ContendServiceTest, AWaiterGivingUpLateNeverEndsALaterHoldOfItsContender) {
  auto node = [] { return make_contender("m", nullptr, nullptr, "node-a"); };
  auto b = b_factory_->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  auto old_core = a_factory_->create_contend_service(node()).value();
  SIMBA_ASSERT_OK(old_core->start());
  ASSERT_TRUE(
      eventually([&] { return old_core->after_owner().is_owner(b->contender_id()); }, seconds(5)));
  faults_->set_releases_held_back(true);  // the partition: its request times out
  EXPECT_THAT(old_core->stop(), testing::StatusIs(StatusCode::kDeadlineExceeded));
  faults_->set_releases_held_back(false);  // the heal
  SIMBA_ASSERT_OK(b->stop());
  auto new_core = a_factory_->create_contend_service(node()).value();
  SIMBA_ASSERT_OK(new_core->start());
  ASSERT_TRUE(eventually([&] { return new_core->is_owner(); }, seconds(5)));
  const std::uint64_t token = new_core->fencing_token();
  ASSERT_EQ(faults_->deliver_held_back(), 1);  // the old request arrives only now
  auto held = store_->read("m", std::chrono::steady_clock::now() + seconds(1));
  SIMBA_ASSERT_OK(held);
  EXPECT_EQ(held->owner.owner_id, "node-a") << "the late request ended the new core's hold";
  EXPECT_EQ(held->owner.fencing_token, token);
  SIMBA_ASSERT_OK(new_core->stop());
  EXPECT_EQ(store_owner(), "");
}

TEST_F(ContendServiceTest, StoreErrorsAreRetriedWithGrowingBackoff) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_mode(Mode::kFail);
  SIMBA_ASSERT_OK(a->start());
  // 100 ms (+ jitter pinned at 1 ms), then 200 ms, then 400 ms.
  ASSERT_TRUE(waiting(milliseconds(101)));
  EXPECT_EQ(faults_->acquire_calls(), 1);
  clock_->advance(milliseconds(100));
  settle();
  EXPECT_EQ(faults_->acquire_calls(), 1);
  clock_->advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  ASSERT_TRUE(waiting(milliseconds(201)));
  clock_->advance(milliseconds(201));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 3; }, seconds(5)));
  ASSERT_TRUE(waiting(milliseconds(401)));
  clock_->advance(milliseconds(300));
  settle();
  EXPECT_EQ(faults_->acquire_calls(), 3);
  faults_->set_mode(Mode::kPass);
  clock_->advance(milliseconds(101));
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, StoreSayingWhenToRetryIsRetriedThenNotByBackoff) {
  // Redis's restart guard says when it grants leases again: the contender
  // comes back then (+ jitter pinned at 1 ms), not where the doubling
  // backoff lands (100, 300, 700, 1500, 3100 ms...: up to a ttl late).
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_failure_retry_after(milliseconds(2500));
  faults_->set_mode(Mode::kFail);
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(waiting(milliseconds(2501)));
  EXPECT_EQ(faults_->acquire_calls(), 1);
  clock_->advance(milliseconds(2500));
  settle();
  EXPECT_EQ(faults_->acquire_calls(), 1);
  faults_->set_mode(Mode::kPass);
  clock_->advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  EXPECT_EQ(faults_->acquire_calls(), 2);
  SIMBA_ASSERT_OK(a->stop());
}

// A retry the store scheduled (an election that changed under the call, a
// restart guard) is expected: logged at info, not warned about. A failure
// the store gave no time for still warns (at the default level).
TEST_F(ContendServiceTest, ARetryTheStoreScheduledIsNoWarning) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  faults_->set_failure_retry_after(milliseconds(0));
  faults_->set_mode(Mode::kFail);
  ::testing::internal::CaptureStderr();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() >= 1; }, seconds(5)));
  settle();
  const std::string scheduled = ::testing::internal::GetCapturedStderr();
  faults_->set_mode(Mode::kPass);  // for the stop's leave()
  SIMBA_ASSERT_OK(a->stop());
  EXPECT_THAT(scheduled, Not(HasSubstr("simba[W]")));

  auto b = a_factory_->create_contend_service(contender("B", &events_)).value();
  faults_->set_failure_retry_after(std::nullopt);
  faults_->set_mode(Mode::kFail);
  ::testing::internal::CaptureStderr();
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() >= 2; }, seconds(5)));
  settle();
  const std::string unscheduled = ::testing::internal::GetCapturedStderr();
  faults_->set_mode(Mode::kPass);
  SIMBA_ASSERT_OK(b->stop());
  EXPECT_THAT(unscheduled, HasSubstr("simba[W] mutex 'm': store unreachable"));
}

TEST_F(ContendServiceTest, CallbacksMayCallBackIntoTheServiceEvenStop) {
  std::unique_ptr<MutexContendService> service;
  std::atomic<bool> was_owner{false};
  std::atomic<bool> stop_ok{false};
  auto contender = make_contender(
      "m",
      [&](const MutexState&) {
        was_owner = service->is_owner();
        (void)service->mutex_state();
        stop_ok = service->stop().ok();
      },
      [&](const MutexState&) { events_.add("released"); });
  service = a_factory_->create_contend_service(contender).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(eventually([&] { return stop_ok.load(); }, seconds(5)));
  EXPECT_TRUE(was_owner.load());
  ASSERT_TRUE(eventually([&] { return events_.count("released") == 1; }, seconds(5)));
  EXPECT_EQ(service->status(), ServiceStatus::kInitial);
  EXPECT_EQ(store_owner(), "");
}

TEST_F(ContendServiceTest, CallbacksOfOneServiceNeverOverlapAndKeepTheirOrder) {
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  auto enter = [&] {
    if (inside.fetch_add(1) != 0) overlapped = true;
    std::this_thread::sleep_for(milliseconds(50));
    inside.fetch_sub(1);
  };
  auto contender = make_contender(
      "m",
      [&](const MutexState&) {
        enter();
        events_.add("acquired");
      },
      [&](const MutexState&) {
        enter();
        events_.add("released");
      });
  auto a = a_factory_->create_contend_service(contender).value();
  for (int i = 0; i < 3; ++i) {
    SIMBA_ASSERT_OK(a->start());
    ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
    SIMBA_ASSERT_OK(a->stop());  // returns after the callbacks ran
  }
  EXPECT_FALSE(overlapped.load());
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("acquired", "released", "acquired", "released",
                                                    "acquired", "released"));
}

TEST_F(ContendServiceTest, LifecycleMisuseIsRejected) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  EXPECT_THAT(a->stop(),
              testing::StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("INITIAL")));
  SIMBA_ASSERT_OK(a->start());
  EXPECT_THAT(a->start(),
              testing::StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("RUNNING")));
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, DestroyingTheFactoryStopsItsServices) {
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  a_factory_.reset();
  EXPECT_EQ(a->status(), ServiceStatus::kInitial);
  EXPECT_EQ(store_owner(), "");
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released"));
  EXPECT_THAT(a->start(), testing::StatusIs(StatusCode::kFailedPrecondition));
}

TEST_F(ContendServiceTest, DestroyingARunningServiceReleasesItsMutex) {
  {
    auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
    SIMBA_ASSERT_OK(a->start());
    ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  }
  EXPECT_EQ(store_owner(), "");
}

TEST_F(ContendServiceTest, RetrieverFollowsTheOwner) {
  std::vector<MutexState> seen;
  std::mutex mu;
  auto observer =
      b_factory_
          ->create_retrieval_service(make_retriever("m",
                                                    [&](const MutexState& s) {
                                                      std::lock_guard<std::mutex> lock(mu);
                                                      seen.push_back(s);
                                                    }))
          .value();
  SIMBA_ASSERT_OK(observer->start());
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  // No push for acquisitions from the memory store: the poll interval (1 s).
  ASSERT_TRUE(waiting(seconds(1)));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return observer->after_owner().owner_id == a->contender_id(); },
                         seconds(5)));
  EXPECT_TRUE(observer->has_owner());
  SIMBA_ASSERT_OK(a->stop());
  // Releases are pushed.
  ASSERT_TRUE(eventually([&] { return observer->after_owner().owner_id.empty(); }, seconds(5)));
  SIMBA_ASSERT_OK(observer->stop());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(seen.size(), 3u);
}

// Answers like a store that cannot know another owner's times (a ZooKeeper
// participant of JVM Simba; the owner ahead of an etcd waiter): that owner's
// times unknown (0), and "ask again" 10 s after the store's now.
class UnknownOwnerTimesBackend final : public testing::ForwardingBackend {
 public:
  explicit UnknownOwnerTimesBackend(std::shared_ptr<Backend> target)
      : ForwardingBackend(std::move(target), /*pushes=*/false) {}
  int acquire_calls() const { return acquire_calls_.load(); }

 protected:
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    ++acquire_calls_;
    auto reply = target_->acquire_or_renew(request, deadline);
    if (reply.ok() && reply->owner.has_owner_id() && !reply->owner.is_owner(request.contender_id)) {
      reply->owner.acquired_at = reply->owner.ttl_at = reply->owner.transition_at = StoreTime(0);
      reply->ask_again_at = reply->store_now + seconds(10);
    }
    return reply;
  }

 private:
  std::atomic<int> acquire_calls_{0};
};

TEST_F(ContendServiceTest, OwnerOfUnknownTimesHoldsAndIsAskedAgainBeforeTheStoresTime) {
  auto backend = std::make_shared<UnknownOwnerTimesBackend>(store_);
  auto b_factory = make_factory(backend, pin_jitter);
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  auto b = b_factory->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(5)));
  // Times of 0 are "unknown", not "ended": A holds until the store says not.
  EXPECT_TRUE(b->has_owner());
  EXPECT_EQ(b->after_owner().transition_at, StoreTime(0));
  const int calls = backend->acquire_calls();
  // 10 s left: back 750 ms early, less the pinned 1 ms of jitter.
  ASSERT_TRUE(waiting(milliseconds(9249)));
  clock_->advance(milliseconds(9248));
  settle();
  EXPECT_EQ(backend->acquire_calls(), calls) << "asked again before its time";
  EXPECT_TRUE(b->has_owner());
  clock_->advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return backend->acquire_calls() == calls + 1; }, seconds(5)));
  SIMBA_ASSERT_OK(b->stop());
  SIMBA_ASSERT_OK(a->stop());
}

// Draws -150 ms where the contend period allows negative jitter, +1 ms
// where it does not.
class EarlyWhereAllowed final : public Random {
 public:
  std::int64_t uniform(std::int64_t lo, std::int64_t /*hi*/) override { return lo < 0 ? -150 : 1; }
};

// A waiter's attempt that its negative jitter made land before the owner's
// lease end finds the lease running, with 150 ms left: its next attempt
// comes after the end, not early again (and again: a spin until the end).
TEST_F(ContendServiceTest, WaiterThatCameEarlyComesBackAfterTheLeaseEnd) {
  auto b_faults = std::make_shared<FaultInjectingBackend>(store_);
  auto b_factory = make_factory(b_faults, [](FactoryOptions& options) {
    options.random = std::make_shared<EarlyWhereAllowed>();
    options.contend.operation_timeout = seconds(30);
  });
  auto a = a_factory_->create_contend_service(contender("A", &events_)).value();
  auto b = b_factory->create_contend_service(contender("B", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  faults_->set_mode(Mode::kFail);  // A dies silently: its lease ends at 16 s
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(
      eventually([&] { return b->after_owner().owner_id == a->contender_id(); }, seconds(5)));
  const int calls = b_faults->acquire_calls();
  ASSERT_TRUE(waiting(seconds(16) - milliseconds(150)));
  clock_->advance(seconds(16) - milliseconds(150));
  ASSERT_TRUE(eventually([&] { return b_faults->acquire_calls() == calls + 1; }, seconds(5)));
  settle();
  EXPECT_EQ(b_faults->acquire_calls(), calls + 1) << "came early more than once";
  EXPECT_FALSE(b->is_owner());
  clock_->advance(milliseconds(151));  // the lease end + 1 ms of jitter
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  EXPECT_EQ(b_faults->acquire_calls(), calls + 2);
  faults_->set_mode(Mode::kPass);
  SIMBA_ASSERT_OK(b->stop());
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ContendServiceTest, FactoryRejectsBadOptions) {
  FactoryOptions options;
  options.contend.ttl = milliseconds(0);
  EXPECT_THAT(MutexContendServiceFactory::create(store_, options),
              testing::StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("ttl")));
  options = {};
  options.io_threads = 0;
  EXPECT_THAT(MutexContendServiceFactory::create(store_, options),
              testing::StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(MutexContendServiceFactory::create(nullptr, {}),
              testing::StatusIs(StatusCode::kInvalidArgument));
}

// A store that renews in batches (as PostgreSQL and MySQL do), on the
// memory store: renew() renews each request whose contender owns its mutex
// by that contender's own acquire_or_renew, and answers the others with what
// the store has, as one call.
class BatchingBackend final : public testing::ForwardingBackend {
 public:
  BatchingBackend(std::shared_ptr<Backend> target, bool pushes)
      : ForwardingBackend(std::move(target), pushes), capabilities_(target_->capabilities()) {
    capabilities_.batch_renewals = true;
  }
  const Capabilities& capabilities() const override { return capabilities_; }
  int acquire_calls() const { return acquire_calls_.load(); }
  int renew_calls() const { return renew_calls_.load(); }
  int renewed() const { return renewed_.load(); }

 protected:
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    ++acquire_calls_;
    return target_->acquire_or_renew(request, deadline);
  }
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override {
    ++renew_calls_;
    std::vector<OwnerRecord> records;
    for (const AcquireRequest& request : requests) {
      SIMBA_ASSIGN_OR_RETURN(OwnerRecord record, target_->read(request.mutex, deadline));
      if (record.owner.is_owner(request.contender_id) && record.owner.has_owner(record.store_now)) {
        SIMBA_ASSIGN_OR_RETURN(record, target_->acquire_or_renew(request, deadline));
        ++renewed_;
      }
      records.push_back(std::move(record));
    }
    return records;
  }

 private:
  Capabilities capabilities_;
  std::atomic<int> acquire_calls_{0};
  std::atomic<int> renew_calls_{0};
  std::atomic<int> renewed_{0};
};

// Owners that acquired at scattered times renew together: after their first
// renewal each renews at a meeting point (a multiple of ttl / 8, at most that
// much early), so 20 leases over 3 periods cost a few batched calls, not 60
// renewals, and every lease holds throughout with its token.
TEST_F(ContendServiceTest, RenewalsGoTogetherInFewCallsAndEveryLeaseHolds) {
  auto backend = std::make_shared<BatchingBackend>(store_, /*pushes=*/true);
  auto factory = make_factory(backend, pin_jitter);
  std::vector<std::unique_ptr<MutexContendService>> services;
  std::vector<std::uint64_t> tokens;
  for (int i = 0; i < 20; ++i) {
    services.push_back(
        factory
            ->create_contend_service(make_contender(
                "m" + std::to_string(i), [](const MutexState&) {}, [](const MutexState&) {}))
            .value());
    SIMBA_ASSERT_OK(services.back()->start());
    ASSERT_TRUE(eventually([&] { return services.back()->is_owner(); }, seconds(5)));
    tokens.push_back(services.back()->fencing_token());
    clock_->advance(milliseconds(300));  // acquisitions over 6 s
    settle();
  }
  ASSERT_EQ(backend->acquire_calls(), 20);
  for (int step = 0; step < 300; ++step) {  // three periods of ttl (10 s)
    clock_->advance(milliseconds(100));
    settle();
  }
  EXPECT_EQ(backend->acquire_calls(), 20) << "no renewal went alone";
  EXPECT_GE(backend->renewed(), 20 * 3);
  // At most one call per meeting point (8 a period), and the first
  // renewals of leases acquired over 6 s meet in at most 6 of them.
  EXPECT_LE(backend->renew_calls(), 3 * 8);
  for (std::size_t i = 0; i < services.size(); ++i) {
    EXPECT_TRUE(services[i]->is_owner()) << i;
    EXPECT_EQ(services[i]->fencing_token(), tokens[i]) << i;
  }
  for (auto& service : services) SIMBA_ASSERT_OK(service->stop());
}

// A batched renewal never acquires: one that finds the hold gone (an
// operator's forced release, unheard without push) reports the loss, and the
// service then acquires anew, under a new token.
TEST_F(ContendServiceTest, ABatchedRenewalThatFindsTheHoldGoneReportsTheLoss) {
  auto backend = std::make_shared<BatchingBackend>(store_, /*pushes=*/false);
  auto factory = make_factory(backend, pin_jitter);
  auto a = factory->create_contend_service(contender("A", &events_)).value();
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const std::uint64_t token = a->fencing_token();
  SIMBA_ASSERT_OK(store_->force_release("m", std::chrono::steady_clock::now() + seconds(1)));
  for (int step = 0; step < 110 && backend->renew_calls() == 0; ++step) {
    clock_->advance(milliseconds(100));
    settle();
  }
  ASSERT_EQ(backend->renew_calls(), 1);
  EXPECT_EQ(backend->renewed(), 0);
  ASSERT_TRUE(eventually([&] { return events_.count("A acquired") == 2; }, seconds(5)));
  EXPECT_THAT(events_.get(), ::testing::ElementsAre("A acquired", "A released", "A acquired"));
  EXPECT_GT(a->fencing_token(), token);
  EXPECT_EQ(backend->acquire_calls(), 2);
  SIMBA_ASSERT_OK(a->stop());
}

// A store whose renew() waits (at most 2 s) until another renew() is out
// too, and answers every request with a free mutex: how many calls were out
// at once.
class OverlapWatchingBackend final : public testing::ForwardingBackend {
 public:
  explicit OverlapWatchingBackend(std::shared_ptr<Backend> target)
      : ForwardingBackend(std::move(target), /*pushes=*/false),
        capabilities_(target_->capabilities()) {
    capabilities_.batch_renewals = true;
  }
  const Capabilities& capabilities() const override { return capabilities_; }
  int calls() const { return calls_.load(); }
  int most_at_once() const { return most_at_once_.load(); }

 protected:
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline) override {
    ++calls_;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++out_;
      most_at_once_ = std::max(most_at_once_.load(), out_);
      // Once two were out together, the rest need not wait.
      overlapped_ = overlapped_ || out_ >= 2;
      cv_.notify_all();
      cv_.wait_for(lock, seconds(2), [&] { return overlapped_; });
      --out_;
    }
    OwnerRecord free;
    free.store_now = StoreTime(1);
    return std::vector<OwnerRecord>(requests.size(), free);
  }

 private:
  Capabilities capabilities_;
  std::mutex mu_;
  std::condition_variable cv_;
  int out_ = 0;              // guarded by mu_
  bool overlapped_ = false;  // guarded by mu_
  std::atomic<int> calls_{0};
  std::atomic<int> most_at_once_{0};
};

// A meeting point of more renewals than one call carries (10,000 owners in
// step): the calls of its chunks are out together, each chunk's answers
// applied while the next is out, instead of each call waiting for the one
// before it to be answered. (Before, the second call went out only after
// the first one's answers: most_at_once was 1.)
TEST_F(ContendServiceTest, TheChunksOfOneMeetingPointGoOutTogether) {
  auto backend = std::make_shared<OverlapWatchingBackend>(store_);
  auto runtime = std::make_shared<internal::Runtime>(clock_, /*io_threads=*/2,
                                                     /*callback_threads=*/1);
  auto batcher = std::make_shared<internal::RenewalBatcher>(runtime, backend);
  constexpr int kRenewals = 2 * static_cast<int>(internal::RenewalBatcher::kMaxBatch) + 1;
  std::atomic<int> answered{0};
  std::atomic<int> failed{0};
  for (int i = 0; i < kRenewals; ++i) {
    ASSERT_TRUE(batcher->submit("m" + std::to_string(i), "c", seconds(10), seconds(6),
                                std::chrono::steady_clock::now() + seconds(10),
                                [&](Result<OwnerRecord> reply, Clock::TimePoint) {
                                  if (!reply.ok()) ++failed;
                                  ++answered;
                                }));
  }
  clock_->advance(internal::RenewalBatcher::kGather);
  settle();
  ASSERT_TRUE(eventually([&] { return answered.load() == kRenewals; }, seconds(10)));
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(backend->calls(), 3) << "1,000 requests a call";
  EXPECT_GE(backend->most_at_once(), 2) << "the chunks went one after another";
}

}  // namespace
}  // namespace simba
