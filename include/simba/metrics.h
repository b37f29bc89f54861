// File: simba/metrics.h
//
// Metrics the library reports to, and a ready Prometheus exposition.
//
//   Metrics            the interface: one call per countable happening. Every
//                      method does nothing by default, so an implementation
//                      overrides only what it wants. No global registry:
//                      pass one to FactoryOptions::metrics (several
//                      factories may share one).
//   PrometheusMetrics  counts, gauges and histograms kept in memory, rendered
//                      in Prometheus' text format (version 0.0.4) by
//                      expose(); serve that at /metrics.
//
// Labels are the store (the backend's scheme) and the mutex. So that 10,000
// mutexes cannot make 10,000 series of each metric, PrometheusMetrics gives
// its own `mutex` label to the first `max_mutex_labels` mutexes it sees and
// folds the rest into mutex="_other" (simba_mutex_labels_folded counts them).
//
// Calls come from the factory's callback threads, never under an internal
// lock, possibly several at once: an implementation must be thread-safe and
// quick, and must not call back into the service.
//
// Example:
//   auto metrics = std::make_shared<simba::PrometheusMetrics>();
//   simba::FactoryOptions options;
//   options.metrics = metrics;
//   auto factory = simba::MutexContendServiceFactory::open(uri, options);
//   ...
//   http_reply(metrics->expose());   // on GET /metrics
//
// Exposed (all with labels store and mutex; losses also with cause):
//   simba_acquisitions_total         counter   holds begun
//   simba_releases_total             counter   holds given up
//   simba_losses_total               counter   holds lost, by cause
//   simba_renewals_total             counter   successful renewals
//   simba_renew_failures_total       counter   renewals that failed
//   simba_store_errors_total         counter   failed store calls (renewals
//                                              included)
//   simba_contenders_waiting         gauge     running contenders not owning
//   simba_owners                     gauge     contenders owning (0 or 1 per
//                                              mutex in one process)
//   simba_contenders_retrying        gauge     running contenders whose last
//                                              store call failed: the store
//                                              unreachable, retrying
//   simba_acquire_latency_seconds    histogram LockEvent::waited
//   simba_handoff_latency_seconds    histogram LockEvent::handoff
//   simba_lease_margin_seconds       histogram LockEvent::margin
// A mutex's series appear with the first report about it (a contender
// starting to wait is one): every counter from then on, at 0 until it
// counts (every cause of simba_losses_total too), so increase() sees the
// first loss; the gauges once touched, the histograms once observed.
//
// Thread safety: PrometheusMetrics is safe to use from any thread.

#ifndef SIMBA_METRICS_H_
#define SIMBA_METRICS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "simba/events.h"

namespace simba {

// Which series a report belongs to.
struct MetricLabels {
  std::string_view store;  // the backend's scheme
  std::string_view mutex;
};

class Metrics {
 public:
  virtual ~Metrics() = default;

  // A hold began, after `waited` (LockEvent::waited); `handoff` is
  // LockEvent::handoff when known.
  virtual void acquired(const MetricLabels& /*labels*/, std::chrono::microseconds /*waited*/,
                        std::optional<std::chrono::microseconds> /*handoff*/) {}
  // The owner renewed with `margin` of its previous lease left.
  virtual void renewed(const MetricLabels& /*labels*/, std::chrono::microseconds /*margin*/) {}
  // The owner gave the hold up.
  virtual void released(const MetricLabels& /*labels*/) {}
  // The owner lost the hold.
  virtual void lost(const MetricLabels& /*labels*/, LossCause /*cause*/) {}
  // A store call failed; `renewal` when it was an owner's renewal.
  virtual void store_error(const MetricLabels& /*labels*/, bool /*renewal*/) {}
  // The number of contenders of this process waiting for the mutex changed
  // by `delta` (+1 when one starts waiting, -1 when it owns or stops).
  virtual void waiting_changed(const MetricLabels& /*labels*/, int /*delta*/) {}
  // The number of contenders of this process whose last store call failed
  // (retrying it) changed by `delta`: +1 at a failure after a success or
  // start(), -1 at the next success or stop().
  virtual void retrying_changed(const MetricLabels& /*labels*/, int /*delta*/) {}
};

struct PrometheusMetricsOptions {
  // Mutexes that get their own label; later ones share mutex="_other".
  std::size_t max_mutex_labels = 100;
  // Upper bounds (seconds) of the latency histograms' buckets.
  std::vector<double> latency_buckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                      0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
  // Upper bounds (seconds) of the lease-margin histogram's buckets.
  std::vector<double> margin_buckets{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
};

class PrometheusMetrics final : public Metrics {
 public:
  explicit PrometheusMetrics(PrometheusMetricsOptions options = {});
  ~PrometheusMetrics() override;

  void acquired(const MetricLabels& labels, std::chrono::microseconds waited,
                std::optional<std::chrono::microseconds> handoff) override;
  void renewed(const MetricLabels& labels, std::chrono::microseconds margin) override;
  void released(const MetricLabels& labels) override;
  void lost(const MetricLabels& labels, LossCause cause) override;
  void store_error(const MetricLabels& labels, bool renewal) override;
  void waiting_changed(const MetricLabels& labels, int delta) override;
  void retrying_changed(const MetricLabels& labels, int delta) override;

  // Everything counted so far in Prometheus' text exposition format
  // (Content-Type: text/plain; version=0.0.4).
  std::string expose() const;

  // The mutex label a report about `mutex` of `store` is counted under.
  std::string mutex_label(std::string_view store, std::string_view mutex) const;

 private:
  struct Series;
  Series& series_locked(const MetricLabels& labels);

  const PrometheusMetricsOptions options_;
  mutable std::mutex mu_;
  // (store, mutex label) -> series; a std::map so expose() is sorted.
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Series>> series_;
  // Per store: the mutexes with their own label, and those folded into
  // "_other" (names only: they make no series).
  std::map<std::string, std::set<std::string, std::less<>>, std::less<>> labelled_;
  std::map<std::string, std::set<std::string, std::less<>>, std::less<>> folded_;
};

}  // namespace simba

#endif  // SIMBA_METRICS_H_
