// The clustered-lock conformance suite's cases. See clustered_conformance.h.
//
// Two managers in one process stand for two nodes: each has its own node id,
// factory, connections and threads, exactly as two processes would; the
// killed-node case uses a real second process.
#include "testing/clustered_conformance.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "simba/clustered_lock.h"
#include "simba/registry.h"
#include "testing/fault_injecting_backend.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

#ifndef SIMBA_CLUSTERED_NODE_PATH
#error "SIMBA_CLUSTERED_NODE_PATH must name the simba-test-clustered-node binary"
#endif

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clk = std::chrono::steady_clock;

// Waits (scaled) for a future; an error status when it is not ready in time,
// so a hung call fails the test instead of hanging it.
Status await(std::future<Status> future, milliseconds timeout = seconds(10)) {
  if (future.wait_for(scaled(timeout)) != std::future_status::ready) {
    return deadline_exceeded_error("the future was not ready within " +
                                   std::to_string(scaled(timeout).count()) + "ms");
  }
  return future.get();
}
Result<bool> await(std::future<Result<bool>> future, milliseconds timeout = seconds(10)) {
  if (future.wait_for(scaled(timeout)) != std::future_status::ready) {
    return deadline_exceeded_error("the future was not ready within " +
                                   std::to_string(scaled(timeout).count()) + "ms");
  }
  return future.get();
}

template <typename T>
bool is_ready(const std::future<T>& future, milliseconds wait = milliseconds(0)) {
  return future.wait_for(wait) == std::future_status::ready;
}

long long millis_since(Clk::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clk::now() - start).count();
}

class Fixture {
 public:
  explicit Fixture(const ClusteredTarget& target)
      : target_(target), uri_(target.uri(unique_test_name("cl-"))) {}

  const std::string& uri() const { return uri_; }
  const ContendOptions& lease() const { return target_.lease; }

  // A node: a manager of its own on the test's store.
  std::unique_ptr<ClusteredLockManager> node() {
    ClusteredLockOptions options;
    options.lease = target_.lease;
    auto manager = ClusteredLockManager::open(uri_, options);
    EXPECT_THAT(manager, IsOk()) << uri_;
    return manager.ok() ? std::move(manager).value() : nullptr;
  }

  // A node whose store calls go through a FaultInjectingBackend.
  std::unique_ptr<ClusteredLockManager> faulty_node(
      std::shared_ptr<FaultInjectingBackend>* faults) {
    auto backend = open_backend(uri_);
    EXPECT_THAT(backend, IsOk()) << uri_;
    if (!backend.ok()) return nullptr;
    *faults = std::make_shared<FaultInjectingBackend>(*backend);
    ClusteredLockOptions options;
    options.lease = target_.lease;
    auto manager = ClusteredLockManager::create(std::shared_ptr<Backend>(*faults), options);
    EXPECT_THAT(manager, IsOk());
    return manager.ok() ? std::move(manager).value() : nullptr;
  }

  static std::shared_ptr<ClusteredLock> lock(ClusteredLockManager& node, const std::string& name) {
    EXPECT_THAT(node.define(name), IsOk());
    auto lock = node.get(name);
    EXPECT_THAT(lock, IsOk());
    return lock.ok() ? *lock : nullptr;
  }

  // A waiting node notices a release: at once where the store pushes
  // (2 s covers the hops), otherwise within one contend period.
  milliseconds handoff_bound(const ClusteredLockManager& node) const {
    return node.factory()->backend()->capabilities().push_release ? milliseconds(seconds(2))
                                                                  : expiry_bound();
  }
  // A dead holder's lease runs out and a waiter notices: the hard lease
  // (ttl + transition) plus the contender's largest jitter (DESIGN §3:
  // U[-200, 1000) ms), the docs' "ttl + transition + 1 s"; plus 0.5 s for
  // the acquisition's round trip and the callback on a loaded machine.
  milliseconds expiry_bound() const {
    return lease().ttl + lease().transition + milliseconds(1000) + scaled(milliseconds(500));
  }

 private:
  ClusteredTarget target_;
  std::string uri_;
};

// ---- mutual exclusion ---------------------------------------------------------

TEST_P(ClusteredConformance, TwoNodesExcludeEachOther) {
  // Shared state first: it must outlive the nodes' threads.
  std::atomic<int> counter{0};
  std::atomic<bool> inside{false};
  std::atomic<int> overlaps{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "counter");
  auto lb = Fixture::lock(*b, "counter");
  ASSERT_TRUE(la && lb);
  constexpr int kThreadsPerNode = 2;
  constexpr int kRounds = 10;
  // A polling store hands over only at the waiter's next poll; a round may
  // wait for several of those.
  const milliseconds wait = 3 * fx.expiry_bound();
  std::vector<std::thread> threads;
  for (const auto& lock : {la, lb}) {
    for (int t = 0; t < kThreadsPerNode; ++t) {
      threads.emplace_back([&, lock] {
        for (int r = 0; r < kRounds; ++r) {
          Status locked = await(lock->lock(), wait);
          if (!locked.ok()) {
            std::lock_guard<std::mutex> guard(failures_mu);
            failures.push_back("lock: " + locked.to_string());
            return;
          }
          if (inside.exchange(true)) ++overlaps;
          // Not an atomic increment: lost updates would show a broken lock.
          const int seen = counter.load();
          std::this_thread::sleep_for(milliseconds(1));
          counter.store(seen + 1);
          inside.store(false);
          Result<bool> unlocked = await(lock->unlock());
          if (!unlocked.ok() || !*unlocked) {
            std::lock_guard<std::mutex> guard(failures_mu);
            failures.push_back("unlock: " + (unlocked.ok() ? std::string("false")
                                                           : unlocked.status().to_string()));
            return;
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(failures, ::testing::IsEmpty());
  EXPECT_EQ(overlaps.load(), 0) << "two holders at once";
  EXPECT_EQ(counter.load(), 2 * kThreadsPerNode * kRounds);
}

TEST_P(ClusteredConformance, ManyLockFuturesResolveOneAtATime) {
  Fixture fx(GetParam());
  auto node = fx.node();
  ASSERT_TRUE(node);
  auto lock = Fixture::lock(*node, "many");
  ASSERT_TRUE(lock);
  constexpr int kCalls = 50;
  std::vector<std::future<Status>> calls;
  for (int i = 0; i < kCalls; ++i) calls.push_back(lock->lock());
  std::vector<bool> done(kCalls, false);
  std::uint64_t last_token = 0;
  for (int i = 0; i < kCalls; ++i) {
    int ready = -1;
    const auto give_up = Clk::now() + scaled(seconds(10));
    while (ready < 0 && Clk::now() < give_up) {
      for (int j = 0; j < kCalls && ready < 0; ++j) {
        if (!done[j] && is_ready(calls[j])) ready = j;
      }
      if (ready < 0) std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_GE(ready, 0) << "hold " << i << " never came";
    // Within a node the calls queue FIFO.
    EXPECT_EQ(ready, i);
    done[ready] = true;
    SIMBA_ASSERT_OK(calls[ready].get());
    // Nobody else may be granted while this call holds the lock.
    std::this_thread::sleep_for(milliseconds(2));
    for (int j = 0; j < kCalls; ++j) {
      if (!done[j]) {
        EXPECT_FALSE(is_ready(calls[j])) << "call " << j << " granted during hold " << i;
      }
    }
    const std::uint64_t token = lock->fencing_token();
    EXPECT_GT(token, last_token) << "hold " << i;
    last_token = token;
    EXPECT_THAT(await(lock->unlock()), IsOkAndHolds(true)) << "hold " << i;
  }
  EXPECT_THAT(await(lock->is_locked()), IsOkAndHolds(false));
}

TEST_P(ClusteredConformance, HeldLockBlocksOtherNodeUntilUnlock) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "blocking");
  auto lb = Fixture::lock(*b, "blocking");
  ASSERT_TRUE(la && lb);
  const auto asked = Clk::now();
  SIMBA_ASSERT_OK(await(la->lock()));
  const std::uint64_t a_token = la->fencing_token();
  EXPECT_GT(a_token, 0u);
  EXPECT_TRUE(la->is_held());
  // The hold lasts until its lease deadline: after the grant, within
  // ttl + transition of the request (renewals only move it later).
  const auto deadline = la->lease_deadline();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_GT(*deadline, Clk::now());
  EXPECT_LE(*deadline, Clk::now() + fx.lease().ttl + fx.lease().transition);
  EXPECT_GE(*deadline, asked + fx.lease().transition);
  auto b_lock = lb->lock();
  EXPECT_FALSE(is_ready(b_lock, scaled(milliseconds(500)))) << "B got a lock A holds";
  EXPECT_FALSE(lb->is_held());
  EXPECT_EQ(lb->fencing_token(), 0u);
  EXPECT_FALSE(lb->lease_deadline().has_value());
  const auto unlocked = Clk::now();
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(true));
  ASSERT_TRUE(is_ready(b_lock, scaled(fx.handoff_bound(*b)))) << "hand-off too slow";
  RecordProperty("handoff_ms", std::to_string(millis_since(unlocked)));
  SIMBA_ASSERT_OK(b_lock.get());
  EXPECT_GT(lb->fencing_token(), a_token);
  EXPECT_FALSE(la->is_held());
  EXPECT_FALSE(la->lease_deadline().has_value()) << "an unlocked hold still names a deadline";
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
}

TEST_P(ClusteredConformance, NotReentrantAndAnyThreadMayUnlock) {
  Fixture fx(GetParam());
  auto node = fx.node();
  ASSERT_TRUE(node);
  auto lock = Fixture::lock(*node, "reentry");
  ASSERT_TRUE(lock);
  SIMBA_ASSERT_OK(await(lock->lock()));
  auto again = lock->lock();
  EXPECT_FALSE(is_ready(again, scaled(milliseconds(300)))) << "a second lock() of the holder";
  // Ownership is the node's: another thread unlocks.
  Result<bool> unlocked = false;
  std::thread([&] { unlocked = await(lock->unlock()); }).join();
  EXPECT_THAT(unlocked, IsOkAndHolds(true));
  SIMBA_ASSERT_OK(await(std::move(again)));
  EXPECT_TRUE(lock->is_held());
  EXPECT_THAT(await(lock->unlock()), IsOkAndHolds(true));
}

// ---- try_lock ---------------------------------------------------------------------

TEST_P(ClusteredConformance, TryLockIsOneAttempt) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "try");
  auto lb = Fixture::lock(*b, "try");
  ASSERT_TRUE(la && lb);
  EXPECT_THAT(await(la->try_lock()), IsOkAndHolds(true));
  EXPECT_THAT(await(lb->try_lock()), IsOkAndHolds(false));
  EXPECT_THAT(await(la->try_lock()), IsOkAndHolds(false)) << "non-reentrant";
  EXPECT_THAT(await(lb->try_lock(milliseconds(0))), IsOkAndHolds(false));
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(true));
  EXPECT_THAT(await(lb->try_lock()), IsOkAndHolds(true));
  EXPECT_GT(lb->fencing_token(), 0u);
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
}

TEST_P(ClusteredConformance, TryLockWithTimeout) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "try-timeout");
  auto lb = Fixture::lock(*b, "try-timeout");
  ASSERT_TRUE(la && lb);
  EXPECT_THAT(await(lb->try_lock(milliseconds(-1))), StatusIs(StatusCode::kInvalidArgument));
  SIMBA_ASSERT_OK(await(la->lock()));

  const auto started = Clk::now();
  EXPECT_THAT(await(lb->try_lock(milliseconds(600))), IsOkAndHolds(false));
  EXPECT_GE(millis_since(started), 600);

  // Freed in time: true.
  auto in_time = lb->try_lock(fx.handoff_bound(*b) + seconds(5));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(is_ready(in_time));
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(true));
  EXPECT_THAT(await(std::move(in_time), fx.handoff_bound(*b) + seconds(6)), IsOkAndHolds(true));
  EXPECT_TRUE(lb->is_held());
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
}

// ---- unlock and queries --------------------------------------------------------------

TEST_P(ClusteredConformance, UnlockByANodeThatDoesNotHoldIsFalse) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "unlock");
  auto lb = Fixture::lock(*b, "unlock");
  ASSERT_TRUE(la && lb);
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(false)) << "never locked";
  SIMBA_ASSERT_OK(await(la->lock()));
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(false));
  EXPECT_TRUE(la->is_held()) << "another node's unlock freed the lock";
  EXPECT_THAT(await(lb->is_locked()), IsOkAndHolds(true));
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(true));
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(false)) << "unlocked twice";
}

TEST_P(ClusteredConformance, IsLockedAndIsLockedByMeFromBothNodes) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "queries");
  auto lb = Fixture::lock(*b, "queries");
  ASSERT_TRUE(la && lb);
  EXPECT_THAT(await(la->is_locked()), IsOkAndHolds(false));
  EXPECT_THAT(await(lb->is_locked()), IsOkAndHolds(false));
  EXPECT_THAT(await(la->is_locked_by_me()), IsOkAndHolds(false));
  SIMBA_ASSERT_OK(await(la->lock()));
  EXPECT_THAT(await(la->is_locked()), IsOkAndHolds(true));
  EXPECT_THAT(await(lb->is_locked()), IsOkAndHolds(true));
  EXPECT_THAT(await(la->is_locked_by_me()), IsOkAndHolds(true));
  EXPECT_THAT(await(lb->is_locked_by_me()), IsOkAndHolds(false));
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(true));
  EXPECT_THAT(await(la->is_locked()), IsOkAndHolds(false));
  EXPECT_THAT(await(lb->is_locked()), IsOkAndHolds(false));
  EXPECT_THAT(await(la->is_locked_by_me()), IsOkAndHolds(false));
}

// ---- definitions ----------------------------------------------------------------------

TEST_P(ClusteredConformance, UndefinedAndBadInputAreClearErrors) {
  Fixture fx(GetParam());
  auto node = fx.node();
  ASSERT_TRUE(node);
  EXPECT_THAT(
      node->get("never-defined"),
      StatusIs(StatusCode::kNotFound, ::testing::AllOf(::testing::HasSubstr("never-defined"),
                                                       ::testing::HasSubstr("define"))));
  EXPECT_FALSE(node->is_defined("never-defined"));
  EXPECT_THAT(await(node->remove("never-defined")), IsOkAndHolds(false));

  EXPECT_THAT(node->define("defined"), IsOkAndHolds(true));
  EXPECT_THAT(node->define("defined"), IsOkAndHolds(false));
  EXPECT_TRUE(node->is_defined("defined"));
  auto first = node->get("defined");
  auto second = node->get("defined");
  SIMBA_ASSERT_OK(first);
  SIMBA_ASSERT_OK(second);
  EXPECT_EQ(first->get(), second->get()) << "one handle per name";
  EXPECT_EQ((*first)->name(), "defined");
  EXPECT_EQ((*first)->node_id(), node->node_id());

  const std::size_t max = node->factory()->backend()->capabilities().max_mutex_length;
  EXPECT_THAT(node->define(""),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(node->define(std::string(max + 1, 'm')),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(node->define("line\nbreak"), StatusIs(StatusCode::kInvalidArgument));
  ClusteredLockConfig bad_lease;
  bad_lease.lease = fx.lease();
  bad_lease.lease->ttl = milliseconds(0);
  EXPECT_THAT(node->define("bad-lease", bad_lease),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("ttl")));
  EXPECT_FALSE(node->is_defined("bad-lease"));

  ClusteredLockOptions bad_node;
  bad_node.node_id = "line\nbreak";
  EXPECT_THAT(ClusteredLockManager::open(fx.uri(), bad_node),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("node_id")));
  ClusteredLockOptions bad_threads;
  bad_threads.callback_threads = 0;
  EXPECT_THAT(ClusteredLockManager::open(fx.uri(), bad_threads),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("callback_threads")));
  EXPECT_THAT(ClusteredLockManager::open("nosuchstore://x"), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(ClusteredLockManager::create(std::shared_ptr<MutexContendServiceFactory>()),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(ClusteredConformance, RemoveReleasesAndFailsPending) {
  Latch lost;
  std::mutex reason_mu;
  Status reason;
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "removed");
  auto lb = Fixture::lock(*b, "removed");
  ASSERT_TRUE(la && lb);
  SIMBA_ASSERT_OK(await(la->lock()));
  la->add_loss_listener([&](const Status& why) {
    std::lock_guard<std::mutex> guard(reason_mu);
    reason = why;
    lost.set();
  });
  std::stop_token hold = la->lost_token();
  auto pending = la->lock();
  auto timed = la->try_lock(seconds(60));
  auto b_lock = lb->lock();
  EXPECT_FALSE(is_ready(b_lock, scaled(milliseconds(200))));

  EXPECT_THAT(await(a->remove("removed")), IsOkAndHolds(true));
  EXPECT_THAT(await(std::move(pending)),
              StatusIs(StatusCode::kCancelled, ::testing::HasSubstr("removed")));
  EXPECT_THAT(await(std::move(timed)), StatusIs(StatusCode::kCancelled));
  ASSERT_TRUE(lost.wait(seconds(5))) << "the holder was not told";
  {
    std::lock_guard<std::mutex> guard(reason_mu);
    EXPECT_THAT(reason, StatusIs(StatusCode::kCancelled));
  }
  EXPECT_TRUE(hold.stop_requested());
  EXPECT_FALSE(la->is_held());
  EXPECT_FALSE(a->is_defined("removed"));
  EXPECT_THAT(a->get("removed"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(await(la->lock()),
              StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("removed")));
  EXPECT_THAT(await(la->unlock()), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(await(a->remove("removed")), IsOkAndHolds(false));

  // Released at the store: the other node gets it.
  SIMBA_ASSERT_OK(await(std::move(b_lock), fx.handoff_bound(*b)));
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
  // Defined again: a new, working handle.
  EXPECT_THAT(a->define("removed"), IsOkAndHolds(true));
  auto again = a->get("removed");
  SIMBA_ASSERT_OK(again);
  EXPECT_THAT(await((*again)->try_lock(fx.handoff_bound(*a))), IsOkAndHolds(true));
  EXPECT_THAT(await((*again)->unlock()), IsOkAndHolds(true));
}

TEST_P(ClusteredConformance, DestroyedManagerFreesItsLocks) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "destroyed");
  auto lb = Fixture::lock(*b, "destroyed");
  ASSERT_TRUE(la && lb);
  SIMBA_ASSERT_OK(await(la->lock()));
  std::stop_token hold = la->lost_token();
  auto pending = la->lock();
  auto b_lock = lb->lock();
  a.reset();
  EXPECT_THAT(await(std::move(pending)), StatusIs(StatusCode::kCancelled));
  EXPECT_TRUE(hold.stop_requested());
  // The handle outlives its manager: a clear error, no crash.
  EXPECT_THAT(await(la->lock()), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(await(la->is_locked()), StatusIs(StatusCode::kFailedPrecondition));
  SIMBA_ASSERT_OK(await(std::move(b_lock), fx.handoff_bound(*b)));
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
}

// ---- callbacks --------------------------------------------------------------------------

// What the callbacks saw; shared with them so it outlives any late one.
struct CallbackLog {
  std::mutex mu;
  std::vector<std::string> events;
  std::vector<std::thread::id> threads;
  Latch done;

  void add(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(event);
    threads.push_back(std::this_thread::get_id());
  }
  static std::string of(const Status& s) { return s.ok() ? "ok" : s.to_string(); }
  static std::string of(const Result<bool>& r) {
    return r.ok() ? (*r ? "true" : "false") : r.status().to_string();
  }
};

TEST_P(ClusteredConformance, CallbacksRunOnLibraryThreads) {
  auto log = std::make_shared<CallbackLog>();
  Fixture fx(GetParam());
  auto node = fx.node();
  ASSERT_TRUE(node);
  auto lock = Fixture::lock(*node, "callbacks");
  ASSERT_TRUE(lock);
  // The documented pattern: work in the lock() callback, unlock from it,
  // chain the next step from unlock()'s callback. No thread of ours waits.
  std::weak_ptr<ClusteredLock> weak = lock;
  lock->lock([log, weak](Status locked) {
    log->add("lock " + CallbackLog::of(locked));
    auto l1 = weak.lock();
    if (!l1) return log->done.set();
    l1->try_lock([log, weak](Result<bool> again) {
      log->add("try_lock " + CallbackLog::of(again));
      auto l2 = weak.lock();
      if (!l2) return log->done.set();
      l2->try_lock(milliseconds(100), [log, weak](Result<bool> timed) {
        log->add("try_lock(100ms) " + CallbackLog::of(timed));
        auto l3 = weak.lock();
        if (!l3) return log->done.set();
        l3->is_locked([log, weak](Result<bool> anyone) {
          log->add("is_locked " + CallbackLog::of(anyone));
          auto l4 = weak.lock();
          if (!l4) return log->done.set();
          l4->is_locked_by_me([log, weak](Result<bool> mine) {
            log->add("is_locked_by_me " + CallbackLog::of(mine));
            auto l5 = weak.lock();
            if (!l5) return log->done.set();
            l5->unlock([log](Result<bool> unlocked) {
              log->add("unlock " + CallbackLog::of(unlocked));
              log->done.set();
            });
          });
        });
      });
    });
  });
  ASSERT_TRUE(log->done.wait(seconds(20)));
  std::lock_guard<std::mutex> guard(log->mu);
  EXPECT_THAT(log->events,
              ::testing::ElementsAre("lock ok", "try_lock false", "try_lock(100ms) false",
                                     "is_locked true", "is_locked_by_me true", "unlock true"));
  for (const auto& id : log->threads) EXPECT_NE(id, std::this_thread::get_id());
}

// ---- threads ------------------------------------------------------------------------------

TEST_P(ClusteredConformance, WaitingLocksDoNotAddThreads) {
  Fixture fx(GetParam());
  auto a = fx.node();
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  constexpr int kLocks = 200;
  std::vector<std::shared_ptr<ClusteredLock>> held, waiting;
  for (int i = 0; i < kLocks; ++i) {
    const std::string name = "threads-" + std::to_string(i);
    held.push_back(Fixture::lock(*a, name));
    waiting.push_back(Fixture::lock(*b, name));
    ASSERT_TRUE(held.back() && waiting.back());
  }
  std::vector<std::future<Status>> holds;
  for (auto& lock : held) holds.push_back(lock->lock());
  for (auto& hold : holds) SIMBA_ASSERT_OK(await(std::move(hold), seconds(30)));
  // B has used the store once, so threads a backend starts on first use
  // (a subscriber connection, a watch) are there before the count.
  auto warm = Fixture::lock(*b, "threads-warm-up");
  SIMBA_ASSERT_OK(await(warm->lock()));
  EXPECT_THAT(await(warm->unlock()), IsOkAndHolds(true));
  const int before = count_threads();
  const int simba_before = count_simba_threads();
  const std::string names_before = thread_names();
  // Simba's own threads: at most one more (a worker a backend starts on
  // first contention). All threads: that, plus what the store's client
  // library adds to its own pool under load; never a thread per lock.
  const int allowed = before + 1 + GetParam().client_library_threads_under_load;

  std::vector<std::future<Status>> waits;
  for (auto& lock : waiting) waits.push_back(lock->lock());
  // Every waiting lock is contending by now.
  std::this_thread::sleep_for(scaled(seconds(1)));
  const int during = count_threads();
  RecordProperty("threads_before", std::to_string(before));
  RecordProperty("threads_waiting", std::to_string(during));
  EXPECT_LE(count_simba_threads(), simba_before + 1)
      << kLocks << " waiting locks added Simba threads\nbefore: " << names_before
      << "\nwaiting: " << thread_names();
  EXPECT_LE(during, allowed) << kLocks << " waiting locks added threads\nbefore: " << names_before
                             << "\nwaiting: " << thread_names();
  for (auto& wait : waits) EXPECT_FALSE(is_ready(wait));

  std::vector<std::future<Result<bool>>> releases;
  for (auto& lock : held) releases.push_back(lock->unlock());
  for (auto& release : releases) EXPECT_THAT(await(std::move(release)), IsOkAndHolds(true));
  for (auto& wait : waits) SIMBA_EXPECT_OK(await(std::move(wait), fx.expiry_bound() + seconds(10)));
  EXPECT_LE(count_simba_threads(), simba_before + 1) << thread_names();
  EXPECT_LE(count_threads(), allowed)
      << "before: " << names_before << "\nafter: " << thread_names();
  releases.clear();
  for (auto& lock : waiting) releases.push_back(lock->unlock());
  for (auto& release : releases) EXPECT_THAT(await(std::move(release)), IsOkAndHolds(true));
}

// ---- losing a hold ----------------------------------------------------------------------------

TEST_P(ClusteredConformance, NodeIsToldWhenItLosesTheLock) {
  Latch lost;
  std::mutex reason_mu;
  Status reason;
  Fixture fx(GetParam());
  std::shared_ptr<FaultInjectingBackend> faults;
  auto a = fx.faulty_node(&faults);
  auto b = fx.node();
  ASSERT_TRUE(a && b);
  auto la = Fixture::lock(*a, "lost");
  auto lb = Fixture::lock(*b, "lost");
  ASSERT_TRUE(la && lb);
  la->add_loss_listener([&](const Status& why) {
    std::lock_guard<std::mutex> guard(reason_mu);
    reason = why;
    lost.set();
  });
  SIMBA_ASSERT_OK(await(la->lock()));
  const std::uint64_t a_token = la->fencing_token();
  std::stop_token hold = la->lost_token();
  EXPECT_FALSE(hold.stop_requested());
  auto b_lock = lb->lock();
  EXPECT_FALSE(is_ready(b_lock, scaled(milliseconds(200))));

  // A's store calls fail: its renewals stop, its lease runs out.
  faults->set_mode(FaultInjectingBackend::Mode::kFail);
  ASSERT_TRUE(lost.wait(fx.lease().ttl + fx.lease().transition + seconds(1)))
      << "the node was not told it lost the lock";
  {
    std::lock_guard<std::mutex> guard(reason_mu);
    EXPECT_THAT(reason, StatusIs(StatusCode::kAborted, ::testing::HasSubstr("lost")));
  }
  EXPECT_TRUE(hold.stop_requested());
  EXPECT_FALSE(la->is_held());
  EXPECT_EQ(la->fencing_token(), 0u);
  SIMBA_ASSERT_OK(await(std::move(b_lock), fx.expiry_bound()));
  EXPECT_GT(lb->fencing_token(), a_token);
  faults->set_mode(FaultInjectingBackend::Mode::kPass);
  EXPECT_THAT(await(la->unlock()), IsOkAndHolds(false)) << "a lost hold is not the node's";
  EXPECT_THAT(await(la->is_locked_by_me()), IsOkAndHolds(false));
  EXPECT_THAT(await(lb->unlock()), IsOkAndHolds(true));
}

// ---- another process ----------------------------------------------------------------------------

TEST_P(ClusteredCrossProcess, KilledNodeIsReplacedWithinTheLease) {
  Fixture fx(GetParam());
  Subprocess other({SIMBA_CLUSTERED_NODE_PATH, "--store", fx.uri(), "--lock", "killed-node",
                    "--ttl-ms", std::to_string(fx.lease().ttl.count()), "--transition-ms",
                    std::to_string(fx.lease().transition.count())});
  ASSERT_TRUE(other.started());
  auto locked = other.wait_for_line("LOCKED", seconds(20));
  ASSERT_TRUE(locked.has_value()) << "the other node never locked";
  const std::uint64_t other_token = std::stoull(locked->substr(7));
  auto node = fx.node();
  ASSERT_TRUE(node);
  auto lock = Fixture::lock(*node, "killed-node");
  ASSERT_TRUE(lock);
  auto waiting = lock->lock();
  EXPECT_FALSE(is_ready(waiting, scaled(milliseconds(300))))
      << "locked while the other node held it";
  EXPECT_THAT(await(lock->is_locked()), IsOkAndHolds(true));
  const auto killed = Clk::now();
  other.signal(SIGKILL);
  other.wait();
  SIMBA_ASSERT_OK(await(std::move(waiting), fx.lease().ttl + fx.lease().transition + seconds(2)));
  RecordProperty("failover_ms", std::to_string(millis_since(killed)));
  EXPECT_GT(lock->fencing_token(), other_token);
  EXPECT_THAT(await(lock->unlock()), IsOkAndHolds(true));
}

}  // namespace
}  // namespace simba::testing

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ClusteredCrossProcess);
