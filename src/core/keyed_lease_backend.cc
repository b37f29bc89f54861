// Keyed locks over any contention backend (simba/backend.h): a hold of a key
// is a Locker on the mutex of that name, under a contender id of its own. The
// Locker brings everything the store offers: one round trip to take a free
// key, push hand-off, a lease renewed while held (so a crashed holder's key
// frees itself), fencing tokens, and loss signals.
#include <algorithm>
#include <utility>

#include "simba/keyed_backend.h"
#include "simba/locker.h"

namespace simba {
namespace {

class LeaseKeyHold final : public KeyHold {
 public:
  LeaseKeyHold(std::shared_ptr<MutexContendServiceFactory> factory, std::unique_ptr<Locker> locker)
      : factory_(std::move(factory)), locker_(std::move(locker)) {}
  // ~Locker releases what is still held.
  std::uint64_t fencing_token() const override { return token_; }
  Status release(Deadline) override {
    // The Locker bounds its release by the lease options' operation_timeout.
    return locker_->release();
  }
  void set_token(std::uint64_t token) { token_ = token; }

 private:
  // The factory must outlive its Locker (declared first: destroyed last).
  const std::shared_ptr<MutexContendServiceFactory> factory_;
  std::unique_ptr<Locker> locker_;
  std::uint64_t token_ = 0;
};

class LeaseKeyedLockBackend final : public KeyedLockBackend {
 public:
  LeaseKeyedLockBackend(std::shared_ptr<MutexContendServiceFactory> factory, ContendOptions lease)
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

  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override {
    SIMBA_RETURN_IF_ERROR(validate_key(request.key));
    LockerOptions options;
    options.contend = lease_;
    options.on_lost = request.on_lost;
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<Locker> locker,
                           Locker::create(*factory_, std::string(request.key), options));
    Status acquired;
    if (request.wait_deadline == Deadline::max()) {
      acquired = locker->acquire(request.cancel);
    } else {
      // Rounded up: never give up before the deadline.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          request.wait_deadline - std::chrono::steady_clock::now());
      acquired = locker->acquire(std::max(left, std::chrono::milliseconds(0)), request.cancel);
    }
    if (acquired.code() == StatusCode::kDeadlineExceeded) return std::unique_ptr<KeyHold>();
    // (On any error the Locker has stopped contending; destroying it
    // releases an acquisition that landed meanwhile.)
    SIMBA_RETURN_IF_ERROR(acquired);
    const std::uint64_t token = locker->fencing_token();
    auto hold = std::make_unique<LeaseKeyHold>(factory_, std::move(locker));
    hold->set_token(token);
    return std::unique_ptr<KeyHold>(std::move(hold));
  }

 private:
  const std::shared_ptr<MutexContendServiceFactory> factory_;
  const ContendOptions lease_;
  KeyedLockCapabilities capabilities_;
};

}  // namespace

Result<std::shared_ptr<KeyedLockBackend>> NewLeaseKeyedLockBackend(
    std::shared_ptr<Backend> backend, ContendOptions lease, std::shared_ptr<Metrics> metrics,
    std::shared_ptr<LockEventListener> events) {
  if (backend == nullptr) return InvalidArgumentError("backend must not be null");
  SIMBA_RETURN_IF_ERROR(lease.Validate());
  FactoryOptions options;
  options.contend = lease;
  options.metrics = std::move(metrics);
  options.events = std::move(events);
  SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<MutexContendServiceFactory> factory,
                         MutexContendServiceFactory::create(std::move(backend), options));
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<LeaseKeyedLockBackend>(
      std::shared_ptr<MutexContendServiceFactory>(std::move(factory)), lease));
}

}  // namespace simba
