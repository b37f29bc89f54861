// The contend/retrieval loop, once for every backend: Simba's lifecycle and
// notification rules plus the lease deadline, renewal retries and push
// wake-ups. The public service classes are thin handles over a ServiceCore,
// which timer and I/O tasks reach through weak pointers so a late task
// never touches a destroyed service.
#ifndef SIMBA_CORE_SERVICE_CORE_H_
#define SIMBA_CORE_SERVICE_CORE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "core/observers.h"
#include "core/renewal_batcher.h"
#include "core/runtime.h"
#include "simba/backend.h"
#include "simba/contend_period.h"
#include "simba/contend_service.h"
#include "simba/contender.h"
#include "simba/events.h"
#include "simba/metrics.h"

namespace simba::internal {

// Internal observation points (used by clustered and keyed locks).
struct ServiceHooks {
  // After each contend/read attempt of the running start() has been decided
  // and applied, on the thread that ran it (the I/O pool; the caller's for
  // start_and_attempt; a pushing thread for MutexEvent::answered_for),
  // outside every lock. `status` is the store call's outcome.
  std::function<void(const Status& status)> attempt_done;
  // Subscribe to the store's pushes only while waiting: not at start(), but
  // when an attempt finds another owner (then ask again at once, so nothing
  // released in between goes unheard), and drop the subscription once we
  // own the mutex. A holder then neither subscribes nor unsubscribes on its
  // way in and out; a push telling it of its own loss is not heard (its
  // next renewal finds out). For keyed leases, which take and give up a key
  // per hold.
  bool subscribe_only_while_waiting = false;
  // stop() waits until the owner's callbacks have run, before the store
  // hears the release and again before it returns (a contend service's
  // on_released must run before anybody else can own the mutex). Keyed
  // leases turn it off: the hold has ended on the holder's own call, their
  // contender only reports losses and ignores one of an earlier hold, and
  // the wait is two thread hops on every hand-off.
  bool stop_waits_for_callbacks = true;
  // Which owner changes the contender hears (MutexRetriever::on_owner, on
  // the strand); null: every one. A Locker acts only on a hold it loses: the
  // other changes of an acquisition (another owner seen, ours granted,
  // released on stop) would each wake a callback thread for nothing.
  std::function<bool(const MutexState& state)> notify_if;

  // A notify_if for a holder that acts only on a hold it loses: a change
  // that ends `contender_id`'s ownership while `held` (the holder's own
  // flag, set while it holds; read here under the core's lock) is true.
  static std::function<bool(const MutexState& state)> lost_while(
      std::string contender_id, std::shared_ptr<const std::atomic<bool>> held) {
    return [id = std::move(contender_id), held = std::move(held)](const MutexState& change) {
      return held->load() && change.is_released(id);
    };
  }
};

class ServiceCore : public std::enable_shared_from_this<ServiceCore> {
 public:
  enum class Mode { kContend, kRetrieve };

  ServiceCore(Mode mode, std::shared_ptr<MutexRetriever> retriever,
              std::shared_ptr<MutexContender> contender, ContendOptions options,
              std::chrono::milliseconds poll_interval, std::shared_ptr<Runtime> runtime,
              std::shared_ptr<Backend> backend, std::shared_ptr<Random> random, ServiceHooks hooks,
              Observers observers = {}, std::shared_ptr<RenewalBatcher> batcher = nullptr);

  ~ServiceCore();
  ServiceCore(const ServiceCore&) = delete;
  ServiceCore& operator=(const ServiceCore&) = delete;

  Status start();
  // start(), with the first attempt run on the calling thread before it
  // returns, where there is no initial delay: for a caller that would only
  // wait for that answer (a Locker), one thread hop less per acquisition.
  // The attempt is bounded by the store call's deadline, as on the I/O pool.
  Status start_and_attempt();
  // start_and_attempt() for a caller that takes the first answer and then
  // stops (Locker::try_acquire): that attempt is AcquireRequest::once, so a
  // backend does not queue it for a push.
  Status start_once();
  // For a caller that waits for ownership: start_and_attempt(), unless
  // `cancel` may end that wait before the store call would (then start():
  // the attempt runs on the I/O pool, and the caller stays free to leave).
  Status start_for(const std::stop_token& cancel);
  Status stop();

  ServiceStatus status() const;
  const std::string& mutex() const { return mutex_; }
  const std::string& contender_id() const { return contender_id_; }
  MutexState mutex_state() const;
  bool has_owner() const;
  bool is_owner() const;
  bool is_in_ttl() const;
  std::uint64_t fencing_token() const;
  std::optional<Clock::TimePoint> lease_deadline() const;

  // Waits, on a started core, until it owns the mutex: OK; kCancelled once
  // `cancel` is stopped; kDeadlineExceeded once `deadline` (on the factory's
  // clock; TimePoint::max() for none) has passed and an attempt of this
  // start() has answered. A deadline already past still waits for the first
  // answer, so a mutex free on arrival is taken ("try once"). Store errors:
  // a permanent one (not is_retryable: refused credentials, TLS
  // verification, ...) is returned as soon as an attempt meets it;
  // transient ones are retried until the deadline, and if the last attempt
  // before it failed, the result is kUnavailable "the store could not be
  // reached (...)" with that attempt's message (the hosts tried and their
  // causes), for the caller to prefix with what it was acquiring. What Locker, keyed leases
  // wait on.
  Status await_owner(Clock::TimePoint deadline, const std::stop_token& cancel);
  // The outcome of this start()'s last answered attempt; nullopt before the
  // first answer.
  std::optional<Status> last_attempt() const;

 private:
  using Generation = std::uint64_t;

  // start(), start_and_attempt() and start_once().
  Status start(bool attempt_here, bool once);
  void schedule_attempt_locked(std::chrono::milliseconds delay);
  void on_attempt_timer(Generation gen);
  // Hands the attempt to the I/O pool now (or asks the one in flight to
  // run again).
  void start_attempt_locked(Generation gen);
  // `losses_seen` is losses_ when the attempt was handed off.
  void run_attempt(Generation gen, std::uint64_t losses_seen);
  // Applies the store's answer to the attempt of lifecycle `gen` sent at
  // `sent` (run_attempt's, or a batched renewal's), outside every lock.
  void apply_answer(Generation gen, std::uint64_t losses_seen, Clock::TimePoint sent,
                    Result<OwnerRecord> reply);
  void on_lease_deadline(Generation gen);
  void on_event(Generation gen, const MutexEvent& event);
  // on_event's part under mu_: true when the caller is to run the attempt
  // itself (MutexEvent::answered_for names us), with *losses for it.
  bool on_event_locked(Generation gen, const MutexEvent& event, std::uint64_t* losses);
  // Subscribes to the store's pushes for lifecycle `gen`; null if the store
  // has none or subscribing failed (logged; polling still works).
  std::unique_ptr<Subscription> open_subscription(Generation gen, Status* error);
  // Records `owner` as the new "after" state and queues the callback.
  void apply_locked(const MutexOwner& owner);
  bool is_owner_locked(Clock::TimePoint now) const;
  // The HoldBound that goes with `reply`, an answer naming us the owner.
  std::shared_ptr<const HoldBound> bound_of_locked(const OwnerRecord& reply) const;
  // Reports to the observers, in order on the strand, outside every lock.
  // `renewal` marks a store error of an owner. No-ops without observers.
  void report_locked(LockEvent event, bool renewal = false);
  // A LockEvent of `kind` about this contender and `token`, stamped now.
  LockEvent make_event_locked(LockEvent::Kind kind, std::uint64_t token) const;
  // A reply made us the owner (or renewed us) until `deadline`: report it
  // (before lease_deadline_ and state_ take the new values).
  void report_hold_locked(const MutexOwner& owner, Clock::TimePoint now, Clock::TimePoint deadline);
  // Releases a grant under `token`, a hold of ours that already ended here,
  // then asks again (run_attempt's second call; it ends the attempt).
  void give_back(Generation gen, std::uint64_t token);
  // Our hold (state_.after) ended without our giving it up: report the loss.
  void report_loss_locked(LossCause cause, std::string why);
  // Counts this contender as waiting (or not) in the metrics' gauge.
  void set_waiting_locked(bool waiting);
  // Counts this contender as retrying a failed store call (or not).
  void set_retrying_locked(bool retrying);
  StoreTime estimated_store_now_locked(Clock::TimePoint now) const;
  std::chrono::milliseconds failure_delay_locked(Clock::TimePoint now, const Status& error);
  Deadline store_deadline() const;

  const Mode mode_;
  const std::shared_ptr<MutexRetriever> retriever_;
  const std::shared_ptr<MutexContender> contender_;  // null in kRetrieve mode
  const std::string mutex_;
  const std::string contender_id_;  // empty in kRetrieve mode
  const ContendOptions options_;
  const std::chrono::milliseconds poll_interval_;
  const std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<Clock> clock_;
  const std::shared_ptr<Backend> backend_;
  const std::shared_ptr<Random> random_;
  const ContendPeriod period_;
  const std::shared_ptr<Strand> strand_;
  const ServiceHooks hooks_;
  const Observers observers_;
  // Sends this owner's renewals with the factory's others; null where the
  // store renews one lease a call.
  const std::shared_ptr<RenewalBatcher> batcher_;

  mutable std::mutex mu_;
  ServiceStatus status_ = ServiceStatus::kInitial;
  // Bumped by every start() and stop(): a result carrying an older value
  // belongs to a finished lifecycle and is dropped.
  Generation generation_ = 0;
  // The lifecycle's next attempt is AcquireRequest::once (start_once()).
  bool once_ = false;
  MutexState state_;
  // Local end of our lease (meaningful while state_.after is us).
  Clock::TimePoint lease_deadline_{};
  // The store's second bound on our hold (HoldBound), or null: the lease
  // alone. On the real clock, as the store session it follows.
  std::shared_ptr<const HoldBound> bound_;
  // The store's time at our last reply and when we received it, to estimate
  // store time without comparing clocks.
  StoreTime anchor_store_{0};
  Clock::TimePoint anchor_local_{};
  // The last answer could not tell when state_.after's hold ends
  // (OwnerRecord::ask_again_at): it holds until the store says otherwise.
  bool owner_times_unknown_ = false;
  Runtime::TimerId attempt_timer_ = 0;
  Runtime::TimerId deadline_timer_ = 0;
  // One store call at a time per service; a wake-up that arrives meanwhile
  // makes the next attempt immediate instead of starting a second one.
  bool in_flight_ = false;
  bool rerun_ = false;
  // Store-reported losses (kLost events naming us) so far. An attempt that
  // overlapped one may carry an answer the store computed before the loss:
  // its "you own it" is not trusted, only asked again.
  std::uint64_t losses_ = 0;
  // The highest token of a hold of ours that ended here (kept across
  // stop() and start(): a release that failed leaves the hold at the store).
  std::uint64_t ended_token_ = 0;
  int failures_ = 0;
  // This start()'s answered attempts and the last one's outcome, and the
  // wake-up of await_owner (notified as each attempt is applied).
  int attempts_ = 0;
  Status last_attempt_;
  std::condition_variable answered_;
  std::unique_ptr<Subscription> subscription_;

  // For metrics and events (kept only with observers).
  // Since when this contender has wanted the mutex without owning it.
  Clock::TimePoint wait_began_{};
  // Whether the waiting gauge counts us now, and the retrying gauge.
  bool counted_waiting_ = false;
  bool counted_retrying_ = false;
  // While waiting: the earliest moment the mutex was known to be free since
  // we last saw another owner (a pushed release, or that owner's lease end
  // estimated on our clock); busy_seen_ says we saw another owner at all.
  bool busy_seen_ = false;
  std::optional<Clock::TimePoint> free_known_at_;
};

// The factory's state (MutexContendServiceFactory's private implementation),
// shared with Locker, keyed leases and clustered locks: the backend, the one
// Runtime they all run on, and the services still alive.
class FactoryImpl {
 public:
  FactoryImpl(std::shared_ptr<Backend> backend, FactoryOptions options);
  // Stops the services still running, then the Runtime.
  ~FactoryImpl();
  FactoryImpl(const FactoryImpl&) = delete;
  FactoryImpl& operator=(const FactoryImpl&) = delete;

  // Checks `options` as MutexContendServiceFactory::create does.
  static Status validate(const FactoryOptions& options);

  Result<std::unique_ptr<MutexContendService>> create_contend_service(
      std::shared_ptr<MutexContender> contender, const ContendOptions& options, ServiceHooks hooks);
  Result<std::unique_ptr<MutexRetrievalService>> create_retrieval_service(
      std::shared_ptr<MutexRetriever> retriever);
  // A contend core without a public handle (keyed leases drive it
  // themselves). Validated as CreateContendService; tracked, so the factory's
  // end stops it.
  Result<std::shared_ptr<ServiceCore>> create_contend_core(
      std::shared_ptr<MutexContender> contender, const ContendOptions& options, ServiceHooks hooks);

  const std::shared_ptr<Backend>& backend() const { return backend_; }
  const std::shared_ptr<Clock>& clock() const { return options_.clock; }
  const ContendOptions& contend_options() const { return options_.contend; }
  const FactoryOptions& options() const { return options_; }
  const std::shared_ptr<Runtime>& runtime() const { return runtime_; }
  const Observers& observers() const { return observers_; }

 private:
  void track(const std::shared_ptr<ServiceCore>& core);

  const std::shared_ptr<Backend> backend_;
  FactoryOptions options_;
  std::shared_ptr<Runtime> runtime_;
  // Where the store batches renewals (Capabilities::batch_renewals); null
  // otherwise.
  std::shared_ptr<RenewalBatcher> batcher_;
  Observers observers_;
  std::mutex mu_;
  std::vector<std::weak_ptr<ServiceCore>> services_;
};

// How the library reaches a factory's implementation (a friend of
// MutexContendServiceFactory).
struct FactoryAccess {
  static const std::shared_ptr<FactoryImpl>& of(const MutexContendServiceFactory& factory) {
    return factory.impl_;
  }
  static std::unique_ptr<MutexContendServiceFactory> wrap(std::shared_ptr<FactoryImpl> impl) {
    return std::unique_ptr<MutexContendServiceFactory>(
        new MutexContendServiceFactory(std::move(impl)));
  }
};

}  // namespace simba::internal

#endif  // SIMBA_CORE_SERVICE_CORE_H_
