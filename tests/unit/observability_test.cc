// What a contend service reports to FactoryOptions::metrics and ::events, on
// virtual time: every kind of event, each loss cause, the waiting gauge, and
// the latencies (which the virtual clock makes exact).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "simba/contend_service.h"
#include "simba/events.h"
#include "simba/keyed_backend.h"
#include "simba/keyed_lock.h"
#include "simba/metrics.h"
#include "testing/fault_injecting_backend.h"
#include "testing/forwarding_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/virtual_time_test.h"

namespace simba {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using Kind = LockEvent::Kind;
using Mode = testing::FaultInjectingBackend::Mode;

class RecordingListener final : public LockEventListener {
 public:
  void on_event(const LockEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }
  std::vector<LockEvent> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<Kind> kinds() const {
    std::vector<Kind> kinds;
    for (const auto& e : get()) kinds.push_back(e.kind);
    return kinds;
  }
  // The last event of `kind`; fails the test if there is none.
  LockEvent last(Kind kind) const {
    const auto all = get();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->kind == kind) return *it;
    }
    ADD_FAILURE() << "no " << lock_event_kind_name(kind) << " event";
    return LockEvent{};
  }
  int count(Kind kind) const {
    int n = 0;
    for (const auto& e : get()) n += e.kind == kind ? 1 : 0;
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<LockEvent> events_;
};

// Records every Metrics call as a line.
class RecordingMetrics final : public Metrics {
 public:
  void acquired(const MetricLabels& l, microseconds waited,
                std::optional<microseconds> handoff) override {
    add(name(l) + " acquired waited=" + std::to_string(waited.count()) +
        (handoff ? " handoff=" + std::to_string(handoff->count()) : ""));
  }
  void renewed(const MetricLabels& l, microseconds margin) override {
    add(name(l) + " renewed margin=" + std::to_string(margin.count()));
  }
  void released(const MetricLabels& l) override { add(name(l) + " released"); }
  void lost(const MetricLabels& l, LossCause cause) override {
    add(name(l) + " lost " + std::string(loss_cause_name(cause)));
  }
  void store_error(const MetricLabels& l, bool renewal) override {
    add(name(l) + (renewal ? " renew_failed" : " store_error"));
  }
  void waiting_changed(const MetricLabels& l, int delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_ += delta;
    lines_.push_back(name(l) + " waiting " + std::to_string(delta));
  }
  std::vector<std::string> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  int waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  static std::string name(const MetricLabels& l) {
    return std::string(l.store) + "/" + std::string(l.mutex);
  }
  void add(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::move(line));
  }
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  int waiting_ = 0;
};

// Forwards to a store, except that acquire_or_renew can be made to answer
// that somebody else owns the mutex (what a store says after it ended our
// hold without telling us).
class ForgingBackend final : public testing::ForwardingBackend {
 public:
  explicit ForgingBackend(std::shared_ptr<Backend> target)
      : ForwardingBackend(std::move(target), /*pushes=*/false) {}
  void forge_owner(std::string owner) {
    std::lock_guard<std::mutex> lock(mu_);
    forged_owner_ = std::move(owner);
  }

 protected:
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    auto reply = target_->acquire_or_renew(request, deadline);
    std::lock_guard<std::mutex> lock(mu_);
    if (reply.ok() && !forged_owner_.empty()) {
      reply->owner.owner_id = forged_owner_;
      reply->owner.fencing_token += 100;
    }
    return reply;
  }

 private:
  std::mutex mu_;
  std::string forged_owner_;
};

class ObservabilityTest : public testing::VirtualTimeTest {
 protected:
  std::unique_ptr<MutexContendServiceFactory> observed_factory(std::shared_ptr<Backend> backend) {
    return make_factory(std::move(backend), [this](FactoryOptions& o) {
      o.random = std::make_shared<testing::FixedRandom>(1);
      o.contend.operation_timeout = seconds(30);
      o.metrics = metrics_;
      o.events = events_;
    });
  }
  std::unique_ptr<MutexContendService> service(MutexContendServiceFactory& factory,
                                               const std::string& id) {
    return factory.create_contend_service(make_contender("m", nullptr, nullptr, id)).value();
  }

  std::shared_ptr<RecordingMetrics> metrics_ = std::make_shared<RecordingMetrics>();
  std::shared_ptr<RecordingListener> events_ = std::make_shared<RecordingListener>();
};

TEST_F(ObservabilityTest, AHoldIsReportedFromAcquisitionThroughRenewalToRelease) {
  auto factory = observed_factory(faults_);
  auto a = service(*factory, "A");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kAcquired) == 1; }, seconds(5)));
  const LockEvent acquired = events_->last(Kind::kAcquired);
  EXPECT_EQ(acquired.store, "memory");
  EXPECT_EQ(acquired.mutex, "m");
  EXPECT_EQ(acquired.contender_id, "A");
  EXPECT_EQ(acquired.fencing_token, a->fencing_token());
  EXPECT_GT(acquired.fencing_token, 0u);
  // The hard lease (16 s) less the 200 ms safety margin.
  EXPECT_EQ(acquired.lease_left, milliseconds(15800));
  EXPECT_EQ(acquired.waited, microseconds(0));
  EXPECT_FALSE(acquired.handoff.has_value()) << "the mutex was free at the first attempt";
  EXPECT_FALSE(acquired.cause.has_value());

  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kRenewed) == 1; }, seconds(5)));
  // Renewed at ttl: 15.8 s - 10 s of the old lease was left.
  EXPECT_EQ(events_->last(Kind::kRenewed).margin, microseconds(5'800'000));
  EXPECT_EQ(events_->last(Kind::kRenewed).fencing_token, acquired.fencing_token);

  SIMBA_ASSERT_OK(a->stop());
  EXPECT_THAT(events_->kinds(),
              ::testing::ElementsAre(Kind::kAcquired, Kind::kRenewed, Kind::kReleased));
  EXPECT_EQ(events_->last(Kind::kReleased).fencing_token, acquired.fencing_token);
  EXPECT_THAT(metrics_->get(),
              ::testing::ElementsAre("memory/m waiting 1", "memory/m acquired waited=0",
                                     "memory/m waiting -1", "memory/m renewed margin=5800000",
                                     "memory/m released"));
}

TEST_F(ObservabilityTest, AWaiterReportsHowLongItWaitedAndTheHandOffAfterAPushedRelease) {
  auto a_factory = observed_factory(faults_);
  auto b_factory = observed_factory(store_);
  auto a = service(*a_factory, "A");
  auto b = service(*b_factory, "B");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->after_owner().owner_id == "A"; }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return metrics_->waiting() == 1; }, seconds(5)));
  // A holds on for 3 s (short of its renewal), then lets go.
  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(3));
  SIMBA_ASSERT_OK(a->stop());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kAcquired) == 2; }, seconds(5)));
  const LockEvent acquired = events_->last(Kind::kAcquired);
  EXPECT_EQ(acquired.contender_id, "B");
  EXPECT_EQ(acquired.waited, microseconds(3'000'000));
  // The push woke B with no time passing at all.
  EXPECT_EQ(acquired.handoff, microseconds(0));
  // The waiting gauge drops in the strand task right after the one that
  // delivered the event: the test may look in between.
  EXPECT_TRUE(eventually([&] { return metrics_->waiting() == 0; }, seconds(5)));
  SIMBA_ASSERT_OK(b->stop());
}

TEST_F(ObservabilityTest, AHandOffAfterACrashIsMeasuredFromTheEndOfTheDeadOwnersLease) {
  auto a_factory = observed_factory(faults_);
  auto b_factory = observed_factory(store_);
  auto a = service(*a_factory, "A");
  auto b = service(*b_factory, "B");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually([&] { return b->after_owner().owner_id == "A"; }, seconds(5)));
  // A's store calls hang from now on: it can neither renew nor release.
  faults_->set_mode(Mode::kHang);
  // B polls when A's hard lease (16 s) has ended, plus the pinned 1 ms of
  // jitter; A's local deadline (15.8 s) passes first.
  ASSERT_TRUE(waiting(seconds(16) + milliseconds(1)));
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  ASSERT_TRUE(waiting(seconds(6) + milliseconds(1)));
  clock_->advance(seconds(6) + milliseconds(1));
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kAcquired) == 2; }, seconds(5)));
  const LockEvent acquired = events_->last(Kind::kAcquired);
  EXPECT_EQ(acquired.contender_id, "B");
  EXPECT_EQ(acquired.handoff, microseconds(1000));
  EXPECT_EQ(acquired.waited, microseconds(16'001'000));
  // (A's events come from its own factory's threads.)
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kLost) == 1; }, seconds(5)));
  const LockEvent lost = events_->last(Kind::kLost);
  EXPECT_EQ(lost.contender_id, "A");
  EXPECT_EQ(lost.cause, LossCause::kDeadlinePassed) << "the renewal hung: nothing failed";
  faults_->set_mode(Mode::kPass);
  SIMBA_ASSERT_OK(b->stop());
  (void)a->stop();
}

TEST_F(ObservabilityTest, RenewalsThatFailUntilTheDeadlineAreALossByRenewalFailure) {
  auto factory = observed_factory(faults_);
  auto a = service(*factory, "A");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  const auto token = a->fencing_token();
  faults_->set_acquire_mode(Mode::kFail);
  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(10));  // the renewal fails
  ASSERT_TRUE(eventually([&] { return faults_->acquire_calls() == 2; }, seconds(5)));
  // Retries fail too, up to the deadline at 15.8 s.
  for (int i = 0; i < 40 && a->is_owner(); ++i) {
    clock_->advance(milliseconds(250));
    settle();
  }
  ASSERT_FALSE(a->is_owner());
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kLost) == 1; }, seconds(5)));
  const LockEvent lost = events_->last(Kind::kLost);
  EXPECT_EQ(lost.cause, LossCause::kRenewalFailed);
  EXPECT_EQ(lost.fencing_token, token);
  EXPECT_FALSE(lost.error.ok());
  const LockEvent error = events_->last(Kind::kStoreError);
  EXPECT_EQ(error.error.code(), StatusCode::kUnavailable);
  const auto lines = metrics_->get();
  EXPECT_THAT(lines, ::testing::Contains("memory/m renew_failed"));
  EXPECT_THAT(lines, ::testing::Contains("memory/m lost renewal_failed"));
  // After the loss the service counts as waiting again.
  EXPECT_TRUE(eventually([&] { return metrics_->waiting() == 1; }, seconds(5)));
  faults_->set_acquire_mode(Mode::kPass);
  SIMBA_ASSERT_OK(a->stop());
  EXPECT_EQ(metrics_->waiting(), 0);
}

TEST_F(ObservabilityTest, APushedLossIsForcedOnlyWhenTheStoreSaysSo) {
  auto factory = observed_factory(faults_);
  auto a = service(*factory, "A");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  MutexEvent lost{MutexEvent::Kind::kLost, "m", "A", a->fencing_token()};
  faults_->push(lost);
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kLost) == 1; }, seconds(5)));
  EXPECT_EQ(events_->last(Kind::kLost).cause, LossCause::kOtherOwner);
  // The store still had A: the service takes it again (a new acquisition).
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kAcquired) == 2; }, seconds(5)));
  lost.fencing_token = a->fencing_token();
  lost.forced = true;
  faults_->push(lost);
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kLost) == 2; }, seconds(5)));
  EXPECT_EQ(events_->last(Kind::kLost).cause, LossCause::kForcedRelease);
  SIMBA_ASSERT_OK(a->stop());
}

TEST_F(ObservabilityTest, ARenewalAnsweredWithAnotherOwnerIsALossToThatOwner) {
  auto forging = std::make_shared<ForgingBackend>(store_);
  auto factory = observed_factory(forging);
  auto a = service(*factory, "A");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  forging->forge_owner("Z");
  ASSERT_TRUE(waiting(seconds(10)));
  clock_->advance(seconds(10));
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kLost) == 1; }, seconds(5)));
  const LockEvent lost = events_->last(Kind::kLost);
  EXPECT_EQ(lost.cause, LossCause::kOtherOwner);
  EXPECT_THAT(lost.error.message(), ::testing::HasSubstr("Z"));
  SIMBA_ASSERT_OK(a->stop());
  EXPECT_EQ(events_->count(Kind::kReleased), 0) << "nothing was held at stop()";
}

TEST_F(ObservabilityTest, PrometheusMetricsSeeTheOwnerAndTheWaiter) {
  auto prometheus = std::make_shared<PrometheusMetrics>();
  auto options = [&](FactoryOptions& o) {
    o.metrics = prometheus;
    o.random = std::make_shared<testing::FixedRandom>(1);
  };
  auto a_factory = make_factory(faults_, options);
  auto b_factory = make_factory(store_, options);
  auto a = service(*a_factory, "A");
  auto b = service(*b_factory, "B");
  SIMBA_ASSERT_OK(a->start());
  ASSERT_TRUE(eventually([&] { return a->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->start());
  ASSERT_TRUE(eventually(
      [&] {
        // B counts as waiting from start(), before its first read; the
        // hand-off below is timed only if that read has seen A own it.
        if (!b->after_owner().is_owner("A")) return false;
        // (Reports arrive on the factories' callback threads, in no set
        // order between the two services.)
        const std::string text = prometheus->expose();
        return text.find("simba_contenders_waiting{store=\"memory\",mutex=\"m\"} 1") !=
                   std::string::npos &&
               text.find("simba_acquisitions_total{store=\"memory\",mutex=\"m\"} 1") !=
                   std::string::npos;
      },
      seconds(5)));
  const std::string text = prometheus->expose();
  EXPECT_THAT(text, ::testing::HasSubstr("simba_owners{store=\"memory\",mutex=\"m\"} 1"));
  EXPECT_THAT(text,
              ::testing::HasSubstr("simba_acquisitions_total{store=\"memory\",mutex=\"m\"} 1"));
  SIMBA_ASSERT_OK(a->stop());
  ASSERT_TRUE(eventually([&] { return b->is_owner(); }, seconds(5)));
  SIMBA_ASSERT_OK(b->stop());
  // stop() has waited for B's reports; A's came before B could acquire.
  const std::string after = prometheus->expose();
  EXPECT_THAT(after,
              ::testing::HasSubstr("simba_acquisitions_total{store=\"memory\",mutex=\"m\"} 2"));
  EXPECT_THAT(after, ::testing::HasSubstr("simba_releases_total{store=\"memory\",mutex=\"m\"} 2"));
  EXPECT_THAT(after,
              ::testing::HasSubstr("simba_contenders_waiting{store=\"memory\",mutex=\"m\"} 0"));
  EXPECT_THAT(after, ::testing::HasSubstr(
                         "simba_handoff_latency_seconds_count{store=\"memory\",mutex=\"m\"} 1"));
}

TEST_F(ObservabilityTest, KeyedHoldsOnALeaseStoreReportUnderTheirKey) {
  ContendOptions lease;
  lease.ttl = seconds(5);
  lease.transition = seconds(2);
  auto backend = new_lease_keyed_lock_backend(store_, lease, metrics_, events_).value();
  auto provider = KeyedLockProvider::create(backend).value();
  {
    auto held = provider->acquire("wallet:7", seconds(60)).value();
    ASSERT_TRUE(held.is_held());
    ASSERT_TRUE(eventually([&] { return events_->count(Kind::kAcquired) == 1; }, seconds(5)));
    const LockEvent acquired = events_->last(Kind::kAcquired);
    EXPECT_EQ(acquired.mutex, "wallet:7");
    EXPECT_EQ(acquired.fencing_token, held.fencing_token());
  }
  ASSERT_TRUE(eventually([&] { return events_->count(Kind::kReleased) == 1; }, seconds(5)));
  EXPECT_THAT(metrics_->get(), ::testing::Contains("memory/wallet:7 released"));
}

}  // namespace
}  // namespace simba
