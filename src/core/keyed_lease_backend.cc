// Keyed locks over any contention backend (simba/backend.h): a key is the
// store's mutex of that name, held under a lease by this provider's contender
// for it. Each (provider, key) has one contender and one ServiceCore, started
// for a hold and stopped at its release, and reused by the next hold; the
// threads of one provider that want one key take turns in arrival order, as
// the store cannot tell them apart. The core brings what the store offers:
// one round trip to take a free key, push hand-off (subscribed only while
// waiting), a lease renewed while held (so a crashed holder's key frees
// itself), fencing tokens, and loss signals. It runs on the Runtime of the
// backend's factory, which the provider shares.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "core/service_core.h"
#include "simba/keyed_backend.h"

namespace simba {
namespace internal {
namespace {

using std::chrono::milliseconds;

// Idle keys (stopped cores, nobody waiting) kept for their next hold; past
// this many an idle key is forgotten, so a provider that touched a million
// keys does not keep a million cores.
constexpr std::size_t kMaxIdleKeys = 256;

class LeaseKeyedLockBackend;

// One key of one provider: its contender and core, and the turns of the
// provider's threads that want it.
class KeySlot : public std::enable_shared_from_this<KeySlot> {
 public:
  explicit KeySlot(std::string key) : key_(std::move(key)) {}

  const std::string& key() const { return key_; }

  // Waits for this thread's turn at the key. OK: its turn (the caller then
  // owns the core until EndTurn); kDeadlineExceeded when `deadline` passes
  // first; kCancelled.
  Status TakeTurn(Deadline deadline, const std::stop_token& cancel) {
    // Registered before taking mu_: a stop already requested runs it here.
    std::stop_callback wake(cancel, [this] {
      std::lock_guard<std::mutex> guard(mu_);
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t ticket = next_ticket_++;
    for (;;) {
      if (serving_ == ticket && !busy_) {
        busy_ = true;
        ++serving_;
        return OkStatus();
      }
      if (cancel.stop_requested() || std::chrono::steady_clock::now() >= deadline) {
        // Give up this place in line: later tickets must not wait for it.
        abandoned_.push_back(ticket);
        SkipAbandonedLocked();
        cv_.notify_all();
        return cancel.stop_requested()
                   ? CancelledError("acquiring key '" + key_ + "' was cancelled")
                   : DeadlineExceededError("key '" + key_ + "' is held by this provider");
      }
      if (deadline == Deadline::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, deadline);
      }
    }
  }

  // Hands the key to the next thread in line.
  void EndTurn() {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    SkipAbandonedLocked();
    cv_.notify_all();
  }

  // The core, made on first use; its callbacks reach this slot weakly.
  Result<std::shared_ptr<ServiceCore>> Core(FactoryImpl& factory, const ContendOptions& lease);

  // For the core's hooks and contender.
  void OnAttemptDone(std::uint64_t run) {
    std::lock_guard<std::mutex> lock(mu_);
    if (run != run_) return;
    ++attempts_;
    cv_.notify_all();
  }
  void OnStarted(std::uint64_t run) {
    std::lock_guard<std::mutex> lock(mu_);
    run_ = run;
    attempts_ = 0;
  }
  void OnReleased() {
    std::function<void()> lost;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!holding_) return;  // a release of ours, or no hold yet
      holding_ = false;
      lost = std::move(on_lost_);
    }
    if (lost) lost();
  }

  // Waits, on the current turn, until the started core owns the key. OK:
  // owned; kDeadlineExceeded after `deadline` (once one attempt answered);
  // kCancelled.
  Status AwaitOwner(ServiceCore& core, Deadline deadline, const std::stop_token& cancel) {
    std::stop_callback wake(cancel, [this] {
      std::lock_guard<std::mutex> guard(mu_);
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (core.is_owner()) return OkStatus();
      if (cancel.stop_requested()) {
        return CancelledError("acquiring key '" + key_ + "' was cancelled");
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline && attempts_ > 0) {
        return DeadlineExceededError("key '" + key_ + "' is held elsewhere");
      }
      // Even a deadline already past waits for the first attempt's answer:
      // a key free on arrival is taken. Without a deadline, wake now and
      // then in case a notification raced.
      const Deadline wake_at = now >= deadline ? now + milliseconds(10)
                               : deadline == Deadline::max() ? now + std::chrono::seconds(1)
                                                             : deadline;
      cv_.wait_until(lock, wake_at);
    }
  }

  // The hold begins: a loss from now on runs `on_lost`.
  void BeginHold(std::function<void()> on_lost) {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = true;
    on_lost_ = std::move(on_lost);
  }
  // The hold ends by release: a loss is no longer reported.
  void EndHold() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = false;
    on_lost_ = nullptr;
  }

 private:
  void SkipAbandonedLocked() {
    for (bool skipped = true; skipped && !busy_;) {
      skipped = false;
      for (auto it = abandoned_.begin(); it != abandoned_.end(); ++it) {
        if (*it == serving_) {
          abandoned_.erase(it);
          ++serving_;
          skipped = true;
          break;
        }
      }
    }
  }

  const std::string key_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Turns: tickets in arrival order; `serving_` is the next to go.
  std::uint64_t next_ticket_ = 0;
  std::uint64_t serving_ = 0;
  bool busy_ = false;
  std::deque<std::uint64_t> abandoned_;
  // The core's current run and its answered attempts.
  std::uint64_t run_ = 0;
  int attempts_ = 0;
  bool holding_ = false;
  std::function<void()> on_lost_;
  std::shared_ptr<ServiceCore> core_;  // made on first use, under mu_
};

// The contender of one key: hears only that the hold ended.
class KeyContender final : public MutexContender {
 public:
  KeyContender(std::string key, std::string id, std::weak_ptr<KeySlot> slot)
      : MutexContender(std::move(key), std::move(id)), slot_(std::move(slot)) {}
  void on_released(const MutexState&) override {
    if (auto slot = slot_.lock()) slot->OnReleased();
  }

 private:
  std::weak_ptr<KeySlot> slot_;
};

Result<std::shared_ptr<ServiceCore>> KeySlot::Core(FactoryImpl& factory,
                                                   const ContendOptions& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (core_ != nullptr) return core_;
  std::weak_ptr<KeySlot> weak = weak_from_this();
  ServiceHooks hooks;
  hooks.started = [weak](std::uint64_t run) {
    if (auto slot = weak.lock()) slot->OnStarted(run);
  };
  hooks.attempt_done = [weak](const Status&, std::uint64_t run) {
    if (auto slot = weak.lock()) slot->OnAttemptDone(run);
  };
  hooks.subscribe_only_while_waiting = true;
  auto contender = std::make_shared<KeyContender>(
      key_, MutexContender::GenerateHostContenderId(), weak);
  SIMBA_ASSIGN_OR_RETURN(core_, factory.CreateContendCore(std::move(contender), lease,
                                                          std::move(hooks)));
  return core_;
}

class LeaseKeyedLockBackend final : public KeyedLockBackend,
                                    public std::enable_shared_from_this<LeaseKeyedLockBackend> {
 public:
  LeaseKeyedLockBackend(std::shared_ptr<FactoryImpl> factory, ContendOptions lease)
      : factory_(std::move(factory)), lease_(lease) {
    const Capabilities& store = factory_->backend()->capabilities();
    capabilities_.mechanism = "lease on the store's mutexes (fencing: " + store.fencing_source + ")";
    capabilities_.cross_process = store.cross_process;
    capabilities_.fencing_tokens = true;
    capabilities_.fifo = store.fifo;
    capabilities_.push_handoff = store.push_release;
    capabilities_.freed_with_session = store.ends_with_session;
    capabilities_.max_key_length = store.max_mutex_length;
    capabilities_.reports_holds = true;
  }

  std::string_view scheme() const override { return factory_->backend()->scheme(); }
  const KeyedLockCapabilities& capabilities() const override { return capabilities_; }

  Status validate_key(std::string_view key) const override {
    SIMBA_RETURN_IF_ERROR(KeyedLockBackend::validate_key(key));
    // The store's own rules for names (ZooKeeper: no '/'), said of a key.
    const Status store = factory_->backend()->validate_mutex(key);
    if (!store.ok()) {
      return InvalidArgumentError("key '" + std::string(key) + "' cannot be held by the " +
                                  std::string(scheme()) + " store: " + store.message());
    }
    return OkStatus();
  }

  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override;

  // A user of `slot` (from Slot()) is done with it: when it was the last,
  // the key is idle (kept for its next hold, or forgotten).
  void Done(const std::shared_ptr<KeySlot>& slot) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(slot->key());
    if (it == slots_.end() || it->second.slot != slot || --it->second.users > 0) return;
    if (idle_ >= kMaxIdleKeys) {
      slots_.erase(it);
    } else {
      ++idle_;
    }
  }

 private:
  std::shared_ptr<Runtime> shared_runtime() const override { return factory_->runtime(); }

  // The slot of `key`, with one more user (until Done).
  std::shared_ptr<KeySlot> Slot(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = slots_[key];
    if (entry.slot == nullptr) {
      entry.slot = std::make_shared<KeySlot>(key);
    } else if (entry.users == 0) {
      --idle_;
    }
    ++entry.users;
    return entry.slot;
  }

  // A key's slot and how many acquisitions and holds use it; idle at 0.
  struct Entry {
    std::shared_ptr<KeySlot> slot;
    int users = 0;
  };

  const std::shared_ptr<FactoryImpl> factory_;
  const ContendOptions lease_;
  KeyedLockCapabilities capabilities_;
  std::mutex mu_;
  std::map<std::string, Entry, std::less<>> slots_;
  std::size_t idle_ = 0;
};

// One hold: the key's turn and its running core.
class LeaseKeyHold final : public KeyHold {
 public:
  LeaseKeyHold(std::shared_ptr<LeaseKeyedLockBackend> backend, std::shared_ptr<KeySlot> slot,
               std::shared_ptr<ServiceCore> core, std::uint64_t token)
      : backend_(std::move(backend)),
        slot_(std::move(slot)),
        core_(std::move(core)),
        token_(token) {}
  ~LeaseKeyHold() override { (void)release(Deadline::max()); }

  std::uint64_t fencing_token() const override { return token_; }
  Status release(Deadline) override {
    if (released_) return OkStatus();
    released_ = true;
    slot_->EndHold();
    // Bounded by the lease options' operation_timeout.
    Status stopped = core_->status() == ServiceStatus::kRunning ? core_->Stop() : OkStatus();
    slot_->EndTurn();
    backend_->Done(slot_);
    return stopped;
  }

 private:
  const std::shared_ptr<LeaseKeyedLockBackend> backend_;
  const std::shared_ptr<KeySlot> slot_;
  const std::shared_ptr<ServiceCore> core_;
  const std::uint64_t token_;
  bool released_ = false;
};

Result<std::unique_ptr<KeyHold>> LeaseKeyedLockBackend::acquire(const KeyAcquireRequest& request) {
  SIMBA_RETURN_IF_ERROR(validate_key(request.key));
  const std::shared_ptr<KeySlot> slot = Slot(std::string(request.key));
  if (Status turn = slot->TakeTurn(request.wait_deadline, request.cancel); !turn.ok()) {
    Done(slot);
    if (turn.code() == StatusCode::kDeadlineExceeded) return std::unique_ptr<KeyHold>();
    return turn;
  }
  Result<std::shared_ptr<ServiceCore>> core = slot->Core(*factory_, lease_);
  Status awaited = core.ok() ? (*core)->Start() : core.status();
  if (awaited.ok()) awaited = slot->AwaitOwner(**core, request.wait_deadline, request.cancel);
  if (awaited.ok()) {
    slot->BeginHold(request.on_lost);
    // Lost between the grant and BeginHold: the loss was not heard.
    if ((*core)->is_owner()) {
      return std::unique_ptr<KeyHold>(std::make_unique<LeaseKeyHold>(
          shared_from_this(), slot, *core, (*core)->fencing_token()));
    }
    slot->EndHold();
    awaited = DeadlineExceededError("key '" + slot->key() + "' was lost as it was granted");
  }
  // Give up our place: stopping releases the key if an attempt got it
  // meanwhile.
  if (core.ok() && (*core)->status() == ServiceStatus::kRunning) (void)(*core)->Stop();
  slot->EndTurn();
  Done(slot);
  if (awaited.code() == StatusCode::kDeadlineExceeded) return std::unique_ptr<KeyHold>();
  return awaited;
}

}  // namespace
}  // namespace internal

Result<std::shared_ptr<KeyedLockBackend>> NewLeaseKeyedLockBackend(
    std::shared_ptr<Backend> backend, ContendOptions lease, std::shared_ptr<Metrics> metrics,
    std::shared_ptr<LockEventListener> events) {
  if (backend == nullptr) return InvalidArgumentError("backend must not be null");
  SIMBA_RETURN_IF_ERROR(lease.Validate());
  FactoryOptions options;
  options.contend = lease;
  options.metrics = std::move(metrics);
  options.events = std::move(events);
  SIMBA_RETURN_IF_ERROR(internal::FactoryImpl::Validate(options));
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<internal::LeaseKeyedLockBackend>(
      std::make_shared<internal::FactoryImpl>(std::move(backend), std::move(options)), lease));
}

}  // namespace simba
