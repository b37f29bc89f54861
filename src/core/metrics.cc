// PrometheusMetrics (simba/metrics.h).
#include "simba/metrics.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "core/json.h"

namespace simba {
namespace {

using std::chrono::microseconds;

constexpr std::string_view kOtherMutex = "_other";
constexpr std::size_t kCauses = 4;

// Bucket bounds sorted, without duplicates, NaN or infinities (+Inf is
// always added on output), whatever order the options gave them in.
std::vector<double> normalized_bounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(), [](double b) { return !std::isfinite(b); }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

PrometheusMetricsOptions normalized(PrometheusMetricsOptions options) {
  options.latency_buckets = normalized_bounds(std::move(options.latency_buckets));
  options.margin_buckets = normalized_bounds(std::move(options.margin_buckets));
  return options;
}

// Counts per bucket (not yet cumulative; the last one is +Inf), and the sum
// kept in whole microseconds so it stays exact however many are added.
struct Histogram {
  explicit Histogram(std::size_t bounds) : buckets(bounds + 1, 0) {}

  void observe(const std::vector<double>& bounds, microseconds value) {
    const double seconds = static_cast<double>(value.count()) / 1e6;
    const auto it = std::lower_bound(bounds.begin(), bounds.end(), seconds);
    ++buckets[static_cast<std::size_t>(it - bounds.begin())];
    sum_us += value.count();
    ++count;
  }

  std::vector<std::uint64_t> buckets;
  std::int64_t sum_us = 0;
  std::uint64_t count = 0;
};

// Sorted by name, so the samples of simba_losses_total come out sorted.
constexpr std::array<LossCause, kCauses> kCausesByName = {
    LossCause::kDeadlinePassed, LossCause::kForcedRelease, LossCause::kOtherOwner,
    LossCause::kRenewalFailed};

std::size_t cause_index(LossCause cause) {
  switch (cause) {
    case LossCause::kRenewalFailed:
      return 0;
    case LossCause::kDeadlinePassed:
      return 1;
    case LossCause::kOtherOwner:
      return 2;
    case LossCause::kForcedRelease:
      return 3;
  }
  return 0;
}

// A label value escaped per the exposition format: backslash, double quote
// and line feed.
void append_label_value(std::string& out, std::string_view value) {
  internal::append_quoted(out, value, internal::kLabelQuoting);
}

// The shortest text that parses back to `value`, in plain decimals where
// that stays short ("0.0005", "1", "2.5"; the shortest form would give
// "5e-04"), else with an exponent.
std::string format_double(double value) {
  char buf[128];
  const double magnitude = std::fabs(value);
  const bool plain = magnitude == 0 || (magnitude >= 1e-9 && magnitude < 1e21);
  const auto result = plain ? std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed)
                            : std::to_chars(buf, buf + sizeof buf, value);
  if (result.ec != std::errc()) return "NaN";
  return std::string(buf, result.ptr);
}

// Microseconds as decimal seconds: 1234567 -> "1.234567", 2500000 -> "2.5".
std::string seconds_from_micros(std::int64_t us) { return internal::fixed_point(us, 6); }

void append_family_header(std::string& out, std::string_view name, std::string_view type,
                          std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

// name{store="...",mutex="..."[,extra]} value
void append_sample(std::string& out, std::string_view name, std::string_view store,
                   std::string_view mutex, std::string_view extra_label,
                   std::string_view extra_value, std::string_view value) {
  out += name;
  out += "{store=";
  append_label_value(out, store);
  out += ",mutex=";
  append_label_value(out, mutex);
  if (!extra_label.empty()) {
    out += ',';
    out += extra_label;
    out += '=';
    append_label_value(out, extra_value);
  }
  out += "} ";
  out += value;
  out += '\n';
}

}  // namespace

// Everything counted for one (store, mutex label). A sample is exposed once
// something was counted into it: counters and histograms when non-zero, the
// gauges once touched (so a gauge back at 0 still shows 0).
struct PrometheusMetrics::Series {
  Series(std::size_t latency_bounds, std::size_t margin_bounds)
      : acquire_latency(latency_bounds),
        handoff_latency(latency_bounds),
        lease_margin(margin_bounds) {}

  std::uint64_t acquisitions = 0;
  std::uint64_t releases = 0;
  std::array<std::uint64_t, kCauses> losses{};  // by CauseIndex
  std::uint64_t renewals = 0;
  std::uint64_t renew_failures = 0;
  std::uint64_t store_errors = 0;
  // Raw sums of the deltas: reports from several threads may arrive out of
  // order and dip below 0 for a moment, so only the output is clamped.
  std::int64_t waiting = 0;
  bool waiting_touched = false;
  std::int64_t retrying = 0;
  bool retrying_touched = false;
  std::int64_t owners = 0;
  bool owners_touched = false;
  Histogram acquire_latency;
  Histogram handoff_latency;
  Histogram lease_margin;
};

PrometheusMetrics::PrometheusMetrics(PrometheusMetricsOptions options)
    : options_(normalized(std::move(options))) {}

PrometheusMetrics::~PrometheusMetrics() = default;

PrometheusMetrics::Series& PrometheusMetrics::series_locked(const MetricLabels& labels) {
  auto& labelled = labelled_[std::string(labels.store)];
  std::string_view mutex_label = labels.mutex;
  if (labelled.find(labels.mutex) == labelled.end()) {
    if (labelled.size() < options_.max_mutex_labels) {
      labelled.emplace(labels.mutex);
    } else {
      folded_[std::string(labels.store)].emplace(labels.mutex);
      mutex_label = kOtherMutex;
    }
  }
  auto& slot = series_[{std::string(labels.store), std::string(mutex_label)}];
  if (!slot) {
    slot =
        std::make_unique<Series>(options_.latency_buckets.size(), options_.margin_buckets.size());
  }
  return *slot;
}

std::string PrometheusMetrics::mutex_label(std::string_view store, std::string_view mutex) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = labelled_.find(store);
  const std::size_t used = it == labelled_.end() ? 0 : it->second.size();
  if (it != labelled_.end() && it->second.find(mutex) != it->second.end()) {
    return std::string(mutex);
  }
  return used < options_.max_mutex_labels ? std::string(mutex) : std::string(kOtherMutex);
}

void PrometheusMetrics::acquired(const MetricLabels& labels, microseconds waited,
                                 std::optional<microseconds> handoff) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  ++s.acquisitions;
  ++s.owners;
  s.owners_touched = true;
  s.acquire_latency.observe(options_.latency_buckets, waited);
  if (handoff) s.handoff_latency.observe(options_.latency_buckets, *handoff);
}

void PrometheusMetrics::renewed(const MetricLabels& labels, microseconds margin) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  ++s.renewals;
  s.lease_margin.observe(options_.margin_buckets, margin);
}

void PrometheusMetrics::released(const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  ++s.releases;
  --s.owners;
  s.owners_touched = true;
}

void PrometheusMetrics::lost(const MetricLabels& labels, LossCause cause) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  ++s.losses[cause_index(cause)];
  --s.owners;
  s.owners_touched = true;
}

void PrometheusMetrics::store_error(const MetricLabels& labels, bool renewal) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  ++s.store_errors;
  if (renewal) ++s.renew_failures;
}

void PrometheusMetrics::waiting_changed(const MetricLabels& labels, int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  s.waiting += delta;
  s.waiting_touched = true;
}

void PrometheusMetrics::retrying_changed(const MetricLabels& labels, int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_locked(labels);
  s.retrying += delta;
  s.retrying_touched = true;
}

std::string PrometheusMetrics::expose() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;

  // One family: its header, then a sample per series that has one, in
  // series_ order (sorted by store, then mutex label). `sample` appends the
  // series' samples and returns whether it had any; the header goes in
  // front of the first.
  const auto family = [&](std::string_view name, std::string_view type, std::string_view help,
                          const auto& sample) {
    std::string samples;
    for (const auto& [key, series] : series_) sample(samples, key.first, key.second, *series);
    if (samples.empty()) return;
    append_family_header(out, name, type, help);
    out += samples;
  };
  // Counters are exposed from the moment their series exists, zeros too:
  // a series that first appears at 1 hides that step from increase() and
  // rate(), so an alert on the first loss would never fire.
  const auto counter = [&](std::string_view name, std::string_view help,
                           std::uint64_t Series::*field) {
    family(
        name, "counter", help,
        [&](std::string& o, const std::string& store, const std::string& mutex, const Series& s) {
          append_sample(o, name, store, mutex, {}, {}, std::to_string(s.*field));
        });
  };
  const auto gauge = [&](std::string_view name, std::string_view help, std::int64_t Series::*field,
                         bool Series::*touched) {
    family(
        name, "gauge", help,
        [&](std::string& o, const std::string& store, const std::string& mutex, const Series& s) {
          if (s.*touched) {
            append_sample(o, name, store, mutex, {}, {},
                          std::to_string(std::max<std::int64_t>(s.*field, 0)));
          }
        });
  };
  const auto histogram = [&](std::string_view name, std::string_view help, Histogram Series::*field,
                             const std::vector<double>& bounds) {
    const std::string bucket = std::string(name) + "_bucket";
    const std::string sum = std::string(name) + "_sum";
    const std::string count = std::string(name) + "_count";
    family(
        name, "histogram", help,
        [&](std::string& o, const std::string& store, const std::string& mutex, const Series& s) {
          const Histogram& h = s.*field;
          if (h.count == 0) return;
          std::uint64_t cumulative = 0;
          for (std::size_t i = 0; i < bounds.size(); ++i) {
            cumulative += h.buckets[i];
            append_sample(o, bucket, store, mutex, "le", format_double(bounds[i]),
                          std::to_string(cumulative));
          }
          append_sample(o, bucket, store, mutex, "le", "+Inf", std::to_string(h.count));
          append_sample(o, sum, store, mutex, {}, {}, seconds_from_micros(h.sum_us));
          append_sample(o, count, store, mutex, {}, {}, std::to_string(h.count));
        });
  };

  counter("simba_acquisitions_total", "Holds of a mutex begun.", &Series::acquisitions);
  counter("simba_releases_total", "Holds of a mutex given up.", &Series::releases);
  family("simba_losses_total", "counter", "Holds of a mutex lost, by cause.",
         [](std::string& o, const std::string& store, const std::string& mutex, const Series& s) {
           // Every cause, zeros too (see `counter`).
           for (const LossCause cause : kCausesByName) {
             append_sample(o, "simba_losses_total", store, mutex, "cause", loss_cause_name(cause),
                           std::to_string(s.losses[cause_index(cause)]));
           }
         });
  counter("simba_renewals_total", "Successful lease renewals.", &Series::renewals);
  counter("simba_renew_failures_total", "Lease renewals that failed.", &Series::renew_failures);
  counter("simba_store_errors_total", "Failed store calls, renewals included.",
          &Series::store_errors);
  gauge("simba_contenders_waiting", "Running contenders of this process not owning the mutex.",
        &Series::waiting, &Series::waiting_touched);
  gauge("simba_owners", "Contenders of this process owning the mutex.", &Series::owners,
        &Series::owners_touched);
  gauge("simba_contenders_retrying",
        "Running contenders of this process whose last store call failed (the store "
        "unreachable, retrying).",
        &Series::retrying, &Series::retrying_touched);
  histogram("simba_acquire_latency_seconds", "Time from starting (or losing) to owning the mutex.",
            &Series::acquire_latency, options_.latency_buckets);
  histogram("simba_handoff_latency_seconds", "Time from the mutex becoming free to owning it.",
            &Series::handoff_latency, options_.latency_buckets);
  histogram("simba_lease_margin_seconds", "Lease time left when a renewal came back.",
            &Series::lease_margin, options_.margin_buckets);

  // Per store seen (every report records its store in labelled_, even with
  // max_mutex_labels 0), how many mutexes share mutex="_other".
  if (!labelled_.empty()) {
    append_family_header(
        out, "simba_mutex_labels_folded", "gauge",
        "Distinct mutexes counted under mutex=\"_other\" (over max_mutex_labels).");
    for (const auto& [store, names] : labelled_) {
      const auto it = folded_.find(store);
      const std::size_t folded = it == folded_.end() ? 0 : it->second.size();
      out += "simba_mutex_labels_folded{store=";
      append_label_value(out, store);
      out += "} ";
      out += std::to_string(folded);
      out += '\n';
    }
  }
  return out;
}

}  // namespace simba
