// File: simba/contend_service.h
//
// Services that keep contending for (or observing) one mutex, and the factory
// that makes them for one store.
//
//   MutexContendServiceFactory  one per store: owns the store connection(s) and
//                               a fixed set of threads shared by all services
//   MutexContendService         contends for a mutex on behalf of a contender,
//                               renewing while it owns it
//   MutexRetrievalService       watches who owns a mutex without contending
//
// Lifecycle: INITIAL -> start() -> STARTING -> RUNNING -> stop() -> STOPPING
// -> INITIAL. start() from any state but INITIAL, and stop() from any state
// but RUNNING, return kFailedPrecondition. A stopped service may be started
// again; results that arrive late from an earlier run are dropped.
//
// Ownership is a lease: `is_owner()` is true only while the contender holds
// the mutex at the store *and* the local lease deadline has not passed. The
// deadline is measured on the local monotonic clock from the moment the last
// successful acquire/renew request was sent, so it never outlasts the store's
// lease. When it passes without a successful renewal, the contender gets
// on_released even if the store call still hangs.
//
// Example:
//   auto factory = simba::MutexContendServiceFactory::open("sqlite:///tmp/s.db");
//   if (!factory.ok()) return fail(factory.status());
//   auto contender = simba::make_contender("report-job",
//       [](const simba::MutexState& s) { start_leading(s.after.fencing_token); },
//       [](const simba::MutexState&) { stop_leading(); });
//   auto service = (*factory)->create_contend_service(contender).value();
//   service->start();   // returns at once; callbacks follow
//   ...
//   service->stop();    // releases the mutex if held
//
// Thread safety: services and the factory are safe to use from any thread.
// The factory must outlive its services; destroying it stops any service
// still running.

#ifndef SIMBA_CONTEND_SERVICE_H_
#define SIMBA_CONTEND_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "simba/backend.h"
#include "simba/clock.h"
#include "simba/contend_period.h"
#include "simba/contender.h"
#include "simba/events.h"
#include "simba/metrics.h"
#include "simba/mutex_owner.h"
#include "simba/status.h"

namespace simba {

enum class ServiceStatus { kInitial, kStarting, kRunning, kStopping };
std::string_view service_status_name(ServiceStatus status);

// Lease and timing settings of a contend service.
struct ContendOptions {
  // Soft lease: the owner renews this long after each acquire/renew.
  // Must be > 0. Default: 10 s (JVM Simba's default).
  std::chrono::milliseconds ttl{10000};
  // Grace after ttl in which the owner may still renew and nobody else may
  // take over; also the owner's window to retry a failed renewal. Must be
  // >= 0. Default: 6 s.
  std::chrono::milliseconds transition{6000};
  // Delay before the first attempt after start(). Must be >= 0. Default: 0.
  std::chrono::milliseconds initial_delay{0};
  // Longest time one store call may take before it counts as failed. Must be
  // > 0. Default: 3 s.
  std::chrono::milliseconds operation_timeout{3000};

  // kInvalidArgument naming the first bad field, or OK.
  Status validate() const;
};

class MutexRetrievalService {
 public:
  virtual ~MutexRetrievalService() = default;

  // Begins observing/contending. Returns at once; results arrive through the
  // callbacks.
  virtual Status start() = 0;
  // Stops; a contend service releases the mutex at the store if it may hold
  // it, and its contender gets on_released if it was the owner. on_released
  // comes first: it has run before the release is sent, so nobody else can
  // acquire while the owner still works (called from one of this service's
  // callbacks, it runs right after that callback returns). Returns the
  // store's error if that release failed (the service is stopped anyway and
  // the lease will expire). Waits for running callbacks of this service to
  // finish unless called from one of them.
  virtual Status stop() = 0;

  virtual ServiceStatus status() const = 0;
  // STARTING or RUNNING.
  bool running() const {
    ServiceStatus s = status();
    return s == ServiceStatus::kStarting || s == ServiceStatus::kRunning;
  }

  virtual const std::string& mutex() const = 0;
  // The latest applied owner update (before/after).
  virtual MutexState mutex_state() const = 0;
  MutexOwner before_owner() const { return mutex_state().before; }
  MutexOwner after_owner() const { return mutex_state().after; }
  // Somebody's hard lease has not ended, by the estimated store time.
  virtual bool has_owner() const = 0;
};

class MutexContendService : public MutexRetrievalService {
 public:
  virtual const std::string& contender_id() const = 0;
  virtual const std::shared_ptr<MutexContender>& contender() const = 0;

  // This contender owns the mutex and its local lease deadline has not
  // passed. Never the cached id alone.
  virtual bool is_owner() const = 0;
  // is_owner() and the soft lease (ttl) has not ended.
  virtual bool is_in_ttl() const = 0;
  // The fencing token of the current ownership, or 0 when !is_owner().
  virtual std::uint64_t fencing_token() const = 0;
  // When the current ownership ends locally unless renewed (monotonic clock
  // of the factory); nullopt when not the owner.
  virtual std::optional<Clock::TimePoint> lease_deadline() const = 0;
};

// Settings of a factory.
struct FactoryOptions {
  // Defaults for services made by this factory.
  ContendOptions contend;
  // Time source. Default: Clock::steady().
  std::shared_ptr<Clock> clock;
  // Jitter source. Default: Random::standard().
  std::shared_ptr<Random> random;
  // Threads running store calls, shared by all services. Default: 2.
  int io_threads = 2;
  // Threads running callbacks, shared by all services. Default: 2.
  int callback_threads = 2;
  // How often a retrieval service re-reads the owner when the store cannot
  // push. Default: 1 s.
  std::chrono::milliseconds retrieval_poll_interval{1000};
  // Where contend services report counts and latencies (metrics.h), e.g. a
  // PrometheusMetrics. Default: none (nothing is measured).
  std::shared_ptr<Metrics> metrics;
  // Where contend services report what happens to their holds (events.h).
  // Default: none.
  std::shared_ptr<LockEventListener> events;
};

namespace internal {
class FactoryImpl;
struct FactoryAccess;
}  // namespace internal

// A concrete class: its state (the backend, the threads, the live services)
// is private to the library, which Locker, Scheduler, keyed and clustered
// locks reach without casting.
class MutexContendServiceFactory {
 public:
  // Opens the store named by `uri` through the default registry (see
  // registry.h) and makes a factory over it. Defined in simba::simba (the
  // library with the built-in backends). Errors: kInvalidArgument for a
  // malformed URI, kUnimplemented for a scheme not compiled in (the message
  // lists those that are), kUnavailable / kPermissionDenied when the store
  // cannot be reached or opened.
  static Result<std::unique_ptr<MutexContendServiceFactory>> open(std::string_view uri,
                                                                  FactoryOptions options = {});
  // A factory over an already opened backend.
  static Result<std::unique_ptr<MutexContendServiceFactory>> create(
      std::shared_ptr<Backend> backend, FactoryOptions options = {});

  // Stops the services still running (their mutexes released), then the
  // threads.
  ~MutexContendServiceFactory();
  MutexContendServiceFactory(const MutexContendServiceFactory&) = delete;
  MutexContendServiceFactory& operator=(const MutexContendServiceFactory&) = delete;

  // A contend service for `contender` with the factory's ContendOptions, or
  // with `options`. Errors: kInvalidArgument for a mutex name or contender
  // id this store cannot hold, or bad options.
  Result<std::unique_ptr<MutexContendService>> create_contend_service(
      std::shared_ptr<MutexContender> contender);
  Result<std::unique_ptr<MutexContendService>> create_contend_service(
      std::shared_ptr<MutexContender> contender, const ContendOptions& options);

  // A service that reports the owner of `retriever->mutex()` to it.
  Result<std::unique_ptr<MutexRetrievalService>> create_retrieval_service(
      std::shared_ptr<MutexRetriever> retriever);

  const std::shared_ptr<Backend>& backend() const;
  const std::shared_ptr<Clock>& clock() const;
  const ContendOptions& contend_options() const;

 private:
  friend struct internal::FactoryAccess;
  explicit MutexContendServiceFactory(std::shared_ptr<internal::FactoryImpl> impl);

  // Shared with what runs on the factory's threads (keyed leases, clustered
  // locks), which may hold it a little past the factory.
  std::shared_ptr<internal::FactoryImpl> impl_;
};

}  // namespace simba

#endif  // SIMBA_CONTEND_SERVICE_H_
