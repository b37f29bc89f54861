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
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "core/service_core.h"
#include "core/worker.h"
#include "simba/keyed_backend.h"

namespace simba {
namespace internal {
namespace {

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

  // The provider's threads that want the key take turns in arrival order.
  TurnGate& turns() { return turns_; }

  // The core, made on first use; its callbacks reach this slot weakly.
  Result<std::shared_ptr<ServiceCore>> core(FactoryImpl& factory, const ContendOptions& lease);

  // For the contender: the ownership of token `token` ended without our
  // release.
  void on_released(std::uint64_t token) {
    std::function<void()> lost;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A release of ours, no hold yet, or the end of an earlier hold (its
      // stop() does not wait for this callback): tokens only grow, so an
      // earlier hold's is below this one's. (Not "differs": a renewal that
      // came back with a new token keeps the hold, and its end is a loss.)
      if (!held_->load() || token < hold_token_) return;
      held_->store(false);
      lost = std::move(on_lost_);
    }
    if (lost) lost();
  }

  // The hold of token `token` begins: its loss from now on runs `on_lost`.
  void begin_hold(std::uint64_t token, std::function<void()> on_lost) {
    std::lock_guard<std::mutex> lock(mu_);
    held_->store(true);
    hold_token_ = token;
    on_lost_ = std::move(on_lost);
  }
  // The hold ends by release: a loss is no longer reported.
  void end_hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_->store(false);
    on_lost_ = nullptr;
  }

 private:
  const std::string key_;
  TurnGate turns_;
  mutable std::mutex mu_;
  // Whether a hold is on. Written under mu_ (with hold_token_); atomic and
  // shared because the core's notify_if filter reads it without mu_, under
  // the core's lock, and may outlive the slot.
  const std::shared_ptr<std::atomic<bool>> held_ = std::make_shared<std::atomic<bool>>(false);
  std::uint64_t hold_token_ = 0;
  std::function<void()> on_lost_;
  std::shared_ptr<ServiceCore> core_;  // made on first use, under mu_
};

Result<std::shared_ptr<ServiceCore>> KeySlot::core(FactoryImpl& factory,
                                                   const ContendOptions& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (core_ != nullptr) return core_;
  // The contender hears only that the hold ended.
  auto contender =
      make_contender(key_, nullptr, [weak = weak_from_this()](const MutexState& state) {
        if (auto slot = weak.lock()) slot->on_released(state.before.fencing_token);
      });
  ServiceHooks hooks;
  hooks.subscribe_only_while_waiting = true;
  hooks.stop_waits_for_callbacks = false;
  // Only a hold that ends without our release is news (as for a Locker):
  // the other changes of every acquisition would each wake a callback
  // thread for nothing.
  hooks.notify_if = ServiceHooks::lost_while(contender->contender_id(), held_);
  SIMBA_ASSIGN_OR_RETURN(
      core_, factory.create_contend_core(std::move(contender), lease, std::move(hooks)));
  return core_;
}

class LeaseKeyedLockBackend final : public KeyedLockBackend,
                                    public std::enable_shared_from_this<LeaseKeyedLockBackend> {
 public:
  LeaseKeyedLockBackend(std::shared_ptr<FactoryImpl> factory, ContendOptions lease)
      : factory_(std::move(factory)), lease_(lease) {
    const Capabilities& store = factory_->backend()->capabilities();
    capabilities_.mechanism =
        "lease on the store's mutexes (fencing: " + store.fencing_source + ")";
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
      return invalid_argument_error("key '" + std::string(key) + "' cannot be held by the " +
                                    std::string(scheme()) + " store: " + store.message());
    }
    return ok_status();
  }

  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override;

  // A user of `slot` (from Slot()) is done with it: when it was the last,
  // the key is idle (kept for its next hold, or forgotten).
  void done(const std::shared_ptr<KeySlot>& slot) {
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
  std::shared_ptr<KeySlot> slot_for(const std::string& key) {
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
               TurnGate::Turn turn, std::shared_ptr<ServiceCore> core)
      : backend_(std::move(backend)),
        slot_(std::move(slot)),
        turn_(std::move(turn)),
        core_(std::move(core)),
        token_(core_->fencing_token()) {}
  ~LeaseKeyHold() override { (void)release(Deadline::max()); }

  std::uint64_t fencing_token() const override { return token_; }
  // The core's lease, read now: its loss callback may still be on its way.
  bool is_held() const override { return core_->fencing_token() == token_; }
  Status release(Deadline) override {
    if (!turn_.taken()) return ok_status();
    slot_->end_hold();
    // Bounded by the lease options' operation_timeout.
    Status stopped = core_->status() == ServiceStatus::kRunning ? core_->stop() : ok_status();
    turn_.release();
    backend_->done(slot_);
    return stopped;
  }

 private:
  const std::shared_ptr<LeaseKeyedLockBackend> backend_;
  const std::shared_ptr<KeySlot> slot_;
  TurnGate::Turn turn_;  // given back by release()
  const std::shared_ptr<ServiceCore> core_;
  const std::uint64_t token_;
};

Result<std::unique_ptr<KeyHold>> LeaseKeyedLockBackend::acquire(const KeyAcquireRequest& request) {
  SIMBA_RETURN_IF_ERROR(validate_key(request.key));
  const std::shared_ptr<KeySlot> slot = slot_for(std::string(request.key));
  TurnGate::Turn turn = slot->turns().take(request.wait_deadline, request.cancel);
  Status awaited = turn.taken()                      ? ok_status()
                   : request.cancel.stop_requested() ? cancelled_error("cancelled")
                                                     : deadline_exceeded_error("held here");
  std::shared_ptr<ServiceCore> core;
  if (awaited.ok()) {
    Result<std::shared_ptr<ServiceCore>> made = slot->core(*factory_, lease_);
    // The first attempt on this thread, which would only wait for it (one
    // thread hop less), unless a cancel may end the wait before the store
    // call does.
    if (made.ok()) core = *made;
    awaited = made.ok() ? core->start_for(request.cancel) : made.status();
  }
  if (awaited.ok()) awaited = core->await_owner(request.wait_deadline, request.cancel);
  if (awaited.ok()) {
    const std::uint64_t token = core->fencing_token();
    slot->begin_hold(token, request.on_lost);
    // Lost between the grant and begin_hold: the loss was not heard.
    if (token != 0 && core->is_owner()) {
      return std::unique_ptr<KeyHold>(
          std::make_unique<LeaseKeyHold>(shared_from_this(), slot, std::move(turn), core));
    }
    slot->end_hold();
    awaited = deadline_exceeded_error("key '" + slot->key() + "' was lost as it was granted");
  }
  // Give up our place: stopping leaves the wait, and an attempt that got
  // the key meanwhile gives it back by its token when its answer comes.
  if (core != nullptr && core->status() == ServiceStatus::kRunning) (void)core->stop();
  turn.release();
  done(slot);
  if (awaited.code() == StatusCode::kCancelled) {
    return cancelled_error("acquiring key '" + slot->key() + "' was cancelled");
  }
  if (awaited.code() == StatusCode::kDeadlineExceeded) return std::unique_ptr<KeyHold>();
  return awaited.with_context("key '" + slot->key() + "'");
}

}  // namespace
}  // namespace internal

Result<std::shared_ptr<KeyedLockBackend>> new_lease_keyed_lock_backend(
    std::shared_ptr<Backend> backend, ContendOptions lease, std::shared_ptr<Metrics> metrics,
    std::shared_ptr<LockEventListener> events) {
  if (backend == nullptr) return invalid_argument_error("backend must not be null");
  SIMBA_RETURN_IF_ERROR(lease.validate());
  FactoryOptions options;
  options.contend = lease;
  options.metrics = std::move(metrics);
  options.events = std::move(events);
  SIMBA_RETURN_IF_ERROR(internal::FactoryImpl::validate(options));
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<internal::LeaseKeyedLockBackend>(
      std::make_shared<internal::FactoryImpl>(std::move(backend), std::move(options)), lease));
}

}  // namespace simba
