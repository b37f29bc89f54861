// The keyed-lock contract, once for every store: per-(thread, key)
// reentrancy, the max_hold watchdog, and the arbitration between a release,
// the watchdog and a loss reported by the store (whichever comes first ends
// the hold; the others find it ended). Backends only take and free a key.
#include "simba/keyed_lock.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/observers.h"
#include "core/runtime.h"
#include "simba/contender.h"

namespace simba {

Status KeyedLockBackend::validate_key(std::string_view key) const {
  return validate_name("key", key, capabilities().max_key_length);
}

namespace internal {
namespace {

using std::chrono::milliseconds;

// How long freeing a key at the store may take when the watchdog, a loss or
// the provider's end does it (a holder's own release() uses the same bound).
constexpr milliseconds kReleaseTimeout{5000};

Deadline release_deadline() { return std::chrono::steady_clock::now() + kReleaseTimeout; }

}  // namespace

// Reports the holds of a backend that does not report them itself (the
// servers' own keyed locks: PostgreSQL, MySQL, memory) the way contend
// services report theirs: each key is a mutex, the provider one contender.
// Events go out on the thread where they happen (the acquiring or
// releasing thread, the watchdog's timer, the store's callback), never
// under a lock of ours; the holds of one key by one thread come in order.
class HoldReporter {
 public:
  HoldReporter() = default;
  HoldReporter(std::string store, Observers observers, std::shared_ptr<Clock> clock)
      : store_(std::move(store)),
        contender_id_(MutexContender::generate_host_contender_id()),
        observers_(std::move(observers)),
        clock_(std::move(clock)) {}

  void waiting(const std::string& key, int delta) const {
    if (observers_.metrics) observers_.metrics->waiting_changed(MetricLabels{store_, key}, delta);
  }
  void acquired(const std::string& key, std::uint64_t token, std::chrono::microseconds waited,
                milliseconds max_hold) const {
    if (!observers_.any()) return;
    LockEvent event = make(LockEvent::Kind::kAcquired, key, token);
    event.waited = waited;
    event.lease_left = max_hold;  // the hold ends at max_hold unless released
    observers_.deliver(event);
  }
  void released(const std::string& key, std::uint64_t token) const {
    if (observers_.any()) observers_.deliver(make(LockEvent::Kind::kReleased, key, token));
  }
  void lost(const std::string& key, std::uint64_t token, LossCause cause, std::string why) const {
    if (!observers_.any()) return;
    LockEvent event = make(LockEvent::Kind::kLost, key, token);
    event.cause = cause;
    event.error = aborted_error(std::move(why));
    observers_.deliver(event);
  }
  void store_error(const std::string& key, const Status& error) const {
    if (!observers_.any()) return;
    LockEvent event = make(LockEvent::Kind::kStoreError, key, 0);
    event.error = error;
    observers_.deliver(event);
  }

 private:
  LockEvent make(LockEvent::Kind kind, const std::string& key, std::uint64_t token) const {
    return make_lock_event(kind, store_, key, contender_id_, token, *clock_);
  }

  std::string store_;
  std::string contender_id_;
  Observers observers_;
  std::shared_ptr<Clock> clock_ = Clock::steady();
};

class KeyedProviderState;

// One acquisition of a key by one thread, shared by its re-entrant Leases.
class KeyedHold {
 public:
  enum class Ending { kReleased, kWatchdog, kLost, kProviderClosed };

  KeyedHold(std::string key, std::thread::id thread, std::weak_ptr<KeyedProviderState> provider)
      : key_(std::move(key)), thread_(thread), provider_(std::move(provider)) {}

  const std::string& key() const { return key_; }
  std::thread::id thread() const { return thread_; }
  const std::weak_ptr<KeyedProviderState>& provider() const { return provider_; }

  // Called once the store granted the key.
  void granted(std::unique_ptr<KeyHold> store_hold, Clock::TimePoint deadline,
               std::shared_ptr<Clock> clock) {
    std::lock_guard<std::mutex> lock(mu_);
    token_ = store_hold->fencing_token();
    deadline_ = deadline;
    clock_ = std::move(clock);
    if (ended_) {
      // Lost before the grant was recorded: free what the store gave us.
      orphan_ = std::move(store_hold);
      return;
    }
    store_hold_ = std::move(store_hold);
  }
  void set_watchdog(Runtime::TimerId id) {
    std::lock_guard<std::mutex> lock(mu_);
    watchdog_ = id;
  }

  bool is_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    // The deadline too: a late watchdog never stretches max_hold. And the
    // store hold's own view (a lease stops at its deadline, however late
    // its loss is delivered).
    return !ended_ && store_hold_ != nullptr && clock_->now() < deadline_ && store_hold_->is_held();
  }
  std::uint64_t token() const {
    std::lock_guard<std::mutex> lock(mu_);
    return token_;
  }
  Clock::TimePoint deadline() const {
    std::lock_guard<std::mutex> lock(mu_);
    return deadline_;
  }
  std::stop_token lost_token() const { return lost_.get_token(); }

  // Ends the hold for `why` if nothing ended it yet, and returns what the
  // store still holds (null if something else ended it first, or for a
  // hold whose grant is still on its way). The caller frees it.
  std::unique_ptr<KeyHold> end(Ending why, Runtime::TimerId* watchdog) {
    std::unique_ptr<KeyHold> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_) return std::move(orphan_);
      ended_ = true;
      *watchdog = watchdog_;
      watchdog_ = 0;
      held = std::move(store_hold_);
    }
    // Outside the lock: stop_callbacks run here, and one may ask this hold
    // about itself (is_held() and fencing_token() take the lock).
    if (why != Ending::kReleased) lost_.request_stop();
    return held;
  }

 private:
  const std::string key_;
  const std::thread::id thread_;
  const std::weak_ptr<KeyedProviderState> provider_;
  std::stop_source lost_;

  mutable std::mutex mu_;
  bool ended_ = false;
  std::unique_ptr<KeyHold> store_hold_;
  std::unique_ptr<KeyHold> orphan_;
  std::uint64_t token_ = 0;
  Clock::TimePoint deadline_{};
  std::shared_ptr<Clock> clock_ = Clock::steady();
  Runtime::TimerId watchdog_ = 0;
};

// What the provider's holds share: the backend, the watchdog's timer thread,
// and the table of (thread, key) acquisitions for reentrancy.
class KeyedProviderState : public std::enable_shared_from_this<KeyedProviderState> {
 public:
  KeyedProviderState(std::shared_ptr<KeyedLockBackend> backend, std::shared_ptr<Clock> clock,
                     HoldReporter reporter)
      : backend_(std::move(backend)),
        clock_(std::move(clock)),
        reporter_(std::move(reporter)),
        runtime_(backend_->shared_runtime()) {
    // The backend's threads when it runs on the library's (a lease
    // backend's factory) and they keep the watchdog's clock. Otherwise one
    // timer thread for the watchdogs and one I/O thread to free keys they
    // (or a loss) end: the holder's threads do the rest.
    if (runtime_ == nullptr || runtime_->clock() != clock_) {
      runtime_ = std::make_shared<Runtime>(clock_, 1, 1);
      owns_runtime_ = true;
    }
  }

  const std::shared_ptr<KeyedLockBackend>& backend() const { return backend_; }
  const std::shared_ptr<Clock>& clock() const { return clock_; }
  const HoldReporter& reporter() const { return reporter_; }

  // The live acquisition of `key` by this thread, with one more lease on it.
  std::shared_ptr<KeyedHold> reenter(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find({std::this_thread::get_id(), key});
    if (it == table_.end() || !it->second.hold->is_held()) return nullptr;
    ++it->second.leases;
    return it->second.hold;
  }

  // Records a granted acquisition and starts its watchdog.
  void track(const std::shared_ptr<KeyedHold>& hold) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Replaces an acquisition of this thread that already ended (its
      // leases are still open): it is of no use for reentrancy any more.
      table_[{hold->thread(), hold->key()}] = Entry{hold, 1};
    }
    std::weak_ptr<KeyedHold> weak = hold;
    std::weak_ptr<KeyedProviderState> self = weak_from_this();
    hold->set_watchdog(runtime_->schedule_at(hold->deadline(), [weak, self] {
      auto h = weak.lock();
      auto state = self.lock();
      if (h != nullptr && state != nullptr)
        state->end_in_background(h, KeyedHold::Ending::kWatchdog);
    }));
  }

  // One lease of `hold` is given up. True when it was the last.
  bool leave(const std::shared_ptr<KeyedHold>& hold) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find({hold->thread(), hold->key()});
    if (it == table_.end() || it->second.hold != hold) return true;
    if (--it->second.leases > 0) return false;
    table_.erase(it);
    return true;
  }

  // Frees the key now, on this thread (a holder's release).
  Status end_now(const std::shared_ptr<KeyedHold>& hold) {
    Runtime::TimerId watchdog = 0;
    std::unique_ptr<KeyHold> store_hold = hold->end(KeyedHold::Ending::kReleased, &watchdog);
    if (watchdog != 0) runtime_->cancel(watchdog);
    if (store_hold == nullptr) return ok_status();  // the watchdog or a loss was first
    // Given up before the store hears it, as a contend service's stop().
    reporter_.released(hold->key(), hold->token());
    return store_hold->release(std::chrono::steady_clock::now() + kReleaseTimeout)
        .with_context("releasing key '" + hold->key() + "'");
  }

  // The watchdog or a loss: the hold ends at once (is_held() turns false,
  // lost_token() stops); the store is told on the I/O thread, so a timer or
  // a store's callback thread never waits for it.
  void end_in_background(const std::shared_ptr<KeyedHold>& hold, KeyedHold::Ending why) {
    Runtime::TimerId watchdog = 0;
    std::unique_ptr<KeyHold> store_hold = hold->end(why, &watchdog);
    if (watchdog != 0) runtime_->cancel(watchdog);
    if (store_hold == nullptr) return;
    if (why == KeyedHold::Ending::kWatchdog) {
      SIMBA_LOG(kWarn, "key '" << hold->key() << "': held for its whole max_hold; freeing it");
      reporter_.lost(hold->key(), hold->token(), LossCause::kDeadlinePassed,
                     "held for its whole max_hold");
    } else {
      SIMBA_LOG(kWarn, "key '" << hold->key() << "': the store ended the hold");
      reporter_.lost(hold->key(), hold->token(), LossCause::kOtherOwner,
                     "the store ended the hold (its session or lock was lost)");
    }
    auto shared = std::make_shared<std::unique_ptr<KeyHold>>(std::move(store_hold));
    const std::string key = hold->key();
    {
      std::lock_guard<std::mutex> lock(pending_->mu);
      ++pending_->tasks;
    }
    // If the pool is closed the task is dropped, and destroying the hold
    // frees the key. The task holds nothing of the provider but the count
    // close() waits for (the backend outlives it: Close waits).
    const bool posted = runtime_->post_io([shared, key, pending = pending_] {
      const Status released = (*shared)->release(release_deadline());
      if (!released.ok()) {
        SIMBA_LOG(kWarn, "key '" << key << "': freeing it failed (the store's session or "
                                 << "lease frees it): " << released);
      }
      shared->reset();
      pending->done();
    });
    if (!posted) pending_->done();
  }

  // The provider is going away: free every key still held, then stop the
  // threads.
  void close() {
    std::vector<std::shared_ptr<KeyedHold>> holds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, entry] : table_) holds.push_back(entry.hold);
      table_.clear();
    }
    for (const auto& hold : holds) {
      Runtime::TimerId watchdog = 0;
      std::unique_ptr<KeyHold> store_hold =
          hold->end(KeyedHold::Ending::kProviderClosed, &watchdog);
      if (watchdog != 0) runtime_->cancel(watchdog);
      if (store_hold == nullptr) continue;
      reporter_.released(hold->key(), hold->token());
      (void)store_hold->release(release_deadline());
    }
    if (owns_runtime_) {
      runtime_->shutdown();
    } else {
      // The backend's threads go on: wait for the keys this provider is
      // freeing on them.
      std::unique_lock<std::mutex> lock(pending_->mu);
      pending_->cv.wait(lock, [&] { return pending_->tasks == 0; });
    }
  }

 private:
  struct Entry {
    std::shared_ptr<KeyedHold> hold;
    int leases = 0;
  };

  // Background releases not finished yet.
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    int tasks = 0;
    void done() {
      std::lock_guard<std::mutex> lock(mu);
      if (--tasks == 0) cv.notify_all();
    }
  };

  const std::shared_ptr<KeyedLockBackend> backend_;
  const std::shared_ptr<Clock> clock_;
  const HoldReporter reporter_;
  std::shared_ptr<Runtime> runtime_;
  bool owns_runtime_ = false;
  const std::shared_ptr<Pending> pending_ = std::make_shared<Pending>();
  std::mutex mu_;
  std::map<std::pair<std::thread::id, std::string>, Entry> table_;
};

class KeyedLockProviderImpl final : public KeyedLockProvider {
 public:
  explicit KeyedLockProviderImpl(std::shared_ptr<KeyedProviderState> state)
      : state_(std::move(state)) {}
  ~KeyedLockProviderImpl() override { state_->close(); }

  Result<Lease> acquire(std::string_view key, milliseconds max_hold,
                        std::stop_token cancel) override {
    SIMBA_ASSIGN_OR_RETURN(std::optional<Lease> lease,
                           acquire_until(key, Deadline::max(), max_hold, std::move(cancel)));
    if (!lease.has_value()) {
      return internal_error("the store gave up waiting for key '" + std::string(key) +
                            "' although no deadline was set");
    }
    return std::move(*lease);
  }

  Result<std::optional<Lease>> try_acquire(std::string_view key, milliseconds max_wait,
                                           milliseconds max_hold, std::stop_token cancel) override {
    if (max_wait < milliseconds(0)) {
      return invalid_argument_error("max_wait must be >= 0, got " +
                                    std::to_string(max_wait.count()) + " ms");
    }
    return acquire_until(key, std::chrono::steady_clock::now() + max_wait, max_hold,
                         std::move(cancel));
  }

  const KeyedLockCapabilities& capabilities() const override {
    return state_->backend()->capabilities();
  }
  std::string_view scheme() const override { return state_->backend()->scheme(); }

 private:
  Result<std::optional<Lease>> acquire_until(std::string_view key_view, Deadline wait_deadline,
                                             milliseconds max_hold, std::stop_token cancel) {
    if (max_hold <= milliseconds(0)) {
      return invalid_argument_error("max_hold must be > 0, got " +
                                    std::to_string(max_hold.count()) + " ms");
    }
    SIMBA_RETURN_IF_ERROR(state_->backend()->validate_key(key_view));
    const std::string key(key_view);
    // Reentrancy: this thread holds the key already. Its first max_hold
    // stays in force.
    if (auto held = state_->reenter(key)) return std::optional<Lease>(Lease(std::move(held)));

    auto hold = std::make_shared<KeyedHold>(key, std::this_thread::get_id(), state_);
    std::weak_ptr<KeyedHold> weak = hold;
    std::weak_ptr<KeyedProviderState> provider = state_;
    KeyAcquireRequest request;
    request.key = key;
    request.max_hold = max_hold;
    request.wait_deadline = wait_deadline;
    request.cancel = std::move(cancel);
    request.on_lost = [weak, provider] {
      auto h = weak.lock();
      auto state = provider.lock();
      if (h != nullptr && state != nullptr) state->end_in_background(h, KeyedHold::Ending::kLost);
    };
    const HoldReporter& reporter = state_->reporter();
    const auto asked = std::chrono::steady_clock::now();
    reporter.waiting(key, +1);
    Result<std::unique_ptr<KeyHold>> acquired = state_->backend()->acquire(request);
    reporter.waiting(key, -1);
    if (!acquired.ok()) {
      // The caller's own doing (a cancel, a bad request) is no store error.
      const StatusCode code = acquired.status().code();
      if (code != StatusCode::kCancelled && code != StatusCode::kInvalidArgument) {
        reporter.store_error(key, acquired.status());
      }
      return acquired.status();
    }
    std::unique_ptr<KeyHold> store_hold = std::move(*acquired);
    if (store_hold == nullptr) return std::optional<Lease>();
    const std::uint64_t token = store_hold->fencing_token();
    // max_hold counts from the grant: the wait is not part of the hold.
    hold->granted(std::move(store_hold), state_->clock()->now() + max_hold, state_->clock());
    reporter.acquired(key, token,
                      std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - asked),
                      max_hold);
    state_->track(hold);
    return std::optional<Lease>(Lease(std::move(hold)));
  }

  const std::shared_ptr<KeyedProviderState> state_;
};

}  // namespace internal

// ---- Lease ----

Lease::Lease(std::shared_ptr<internal::KeyedHold> hold) : hold_(std::move(hold)) {}

Lease::Lease(Lease&& other) noexcept
    : hold_(std::move(other.hold_)), released_(std::exchange(other.released_, false)) {}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    (void)release();
    hold_ = std::move(other.hold_);
    released_ = std::exchange(other.released_, false);
  }
  return *this;
}

Lease::~Lease() {
  const Status released = release();
  if (!released.ok()) {
    SIMBA_LOG(kWarn, released << " (the store's session or lease frees the key)");
  }
}

bool Lease::is_held() const { return hold_ != nullptr && !released_ && hold_->is_held(); }

std::uint64_t Lease::fencing_token() const { return is_held() ? hold_->token() : 0; }

std::stop_token Lease::lost_token() const {
  return hold_ != nullptr ? hold_->lost_token() : std::stop_token();
}

Clock::TimePoint Lease::hold_deadline() const {
  return hold_ != nullptr ? hold_->deadline() : Clock::TimePoint{};
}

const std::string& Lease::key() const {
  static const std::string kNone;
  return hold_ != nullptr ? hold_->key() : kNone;
}

Status Lease::release() {
  if (hold_ == nullptr || released_) return ok_status();
  released_ = true;
  auto state = hold_->provider().lock();
  if (state == nullptr) return ok_status();      // the provider freed it when it closed
  if (!state->leave(hold_)) return ok_status();  // an outer lease still holds it
  return state->end_now(hold_);
}

// ---- KeyedLockProvider ----

Result<std::unique_ptr<KeyedLockProvider>> KeyedLockProvider::create(
    std::shared_ptr<KeyedLockBackend> backend, KeyedLockOptions options) {
  if (backend == nullptr) return invalid_argument_error("backend must not be null");
  SIMBA_RETURN_IF_ERROR(options.lease.validate());
  if (options.clock == nullptr) options.clock = Clock::steady();
  // A backend that reports its holds itself got the sinks when it was made.
  internal::HoldReporter reporter;
  if (!backend->capabilities().reports_holds) {
    reporter = internal::HoldReporter(
        std::string(backend->scheme()),
        internal::Observers{std::move(options.metrics), std::move(options.events)}, options.clock);
  }
  auto state = std::make_shared<internal::KeyedProviderState>(std::move(backend), options.clock,
                                                              std::move(reporter));
  return std::unique_ptr<KeyedLockProvider>(
      std::make_unique<internal::KeyedLockProviderImpl>(std::move(state)));
}

}  // namespace simba
