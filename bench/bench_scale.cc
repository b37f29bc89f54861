#include "bench_scale.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "simba/backend.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/keyed_backend.h"
#include "simba/keyed_lock.h"
#include "simba/registry.h"
#include "simba/uri.h"

namespace simba::bench {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Counts the store calls made through it and, for each mutex, how late each
// renewal started: its start minus (the previous call's start + ttl), since
// the core renews when the soft lease that call set ends. Everything else is
// passed through unchanged.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string_view scheme() const override { return inner_->scheme(); }
  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  Status validate_store_mutex(std::string_view mutex) const override {
    return inner_->validate_mutex(mutex);
  }
  Status validate_store_contender_id(std::string_view id) const override {
    return inner_->validate_contender_id(id);
  }

  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override {
    ++calls_;
    const auto start = BenchClock::now();
    Result<OwnerRecord> result = inner_->acquire_or_renew(request, deadline);
    const bool owner = result.ok() && result->owner.is_owner(request.contender_id);
    std::lock_guard<std::mutex> lock(mu_);
    note_locked(request, start, owner);
    return result;
  }
  // One store call for the batch; each renewal's lag as for one alone.
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override {
    ++calls_;
    const auto start = BenchClock::now();
    Result<std::vector<OwnerRecord>> result = inner_->renew(requests, deadline);
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const bool owner = result.ok() && (*result)[i].owner.is_owner(requests[i].contender_id);
      note_locked(requests[i], start, owner);
    }
    return result;
  }
  Result<bool> do_release(std::string_view mutex, std::string_view id, std::uint64_t token,
                          Deadline deadline) override {
    ++calls_;
    return inner_->release(mutex, id, token, deadline);
  }
  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override {
    ++calls_;
    return inner_->force_release(mutex, deadline);
  }
  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override {
    ++calls_;
    return inner_->read(mutex, deadline);
  }
  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override {
    ++calls_;
    return inner_->list(deadline);
  }
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view id,
      std::function<void(const MutexEvent&)> listener) override {
    return inner_->subscribe(mutex, id, std::move(listener));
  }

  // Starts the measured window: calls and renewal lags count from now.
  void start_window() {
    std::lock_guard<std::mutex> lock(mu_);
    measuring_ = true;
    lags_.clear();
    renewals_ = 0;
    calls_ = 0;
  }
  long long calls() const { return calls_.load(); }
  std::vector<double> take_lags(long long* renewals) {
    std::lock_guard<std::mutex> lock(mu_);
    measuring_ = false;
    *renewals = renewals_;
    return std::move(lags_);
  }

 private:
  // A call that started at `start` for `request` ended with us the owner
  // or not. REQUIRES: mu_.
  void note_locked(const AcquireRequest& request, BenchClock::time_point start, bool owner) {
    auto& last = last_start_[std::string(request.mutex)];
    if (owner && last.has_value() && measuring_) {
      lags_.push_back(micros(start - (*last + request.ttl)));
      ++renewals_;
    }
    if (owner) {
      last = start;
    } else {
      last.reset();
    }
  }

  std::shared_ptr<Backend> inner_;
  std::atomic<long long> calls_{0};
  std::mutex mu_;
  std::unordered_map<std::string, std::optional<BenchClock::time_point>> last_start_;
  bool measuring_ = false;
  std::vector<double> lags_;
  long long renewals_ = 0;
};

// What one scale case reports besides its lags.
struct Footprint {
  int threads = 0;  // added by the factory or provider
  // Of those, Simba's own (the rest is a client library's pool: gRPC's,
  // ZooKeeper's).
  int simba_threads = 0;
  int sockets = 0;  // added likewise
  double rss_mib = 0;
};

bool wait_until(const std::function<bool()>& done, seconds timeout) {
  const auto deadline = BenchClock::now() + timeout;
  while (!done()) {
    if (BenchClock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

Row scale_row(const std::string& name, const std::string& count_key, int count,
              const Footprint& footprint, double store_ops_per_second, std::vector<double> lags,
              long long renewals, long long lost) {
  const double lag_p99_ms = percentile(lags, 0.99) / 1000.0;
  Row row{"scale", name, std::move(lags), 0, 0, {}};
  row.fields = {Field::integer(count_key, count),
                Field::integer("threads", footprint.threads),
                Field::integer("simba_threads", footprint.simba_threads),
                Field::integer("sockets", footprint.sockets),
                Field::number("rss_mib", footprint.rss_mib),
                Field::number("store_ops_per_s", store_ops_per_second),
                Field::number("renewal_lag_p99_ms", lag_p99_ms),
                Field::integer("renewals", renewals),
                Field::integer("lost", lost)};
  return row;
}

}  // namespace

void scale_mutexes(const Options& options, Report& report) {
  const int threads_before = count_threads();
  const int simba_threads_before = count_simba_threads();
  const int sockets_before = count_sockets();
  auto opened = open_backend(options.store);
  if (!opened.ok()) fail(opened.status().to_string());
  auto counting = std::make_shared<CountingBackend>(std::move(*opened));
  FactoryOptions factory_options;
  factory_options.contend.ttl = options.scale_ttl;
  factory_options.contend.transition = options.scale_transition;
  auto factory = MutexContendServiceFactory::create(counting, factory_options);
  if (!factory.ok()) fail(factory.status().to_string());

  // Mutexes owned right now: a lease lost while the others are still being
  // acquired is taken again later, so counting acquisitions would overshoot.
  std::atomic<int> acquired{0};
  std::atomic<long long> lost{0};
  std::vector<std::unique_ptr<MutexContendService>> services;
  services.reserve(static_cast<std::size_t>(options.scale));
  for (int i = 0; i < options.scale; ++i) {
    auto contender = make_contender(
        "bench-scale-" + std::to_string(i), [&](const MutexState&) { ++acquired; },
        [&](const MutexState&) {
          --acquired;
          ++lost;
        });
    auto service = (*factory)->create_contend_service(contender);
    if (!service.ok()) fail(service.status().to_string());
    if (!(*service)->start().ok()) fail("scale: start failed");
    services.push_back(std::move(*service));
  }
  const auto asked = BenchClock::now();
  if (!wait_until([&] { return acquired.load() == options.scale; }, seconds(300))) {
    fail("scale: " + std::to_string(acquired.load()) + " of " + std::to_string(options.scale) +
         " mutexes acquired within 300 s");
  }
  const double acquire_all_s = std::chrono::duration<double>(BenchClock::now() - asked).count();
  const long long lost_while_acquiring = lost.exchange(0);
  counting->start_window();
  const auto window_start = BenchClock::now();
  std::this_thread::sleep_for(seconds(options.scale_seconds));
  const double window_s = std::chrono::duration<double>(BenchClock::now() - window_start).count();
  const double ops = static_cast<double>(counting->calls()) / window_s;
  long long renewals = 0;
  std::vector<double> lags = counting->take_lags(&renewals);
  Footprint footprint{count_threads() - threads_before,
                      count_simba_threads() - simba_threads_before,
                      count_sockets() - sockets_before, resident_mi_b()};
  const long long lost_in_window = lost.load();
  for (auto& service : services) (void)service->stop();
  Row row = scale_row(std::to_string(options.scale) + " mutexes held by one factory", "mutexes",
                      options.scale, footprint, ops, std::move(lags), renewals, lost_in_window);
  row.fields.push_back(Field::number("acquire_all_s", acquire_all_s));
  row.fields.push_back(Field::integer("lost_while_acquiring", lost_while_acquiring));
  row.fields.push_back(Field::integer("ttl_ms", options.scale_ttl.count()));
  report.add(row);
}

void scale_keys(const Options& options, Report& report) {
  const int threads_before = count_threads();
  const int simba_threads_before = count_simba_threads();
  const int sockets_before = count_sockets();
  KeyedLockOptions keyed_options;
  keyed_options.lease.ttl = options.scale_ttl;
  keyed_options.lease.transition = options.scale_transition;
  // The lease stores' keys are mutexes of the contention backend: count their
  // calls. PostgreSQL and MySQL hold keys in sessions, with no renewals.
  auto uri = Uri::parse(options.store);
  if (!uri.ok()) fail(uri.status().to_string());
  const bool session_store = uri->scheme == "postgresql" || uri->scheme == "postgres" ||
                             uri->scheme == "mysql" || uri->scheme == "mariadb";
  if (session_store) {
    // Each held key pins one of the provider's lock_connections (default 8),
    // so thousands of keys cannot be held at once: docs/benchmarks.md says
    // why and what would change it.
    std::fprintf(stderr,
                 "simba-bench: scale: skipping %d keys on %s: each held key pins a session\n",
                 options.scale, uri->scheme.c_str());
    return;
  }
  const bool lease_store = uri->scheme != "memory";
  std::shared_ptr<CountingBackend> counting;
  auto provider = [&]() -> Result<std::unique_ptr<KeyedLockProvider>> {
    if (!lease_store) return KeyedLockProvider::open(options.store, keyed_options);
    SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<Backend> opened, open_backend(options.store));
    counting = std::make_shared<CountingBackend>(std::move(opened));
    SIMBA_ASSIGN_OR_RETURN(std::shared_ptr<KeyedLockBackend> keyed,
                           new_lease_keyed_lock_backend(counting, keyed_options.lease));
    return KeyedLockProvider::create(std::move(keyed), keyed_options);
  }();
  if (!provider.ok()) fail(provider.status().to_string());

  // Taken by several threads at once (a lease store spends a few round trips
  // per key); each thread keeps and releases its own leases.
  constexpr int kTakers = 16;
  std::mutex mu;
  std::condition_variable cv;
  bool count_now = false;
  int counted = 0;
  bool release_now = false;
  std::atomic<int> held{0};
  std::atomic<int> errors{0};
  std::atomic<int> lost{0};
  std::vector<std::thread> takers;
  const auto asked = BenchClock::now();
  for (int t = 0; t < kTakers; ++t) {
    takers.emplace_back([&, t] {
      std::vector<Lease> leases;
      for (int i = t; i < options.scale && errors.load() == 0; i += kTakers) {
        auto lease = (*provider)->try_acquire("bench-scale-key-" + std::to_string(i), seconds(60),
                                              std::chrono::hours(1));
        if (!lease.ok() || !lease->has_value()) {
          ++errors;
          continue;
        }
        leases.push_back(std::move(**lease));
        ++held;
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return count_now; });
      lock.unlock();
      // Counted at the end of the window, before anyone releases: 10,000
      // releases from 16 threads at once compete with the renewals for the
      // store (they are the callers' own calls, not the I/O pool's), so a
      // lease lost while releasing says something about that, not about
      // holding.
      for (auto& lease : leases) {
        if (!lease.is_held()) ++lost;
      }
      lock.lock();
      ++counted;
      cv.notify_all();
      cv.wait(lock, [&] { return release_now; });
      lock.unlock();
      for (auto& lease : leases) (void)lease.release();
    });
  }
  const bool all =
      wait_until([&] { return held.load() == options.scale || errors.load() > 0; }, seconds(600)) &&
      errors.load() == 0;
  const double acquire_all_s = std::chrono::duration<double>(BenchClock::now() - asked).count();
  if (all && counting) counting->start_window();
  const auto window_start = BenchClock::now();
  if (all) std::this_thread::sleep_for(seconds(options.scale_seconds));
  const double window_s = std::chrono::duration<double>(BenchClock::now() - window_start).count();
  long long renewals = 0;
  std::vector<double> lags;
  double ops = 0;  // memory://: no store calls
  if (counting) {
    ops = static_cast<double>(counting->calls()) / window_s;
    lags = counting->take_lags(&renewals);
  }
  // The takers are the benchmark's threads, not the provider's.
  Footprint footprint{count_threads() - threads_before - kTakers,
                      count_simba_threads() - simba_threads_before,
                      count_sockets() - sockets_before, resident_mi_b()};
  {
    std::unique_lock<std::mutex> lock(mu);
    count_now = true;
    cv.notify_all();
    cv.wait(lock, [&] { return counted == kTakers; });
    release_now = true;
    cv.notify_all();
  }
  for (auto& taker : takers) taker.join();
  if (errors.load() > 0) fail("scale: " + std::to_string(errors.load()) + " keys not acquired");
  if (!all) fail("scale: only " + std::to_string(held.load()) + " keys held within 600 s");
  Row row = scale_row(std::to_string(options.scale) + " keys held by one provider", "keys",
                      options.scale, footprint, ops, std::move(lags), renewals, lost.load());
  row.fields.push_back(Field::number("acquire_all_s", acquire_all_s));
  row.fields.push_back(Field::text("mechanism", (*provider)->capabilities().mechanism));
  report.add(row);
}

}  // namespace simba::bench
