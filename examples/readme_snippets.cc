// The README's code samples, compiled so they cannot drift from the API.
// Each function holds one sample as it appears in README.md; the stubs below
// stand in for the application code the samples call.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <stop_token>

#include "simba/contend_service.h"
#include "simba/events.h"
#include "simba/locker.h"
#include "simba/metrics.h"
#include "simba/scheduler.h"

namespace {

void start_leading(std::uint64_t) {}
void stop_leading() {}
void run_report(std::uint64_t, std::stop_token) {}
void compact(std::uint64_t, std::stop_token) {}

int leader_election() {
  auto factory = simba::MutexContendServiceFactory::open("sqlite:///tmp/simba-readme.db");
  if (!factory.ok()) {
    std::cerr << factory.status() << "\n";
    return 1;
  }

  auto contender = simba::make_contender(
      "report-leader",
      [](const simba::MutexState& s) { start_leading(s.after.fencing_token); },  // on_acquired
      [](const simba::MutexState&) { stop_leading(); });                         // on_released
  auto service = (*factory)->create_contend_service(contender).value();
  (void)service->start();
  if (service->is_owner()) { /* ... */
  }
  (void)service->stop();
  return 0;
}

using FactoryResult = simba::Result<std::unique_ptr<simba::MutexContendServiceFactory>>;

simba::Status locking(FactoryResult& factory) {
  auto locker = simba::Locker::create(**factory, "nightly-report").value();
  if (simba::Status s = locker->acquire(std::chrono::seconds(30)); !s.ok()) {
    return s;
  }
  run_report(locker->fencing_token(), locker->lost_token());
  return simba::ok_status();
}

void scheduling(FactoryResult& factory) {
  auto scheduler =
      simba::Scheduler::create(
          **factory, "compaction",
          simba::ScheduleConfig::fixed_delay(std::chrono::seconds(0), std::chrono::minutes(5)),
          [](const simba::WorkContext& ctx) { compact(ctx.fencing_token, ctx.stop_token); })
          .value();
  (void)scheduler->start();
}

// README: "Metrics and events".
class LogEvents : public simba::LockEventListener {
 public:
  void on_event(const simba::LockEvent& event) override {
    std::clog << simba::lock_event_json(event) << "\n";  // or through your own logger
  }
};

std::string observability() {
  auto metrics = std::make_shared<simba::PrometheusMetrics>();
  simba::FactoryOptions options;
  options.metrics = metrics;                       // counts, gauges, histograms
  options.events = std::make_shared<LogEvents>();  // acquired, renewed, lost, released, store error
  auto factory = simba::MutexContendServiceFactory::open("sqlite:///tmp/simba-readme.db", options);
  if (!factory.ok()) return "";
  auto locker = simba::Locker::create(**factory, "nightly-report").value();
  if (locker->acquire(std::chrono::seconds(30)).ok()) (void)locker->release();
  return metrics->expose();  // serve this at GET /metrics
}

}  // namespace

int main() {
  if (leader_election() != 0) return 1;
  auto factory = simba::MutexContendServiceFactory::open("memory://readme");
  if (!factory.ok() || !locking(factory).ok()) return 1;
  scheduling(factory);
  if (observability().find("simba_acquisitions_total") == std::string::npos) return 1;
  std::cout << "README samples ran\n";
  return 0;
}
