#include "testing/keyed_conformance.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "simba/registry.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

#ifndef SIMBA_KEYED_HOLDER_PATH
#error "SIMBA_KEYED_HOLDER_PATH must name the simba-test-keyed-holder binary"
#endif

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

milliseconds since(steady_clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
}

// Two providers on one store stand for two processes; keys carry the test's
// name, so tests sharing a server (and a database's lock space) never meet.
class KeyedFixture {
 public:
  explicit KeyedFixture(const KeyedTarget& target)
      : target_(target), unique_(unique_test_name()), uri_(target.uri(unique_)) {}

  std::unique_ptr<KeyedLockProvider> provider() {
    auto provider = KeyedLockProvider::open(uri_, target_.options);
    EXPECT_THAT(provider, IsOk()) << uri_;
    return provider.ok() ? std::move(provider).value() : nullptr;
  }
  // Short (SQL stores allow 66 bytes), and unique per test run.
  std::string key(const std::string& name) const {
    char prefix[24];
    std::snprintf(prefix, sizeof prefix,
                  "t%08zx:", std::hash<std::string>()(unique_) & 0xffffffffu);
    return prefix + name;
  }
  const std::string& uri() const { return uri_; }
  const KeyedTarget& target() const { return target_; }

 private:
  KeyedTarget target_;
  std::string unique_;
  std::string uri_;
};

// Held by another thread until release().
class HeldElsewhere {
 public:
  HeldElsewhere(KeyedLockProvider& provider, const std::string& key, milliseconds max_hold) {
    thread_ = std::thread([&provider, key, max_hold, this] {
      auto lease = provider.acquire(key, max_hold);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ok_ = lease.ok() && lease->is_held();
        acquired_ = true;
      }
      cv_.notify_all();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return release_; });
    });
  }
  ~HeldElsewhere() {
    release();
    thread_.join();
  }
  bool wait_held() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, seconds(30), [&] { return acquired_; });
    return ok_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool acquired_ = false;
  bool ok_ = false;
  bool release_ = false;
  std::thread thread_;
};

TEST_P(KeyedConformance, ReportsWhatTheStoreCanDo) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  const KeyedLockCapabilities& caps = provider->capabilities();
  EXPECT_FALSE(caps.mechanism.empty());
  EXPECT_GT(caps.max_key_length, 0u);
  const KeyedExpectations& expect = fx.target().expect;
  EXPECT_EQ(caps.fencing_tokens, expect.fencing_tokens);
  EXPECT_EQ(caps.fifo, expect.fifo);
  EXPECT_EQ(caps.push_handoff, expect.push_handoff);
  EXPECT_EQ(caps.freed_with_session, expect.freed_with_session);
  RecordProperty("mechanism", caps.mechanism);
}

TEST_P(KeyedConformance, EightThreadsIncrementExactlyUnderOneKey) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  constexpr int kThreads = 8;
  constexpr int kIncrements = 1000;
  const std::string key = fx.key("counter");
  // Read and written in two steps, as a plain variable would be: only the
  // lock keeps increments from being lost. (Atomic only so that
  // ThreadSanitizer, which cannot see a lock held at a store, stays quiet.)
  std::atomic<long long> counter{0};
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        auto lease = provider->acquire(key, seconds(30));
        if (!lease.ok() || !lease->is_held()) {
          ++failures;
          continue;
        }
        if (inside.fetch_add(1) != 0) ++overlaps;
        const long long seen = counter.load(std::memory_order_relaxed);
        counter.store(seen + 1, std::memory_order_relaxed);
        inside.fetch_sub(1);
        if (!lease->release().ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(overlaps.load(), 0) << "two threads held the key at once";
  EXPECT_EQ(counter.load(), kThreads * kIncrements);
}

TEST_P(KeyedConformance, TwoProvidersExcludeEachOther) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("shared");
  auto lease = a->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  auto other = b->try_acquire(key, milliseconds(0), seconds(30));
  ASSERT_THAT(other, IsOk());
  EXPECT_FALSE(other->has_value()) << "another client took a held key";
  SIMBA_ASSERT_OK(lease->release());
  auto after = b->try_acquire(key, seconds(10), seconds(30));
  ASSERT_THAT(after, IsOk());
  EXPECT_TRUE(after->has_value() && (*after)->is_held());
}

TEST_P(KeyedConformance, DifferentKeysNeverBlockEachOther) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  HeldElsewhere first(*provider, fx.key("one"), seconds(30));
  ASSERT_TRUE(first.wait_held());
  const auto start = steady_clock::now();
  auto second = provider->try_acquire(fx.key("two"), milliseconds(0), seconds(30));
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE(second->has_value() && (*second)->is_held()) << "a held key blocked a different one";
  EXPECT_LT(since(start), seconds(5));
}

TEST_P(KeyedConformance, ReentryKeepsTheFirstMaxHoldAndOnlyTheOutermostReleaseFrees) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  auto other = fx.provider();
  ASSERT_TRUE(provider && other);
  const std::string key = fx.key("reentrant");
  auto outer = provider->acquire(key, seconds(30));
  ASSERT_THAT(outer, IsOk());
  // Re-entry: at once, the same hold, the first max_hold (not 1 h, not 1 s).
  auto inner = provider->try_acquire(key, milliseconds(0), std::chrono::hours(1));
  ASSERT_THAT(inner, IsOk());
  ASSERT_TRUE(inner->has_value());
  EXPECT_EQ((*inner)->hold_deadline(), outer->hold_deadline());
  EXPECT_EQ((*inner)->fencing_token(), outer->fencing_token());
  auto innermost = provider->acquire(key, milliseconds(1));
  ASSERT_THAT(innermost, IsOk());
  EXPECT_EQ(innermost->hold_deadline(), outer->hold_deadline()) << "a re-entry shortened it";
  SIMBA_ASSERT_OK(innermost->release());
  SIMBA_ASSERT_OK((*inner)->release());
  SIMBA_ASSERT_OK((*inner)->release());  // idempotent
  EXPECT_TRUE(outer->is_held()) << "an inner release freed the key";
  auto blocked = other->try_acquire(key, milliseconds(0), seconds(30));
  ASSERT_THAT(blocked, IsOk());
  EXPECT_FALSE(blocked->has_value()) << "the key was free while the outer lease held it";
  SIMBA_ASSERT_OK(outer->release());
  EXPECT_FALSE(outer->is_held());
  auto freed = other->try_acquire(key, seconds(10), seconds(30));
  ASSERT_THAT(freed, IsOk());
  EXPECT_TRUE(freed->has_value());
}

TEST_P(KeyedConformance, AnotherThreadOfTheSameProviderDoesNotReenter) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  const std::string key = fx.key("per-thread");
  auto lease = provider->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  Result<std::optional<Lease>> from_other = internal_error("not run");
  std::thread([&] {
    from_other = provider->try_acquire(key, milliseconds(200), seconds(30));
  }).join();
  ASSERT_THAT(from_other, IsOk());
  EXPECT_FALSE(from_other->has_value()) << "reentrancy is per thread, not per provider";
}

TEST_P(KeyedConformance, TheWatchdogFreesTheKeyAtMaxHold) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  auto other = fx.provider();
  ASSERT_TRUE(provider && other);
  const std::string key = fx.key("watchdog");
  const milliseconds max_hold(700);
  const auto start = steady_clock::now();
  auto lease = provider->acquire(key, max_hold);
  ASSERT_THAT(lease, IsOk());
  // A re-entry asking for longer changes nothing.
  auto inner = provider->acquire(key, seconds(60));
  ASSERT_THAT(inner, IsOk());
  const std::stop_token lost = lease->lost_token();
  ASSERT_TRUE(eventually([&] { return lost.stop_requested(); }, seconds(10)))
      << "the watchdog never fired";
  EXPECT_GE(since(start), max_hold);
  EXPECT_FALSE(lease->is_held());
  EXPECT_FALSE(inner->is_held());
  EXPECT_EQ(lease->fencing_token(), 0u);
  // Whatever the holder does now, the key is free for others.
  auto taken = other->try_acquire(key, seconds(10), seconds(30));
  ASSERT_THAT(taken, IsOk());
  EXPECT_TRUE(taken->has_value()) << "the watchdog did not free the key at the store";
  // The late releases are harmless.
  SIMBA_EXPECT_OK(inner->release());
  SIMBA_EXPECT_OK(lease->release());
  EXPECT_TRUE((*taken)->is_held()) << "a late release freed the next holder's key";
}

TEST_P(KeyedConformance, TryAcquireGivesUpAfterMaxWait) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("busy");
  auto lease = a->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  const auto start = steady_clock::now();
  auto waited = b->try_acquire(key, milliseconds(400), seconds(30));
  const milliseconds took = since(start);
  ASSERT_THAT(waited, IsOk());
  EXPECT_FALSE(waited->has_value());
  EXPECT_GE(took, milliseconds(400));
  EXPECT_LT(took, milliseconds(400) + seconds(3)) << "max_wait overrun";
  RecordProperty("try_acquire_400ms_took_ms", std::to_string(took.count()));
}

TEST_P(KeyedConformance, AWaiterGetsTheKeyWhenItIsReleased) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("handoff");
  auto lease = a->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  std::atomic<bool> got{false};
  steady_clock::time_point got_at;
  // Push stores wake the waiter at once: two round trips (the release, then
  // the waiter's acquisition) on a loaded machine. Polling stores: within
  // the waiter's contend period, the hard lease plus the largest jitter
  // (DESIGN §3), plus the acquisition's round trip.
  const KeyedLockOptions& options = fx.target().options;
  const milliseconds bound = fx.target().expect.push_handoff
                                 ? scaled(milliseconds(1000))
                                 : options.lease.ttl + options.lease.transition +
                                       milliseconds(1000) + scaled(milliseconds(500));
  std::thread waiter([&] {
    auto w = b->try_acquire(key, bound + seconds(20), seconds(30));
    got_at = steady_clock::now();
    got = w.ok() && w->has_value();
  });
  // Not a synchronization: B gets the key whether it has begun to wait or
  // not; this lets it begin, so the hand-off (not a first try) is measured.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(got.load());
  const auto released = steady_clock::now();
  SIMBA_ASSERT_OK(lease->release());
  waiter.join();
  ASSERT_TRUE(got.load());
  const auto took = std::chrono::duration_cast<milliseconds>(got_at - released);
  EXPECT_LT(took, bound) << (fx.target().expect.push_handoff ? "push" : "polling")
                         << " hand-off too slow";
  RecordProperty("handoff_ms", std::to_string(took.count()));
}

// Waiters of a fifo store get a key in the order they asked: B, who waited
// before C, holds it next. (Stores that promise no order are only checked
// not to claim one.)
TEST_P(KeyedConformance, FifoStoresServeWaitersInArrivalOrder) {
  KeyedFixture fx(GetParam());
  const KeyedTarget& target = fx.target();
  auto a = fx.provider();
  auto b = fx.provider();
  auto c = fx.provider();
  ASSERT_TRUE(a && b && c);
  if (!target.expect.fifo) {
    EXPECT_FALSE(a->capabilities().fifo);
    return;
  }
  if (!target.store_lists_waiters) {
    // Not a skip: the store's own suite asserts the order, named here.
    EXPECT_FALSE(target.order_tested_by.empty())
        << "a fifo store needs store_lists_waiters or a test of its order in order_tested_by";
    return;
  }
  auto store = open_backend(fx.uri());
  ASSERT_THAT(store, IsOk());
  const std::string key = fx.key("fifo");
  const auto waiting_is = [&](std::size_t n) {
    return eventually(
        [&] {
          auto now = (*store)->waiters(key, steady_clock::now() + seconds(10));
          return now.ok() && now->size() == n;
        },
        seconds(10));
  };
  auto lease = a->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  std::mutex mu;
  std::vector<std::string> order;
  const auto wait_for_key = [&](KeyedLockProvider& provider, const std::string& who) {
    return std::thread([&provider, &key, &mu, &order, who] {
      auto held = provider.try_acquire(key, seconds(30), seconds(30));
      if (!held.ok() || !held->has_value()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(who);
      }
      (void)(*held)->release();
    });
  };
  std::thread tb = wait_for_key(*b, "B");
  ASSERT_TRUE(waiting_is(1)) << "B never queued";
  std::thread tc = wait_for_key(*c, "C");
  ASSERT_TRUE(waiting_is(2)) << "C never queued behind B";
  SIMBA_ASSERT_OK(lease->release());
  tb.join();
  tc.join();
  EXPECT_THAT(order, ::testing::ElementsAre("B", "C"));
}

TEST_P(KeyedConformance, CancellingAWaitReturnsPromptly) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("cancel");
  auto lease = a->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  std::stop_source cancel;
  Result<Lease> waited = internal_error("not run");
  std::thread waiter([&] { waited = b->acquire(key, seconds(30), cancel.get_token()); });
  std::this_thread::sleep_for(milliseconds(300));
  const auto start = steady_clock::now();
  cancel.request_stop();
  waiter.join();
  EXPECT_LT(since(start), seconds(2));
  EXPECT_THAT(waited, StatusIs(StatusCode::kCancelled));
  // The cancelled waiter left nothing behind: once released, the key is free.
  SIMBA_ASSERT_OK(lease->release());
  auto again = b->try_acquire(key, seconds(10), seconds(30));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->has_value());
}

TEST_P(KeyedConformance, FencingTokensGrowWithEveryHolder) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("tokens");
  std::uint64_t last = 0;
  for (int i = 0; i < 6; ++i) {
    auto lease = (i % 2 == 0 ? a : b)->acquire(key, seconds(30));
    ASSERT_THAT(lease, IsOk());
    const std::uint64_t token = lease->fencing_token();
    if (a->capabilities().fencing_tokens) {
      EXPECT_GT(token, last) << "holder " << i;
    } else {
      EXPECT_EQ(token, 0u) << "a store without tokens must not make them up";
    }
    last = token;
    SIMBA_ASSERT_OK(lease->release());
  }
}

TEST_P(KeyedConformance, DestroyingOrMovingALeaseReleasesExactlyOnce) {
  KeyedFixture fx(GetParam());
  auto a = fx.provider();
  auto b = fx.provider();
  ASSERT_TRUE(a && b);
  const std::string key = fx.key("raii");
  {
    auto lease = a->acquire(key, seconds(30));
    ASSERT_THAT(lease, IsOk());
    Lease moved = std::move(*lease);
    EXPECT_TRUE(moved.is_held());
    EXPECT_FALSE(lease->is_held());
    EXPECT_EQ(moved.key(), key);
  }
  auto after = b->try_acquire(key, seconds(10), seconds(30));
  ASSERT_THAT(after, IsOk());
  EXPECT_TRUE(after->has_value()) << "destroying the lease did not free the key";
  Lease empty;
  EXPECT_FALSE(empty.is_held());
  SIMBA_EXPECT_OK(empty.release());
}

TEST_P(KeyedConformance, BadInputIsRejectedClearly) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  EXPECT_THAT(provider->acquire("", seconds(1)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("key")));
  EXPECT_THAT(provider->acquire(std::string("a\nb"), seconds(1)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("key")));
  EXPECT_THAT(provider->acquire(fx.key("k"), milliseconds(0)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("max_hold")));
  EXPECT_THAT(provider->try_acquire(fx.key("k"), milliseconds(-1), seconds(1)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("max_wait")));
  const std::string too_long(provider->capabilities().max_key_length + 1, 'k');
  EXPECT_THAT(provider->acquire(too_long, seconds(1)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("key")));
}

// Ekbatan's wallet: concurrent deposits, each a read-modify-write under the
// wallet's key, lock taken by the caller around the whole "transaction".
TEST_P(KeyedConformance, ConcurrentWalletDepositsAreAllCommitted) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  auto second_node = fx.provider();
  ASSERT_TRUE(provider && second_node);
  constexpr int kDeposits = 40;
  const std::string wallet = fx.key("wallet:42");
  std::atomic<long long> balance{0};  // two-step read and write, as above
  std::atomic<int> busy{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kDeposits; ++i) {
    KeyedLockProvider& node = i % 2 == 0 ? *provider : *second_node;
    callers.emplace_back([&, i] {
      auto lease = node.try_acquire(wallet, seconds(60), seconds(10));
      if (!lease.ok() || !lease->has_value()) {
        ++busy;
        return;
      }
      const long long read = balance.load(std::memory_order_relaxed);  // read state
      std::this_thread::sleep_for(milliseconds(1));                    // plan the update
      balance.store(read + (i + 1), std::memory_order_relaxed);        // commit
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(busy.load(), 0);
  EXPECT_EQ(balance.load(), kDeposits * (kDeposits + 1) / 2) << "a deposit was lost";
}

// ---- other processes -----------------------------------------------------------

TEST_P(KeyedCrossProcess, AKilledHoldersKeyIsFreed) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  const std::string key = fx.key("crash");
  const KeyedLockOptions& options = fx.target().options;
  Subprocess holder({SIMBA_KEYED_HOLDER_PATH, "--store", fx.uri(), "--key", key, "--ttl-ms",
                     std::to_string(options.lease.ttl.count()), "--transition-ms",
                     std::to_string(options.lease.transition.count())});
  ASSERT_TRUE(holder.started());
  auto held = holder.wait_for_line("HELD", seconds(20));
  ASSERT_TRUE(held.has_value()) << "the other process never held the key";
  auto blocked = provider->try_acquire(key, milliseconds(0), seconds(30));
  ASSERT_THAT(blocked, IsOk());
  EXPECT_FALSE(blocked->has_value()) << "took a key another process holds";
  const auto killed = steady_clock::now();
  holder.signal(SIGKILL);
  holder.wait();
  auto taken = provider->try_acquire(key, fx.target().crash_freed_within, seconds(30));
  ASSERT_THAT(taken, IsOk());
  EXPECT_TRUE(taken->has_value()) << "the dead holder's key was not freed within "
                                  << fx.target().crash_freed_within.count() << " ms";
  RecordProperty("freed_after_kill_ms", std::to_string(since(killed).count()));
}

TEST_P(KeyedCrossProcess, HoldersInTwoProcessesExcludeEachOther) {
  KeyedFixture fx(GetParam());
  auto provider = fx.provider();
  ASSERT_TRUE(provider);
  const std::string key = fx.key("two-processes");
  auto lease = provider->acquire(key, seconds(30));
  ASSERT_THAT(lease, IsOk());
  Subprocess holder({SIMBA_KEYED_HOLDER_PATH, "--store", fx.uri(), "--key", key});
  ASSERT_TRUE(holder.started());
  EXPECT_FALSE(holder.wait_for_line("HELD", milliseconds(1000)).has_value())
      << "the other process took a held key";
  SIMBA_ASSERT_OK(lease->release());
  EXPECT_TRUE(holder.wait_for_line("HELD", seconds(20)).has_value())
      << "the other process never got the released key";
  holder.signal(SIGTERM);
  holder.wait();
}

}  // namespace
}  // namespace simba::testing

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KeyedCrossProcess);
