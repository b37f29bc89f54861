// The conformance suite's cases. See backend_conformance.h.
#include "testing/backend_conformance.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "simba/locker.h"
#include "simba/registry.h"
#include "simba/scheduler.h"
#include "testing/fault_injecting_backend.h"
#include "testing/latch.h"
#include "testing/status_matchers.h"
#include "testing/test_servers.h"
#include "testing/test_util.h"

#ifndef SIMBA_TAKER_PATH
#error "SIMBA_TAKER_PATH must name the simba-test-taker binary"
#endif

namespace simba::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Fixture {
 public:
  explicit Fixture(const BackendTarget& target)
      : target_(target), uri_(target.uri(unique_test_name())) {}

  const std::string& uri() const { return uri_; }
  const ContendOptions& options() const { return target_.options; }

  std::unique_ptr<MutexContendServiceFactory> factory() { return factory(target_.options); }
  std::unique_ptr<MutexContendServiceFactory> factory(const ContendOptions& contend) {
    FactoryOptions options;
    options.contend = contend;
    auto factory = MutexContendServiceFactory::open(uri_, options);
    EXPECT_THAT(factory, IsOk()) << uri_;
    return factory.ok() ? std::move(factory).value() : nullptr;
  }

  // A factory whose store calls go through a FaultInjectingBackend.
  std::unique_ptr<MutexContendServiceFactory> faulty_factory(
      std::shared_ptr<FaultInjectingBackend>* faults, ContendOptions contend) {
    auto backend = open_backend(uri_);
    EXPECT_THAT(backend, IsOk()) << uri_;
    if (!backend.ok()) return nullptr;
    *faults = std::make_shared<FaultInjectingBackend>(*backend);
    FactoryOptions options;
    options.contend = contend;
    auto factory = MutexContendServiceFactory::create(*faults, options);
    EXPECT_THAT(factory, IsOk());
    return factory.ok() ? std::move(factory).value() : nullptr;
  }

  const StoreExpectations& expect() const { return target_.expect; }

  // The longest a waiting contender needs to notice that a lease ended by
  // expiry, or (on a store without push) that the mutex was released: the
  // hard lease (ttl + transition) from the holder's last renewal, plus the
  // contender's largest jitter (DESIGN §3: U[-200, 1000) ms), the bound the
  // docs state (docs/guide.md, docs/backends/mysql.md: "ttl + transition +
  // 1 s"). Plus kRoundTrip: the acquisition that finds it free is one store
  // call, and the timer that sends it runs on a 2-core CI machine busy with
  // other tests (fsync'd stores take up to a few hundred ms per call there).
  milliseconds expiry_bound() const {
    return options().ttl + options().transition + milliseconds(1000) + round_trip();
  }
  // A push reaches the waiter, which then acquires: two store round trips
  // (docs/backends.md: "waiters move at once"), on a loaded machine.
  static milliseconds push_bound() { return scaled(milliseconds(1000)); }
  static milliseconds round_trip() { return scaled(milliseconds(500)); }

 private:
  BackendTarget target_;
  std::string uri_;
};

// Records callbacks of one contender into latches.
struct Recorder {
  Latch acquired;
  Latch released;
  std::atomic<std::uint64_t> token{0};

  std::shared_ptr<MutexContender> contender(const std::string& mutex) {
    return make_contender(
        mutex,
        [this](const MutexState& s) {
          token = s.after.fencing_token;
          acquired.set();
        },
        [this](const MutexState&) { released.set(); });
  }
};

// Acquires and releases `mutex` as a prober until `heard()` says a pushed
// release reached a subscription (made before the call): the backend's push
// channel is up. False if nothing was heard within 10 s.
bool push_is_live(Backend& backend, const std::string& mutex, const std::function<bool()>& heard) {
  return eventually(
      [&] {
        const auto deadline = std::chrono::steady_clock::now() + seconds(10);
        auto held = backend.acquire_or_renew(
            AcquireRequest{mutex, "push-prober", seconds(5), seconds(1)}, deadline);
        if (held.ok() && held->owner.owner_id == "push-prober") {
          (void)backend.release(mutex, "push-prober", held->owner.fencing_token, deadline);
        }
        return eventually(heard, milliseconds(200));
      },
      seconds(10));
}

// ---- JVM Simba's five TCK cases ---------------------------------------------

TEST_P(Conformance, Start) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Recorder rec;
  auto service = factory->create_contend_service(rec.contender("start")).value();
  EXPECT_EQ(service->status(), ServiceStatus::kInitial);
  SIMBA_ASSERT_OK(service->start());
  EXPECT_TRUE(service->running());
  ASSERT_TRUE(rec.acquired.wait(seconds(10)));
  EXPECT_TRUE(service->is_owner());
  EXPECT_GT(service->fencing_token(), 0u);
  EXPECT_EQ(service->after_owner().owner_id, service->contender_id());
  SIMBA_ASSERT_OK(service->stop());
  ASSERT_TRUE(rec.released.wait(seconds(10)));
  EXPECT_FALSE(service->is_owner());
  EXPECT_EQ(service->status(), ServiceStatus::kInitial);
}

TEST_P(Conformance, Restart) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Latch acquired[2], released[2];
  std::atomic<int> round{0};
  auto contender = make_contender(
      "restart", [&](const MutexState&) { acquired[round.load()].set(); },
      [&](const MutexState&) { released[round.load()].set(); });
  auto service = factory->create_contend_service(contender).value();
  for (int r = 0; r < 2; ++r) {
    round = r;
    SIMBA_ASSERT_OK(service->start());
    ASSERT_TRUE(acquired[r].wait(seconds(10))) << "round " << r;
    EXPECT_TRUE(service->is_owner());
    SIMBA_ASSERT_OK(service->stop());
    ASSERT_TRUE(released[r].wait(seconds(10))) << "round " << r;
    EXPECT_FALSE(service->is_owner());
  }
  // Misuse is rejected, not ignored.
  EXPECT_THAT(service->stop(), StatusIs(StatusCode::kFailedPrecondition));
  SIMBA_ASSERT_OK(service->start());
  EXPECT_THAT(service->start(), StatusIs(StatusCode::kFailedPrecondition));
  SIMBA_ASSERT_OK(service->stop());
}

TEST_P(Conformance, Guard) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Recorder rec;
  auto service = factory->create_contend_service(rec.contender("guard")).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(rec.acquired.wait(seconds(10)));
  const std::uint64_t token = service->fencing_token();
  // Longer than ttl (2 s): only renewals keep the lease.
  std::this_thread::sleep_for(seconds(3));
  EXPECT_EQ(service->after_owner().owner_id, service->contender_id());
  EXPECT_TRUE(service->is_owner());
  EXPECT_EQ(service->fencing_token(), token) << "a renewal must keep the token";
  EXPECT_FALSE(rec.released.is_set());
  SIMBA_ASSERT_OK(service->stop());
  ASSERT_TRUE(rec.released.wait(seconds(10)));
  EXPECT_FALSE(service->is_owner());
}

// JVM Simba's multiContend: ten contenders on one mutex. Its 30 s of waiting
// asserted only what unique contender ids make true; here the owner is made
// to let go again and again, so each round is a hand-off among the ten: the
// callbacks never overlap, every acquisition's token exceeds the one before,
// and exactly one contender owns the mutex at the end.
TEST_P(Conformance, MultiContend) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  std::mutex mu;
  int counter = 0;
  std::vector<std::string> violations;
  std::vector<std::pair<std::string, std::uint64_t>> acquisitions;  // owner, token
  std::vector<std::unique_ptr<MutexContendService>> services;
  for (int i = 0; i < 10; ++i) {
    auto c = make_contender(
        "multiContend",
        [&](const MutexState& s) {
          std::lock_guard<std::mutex> lock(mu);
          acquisitions.emplace_back(s.after.owner_id, s.after.fencing_token);
          if (++counter != 1) {
            violations.push_back("acquire by " + s.after.owner_id + " made counter " +
                                 std::to_string(counter));
          }
        },
        [&](const MutexState& s) {
          std::lock_guard<std::mutex> lock(mu);
          if (--counter != 0) {
            violations.push_back("release by " + s.before.owner_id + " made counter " +
                                 std::to_string(counter));
          }
        });
    services.push_back(factory->create_contend_service(c).value());
    SIMBA_ASSERT_OK(services.back()->start());
  }
  const auto acquired_count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return acquisitions.size();
  };
  // Each round: the owner stops (a hand-off to one of the nine waiting) and
  // starts again, to wait in its turn. Push stores hand off in milliseconds;
  // polling stores within expiry_bound().
  constexpr std::size_t kHandOffs = 5;
  const milliseconds bound = fx.expect().push_release ? fx.push_bound() : fx.expiry_bound();
  ASSERT_TRUE(eventually([&] { return acquired_count() >= 1; }, seconds(10)));
  for (std::size_t round = 1; round <= kHandOffs; ++round) {
    MutexContendService* owner = nullptr;
    ASSERT_TRUE(eventually(
        [&] {
          for (const auto& s : services) {
            if (s->is_owner()) owner = s.get();
          }
          return owner != nullptr;
        },
        seconds(10)))
        << "round " << round;
    SIMBA_ASSERT_OK(owner->stop());
    ASSERT_TRUE(eventually([&] { return acquired_count() > round; }, bound))
        << "no hand-off within " << bound.count() << " ms in round " << round;
    SIMBA_ASSERT_OK(owner->start());
  }
  {
    // Scoped: stop() below runs on_released, which takes `mu`.
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_THAT(violations, ::testing::IsEmpty());
    EXPECT_EQ(counter, 1);
    EXPECT_GT(acquisitions.size(), kHandOffs);
    for (std::size_t i = 1; i < acquisitions.size(); ++i) {
      EXPECT_GT(acquisitions[i].second, acquisitions[i - 1].second)
          << "acquisition " << i << " by " << acquisitions[i].first;
    }
    const std::string& owner = acquisitions.back().first;
    int owners = 0;
    for (const auto& s : services) {
      const std::string seen = s->after_owner().owner_id;
      // A waiter's view may lag a hand-off (it looks at its next poll), but
      // it never names a contender that did not own the mutex.
      if (!seen.empty()) {
        EXPECT_TRUE(std::any_of(acquisitions.begin(), acquisitions.end(),
                                [&](const auto& a) { return a.first == seen; }))
            << "a contender's view names " << seen << ", who never owned the mutex";
      }
      if (s->is_owner()) {
        ++owners;
        EXPECT_EQ(s->contender_id(), owner);
      }
    }
    EXPECT_EQ(owners, 1);
  }
  for (auto it = services.rbegin(); it != services.rend(); ++it) SIMBA_EXPECT_OK((*it)->stop());
}

TEST_P(Conformance, Schedule) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Latch ran;
  std::atomic<std::uint64_t> token{0};
  auto scheduler = Scheduler::create(*factory, "schedule",
                                     ScheduleConfig::fixed_delay(milliseconds(0), seconds(1)),
                                     [&](const WorkContext& ctx) {
                                       token = ctx.fencing_token;
                                       ran.set();
                                     })
                       .value();
  EXPECT_FALSE(scheduler->running());
  SIMBA_ASSERT_OK(scheduler->start());
  EXPECT_TRUE(scheduler->running());
  EXPECT_TRUE(ran.wait(seconds(5)));
  EXPECT_GT(token.load(), 0u);
  SIMBA_ASSERT_OK(scheduler->stop());
  EXPECT_FALSE(scheduler->running());
}

// ---- fencing and hand-off ---------------------------------------------------

TEST_P(Conformance, FencingTokensIncreaseAcrossHandovers) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  std::uint64_t previous = 0;
  for (int i = 0; i < 5; ++i) {
    Recorder rec;
    auto service = factory->create_contend_service(rec.contender("fencing")).value();
    SIMBA_ASSERT_OK(service->start());
    ASSERT_TRUE(rec.acquired.wait(seconds(10))) << "handover " << i;
    const std::uint64_t token = service->fencing_token();
    EXPECT_GT(token, previous) << "handover " << i;
    EXPECT_EQ(token, rec.token.load());
    previous = token;
    SIMBA_ASSERT_OK(service->stop());
  }
}

TEST_P(Conformance, WaiterTakesOverAfterStop) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Recorder a, b;
  auto sa = factory->create_contend_service(a.contender("handover")).value();
  auto sb = factory->create_contend_service(b.contender("handover")).value();
  SIMBA_ASSERT_OK(sa->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(sb->start());
  // B has contended at least once and knows A holds the mutex.
  ASSERT_TRUE(
      eventually([&] { return sb->after_owner().owner_id == sa->contender_id(); }, seconds(10)));
  const auto stopped = std::chrono::steady_clock::now();
  SIMBA_ASSERT_OK(sa->stop());
  const bool push = fx.expect().push_release;
  // Push stores wake the waiter at once; polling stores within one contend
  // period of the waiter (the hard lease plus jitter).
  const milliseconds bound = push ? fx.push_bound() : fx.expiry_bound();
  ASSERT_TRUE(b.acquired.wait(bound)) << (push ? "push" : "polling") << " hand-off too slow";
  const auto took = std::chrono::steady_clock::now() - stopped;
  EXPECT_GT(b.token.load(), a.token.load());
  EXPECT_TRUE(sb->is_owner());
  RecordProperty("handoff_ms",
                 std::to_string(std::chrono::duration_cast<milliseconds>(took).count()));
  SIMBA_ASSERT_OK(sb->stop());
}

TEST_P(Conformance, RetrieverObservesOwnerWithoutContending) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Recorder a;
  std::mutex mu;
  std::vector<MutexState> seen;
  auto retriever = make_retriever("observed", [&](const MutexState& s) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(s);
  });
  auto observer = factory->create_retrieval_service(retriever).value();
  auto owner = factory->create_contend_service(a.contender("observed")).value();
  SIMBA_ASSERT_OK(owner->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(observer->start());
  ASSERT_TRUE(eventually([&] { return observer->after_owner().owner_id == owner->contender_id(); },
                         seconds(5)));
  EXPECT_TRUE(observer->has_owner());
  EXPECT_EQ(observer->after_owner().fencing_token, owner->fencing_token());
  SIMBA_ASSERT_OK(owner->stop());
  ASSERT_TRUE(eventually([&] { return observer->after_owner().owner_id.empty(); }, seconds(5)));
  EXPECT_FALSE(observer->has_owner());
  SIMBA_ASSERT_OK(observer->stop());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_FALSE(seen.empty());
}

// ---- losing a lease ---------------------------------------------------------

TEST_P(Conformance, OwnerWhoseRenewalsFailIsReleasedBeforeAnotherAcquires) {
  Fixture fx(GetParam());
  std::shared_ptr<FaultInjectingBackend> faults;
  auto faulty = fx.faulty_factory(&faults, fx.options());
  auto healthy = fx.factory();
  ASSERT_TRUE(faulty && healthy);
  std::mutex mu;
  std::vector<std::string> events;
  std::atomic<bool> a_owned_when_b_acquired{false};
  Latch a_released;
  MutexContendService* a_service = nullptr;
  auto a = make_contender(
      "failing-renewal",
      [&](const MutexState&) {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back("A acquired");
      },
      [&](const MutexState&) {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back("A released");
        a_released.set();
      });
  Latch b_acquired;
  auto b = make_contender(
      "failing-renewal",
      [&](const MutexState&) {
        if (a_service->is_owner()) a_owned_when_b_acquired = true;
        std::lock_guard<std::mutex> lock(mu);
        events.push_back("B acquired");
        b_acquired.set();
      },
      nullptr);
  auto sa = faulty->create_contend_service(a).value();
  a_service = sa.get();
  auto sb = healthy->create_contend_service(b).value();
  SIMBA_ASSERT_OK(sa->start());
  ASSERT_TRUE(eventually([&] { return sa->is_owner(); }, seconds(10)));
  const std::uint64_t a_token = sa->fencing_token();
  SIMBA_ASSERT_OK(sb->start());
  ASSERT_TRUE(
      eventually([&] { return sb->after_owner().owner_id == sa->contender_id(); }, seconds(10)));
  faults->set_mode(FaultInjectingBackend::Mode::kFail);
  ASSERT_TRUE(b_acquired.wait(fx.expiry_bound()));
  EXPECT_FALSE(a_owned_when_b_acquired.load()) << "A still believed it owned the mutex";
  EXPECT_FALSE(sa->is_owner());
  EXPECT_GT(sb->fencing_token(), a_token);
  // What is promised is above: A no longer owned the mutex when B got it
  // (is_owner() checks A's deadline, which ends before the store's lease
  // does), and B's token is greater. The order of the callbacks is not: A's
  // and B's run on different factories' threads, and A's on_released may
  // run just after B's on_acquired. But A is told: its deadline timer has
  // fired by the time the store let B in, so on_released follows at once.
  EXPECT_TRUE(a_released.wait(scaled(milliseconds(500))))
      << "A was not told of its loss although B owns the mutex";
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_THAT(events, ::testing::UnorderedElementsAre("A acquired", "A released", "B acquired"));
  }
  faults->set_mode(FaultInjectingBackend::Mode::kPass);
  SIMBA_EXPECT_OK(sb->stop());
  SIMBA_EXPECT_OK(sa->stop());
}

TEST_P(Conformance, HangingRenewalIsRevokedAtTheLeaseDeadline) {
  Fixture fx(GetParam());
  ContendOptions contend = fx.options();
  // Store calls may hang far longer than the lease.
  contend.operation_timeout = seconds(60);
  std::shared_ptr<FaultInjectingBackend> faults;
  auto factory = fx.faulty_factory(&faults, contend);
  ASSERT_TRUE(factory);
  Recorder rec;
  auto service = factory->create_contend_service(rec.contender("hanging-renewal")).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(rec.acquired.wait(seconds(10)));
  const auto deadline = service->lease_deadline();
  ASSERT_TRUE(deadline.has_value());
  faults->set_mode(FaultInjectingBackend::Mode::kHang);
  // The renewal at ttl hangs; the lease deadline (at most ttl + transition
  // after the last renewal was sent) revokes ownership regardless.
  ASSERT_TRUE(rec.released.wait(contend.ttl + contend.transition + seconds(1)));
  EXPECT_FALSE(service->is_owner());
  EXPECT_EQ(service->fencing_token(), 0u);
  faults->set_mode(FaultInjectingBackend::Mode::kPass);
  SIMBA_EXPECT_OK(service->stop());
}

TEST_P(Conformance, ForceReleaseFreesTheMutexAndRaisesTheFencingFloor) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();

  // A free (even unknown) mutex: nothing to release, the floor still rises.
  auto unknown = backend.force_release("forced-free", deadline());
  SIMBA_ASSERT_OK(unknown);
  EXPECT_FALSE(unknown->previous.has_owner_id());
  EXPECT_GT(unknown->fencing_floor, 0u);

  Recorder a;
  auto sa = factory->create_contend_service(a.contender("forced")).value();
  // What the store pushes to A's contender id (as the core's own
  // subscription hears it).
  std::mutex events_mu;
  std::vector<MutexEvent> events;
  auto listening = backend.subscribe("forced", sa->contender_id(), [&](const MutexEvent& e) {
    std::lock_guard<std::mutex> lock(events_mu);
    events.push_back(e);
  });
  ASSERT_TRUE(listening.ok() || listening.status().code() == StatusCode::kUnimplemented)
      << listening.status();
  if (fx.expect().push_channel_starts_on_subscribe) {
    // A push needs the store's push channel up (PostgreSQL's LISTEN
    // connection, SQLite's watcher baseline, Redis's subscriber), which a
    // backend sets up after the first subscribe; a force in that window is
    // not pushed (its holder learns when the channel comes up and it
    // renews: docs/backends/postgres.md). What is tested here is the push:
    // wait for the channel first, until a probe's release is heard.
    ASSERT_TRUE(push_is_live(backend, "forced", [&] {
      std::lock_guard<std::mutex> lock(events_mu);
      return std::any_of(events.begin(), events.end(),
                         [](const MutexEvent& e) { return e.kind == MutexEvent::Kind::kReleased; });
    })) << "a release on this store was never pushed";
  }
  SIMBA_ASSERT_OK(sa->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));
  const std::uint64_t a_token = sa->fencing_token();
  const auto forced_at = std::chrono::steady_clock::now();
  auto forced = backend.force_release("forced", deadline());
  SIMBA_ASSERT_OK(forced);
  EXPECT_EQ(forced->previous.owner_id, sa->contender_id());
  EXPECT_EQ(forced->previous.fencing_token, a_token);
  EXPECT_GT(forced->fencing_floor, a_token);
  // The old holder learns at once where the store pushes kLost (one push,
  // delivered on its callback thread), else at its next renewal (at ttl
  // after its last one, plus that call's round trip): it lost that
  // acquisition, whether it then wins the mutex again or not.
  const milliseconds told_within =
      fx.expect().forced_loss_pushed ? fx.push_bound() : fx.options().ttl + fx.round_trip();
  ASSERT_TRUE(a.released.wait(told_within))
      << "the holder was not told of the forced release within " << told_within.count() << " ms ("
      << (fx.expect().forced_loss_pushed ? "pushed" : "at its renewal") << ")";
  RecordProperty("told_after_force_ms",
                 std::to_string(std::chrono::duration_cast<milliseconds>(
                                    std::chrono::steady_clock::now() - forced_at)
                                    .count()));
  // A store that tells the holder of its loss knows it was taken away, not
  // ended by its lease: the event says so (MutexEvent::forced). Stores
  // without such a push send none (given a moment to arrive).
  // A loss naming nobody matches every owner (SQLite's, for a hold its
  // watcher never saw).
  const auto lost_a = [&] {
    std::lock_guard<std::mutex> lock(events_mu);
    std::vector<MutexEvent> out;
    for (const MutexEvent& e : events) {
      if (e.kind == MutexEvent::Kind::kLost &&
          (e.owner_id == sa->contender_id() || e.owner_id.empty()) &&
          (e.fencing_token == 0 || e.fencing_token == a_token)) {
        out.push_back(e);
      }
    }
    return out;
  };
  const bool pushed = eventually([&] { return !lost_a().empty(); }, fx.push_bound());
  EXPECT_EQ(pushed, fx.expect().forced_loss_pushed)
      << "this store is described as " << (fx.expect().forced_loss_pushed ? "" : "not ")
      << "pushing a forced release to its holder (docs/operations.md)";
  for (const MutexEvent& e : lost_a()) {
    EXPECT_TRUE(e.forced) << "a forced release pushed kLost without `forced`";
  }
  // Every later acquisition is above the floor.
  Recorder b;
  auto sb = factory->create_contend_service(b.contender("forced")).value();
  SIMBA_ASSERT_OK(sb->start());
  ASSERT_TRUE(eventually([&] { return sa->is_owner() || sb->is_owner(); }, fx.expiry_bound()));
  EXPECT_GT(std::max(sa->fencing_token(), sb->fencing_token()), forced->fencing_floor);
  SIMBA_EXPECT_OK(sb->stop());
  SIMBA_EXPECT_OK(sa->stop());
  EXPECT_THAT(backend.force_release("", deadline()), StatusIs(StatusCode::kInvalidArgument));
}

// Contenders already waiting when an operator forces the release are later
// acquisitions too: whoever owns the mutex next, its token exceeds the floor
// (a store that queues waiters must not hand the mutex to a queue entry that
// predates the floor).
TEST_P(Conformance, ForceReleaseFloorHoldsForContendersAlreadyWaiting) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  const std::string mutex = "forced-queue";
  std::mutex mu;
  std::vector<std::uint64_t> tokens;  // of every acquisition, in order
  const auto contender = [&] {
    return make_contender(
        mutex,
        [&](const MutexState& s) {
          std::lock_guard<std::mutex> lock(mu);
          tokens.push_back(s.after.fencing_token);
        },
        [](const MutexState&) {});
  };
  auto holder = factory->create_contend_service(contender()).value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(eventually([&] { return holder->is_owner(); }, seconds(10)));
  // Its callback too (ownership is decided before the callback runs, on
  // another thread): counted late, the holder's own token would pass for
  // an acquisition after the force (a CI run saw token 1 against floor 2).
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return tokens.size() == 1;
      },
      seconds(10)));
  std::vector<std::unique_ptr<MutexContendService>> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(factory->create_contend_service(contender()).value());
    SIMBA_ASSERT_OK(waiting.back()->start());
  }
  // The waiters have made their first attempt (and joined the queue where
  // the store keeps one) before the force.
  auto listed = backend.waiters(mutex, deadline());
  if (listed.ok()) {
    ASSERT_TRUE(eventually(
        [&] {
          auto now = backend.waiters(mutex, deadline());
          return now.ok() && now->size() == waiting.size();
        },
        seconds(10)));
  } else {
    std::this_thread::sleep_for(milliseconds(500));
  }
  std::size_t before = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    before = tokens.size();
  }
  auto forced = backend.force_release(mutex, deadline());
  SIMBA_ASSERT_OK(forced);
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return tokens.size() > before;
      },
      fx.expiry_bound()));
  {
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = before; i < tokens.size(); ++i) {
      EXPECT_GT(tokens[i], forced->fencing_floor) << "acquisition " << i << " after the force";
    }
  }
  for (auto& service : waiting) SIMBA_EXPECT_OK(service->stop());
  SIMBA_EXPECT_OK(holder->stop());
}

// ---- waiters -------------------------------------------------------------------

TEST_P(Conformance, WaitersListsContendersThatWaitOldestFirst) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  const std::string mutex = "waiters";
  auto fresh = backend.waiters(mutex, deadline());
  if (!fx.expect().lists_waiters) {
    // Stores where waiters leave no trace keep the default, and say exactly
    // that (the dashboard shows "store cannot tell"): that is all they
    // promise. (Not a skip: under CI nothing passes by skipping.)
    ASSERT_THAT(fresh, StatusIs(StatusCode::kUnimplemented));
    return;
  }
  SIMBA_ASSERT_OK(fresh) << "this store is described as listing its waiters";
  EXPECT_THAT(*fresh, ::testing::IsEmpty());

  // As the core does: each contender subscribes with its id, then asks.
  // Leases long enough to outlast the test.
  const std::string a = "waiter-a", b = "waiter-b", c = "waiter-c";
  const auto request = [&](const std::string& id) {
    return AcquireRequest{mutex, id, seconds(20), seconds(5)};
  };
  std::vector<std::unique_ptr<Subscription>> subscriptions;
  for (const std::string& id : {a, b, c}) {
    auto sub = backend.subscribe(mutex, id, [](const MutexEvent&) {});
    ASSERT_TRUE(sub.ok() || sub.status().code() == StatusCode::kUnimplemented) << sub.status();
    if (sub.ok()) subscriptions.push_back(std::move(*sub));
  }
  auto held = backend.acquire_or_renew(request(a), deadline());
  SIMBA_ASSERT_OK(held);
  ASSERT_EQ(held->owner.owner_id, a);
  const std::uint64_t a_token = held->owner.fencing_token;

  // B, then C, ask and wait, polling as the core would until the store
  // lists them (a store may need their subscriptions in place first).
  std::vector<std::string> listed;
  const bool both = eventually(
      [&] {
        for (const std::string& id : {b, c}) {
          auto attempt = backend.acquire_or_renew(request(id), deadline());
          if (!attempt.ok() || attempt->owner.owner_id != a) return false;
        }
        auto now = backend.waiters(mutex, deadline());
        if (!now.ok()) return false;
        listed = *now;
        return listed.size() == 2 && std::find(listed.begin(), listed.end(), b) != listed.end() &&
               std::find(listed.begin(), listed.end(), c) != listed.end();
      },
      seconds(10));
  ASSERT_TRUE(both) << "waiters() never listed B and C; last: " << ::testing::PrintToString(listed);
  // A store may drop a waiter that asked before its subscription was in
  // place (Redis trims queue entries nobody listens for), which then queues
  // again behind C. Both are listed now, so both listen: they queue afresh,
  // B first.
  SIMBA_ASSERT_OK(backend.leave(mutex, b, deadline()));
  SIMBA_ASSERT_OK(backend.leave(mutex, c, deadline()));
  for (const std::string& id : {b, c}) {
    auto attempt = backend.acquire_or_renew(request(id), deadline());
    SIMBA_ASSERT_OK(attempt);
    ASSERT_EQ(attempt->owner.owner_id, a);
  }
  auto queued = backend.waiters(mutex, deadline());
  SIMBA_ASSERT_OK(queued);
  listed = *queued;
  // Every store that lists waiters lists them oldest first
  // (docs/backends.md), fifo or not.
  EXPECT_THAT(listed, ::testing::ElementsAre(b, c)) << "waiters() lists the oldest first";

  // A lets go and B takes over: B no longer waits, A never did.
  EXPECT_THAT(backend.release(mutex, a, a_token, deadline()), IsOkAndHolds(true));
  ASSERT_TRUE(eventually(
      [&] {
        auto attempt = backend.acquire_or_renew(request(b), deadline());
        return attempt.ok() && attempt->owner.owner_id == b;
      },
      seconds(10)))
      << "B never took over";
  auto after = backend.waiters(mutex, deadline());
  SIMBA_ASSERT_OK(after);
  EXPECT_THAT(*after, ::testing::Not(::testing::Contains(b)));
  EXPECT_THAT(*after, ::testing::Not(::testing::Contains(a)));
  EXPECT_THAT(*after, ::testing::ElementsAre(c)) << "C is still in line";

  // C gives up waiting (what a stopping waiter sends): out of the line.
  SIMBA_EXPECT_OK(backend.leave(mutex, c, deadline()));
  EXPECT_THAT(backend.waiters(mutex, deadline()), IsOkAndHolds(::testing::IsEmpty()));
  // B lets go too: nobody waits.
  SIMBA_EXPECT_OK(backend.release(mutex, b, deadline()));
  EXPECT_THAT(backend.waiters(mutex, deadline()), IsOkAndHolds(::testing::IsEmpty()));
}

TEST_P(Conformance, WaitersOfAnUnusedMutexIsEmptyAndABadNameIsAnError) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  auto unused = backend.waiters("nobody-waits", deadline());
  const std::size_t max = backend.capabilities().max_mutex_length;
  if (!fx.expect().lists_waiters) {
    // The default: no queue, whatever the name.
    ASSERT_THAT(unused, StatusIs(StatusCode::kUnimplemented));
    EXPECT_THAT(backend.waiters("", deadline()), StatusIs(StatusCode::kUnimplemented));
    return;
  }
  EXPECT_THAT(*unused, ::testing::IsEmpty());
  EXPECT_THAT(backend.waiters("", deadline()),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(backend.waiters(std::string(max + 1, 'm'), deadline()),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(backend.waiters("line\nbreak", deadline()), StatusIs(StatusCode::kInvalidArgument));
  // Asking changed nothing.
  EXPECT_THAT(backend.waiters("nobody-waits", deadline()), IsOkAndHolds(::testing::IsEmpty()));
}

// ---- what the store promises -------------------------------------------------------

TEST_P(Conformance, CapabilitiesSayWhatTheStorePromises) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const Capabilities& caps = factory->backend()->capabilities();
  EXPECT_EQ(caps.push_release, fx.expect().push_release);
  EXPECT_EQ(caps.fifo, fx.expect().fifo);
  EXPECT_FALSE(caps.fencing_source.empty());
}

// A fifo store's waiters own the mutex in the order they first asked: B,
// who waited before C, is next, whoever of the two hears of the release or
// polls first. (Stores without a queue promise no order; for them this
// checks only that they do not claim one.)
TEST_P(Conformance, FifoStoresHandOverInArrivalOrder) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  if (!fx.expect().fifo) {
    EXPECT_FALSE(factory->backend()->capabilities().fifo);
    return;
  }
  // The queue is how the order is seen: every fifo store lists it.
  ASSERT_TRUE(fx.expect().lists_waiters);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  const std::string mutex = "fifo";
  Recorder a, b, c;
  auto sa = factory->create_contend_service(a.contender(mutex)).value();
  auto sb = factory->create_contend_service(b.contender(mutex)).value();
  auto sc = factory->create_contend_service(c.contender(mutex)).value();
  const auto queue_is = [&](std::vector<std::string> expected) {
    return eventually(
        [&] {
          auto now = backend.waiters(mutex, deadline());
          return now.ok() && *now == expected;
        },
        seconds(10));
  };
  SIMBA_ASSERT_OK(sa->start());
  ASSERT_TRUE(a.acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(sb->start());
  ASSERT_TRUE(queue_is({sb->contender_id()})) << "B never queued";
  SIMBA_ASSERT_OK(sc->start());
  ASSERT_TRUE(queue_is({sb->contender_id(), sc->contender_id()})) << "C never queued behind B";
  SIMBA_ASSERT_OK(sa->stop());
  ASSERT_TRUE(
      eventually([&] { return b.acquired.is_set() || c.acquired.is_set(); }, fx.push_bound()));
  EXPECT_TRUE(b.acquired.is_set()) << "C, who asked after B, owns the mutex first";
  EXPECT_FALSE(c.acquired.is_set());
  SIMBA_ASSERT_OK(sb->stop());
  ASSERT_TRUE(c.acquired.wait(fx.push_bound()));
  EXPECT_GT(c.token.load(), b.token.load());
  EXPECT_GT(b.token.load(), a.token.load());
  SIMBA_EXPECT_OK(sc->stop());
}

// Found by the fault runs (issue #9): a release held up in the network after
// its caller had given up on it reached MySQL after the same contender had
// acquired the mutex again, and ended that newer ownership while its owner
// still worked. A release names the ownership it ends by its token.
TEST_P(Conformance, ALateReleaseOfAnEarlierOwnershipLeavesALaterOneAlone) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  const AcquireRequest request{"late-release", "c1", seconds(10), seconds(5)};

  auto first = backend.acquire_or_renew(request, deadline());
  SIMBA_ASSERT_OK(first);
  ASSERT_EQ(first->owner.owner_id, "c1");
  const std::uint64_t t1 = first->owner.fencing_token;
  EXPECT_THAT(backend.release("late-release", "c1", t1, deadline()), IsOkAndHolds(true));

  auto second = backend.acquire_or_renew(request, deadline());
  SIMBA_ASSERT_OK(second);
  ASSERT_EQ(second->owner.owner_id, "c1");
  const std::uint64_t t2 = second->owner.fencing_token;
  ASSERT_GT(t2, t1);
  // The first ownership's release once more, as if it arrived only now.
  EXPECT_THAT(backend.release("late-release", "c1", t1, deadline()), IsOkAndHolds(false));
  auto still = backend.read("late-release", deadline());
  SIMBA_ASSERT_OK(still);
  EXPECT_EQ(still->owner.owner_id, "c1");
  EXPECT_EQ(still->owner.fencing_token, t2);
  EXPECT_EQ(backend.acquire_or_renew(request, deadline())->owner.fencing_token, t2)
      << "the ownership goes on: a renewal keeps its token";
  EXPECT_THAT(backend.release("late-release", "c1", t2, deadline()), IsOkAndHolds(true));

  // Token 0 releases whatever ownership the contender has.
  auto third = backend.acquire_or_renew(request, deadline());
  SIMBA_ASSERT_OK(third);
  ASSERT_EQ(third->owner.owner_id, "c1");
  EXPECT_THAT(backend.release("late-release", "c1", 0, deadline()), IsOkAndHolds(true));
  auto after = backend.read("late-release", deadline());
  SIMBA_ASSERT_OK(after);
  EXPECT_FALSE(after->owner.has_owner_id());
}

// A batched renewal renews each lease its contender still holds, keeping
// the token, and takes nothing: not another's mutex, not a free one, not a
// mutex the store has never seen. (Stores that renew one lease a call say
// so.)
TEST_P(Conformance, BatchedRenewalsRenewWhatIsHeldAndTakeNothing) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  auto& backend = *factory->backend();
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  EXPECT_EQ(backend.capabilities().batch_renewals, fx.expect().batch_renewals);
  const milliseconds ttl(4000), transition(2000);
  auto request = [&](std::string_view mutex, std::string_view contender) {
    return AcquireRequest{mutex, contender, ttl, transition};
  };
  if (!fx.expect().batch_renewals) {
    EXPECT_THAT(backend.renew({request("r-a", "c1")}, deadline()),
                StatusIs(StatusCode::kUnimplemented));
    return;
  }
  auto a = backend.acquire_or_renew(request("r-a", "c1"), deadline());
  auto b = backend.acquire_or_renew(request("r-b", "c2"), deadline());
  auto theirs = backend.acquire_or_renew(request("r-c", "other"), deadline());
  auto freed = backend.acquire_or_renew(request("r-e", "c1"), deadline());
  SIMBA_ASSERT_OK(a);
  SIMBA_ASSERT_OK(b);
  SIMBA_ASSERT_OK(theirs);
  SIMBA_ASSERT_OK(freed);
  EXPECT_THAT(backend.release("r-e", "c1", deadline()), IsOkAndHolds(true));

  const milliseconds longer(9000);
  const bool length_fixed = fx.expect().lease_length_fixed;
  std::vector<AcquireRequest> requests = {
      request("r-a", "c1"), request("r-b", "c2"), request("r-c", "c1"),
      request("r-d", "c1"), request("r-e", "c1"),
  };
  requests[0].ttl = length_fixed ? ttl : longer;
  requests[1].ttl = longer;
  auto renewed = backend.renew(requests, deadline());
  SIMBA_ASSERT_OK(renewed);
  ASSERT_EQ(renewed->size(), requests.size());
  const OwnerRecord& ra = (*renewed)[0];
  EXPECT_EQ(ra.owner.owner_id, "c1");
  EXPECT_EQ(ra.owner.fencing_token, a->owner.fencing_token) << "a renewal keeps the token";
  if (length_fixed) {
    EXPECT_EQ(ra.owner.ttl_at - ra.store_now, ttl) << "renewed for the ttl asked";
  } else {
    EXPECT_GT(ra.owner.ttl_at - ra.store_now, ttl) << "the longer ttl applies";
    EXPECT_LE(ra.owner.ttl_at - ra.store_now, longer);
  }
  EXPECT_EQ(ra.owner.transition_at - ra.owner.ttl_at, transition);
  EXPECT_EQ((*renewed)[1].owner.owner_id, "c2");
  EXPECT_EQ((*renewed)[1].owner.fencing_token, b->owner.fencing_token);
  if (length_fixed) {
    // Another ttl than its lease's: still c2's under the same token, its
    // lease neither moved nor lengthened.
    EXPECT_LE((*renewed)[1].owner.transition_at - (*renewed)[1].store_now, ttl + transition);
  }
  EXPECT_EQ((*renewed)[2].owner.owner_id, "other") << "another's mutex is named, not taken";
  EXPECT_EQ((*renewed)[2].owner.fencing_token, theirs->owner.fencing_token);
  if (length_fixed) {
    // Its key shares the backend's session lease, whose end is all the
    // store has (the backend ends a hold nobody renews by deleting its key).
    EXPECT_LE((*renewed)[2].owner.transition_at - (*renewed)[2].store_now, ttl + transition);
  } else {
    // Not renewed: where it ends has not moved. Within a millisecond: Redis
    // gives a lease's end as the server's TIME plus PTTL, and in a script
    // PTTL counts from the time the script started, so the sum is late by
    // the milliseconds the script had run (0 or 1) when it read TIME, in
    // the acquisition's reply and in this one alike (a CI run saw 1 ms).
    // A renewal would have moved it by the ttl.
    const auto moved = (*renewed)[2].owner.ttl_at - theirs->owner.ttl_at;
    EXPECT_LE(moved, milliseconds(1)) << "and not renewed";
    EXPECT_GE(moved, milliseconds(-1)) << "and not renewed";
  }
  EXPECT_FALSE((*renewed)[3].owner.has_owner_id()) << "an unknown mutex stays free";
  EXPECT_FALSE((*renewed)[4].owner.has_owner_id()) << "a free mutex stays free";
  for (const OwnerRecord& record : *renewed) EXPECT_GT(record.store_now.count(), 0);

  for (const char* mutex : {"r-d", "r-e"}) {
    auto read = backend.read(mutex, deadline());
    SIMBA_ASSERT_OK(read);
    EXPECT_FALSE(read->owner.has_owner_id()) << mutex;
  }
  auto read_a = backend.read("r-a", deadline());
  SIMBA_ASSERT_OK(read_a);
  if (length_fixed) {
    // The store keeps the lease's end only, in whole seconds.
    EXPECT_GE(read_a->owner.transition_at, ra.owner.transition_at - seconds(1));
  } else {
    // The renewal's end as read back, within a millisecond on Redis (TIME
    // and PTTL in one script may fall in two milliseconds, as above; a CI
    // run saw the read 1 ms early).
    const auto moved = read_a->owner.ttl_at - ra.owner.ttl_at;
    EXPECT_LE(moved, milliseconds(1)) << "the renewal's end as read back";
    EXPECT_GE(moved, milliseconds(-1)) << "the renewal's end as read back";
  }
  EXPECT_THAT(backend.renew({}, deadline()), IsOk());
  for (auto& [mutex, contender] : {std::pair{"r-a", "c1"}, {"r-b", "c2"}, {"r-c", "other"}}) {
    EXPECT_THAT(backend.release(mutex, contender, deadline()), IsOkAndHolds(true));
  }
}

// Found by the clustered fault runs on PostgreSQL (2026-11-28): a waiter
// core of a node gave up during a black hole and released, naming no token;
// the request reached the store after the heal, when the node's next core
// had acquired, and ended that ownership while the node worked on. A
// stopping waiter now leaves the wait (Backend::leave), which ends no
// ownership, whenever it arrives. Here its request is held back and
// delivered after the next core acquired. On etcd and ZooKeeper the entry a
// leave removes is named by the backend's own state when stop() calls it
// (a key's lease, a node's path), and only that request travels late, so
// the old core's leave goes at once there, takes its entry out of the line,
// and what comes late is a leave through another session.
TEST_P(Conformance, AWaiterGivingUpLateNeverEndsALaterHoldOfItsContender) {
  Fixture fx(GetParam());
  const bool named_by_the_backend = fx.expect().fifo;
  std::shared_ptr<FaultInjectingBackend> faults;
  auto node_factory = fx.faulty_factory(&faults, fx.options());
  auto other_factory = fx.factory();
  ASSERT_TRUE(node_factory && other_factory);
  const std::string mutex = "late-leave";
  const auto node = [&] { return make_contender(mutex, nullptr, nullptr, "node-a"); };
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };

  auto holder =
      other_factory->create_contend_service(make_contender(mutex, nullptr, nullptr, "holder-b"))
          .value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(eventually([&] { return holder->is_owner(); }, seconds(10)));
  auto old_core = node_factory->create_contend_service(node()).value();
  SIMBA_ASSERT_OK(old_core->start());
  ASSERT_TRUE(
      eventually([&] { return old_core->after_owner().is_owner("holder-b"); }, seconds(10)));
  if (named_by_the_backend) {
    SIMBA_EXPECT_OK(old_core->stop());
    EXPECT_THAT(other_factory->backend()->waiters(mutex, deadline()),
                IsOkAndHolds(::testing::Not(::testing::Contains("node-a"))))
        << "the stopped waiter is still in line";
  } else {
    faults->set_releases_held_back(true);  // a partition: the request times out
    EXPECT_THAT(old_core->stop(), StatusIs(StatusCode::kDeadlineExceeded));
    faults->set_releases_held_back(false);  // the heal
  }
  SIMBA_ASSERT_OK(holder->stop());

  auto new_core = node_factory->create_contend_service(node()).value();
  SIMBA_ASSERT_OK(new_core->start());
  ASSERT_TRUE(eventually([&] { return new_core->is_owner(); }, fx.expiry_bound()));
  const std::uint64_t token = new_core->fencing_token();
  if (named_by_the_backend) {
    SIMBA_ASSERT_OK(other_factory->backend()->leave(mutex, "node-a", deadline()));
  } else {
    // The old requests arrive only now: stop()'s leave and, when an attempt
    // of the old core was in flight at the stop (it had just subscribed and
    // asked again), that attempt's leave again once its answer came.
    EXPECT_THAT(faults->deliver_held_back(), ::testing::AllOf(::testing::Ge(1), ::testing::Le(2)));
  }
  auto held = other_factory->backend()->read(mutex, deadline());
  SIMBA_ASSERT_OK(held);
  EXPECT_EQ(held->owner.owner_id, "node-a") << "the late request ended the new core's hold";
  EXPECT_EQ(held->owner.fencing_token, token);
  SIMBA_ASSERT_OK(new_core->stop());
}

// Leaving the wait ends no ownership, even one of the same contender id
// (non-fifo stores keep no queue entry that becomes the ownership) or one
// taken through another connection or process (every store).
TEST_P(Conformance, LeavingTheWaitEndsNoOwnership) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  auto other = fx.factory();
  ASSERT_TRUE(factory && other);
  const auto deadline = [] { return std::chrono::steady_clock::now() + seconds(10); };
  auto& backend = *factory->backend();
  const AcquireRequest request{"leave", "c1", seconds(10), seconds(5)};
  auto held = backend.acquire_or_renew(request, deadline());
  SIMBA_ASSERT_OK(held);
  ASSERT_EQ(held->owner.owner_id, "c1");
  SIMBA_EXPECT_OK(other->backend()->leave("leave", "c1", deadline()));
  if (!fx.expect().fifo) {
    SIMBA_EXPECT_OK(backend.leave("leave", "c1", deadline()));
  }
  auto still = other->backend()->read("leave", deadline());
  SIMBA_ASSERT_OK(still);
  EXPECT_EQ(still->owner.owner_id, "c1");
  EXPECT_EQ(still->owner.fencing_token, held->owner.fencing_token);
  EXPECT_THAT(backend.leave("", "c1", deadline()), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(backend.leave("leave", "", deadline()), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(backend.release("leave", "c1", held->owner.fencing_token, deadline()),
              IsOkAndHolds(true));
}

// ---- Locker ------------------------------------------------------------------

TEST_P(Conformance, LockerExcludesTimesOutAndHandsOver) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  auto first = Locker::create(*factory, "locker").value();
  auto second = Locker::create(*factory, "locker").value();
  SIMBA_ASSERT_OK(first->acquire(seconds(10)));
  EXPECT_TRUE(first->is_held());
  const std::uint64_t first_token = first->fencing_token();
  EXPECT_GT(first_token, 0u);
  EXPECT_THAT(first->acquire(seconds(1)), StatusIs(StatusCode::kFailedPrecondition));

  auto attempt = second->try_acquire();
  SIMBA_ASSERT_OK(attempt);
  EXPECT_FALSE(*attempt);
  EXPECT_THAT(second->acquire(milliseconds(300)),
              StatusIs(StatusCode::kDeadlineExceeded, ::testing::HasSubstr("locker")));
  EXPECT_FALSE(second->is_held());

  SIMBA_ASSERT_OK(first->release());
  SIMBA_ASSERT_OK(first->release());  // idempotent
  EXPECT_FALSE(first->is_held());
  SIMBA_ASSERT_OK(second->acquire(seconds(10)));
  EXPECT_TRUE(second->is_held());
  EXPECT_GT(second->fencing_token(), first_token);
}

TEST_P(Conformance, LockerTellsItsHolderWhenTheLeaseIsLost) {
  Fixture fx(GetParam());
  std::shared_ptr<FaultInjectingBackend> faults;
  auto factory = fx.faulty_factory(&faults, fx.options());
  ASSERT_TRUE(factory);
  Latch lost;
  LockerOptions options;
  options.on_lost = [&] { lost.set(); };
  auto locker = Locker::create(*factory, "locker-lost", options).value();
  SIMBA_ASSERT_OK(locker->acquire(seconds(10)));
  std::stop_token token = locker->lost_token();
  EXPECT_FALSE(token.stop_requested());
  faults->set_mode(FaultInjectingBackend::Mode::kFail);
  ASSERT_TRUE(lost.wait(fx.options().ttl + fx.options().transition + seconds(1)));
  EXPECT_TRUE(token.stop_requested());
  EXPECT_FALSE(locker->is_held());
  EXPECT_EQ(locker->fencing_token(), 0u);
  faults->set_mode(FaultInjectingBackend::Mode::kPass);
  SIMBA_EXPECT_OK(locker->release());
}

// ---- bad input -----------------------------------------------------------------

TEST_P(Conformance, BadNamesAndOptionsAreClearErrors) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  const std::size_t max = factory->backend()->capabilities().max_mutex_length;
  auto with_mutex = [&](const std::string& mutex) {
    return factory->create_contend_service(make_contender(mutex, nullptr, nullptr)).status();
  };
  EXPECT_THAT(with_mutex(""),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(with_mutex(std::string(max + 1, 'm')),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  SIMBA_EXPECT_OK(with_mutex(std::string(max, 'm')));
  EXPECT_THAT(with_mutex("line\nbreak"),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(with_mutex(std::string("nul\0byte", 8)),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(with_mutex("\xff\xfe"),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(factory->create_contend_service(make_contender("ok", nullptr, nullptr, "")).status(),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("contender_id")));
  EXPECT_THAT(factory->create_contend_service(nullptr).status(),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("contender")));

  auto with_options = [&](auto mutate) {
    ContendOptions options = fx.options();
    mutate(options);
    return factory->create_contend_service(make_contender("ok", nullptr, nullptr), options)
        .status();
  };
  EXPECT_THAT(with_options([](ContendOptions& o) { o.ttl = milliseconds(0); }),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("ttl")));
  EXPECT_THAT(with_options([](ContendOptions& o) { o.ttl = milliseconds(-5); }),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("ttl")));
  EXPECT_THAT(with_options([](ContendOptions& o) { o.transition = milliseconds(-1); }),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("transition")));
  EXPECT_THAT(with_options([](ContendOptions& o) { o.operation_timeout = milliseconds(0); }),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("operation_timeout")));
  SIMBA_EXPECT_OK(with_options([](ContendOptions& o) { o.transition = milliseconds(0); }));

  EXPECT_THAT(Locker::create(*factory, "").status(),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("mutex")));
  EXPECT_THAT(
      Scheduler::create(*factory, "s", ScheduleConfig::fixed_rate(milliseconds(0), milliseconds(0)),
                        [](const WorkContext&) {})
          .status(),
      StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("period")));
}

TEST_P(Conformance, BadUrisAreClearErrorsWithoutHanging) {
  const BackendTarget& target = GetParam();
  std::vector<BadUri> cases = target.bad_uris;
  cases.push_back({"", StatusCode::kInvalidArgument, "empty"});
  cases.push_back({"no scheme here", StatusCode::kInvalidArgument, "missing \"://\""});
  cases.push_back({"nosuchstore://x", StatusCode::kUnimplemented, "nosuchstore"});
  for (const auto& c : cases) {
    const auto started = std::chrono::steady_clock::now();
    auto factory = MutexContendServiceFactory::open(c.uri);
    EXPECT_THAT(factory, StatusIs(c.expected)) << c.uri;
    EXPECT_FALSE(factory.status().message().empty()) << c.uri;
    // Every case says what the error must name (the URI part at fault).
    EXPECT_FALSE(c.names.empty()) << "the case " << c.uri << " names nothing to look for";
    EXPECT_THAT(std::string(factory.status().message()), ::testing::HasSubstr(c.names)) << c.uri;
    EXPECT_LT(std::chrono::steady_clock::now() - started, scaled(seconds(10))) << c.uri;
  }
  auto unknown = MutexContendServiceFactory::open("nosuchstore://x");
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr(target.name));
}

// ---- scale -----------------------------------------------------------------------

TEST_P(Conformance, ThousandServicesShareAFewThreads) {
  Fixture fx(GetParam());
  // 1,000 renewals per ttl on two I/O threads is what is measured here; a
  // sanitized client runs several times slower, so its leases are stretched
  // as its other waits are (SIMBA_TEST_TIME_SCALE), keeping the load per
  // unit of client speed the same.
  ContendOptions lease = fx.options();
  lease.ttl = scaled(lease.ttl);
  lease.transition = scaled(lease.transition);
  auto factory = fx.factory(lease);
  ASSERT_TRUE(factory);
  constexpr int kServices = 1000;
  std::atomic<int> releases{0};
  std::vector<std::unique_ptr<MutexContendService>> services;
  services.reserve(kServices);
  for (int i = 0; i < kServices; ++i) {
    auto c = make_contender("threads-" + std::to_string(i), nullptr,
                            [&](const MutexState&) { ++releases; });
    services.push_back(factory->create_contend_service(c).value());
    SIMBA_ASSERT_OK(services.back()->start());
  }
  auto all_owned = [&] {
    return std::all_of(services.begin(), services.end(),
                       [](const auto& s) { return s->is_owner(); });
  };
  ASSERT_TRUE(eventually(all_owned, seconds(30)));
  const int threads = count_threads();
  EXPECT_LT(threads, 16) << "threads must not grow with mutexes";
  RecordProperty("threads", std::to_string(threads));
  // Two full leases: every service renews at least twice.
  std::this_thread::sleep_for(2 * (lease.ttl + lease.transition));
  EXPECT_TRUE(all_owned());
  EXPECT_EQ(releases.load(), 0) << "a lease was lost while the store was healthy";
  EXPECT_LT(count_threads(), 16);
  for (auto& s : services) SIMBA_EXPECT_OK(s->stop());
}

// ---- a restarted server -------------------------------------------------------

// The server is killed (a crash) and restarted while a lease is held and
// another contender waits: connections do not survive, the store's state
// does (every store with a server here keeps its writes durable). Whoever
// holds the mutex afterwards, nobody held it together, and if it changed
// hands the token grew. (Was PostgresFailures/MysqlFailures.
// RestartWhileALeaseIsHeldKeepsOneOwner, one copy per store.)
TEST_P(ServerRestartConformance, RestartWhileALeaseIsHeldKeepsOneOwner) {
  const BackendTarget& target = GetParam();
  ASSERT_TRUE(target.uri_on) << target.name << ": no store on a private server";
  auto server = TestServer::start(target.server, target.server_args);
  ASSERT_THAT(server, IsOk());
  const std::string uri = target.uri_on((*server)->uri(), unique_test_name());
  // The lease of the per-store tests this case replaces: ttl 2 s,
  // transition as long as the ttl.
  ContendOptions contend = target.options;
  contend.transition = contend.ttl;
  auto open_factory = [&] {
    FactoryOptions options;
    options.contend = contend;
    auto factory = MutexContendServiceFactory::open(uri, options);
    EXPECT_THAT(factory, IsOk()) << uri;
    return factory.ok() ? std::move(factory).value() : nullptr;
  };
  auto factory_a = open_factory();
  auto factory_b = open_factory();
  ASSERT_TRUE(factory_a && factory_b);
  std::mutex mu;
  int inside = 0;
  int max_inside = 0;
  auto enter = [&] {
    std::lock_guard<std::mutex> lock(mu);
    max_inside = std::max(max_inside, ++inside);
  };
  auto leave = [&] {
    std::lock_guard<std::mutex> lock(mu);
    --inside;
  };
  Latch a_acquired, b_acquired;
  std::atomic<std::uint64_t> a_token{0}, b_token{0};
  auto holder = factory_a
                    ->create_contend_service(make_contender(
                        "m",
                        [&](const MutexState& s) {
                          a_token = s.after.fencing_token;
                          enter();
                          a_acquired.set();
                        },
                        [&](const MutexState&) { leave(); }, "a"))
                    .value();
  auto waiter = factory_b
                    ->create_contend_service(make_contender(
                        "m",
                        [&](const MutexState& s) {
                          b_token = s.after.fencing_token;
                          enter();
                          b_acquired.set();
                        },
                        [&](const MutexState&) { leave(); }, "b"))
                    .value();
  SIMBA_ASSERT_OK(holder->start());
  ASSERT_TRUE(a_acquired.wait(seconds(10)));
  SIMBA_ASSERT_OK(waiter->start());
  // A crash, a second without the server, and a restart on the same port
  // and data.
  SIMBA_ASSERT_OK((*server)->kill());
  std::this_thread::sleep_for(seconds(1));
  SIMBA_ASSERT_OK((*server)->restart());
  const auto restarted = std::chrono::steady_clock::now();
  // Someone owns it again within the store's bound, and nobody shares it
  // while we watch: for at least 6 s after the restart (two leases).
  EXPECT_TRUE(eventually([&] { return holder->is_owner() || waiter->is_owner(); },
                         target.restart_owner_within))
      << "no owner within " << scaled(target.restart_owner_within).count() << " ms of the restart";
  const auto watched_until = restarted + scaled(seconds(6));
  if (std::chrono::steady_clock::now() < watched_until) {
    std::this_thread::sleep_until(watched_until);
  }
  EXPECT_TRUE(holder->is_owner() || waiter->is_owner());
  if (b_acquired.is_set()) {
    EXPECT_GT(b_token.load(), a_token.load());
  }
  SIMBA_ASSERT_OK(holder->stop());
  SIMBA_ASSERT_OK(waiter->stop());
  EXPECT_LE(max_inside, 1);
}

// ---- other processes -----------------------------------------------------------

std::vector<std::string> taker_args(const Fixture& fx, const std::string& mutex) {
  return {SIMBA_TAKER_PATH,
          "--store",
          fx.uri(),
          "--mutex",
          mutex,
          "--ttl-ms",
          std::to_string(fx.options().ttl.count()),
          "--transition-ms",
          std::to_string(fx.options().transition.count())};
}

TEST_P(CrossProcessConformance, KilledOwnerIsReplacedWithinTheLease) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Subprocess taker(taker_args(fx, "killed-owner"));
  ASSERT_TRUE(taker.started());
  auto acquired = taker.wait_for_line("ACQUIRED", seconds(20));
  ASSERT_TRUE(acquired.has_value()) << "the other process never acquired the mutex";
  const std::uint64_t taker_token = std::stoull(acquired->substr(9));
  Recorder rec;
  auto service = factory->create_contend_service(rec.contender("killed-owner")).value();
  SIMBA_ASSERT_OK(service->start());
  ASSERT_TRUE(eventually([&] { return !service->after_owner().owner_id.empty(); }, seconds(10)));
  EXPECT_FALSE(rec.acquired.is_set()) << "acquired while the other process held the mutex";
  if (const milliseconds backed = GetParam().expect.killed_owner_backed_within;
      backed.count() > 0) {
    // (No event to wait for: the holder's record of its backing is in the
    // store's own side table, which the suite does not read.)
    std::this_thread::sleep_for(scaled(backed));
  }
  const auto killed = std::chrono::steady_clock::now();
  taker.signal(SIGKILL);
  taker.wait();
  const milliseconds within = GetParam().expect.killed_owner_replaced_within;
  if (within.count() > 0) {
    EXPECT_TRUE(factory->backend()->capabilities().ends_with_session);
  }
  ASSERT_TRUE(rec.acquired.wait(within.count() > 0 ? scaled(within) : fx.expiry_bound()))
      << (within.count() > 0 ? "the store sees a holder die: not replaced within " +
                                   std::to_string(scaled(within).count()) + " ms"
                             : "not replaced within the lease");
  EXPECT_GT(rec.token.load(), taker_token);
  RecordProperty("failover_ms", std::to_string(std::chrono::duration_cast<milliseconds>(
                                                   std::chrono::steady_clock::now() - killed)
                                                   .count()));
  SIMBA_EXPECT_OK(service->stop());
}

TEST_P(CrossProcessConformance, PausedOwnerLearnsItLostTheLease) {
  Fixture fx(GetParam());
  auto factory = fx.factory();
  ASSERT_TRUE(factory);
  Subprocess taker(taker_args(fx, "paused-owner"));
  ASSERT_TRUE(taker.started());
  auto acquired = taker.wait_for_line("ACQUIRED", seconds(20));
  ASSERT_TRUE(acquired.has_value());
  const std::uint64_t taker_token = std::stoull(acquired->substr(9));
  Recorder rec;
  auto service = factory->create_contend_service(rec.contender("paused-owner")).value();
  SIMBA_ASSERT_OK(service->start());
  // The classic GC pause: longer than the whole lease.
  taker.signal(SIGSTOP);
  ASSERT_TRUE(rec.acquired.wait(fx.expiry_bound()));
  EXPECT_GT(rec.token.load(), taker_token);
  taker.signal(SIGCONT);
  std::vector<std::string> lines;
  auto released = taker.wait_for_line("RELEASED", seconds(3), &lines);
  EXPECT_TRUE(released.has_value()) << "the paused owner was not told it lost the lease";
  // Let the taker sample is_owner() for a while after it resumed.
  std::this_thread::sleep_for(milliseconds(500));
  taker.signal(SIGTERM);
  while (auto line = taker.read_line(seconds(5))) lines.push_back(*line);
  taker.wait();
  for (const auto& line : lines) {
    EXPECT_EQ(line.rfind("VIOLATION", 0), std::string::npos) << line;
    EXPECT_EQ(line.rfind("ACQUIRED", 0), std::string::npos)
        << "the paused owner re-acquired while another held the mutex: " << line;
  }
  EXPECT_TRUE(service->is_owner());
  SIMBA_EXPECT_OK(service->stop());
}

}  // namespace
}  // namespace simba::testing

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CrossProcessConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ServerRestartConformance);
