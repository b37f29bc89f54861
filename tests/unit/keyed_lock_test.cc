// The keyed-lock core (src/core/keyed_lock.cc) on a virtual clock: the
// max_hold watchdog to the millisecond, reentrancy after it fired, a loss
// reported by the store, and the provider's end. The stores themselves are
// covered by the keyed suite (testing/keyed_conformance.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "simba/backends/memory.h"
#include "simba/clock.h"
#include "simba/keyed_lock.h"
#include "simba/metrics.h"
#include "simba/registry.h"
#include "testing/fault_injecting_backend.h"
#include "testing/forwarding_backend.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/thread_recorder.h"

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;

// A store whose holds the test can take away, as a lost session would.
class LosingBackend final : public KeyedLockBackend {
 public:
  LosingBackend() {
    capabilities_.mechanism = "test";
    capabilities_.fencing_tokens = true;
  }
  std::string_view scheme() const override { return "test"; }
  const KeyedLockCapabilities& capabilities() const override { return capabilities_; }
  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    on_lost_ = request.on_lost;
    return std::unique_ptr<KeyHold>(std::make_unique<Hold>(this, ++tokens_));
  }
  void lose_the_hold() {
    std::function<void()> lost;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost = on_lost_;
    }
    lost();
  }
  int releases() const { return releases_.load(); }

 private:
  class Hold final : public KeyHold {
   public:
    Hold(LosingBackend* backend, std::uint64_t token) : backend_(backend), token_(token) {}
    ~Hold() override {
      if (!released_) ++backend_->releases_;
    }
    std::uint64_t fencing_token() const override { return token_; }
    Status release(Deadline) override {
      released_ = true;
      ++backend_->releases_;
      return ok_status();
    }

   private:
    LosingBackend* backend_;
    std::uint64_t token_;
    bool released_ = false;
  };

  KeyedLockCapabilities capabilities_;
  std::mutex mu_;
  std::function<void()> on_lost_;
  std::uint64_t tokens_ = 0;
  std::atomic<int> releases_{0};
};

class KeyedLockTest : public ::testing::Test {
 protected:
  std::unique_ptr<KeyedLockProvider> make_provider(const std::string& name) {
    KeyedLockOptions options;
    options.clock = clock_;
    return KeyedLockProvider::create(new_memory_keyed_lock_backend(name).value(), options).value();
  }
  // True once the watchdog's timer thread waits for `at`.
  bool timer_waits_for(Clock::TimePoint at) {
    return eventually([&] { return clock_->has_waiter_until(at); }, seconds(5));
  }

  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
};

TEST_F(KeyedLockTest, TheWatchdogFiresAtMaxHoldToTheMillisecond) {
  auto provider = make_provider("watchdog");
  auto other = make_provider("watchdog");
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  EXPECT_EQ(lease->hold_deadline(), clock_->now() + seconds(10));
  ASSERT_TRUE(timer_waits_for(lease->hold_deadline()));
  clock_->advance(seconds(10) - milliseconds(1));
  EXPECT_TRUE(lease->is_held());
  auto blocked = other->try_acquire("k", milliseconds(0), seconds(1));
  ASSERT_THAT(blocked, testing::IsOk());
  EXPECT_FALSE(blocked->has_value());
  clock_->advance(milliseconds(1));
  // Not held from that instant on, even before the timer thread runs.
  EXPECT_FALSE(lease->is_held());
  ASSERT_TRUE(eventually([&] { return lease->lost_token().stop_requested(); }, seconds(5)));
  Result<std::optional<Lease>> taken = internal_error("not yet");
  ASSERT_TRUE(eventually(
      [&] {
        taken = other->try_acquire("k", milliseconds(0), seconds(1));
        return taken.ok() && taken->has_value();
      },
      seconds(5)))
      << "the watchdog did not free the key";
  SIMBA_EXPECT_OK(lease->release());
  EXPECT_TRUE((*taken)->is_held()) << "the late release freed the next holder";
}

// A stop_callback on lost_token() runs on the thread that ends the hold; it
// may ask the lease about itself (is_held(), fencing_token()), as code that
// logs its loss does. The hold once stopped the token under its own lock:
// such a callback deadlocked the watchdog's thread.
TEST_F(KeyedLockTest, ALossCallbackMayAskTheLeaseAboutItself) {
  auto provider = make_provider("watchdog-callback");
  auto lease = provider->acquire("k", seconds(1));
  ASSERT_THAT(lease, testing::IsOk());
  std::atomic<int> heard{0};
  std::atomic<bool> held_then{true};
  std::atomic<std::uint64_t> token_then{1};
  std::stop_callback on_lost(lease->lost_token(), [&] {
    held_then = lease->is_held();
    token_then = lease->fencing_token();
    ++heard;
  });
  ASSERT_TRUE(timer_waits_for(lease->hold_deadline()));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return heard.load() == 1; }, seconds(5)))
      << "the loss callback did not finish";
  EXPECT_FALSE(held_then.load());
  EXPECT_EQ(token_then.load(), 0u);
  SIMBA_EXPECT_OK(lease->release());
}

TEST_F(KeyedLockTest, AReentryAfterTheWatchdogIsANewHoldWithANewToken) {
  auto provider = make_provider("reentry-after-watchdog");
  auto outer = provider->acquire("k", seconds(1));
  ASSERT_THAT(outer, testing::IsOk());
  const std::uint64_t first = outer->fencing_token();
  ASSERT_TRUE(timer_waits_for(outer->hold_deadline()));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return outer->lost_token().stop_requested(); }, seconds(5)));
  auto fresh = provider->acquire("k", seconds(5));
  ASSERT_THAT(fresh, testing::IsOk());
  EXPECT_TRUE(fresh->is_held());
  EXPECT_GT(fresh->fencing_token(), first);
  EXPECT_EQ(fresh->hold_deadline(), clock_->now() + seconds(5));
  // Closing the old outer lease must not end the new hold.
  SIMBA_EXPECT_OK(outer->release());
  EXPECT_TRUE(fresh->is_held());
}

TEST_F(KeyedLockTest, ALeaseMayBeReleasedFromAnotherThread) {
  auto provider = make_provider("other-thread");
  auto other = make_provider("other-thread");
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  std::thread([&] { SIMBA_EXPECT_OK(lease->release()); }).join();
  auto taken = other->try_acquire("k", milliseconds(0), seconds(1));
  ASSERT_THAT(taken, testing::IsOk());
  EXPECT_TRUE(taken->has_value());
}

TEST_F(KeyedLockTest, AStoreLossEndsTheHoldAtOnce) {
  auto backend = std::make_shared<LosingBackend>();
  KeyedLockOptions options;
  options.clock = clock_;
  auto provider = KeyedLockProvider::create(backend, options).value();
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  auto inner = provider->acquire("k", seconds(10));
  ASSERT_THAT(inner, testing::IsOk());
  backend->lose_the_hold();
  EXPECT_FALSE(lease->is_held());
  EXPECT_FALSE(inner->is_held());
  EXPECT_TRUE(lease->lost_token().stop_requested());
  EXPECT_EQ(lease->fencing_token(), 0u);
  // The store hold is still given back (in the background), once.
  ASSERT_TRUE(eventually([&] { return backend->releases() == 1; }, seconds(5)));
  SIMBA_EXPECT_OK(inner->release());
  SIMBA_EXPECT_OK(lease->release());
  EXPECT_EQ(backend->releases(), 1);
}

TEST_F(KeyedLockTest, DestroyingTheProviderFreesWhatItsLeasesHold) {
  auto provider = make_provider("provider-end");
  auto other = make_provider("provider-end");
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  provider.reset();
  EXPECT_FALSE(lease->is_held());
  EXPECT_TRUE(lease->lost_token().stop_requested());
  auto taken = other->try_acquire("k", milliseconds(0), seconds(1));
  ASSERT_THAT(taken, testing::IsOk());
  EXPECT_TRUE(taken->has_value());
  SIMBA_EXPECT_OK(lease->release());  // harmless afterwards
}

TEST_F(KeyedLockTest, WaitersOfTheMemoryStoreAreServedInArrivalOrder) {
  auto provider = make_provider("fifo");
  auto holder = provider->acquire("k", seconds(10));
  ASSERT_THAT(holder, testing::IsOk());
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 5; ++i) {
    waiters.emplace_back([&, i] {
      auto lease = provider->acquire("k", seconds(10));
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
    // Each waiter queues before the next one starts.
    std::this_thread::sleep_for(milliseconds(50));
  }
  SIMBA_ASSERT_OK(holder->release());
  for (auto& waiter : waiters) waiter.join();
  EXPECT_THAT(order, ::testing::ElementsAre(0, 1, 2, 3, 4));
}

// What the provider reported, as text: "kind key token [cause]".
class EventRecorder final : public LockEventListener {
 public:
  void on_event(const LockEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string line = std::string(lock_event_kind_name(e.kind)) + " " + e.mutex + " " +
                       std::to_string(e.fencing_token);
    if (e.cause) line += " " + std::string(loss_cause_name(*e.cause));
    lines_.push_back(line);
    if (e.kind == LockEvent::Kind::kAcquired) {
      waited_ok_ =
          waited_ok_ && e.waited.has_value() && !e.contender_id.empty() && e.store == "memory";
    }
  }
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  bool waited_ok() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waited_ok_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  bool waited_ok_ = true;
};

// The servers' own keyed locks (here memory://) report through the provider,
// as contend services do: acquired, released, lost (at max_hold), and the
// waiting gauge while a thread waits.
TEST_F(KeyedLockTest, NativeHoldsReportToMetricsAndEvents) {
  auto metrics = std::make_shared<PrometheusMetrics>();
  auto events = std::make_shared<EventRecorder>();
  KeyedLockOptions options;
  options.clock = clock_;
  options.metrics = metrics;
  options.events = events;
  auto provider =
      KeyedLockProvider::create(new_memory_keyed_lock_backend("reports").value(), options).value();
  auto other = make_provider("reports");

  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  const std::uint64_t first = lease->fencing_token();
  SIMBA_ASSERT_OK(lease->release());

  // A wait: the waiting gauge shows it while the key is held elsewhere.
  auto blocker = other->acquire("w", seconds(60));
  ASSERT_THAT(blocker, testing::IsOk());
  Lease held_w;  // kept until max_hold: the watchdog ends it (a loss)
  std::thread waiter([&] {
    auto waited = provider->acquire("w", seconds(1));
    ASSERT_THAT(waited, testing::IsOk());
    held_w = std::move(*waited);
  });
  ASSERT_TRUE(eventually(
      [&] {
        return metrics->expose().find("simba_contenders_waiting{store=\"memory\",mutex=\"w\"} 1") !=
               std::string::npos;
      },
      seconds(5)));
  SIMBA_ASSERT_OK(blocker->release());
  waiter.join();
  ASSERT_TRUE(timer_waits_for(clock_->now() + seconds(1)));
  clock_->advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return events->lines().size() == 4; }, seconds(5)));

  const std::vector<std::string> lines = events->lines();
  EXPECT_EQ(lines[0], "acquired k " + std::to_string(first));
  EXPECT_EQ(lines[1], "released k " + std::to_string(first));
  EXPECT_EQ(lines[2].rfind("acquired w ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("lost w ", 0), 0u) << lines[3];
  EXPECT_NE(lines[3].find(" deadline_passed"), std::string::npos) << lines[3];
  EXPECT_TRUE(events->waited_ok());
  const std::string text = metrics->expose();
  EXPECT_NE(text.find("simba_acquisitions_total{store=\"memory\",mutex=\"k\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("simba_releases_total{store=\"memory\",mutex=\"k\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(
      text.find("simba_losses_total{store=\"memory\",mutex=\"w\",cause=\"deadline_passed\"} 1"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("simba_contenders_waiting{store=\"memory\",mutex=\"w\"} 0"),
            std::string::npos)
      << text;
}

// A store that ends a hold (a lost session) is a loss the store caused.
TEST_F(KeyedLockTest, AStoreLossIsReportedAsOtherOwner) {
  auto backend = std::make_shared<LosingBackend>();
  auto events = std::make_shared<EventRecorder>();
  KeyedLockOptions options;
  options.clock = clock_;
  options.events = events;
  auto provider = KeyedLockProvider::create(backend, options).value();
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  backend->lose_the_hold();
  SIMBA_EXPECT_OK(lease->release());  // after the loss: no second ending
  const std::vector<std::string> lines = events->lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "acquired k 1");
  EXPECT_EQ(lines[1], "lost k 1 other_owner");
}

// Holds of the lease backend are contend services, which report
// themselves: the provider adds nothing (nothing counted twice).
TEST_F(KeyedLockTest, LeaseHoldsAreReportedOnce) {
  auto metrics = std::make_shared<PrometheusMetrics>();
  auto store = open_backend("memory://keyed-once").value();
  auto backend = new_lease_keyed_lock_backend(store, KeyedLockOptions().lease, metrics).value();
  EXPECT_TRUE(backend->capabilities().reports_holds);
  KeyedLockOptions options;
  options.metrics = metrics;
  auto provider = KeyedLockProvider::create(backend, options).value();
  auto lease = provider->acquire("k", seconds(10));
  ASSERT_THAT(lease, testing::IsOk());
  SIMBA_ASSERT_OK(lease->release());
  ASSERT_TRUE(eventually(
      [&] {
        return metrics->expose().find("simba_releases_total{store=\"memory\",mutex=\"k\"} 1") !=
               std::string::npos;
      },
      seconds(5)))
      << metrics->expose();
  EXPECT_NE(metrics->expose().find("simba_acquisitions_total{store=\"memory\",mutex=\"k\"} 1"),
            std::string::npos)
      << metrics->expose();
}

// A memory store that counts what the keyed leases ask of it: live
// subscriptions, and the contender ids that tried to acquire.
class WatchingBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  // Answers naming another owner as a store that cannot know its times does
  // (ZooKeeper's JVM participants, etcd's waiters): times 0, and ask again
  // far beyond the test.
  void hide_other_owners_times() { hide_times_ = true; }

 protected:
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.emplace_back(request.contender_id);
    }
    Result<OwnerRecord> reply = target_->acquire_or_renew(request, deadline);
    if (hide_times_ && reply.ok() && reply->held() &&
        !reply->owner.is_owner(request.contender_id)) {
      reply->owner.ttl_at = reply->owner.transition_at = StoreTime(0);
      reply->ask_again_at = reply->store_now + seconds(120);
    }
    return reply;
  }
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view id,
      std::function<void(const MutexEvent&)> listener) override {
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Subscription> inner,
                           target_->subscribe(mutex, id, std::move(listener)));
    ++subscribed_;
    ++live_;
    return std::unique_ptr<Subscription>(std::make_unique<Counted>(std::move(inner), live_));
  }

 public:
  int subscribed() const { return subscribed_.load(); }
  int live() const { return live_.load(); }
  std::vector<std::string> ids() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }

 private:
  class Counted final : public Subscription {
   public:
    Counted(std::unique_ptr<Subscription> inner, std::atomic<int>& live)
        : inner_(std::move(inner)), live_(live) {}
    ~Counted() override {
      inner_.reset();
      --live_;
    }

   private:
    std::unique_ptr<Subscription> inner_;
    std::atomic<int>& live_;
  };

  std::atomic<bool> hide_times_{false};
  std::atomic<int> subscribed_{0};
  std::atomic<int> live_{0};
  mutable std::mutex mu_;
  std::vector<std::string> ids_;
};

// Keyed leases subscribe to the store's pushes only while they wait: a free
// key is taken and given back without a subscription, a waiter subscribes
// (and hears the release), and drops it once it holds the key.
void expect_lease_holds_subscribe_only_while_waiting(
    const std::shared_ptr<WatchingBackend>& store) {
  ASSERT_TRUE(store->capabilities().push_release);
  // A ttl far beyond the test: only a pushed release can hand the key over.
  ContendOptions lease;
  lease.ttl = seconds(60);
  lease.transition = seconds(10);
  auto a = KeyedLockProvider::create(new_lease_keyed_lock_backend(store, lease).value()).value();
  auto b = KeyedLockProvider::create(new_lease_keyed_lock_backend(store, lease).value()).value();
  auto held = a->acquire("k", seconds(60));
  ASSERT_THAT(held, testing::IsOk());
  EXPECT_EQ(store->subscribed(), 0) << "a free key was taken with a subscription";
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto taken = b->try_acquire("k", seconds(30), seconds(60));
    got = taken.ok() && taken->has_value();
  });
  ASSERT_TRUE(eventually([&] { return store->live() == 1; }, seconds(10)))
      << "the waiter never subscribed";
  SIMBA_ASSERT_OK(held->release());
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(store->subscribed(), 1);
  // The new holder gave its subscription up (after telling its caller).
  EXPECT_TRUE(eventually([&] { return store->live() == 0; }, seconds(10)));
}

TEST_F(KeyedLockTest, LeaseHoldsSubscribeOnlyWhileWaiting) {
  expect_lease_holds_subscribe_only_while_waiting(
      std::make_shared<WatchingBackend>(open_backend("memory://keyed-subscribe").value()));
}

// A waiter is waiting whether the store says when the owner's lease ends or
// cannot know it (etcd, ZooKeeper): it subscribes either way, or a release
// reaches it only when it asks again.
TEST_F(KeyedLockTest, LeaseWaitersSubscribeWhenTheStoreCannotTellTheOwnersTimes) {
  auto store = std::make_shared<WatchingBackend>(open_backend("memory://keyed-unknown").value());
  store->hide_other_owners_times();
  expect_lease_holds_subscribe_only_while_waiting(store);
}

// One contender per (provider, key), reused by the next hold of the key,
// however many threads of the provider take it.
TEST_F(KeyedLockTest, LeaseHoldsOfAKeyReuseTheProvidersContender) {
  auto store = std::make_shared<WatchingBackend>(open_backend("memory://keyed-reuse").value());
  auto provider = KeyedLockProvider::create(
                      new_lease_keyed_lock_backend(store, KeyedLockOptions().lease).value())
                      .value();
  for (int i = 0; i < 2; ++i) {
    auto lease = provider->acquire("k", seconds(60));
    ASSERT_THAT(lease, testing::IsOk());
    SIMBA_ASSERT_OK(lease->release());
  }
  std::thread other([&] {
    auto lease = provider->acquire("k", seconds(60));
    EXPECT_TRUE(lease.ok() && lease->is_held());
  });
  other.join();
  const std::vector<std::string> ids = store->ids();
  ASSERT_GE(ids.size(), 3u);
  for (const std::string& id : ids) EXPECT_EQ(id, ids.front());
}

// Holds up a key's callbacks at its first release (a listener runs on the
// key's own callback strand), and counts the acquisitions it was told of.
class ReleaseGate final : public LockEventListener {
 public:
  void on_event(const LockEvent& e) override {
    if (e.kind == LockEvent::Kind::kAcquired) ++acquired_;
    if (e.kind == LockEvent::Kind::kReleased && !held_up_.exchange(true)) {
      (void)open_.wait(seconds(10));
    }
  }
  void open() { open_.set(); }
  int acquired() const { return acquired_; }

 private:
  testing::Latch open_;
  std::atomic<bool> held_up_{false};
  std::atomic<int> acquired_{0};
};

// A keyed release does not wait for its hold's callbacks (that wait was two
// thread hops on every hand-off), so the callback saying that a hold ended
// can run after the next hold of the key began, on the same contender. It
// must not read as the next hold's loss.
TEST_F(KeyedLockTest, ALateCallbackOfAnEarlierHoldIsNotTheNextHoldsLoss) {
  auto gate = std::make_shared<ReleaseGate>();
  auto backend = new_lease_keyed_lock_backend(open_backend("memory://keyed-late").value(),
                                              KeyedLockOptions().lease, nullptr, gate)
                     .value();
  auto provider = KeyedLockProvider::create(backend).value();
  auto first = provider->acquire("k", seconds(60));
  ASSERT_TRUE(first.ok() && first->is_held());
  SIMBA_ASSERT_OK(first->release());  // its "ended" callback waits behind the gate
  auto second = provider->acquire("k", seconds(60));
  ASSERT_TRUE(second.ok() && second->is_held());
  gate->open();
  // The strand keeps order: once the second acquisition is told, the first
  // hold's late callback has run.
  ASSERT_TRUE(eventually([&] { return gate->acquired() >= 2; }, seconds(10)));
  EXPECT_FALSE(second->lost_token().stop_requested());
  EXPECT_TRUE(second->is_held());
  SIMBA_EXPECT_OK(second->release());
}

// Holds up the callbacks of one mutex: the first store error an owner meets
// blocks them until the test opens the gate.
class StoreErrorGate final : public LockEventListener {
 public:
  void on_event(const LockEvent& e) override {
    if (e.kind == LockEvent::Kind::kStoreError && e.fencing_token != 0 &&
        !held_up_.exchange(true)) {
      (void)open_.wait(seconds(10));
    }
  }
  void open() { open_.set(); }

 private:
  testing::Latch open_;
  std::atomic<bool> held_up_{false};
};

// On a lease store, is_held() answers for the lease, not for when its loss
// was delivered: a holder whose lease ran out while the loss still waits to
// be dispatched (a busy callback thread, a process resumed after a pause)
// must not count on it. It once read only the hold's own record, which the
// loss callback ends, so is_held() passed past the lease while another
// process could already hold the key.
TEST_F(KeyedLockTest, OnALeaseStoreIsHeldEndsWithTheLeaseNotWithItsLossCallback) {
  auto faults = std::make_shared<testing::FaultInjectingBackend>(
      open_backend("memory://keyed-lease-ends").value());
  auto gate = std::make_shared<StoreErrorGate>();
  ContendOptions lease;
  lease.ttl = milliseconds(300);
  lease.transition = milliseconds(200);
  auto provider =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(faults, lease, nullptr, gate).value())
          .value();
  auto held = provider->acquire("k", seconds(60));
  ASSERT_TRUE(held.ok() && held->is_held());
  const std::uint64_t token = held->fencing_token();
  ASSERT_GT(token, 0u);
  // Renewals fail from now on; the first failure blocks the callbacks, so
  // the loss the lease deadline raises waits behind it.
  const auto cut = std::chrono::steady_clock::now();
  faults->set_mode(testing::FaultInjectingBackend::Mode::kFail);
  // The lease was renewed at most ttl + transition before the cut.
  EXPECT_TRUE(eventually([&] { return !held->is_held(); }, seconds(3)))
      << "is_held() passed for "
      << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - cut).count()
      << " ms after its lease could last";
  EXPECT_LE(std::chrono::steady_clock::now() - cut, lease.ttl + lease.transition + seconds(1));
  EXPECT_EQ(held->fencing_token(), 0u);
  EXPECT_FALSE(held->lost_token().stop_requested()) << "the gate did not hold the loss back";
  gate->open();
  EXPECT_TRUE(eventually([&] { return held->lost_token().stop_requested(); }, seconds(10)));
  faults->set_mode(testing::FaultInjectingBackend::Mode::kPass);
  SIMBA_EXPECT_OK(held->release());
}

// On a lease store an acquisition would only wait for its first attempt:
// it runs on the caller's thread (one hop less, as for a Locker), unless a
// cancel token may end the wait before the store call does.
TEST_F(KeyedLockTest, OnALeaseStoreTheFirstAttemptRunsOnTheCallersThreadUnlessACancelMayEndIt) {
  auto faults = std::make_shared<testing::FaultInjectingBackend>(
      open_backend("memory://keyed-first-attempt").value());
  auto provider =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(faults, ContendOptions{}).value())
          .value();
  testing::ThreadRecorder asked;
  const auto record_thread = [&] { asked.record(); };
  faults->set_before_next_acquire_reply(record_thread);
  {
    auto held = provider->acquire("k", seconds(60));
    ASSERT_TRUE(held.ok() && held->is_held());
    EXPECT_TRUE(asked.recorded_here());
  }
  faults->set_before_next_acquire_reply(record_thread);
  {
    auto held = provider->try_acquire("k", milliseconds(0), seconds(60));
    ASSERT_TRUE(held.ok() && held->has_value());
    EXPECT_TRUE(asked.recorded_here());
  }
  std::stop_source cancel;
  faults->set_before_next_acquire_reply(record_thread);
  {
    auto held = provider->acquire("k", seconds(60), cancel.get_token());
    ASSERT_TRUE(held.ok() && held->is_held());
    EXPECT_FALSE(asked.recorded_here());
  }
}

// A memory store whose first subscribe, once made, waits until a second one
// has been made; and whose subscriptions check, as they are destroyed, that
// a listener of the waiter can still get in (it takes the waiter's lock).
class TwoSubscriptionsBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  ~TwoSubscriptionsBackend() override { join_probes(); }

  // Calls the first subscription's listener as a push would.
  void push_to_first(const MutexEvent& event) {
    std::function<void(const MutexEvent&)> listener;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listener = listeners_.at(0);
    }
    listener(event);
  }
  bool first_made(std::chrono::milliseconds timeout) { return first_made_.wait(timeout); }
  int made() const { return made_.load(); }
  bool destroyed_where_no_listener_could_run() const { return blocked_.load(); }
  void join_probes() {
    std::vector<std::thread> probes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      probes.swap(probes_);
    }
    for (std::thread& probe : probes) probe.join();
  }

 protected:
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view id,
      std::function<void(const MutexEvent&)> listener) override {
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Subscription> inner,
                           target_->subscribe(mutex, id, listener));
    const int n = ++made_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listeners_.push_back(listener);
    }
    if (n == 1) {
      first_made_.set();
      (void)second_made_.wait(seconds(10));
    } else if (n == 2) {
      second_made_.set();
    }
    return std::unique_ptr<Subscription>(
        std::make_unique<Probed>(std::move(inner), this, std::move(listener), std::string(mutex)));
  }

 private:
  // Destroying a subscription may wait for its listener, and a listener
  // waits for the waiter's lock: so a subscription must never be destroyed
  // under that lock. Its destructor sees whether a listener call on
  // another thread gets through.
  class Probed final : public Subscription {
   public:
    Probed(std::unique_ptr<Subscription> inner, TwoSubscriptionsBackend* backend,
           std::function<void(const MutexEvent&)> listener, std::string mutex)
        : inner_(std::move(inner)),
          backend_(backend),
          listener_(std::move(listener)),
          mutex_(std::move(mutex)) {}
    ~Probed() override {
      inner_.reset();
      auto through = std::make_shared<testing::Latch>();
      std::thread probe([listener = listener_, mutex = mutex_, through] {
        listener(MutexEvent{MutexEvent::Kind::kReleased, mutex, "somebody", 0});
        through->set();
      });
      if (!through->wait(seconds(2))) backend_->blocked_ = true;
      std::lock_guard<std::mutex> lock(backend_->mu_);
      backend_->probes_.push_back(std::move(probe));  // joined by the test
    }

   private:
    std::unique_ptr<Subscription> inner_;
    TwoSubscriptionsBackend* backend_;
    std::function<void(const MutexEvent&)> listener_;
    std::string mutex_;
  };

  testing::Latch first_made_;
  testing::Latch second_made_;
  std::atomic<int> made_{0};
  std::atomic<bool> blocked_{false};
  std::mutex mu_;
  std::vector<std::function<void(const MutexEvent&)>> listeners_;
  std::vector<std::thread> probes_;
};

// A waiter subscribes outside its lock, and a push on the subscription being
// made can start a second attempt that subscribes too. Whichever finishes
// second must drop its subscription outside the lock: it once replaced the
// other's under it, and destroying that one waited for its listener, which
// waited for the lock (the contended bench hung).
TEST_F(KeyedLockTest, AWaiterThatSubscribesTwiceAtOnceDropsOneOutsideItsLock) {
  auto memory = open_backend("memory://keyed-two-subscriptions").value();
  auto store = std::make_shared<TwoSubscriptionsBackend>(memory);
  ContendOptions lease;
  lease.ttl = seconds(60);
  lease.transition = seconds(10);
  auto holder =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(memory, lease).value()).value();
  auto waiter =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(store, lease).value()).value();
  auto held = holder->acquire("k", seconds(60));
  ASSERT_TRUE(held.ok() && held->is_held());
  std::atomic<bool> got{false};
  std::thread waiting([&] {
    auto taken = waiter->try_acquire("k", seconds(30), seconds(60));
    got = taken.ok() && taken->has_value();
  });
  ASSERT_TRUE(store->first_made(seconds(10))) << "the waiter never subscribed";
  // A push while the first subscribe has not returned: a second attempt,
  // which finds the key held and subscribes as well.
  store->push_to_first(MutexEvent{MutexEvent::Kind::kReleased, "k", "", 0});
  EXPECT_TRUE(eventually([&] { return store->made() >= 2; }, seconds(10)))
      << "no second attempt subscribed";
  SIMBA_ASSERT_OK(held->release());
  waiting.join();
  EXPECT_TRUE(got.load());
  store->join_probes();
  EXPECT_FALSE(store->destroyed_where_no_listener_could_run())
      << "a subscription was destroyed under the waiter's lock";
}

// A holder is not subscribed, so it does not hear a forced release; its next
// renewal finds the key free and takes it again, under a new token. That is
// a new tenure, not the hold's: the hold is lost (its token no longer fences
// anything), and it must be told.
TEST_F(KeyedLockTest, ARenewalThatComesBackWithANewTokenIsTheHoldsLoss) {
  std::shared_ptr<Backend> store = open_backend("memory://keyed-new-token").value();
  ContendOptions lease;
  lease.ttl = milliseconds(300);
  lease.transition = milliseconds(200);
  auto provider =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(store, lease).value()).value();
  auto held = provider->acquire("k", seconds(60));
  ASSERT_TRUE(held.ok() && held->is_held());
  const std::stop_token lost = held->lost_token();
  auto forced = store->force_release("k", Deadline::max());
  ASSERT_THAT(forced, testing::IsOk());
  // Its next renewal (within a ttl) takes the key again under a new token;
  // the hold hears at once. (The new tenure is given back as soon as the
  // hold is lost, so the test does not look for it at the store.)
  EXPECT_TRUE(eventually([&] { return lost.stop_requested(); }, seconds(10)))
      << "the hold was not told that its token ended";
  EXPECT_FALSE(held->is_held());
  EXPECT_EQ(held->fencing_token(), 0u);
  SIMBA_EXPECT_OK(held->release());
  // The provider gave the new tenure back: the key is free for others.
  auto other =
      KeyedLockProvider::create(new_lease_keyed_lock_backend(store, lease).value()).value();
  auto next = other->try_acquire("k", seconds(5), seconds(60));
  ASSERT_THAT(next, testing::IsOk());
  ASSERT_TRUE(next->has_value());
  // Above the forced floor and the renewal's tenure.
  EXPECT_GT((*next)->fencing_token(), forced->fencing_floor);
}

// A provider on a lease store runs on the threads of the store's factory:
// making it starts none of its own (it used to start three).
TEST_F(KeyedLockTest, AProviderOnALeaseStoreStartsNoThreadsOfItsOwn) {
  auto backend = new_lease_keyed_lock_backend(open_backend("memory://keyed-threads").value(),
                                              KeyedLockOptions().lease)
                     .value();
  const int before = testing::count_threads();
  auto provider = KeyedLockProvider::create(backend).value();
  EXPECT_EQ(testing::count_threads(), before);
  auto lease = provider->acquire("k", milliseconds(50));
  ASSERT_THAT(lease, testing::IsOk());
  // Its watchdog still frees the key at max_hold, on the shared threads.
  const std::stop_token lost = lease->lost_token();
  EXPECT_TRUE(eventually([&] { return lost.stop_requested(); }, seconds(10)));
}

// Keyed leases on a store that cannot be reached wait for it: a
// try_acquire that runs out meanwhile is kUnavailable naming the cause (not
// an empty optional: nobody else holds the key), one with time enough holds
// once the store is back; a store that refuses us fails at once (#34).
TEST_F(KeyedLockTest, LeasesWaitForAnUnreachableStoreAndFailOnARefusal) {
  auto faults = std::make_shared<testing::FaultInjectingBackend>(
      open_backend("memory://keyed-unreachable").value());
  faults->set_mode(testing::FaultInjectingBackend::Mode::kFail);
  auto provider = KeyedLockProvider::create(
                      new_lease_keyed_lock_backend(faults, KeyedLockOptions().lease).value())
                      .value();
  const auto started = std::chrono::steady_clock::now();
  auto ran_out = provider->try_acquire("k", milliseconds(600), seconds(10));
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(600));
  EXPECT_THAT(ran_out,
              testing::StatusIs(StatusCode::kUnavailable,
                                ::testing::AllOf(::testing::HasSubstr("key 'k'"),
                                                 ::testing::HasSubstr("could not be reached"),
                                                 ::testing::HasSubstr("injected failure"))));
  auto waited = std::async(std::launch::async,
                           [&] { return provider->try_acquire("k", seconds(10), seconds(10)); });
  std::this_thread::sleep_for(milliseconds(300));
  faults->set_mode(testing::FaultInjectingBackend::Mode::kPass);
  auto held = waited.get();
  ASSERT_THAT(held, testing::IsOk());
  ASSERT_TRUE(held->has_value());
  SIMBA_ASSERT_OK((*held)->release());

  faults->set_failure_status(permission_denied_error("AUTH refused"));
  faults->set_mode(testing::FaultInjectingBackend::Mode::kFail);
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_THAT(
      provider->try_acquire("k", seconds(30), seconds(10)),
      testing::StatusIs(StatusCode::kPermissionDenied, ::testing::HasSubstr("AUTH refused")));
  EXPECT_LT(std::chrono::steady_clock::now() - asked, seconds(5)) << "a refusal was waited out";
}

}  // namespace
}  // namespace simba
