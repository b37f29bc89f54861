// A Backend decorator that injects failures, for tests (leveldb's
// EnvWrapper idea): calls can fail with kUnavailable or hang until their
// deadline (or until released), while everything else goes to the real store.
#ifndef SIMBA_TESTING_FAULT_INJECTING_BACKEND_H_
#define SIMBA_TESTING_FAULT_INJECTING_BACKEND_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "simba/backend.h"

namespace simba::testing {

class FaultInjectingBackend final : public Backend {
 public:
  enum class Mode {
    kPass,  // forward every call
    kFail,  // every call fails at once (kUnavailable, or set_failure_status)
    kHang,  // every call blocks until its deadline (then kDeadlineExceeded)
            // or until the mode changes (then it is forwarded)
  };

  explicit FaultInjectingBackend(std::shared_ptr<Backend> target);

  // Applies `mode` to every call.
  void set_mode(Mode mode);
  // Applies `mode` to acquire_or_renew only; other calls keep their mode.
  void set_acquire_mode(Mode mode);
  // Injected failures carry this retry_after() hint (nullopt: none), as a
  // store that knows when trying can succeed again would.
  void set_failure_retry_after(std::optional<std::chrono::milliseconds> delay);
  // What an injected failure returns (default kUnavailable "injected
  // failure": a store that cannot be reached); e.g. kPermissionDenied for a
  // store that refuses us.
  void set_failure_status(Status status);
  // Runs `action` once, inside the next acquire_or_renew, after the store
  // has answered and before the answer is returned: what happens while a
  // reply is on its way.
  void set_before_next_acquire_reply(std::function<void()> action);
  // Reports every lease acquire_or_renew grants to the caller `stretch`
  // longer than the store granted it (its ttl_at and transition_at moved
  // later; the store is untouched): a broken backend whose owner keeps
  // believing in a lease after the store has given the mutex to another.
  // The fault run's negative control (tests/faults) uses it. 0: off.
  void set_lease_stretch(std::chrono::milliseconds stretch);
  // Every acquire_or_renew that names the caller the owner carries `bound`
  // (OwnerRecord::bound), as a store that hands a hold over when a session
  // backing it ends would; null (the default): none.
  void set_hold_bound(std::shared_ptr<const HoldBound> bound);
  // While on, what the store pushes never reaches this backend's listeners
  // (a push channel not up yet, or down); push() still does.
  void set_store_pushes_lost(bool lost);
  // While on, release() and leave() fail at once with kDeadlineExceeded, as
  // if the network held them up past their deadline, and are kept: the store
  // gets them only when deliver_held_back() sends them (a request that
  // reaches the store after its caller gave up on it).
  void set_releases_held_back(bool held_back);
  // Sends the held-back calls to the store, oldest first; returns how many.
  int deliver_held_back();
  // Calls made so far, by kind.
  int acquire_calls() const { return acquire_calls_.load(); }
  // Of those, the ones asked AcquireRequest::once.
  int once_acquire_calls() const { return once_acquire_calls_.load(); }
  // Calls blocked in an injected hang right now.
  int hanging_calls() const { return hanging_calls_.load(); }
  int release_calls() const { return release_calls_.load(); }
  int leave_calls() const { return leave_calls_.load(); }
  // The fencing token the last release named (0: any ownership).
  std::uint64_t last_release_token() const { return last_release_token_.load(); }

  std::string_view scheme() const override { return target_->scheme(); }
  const Capabilities& capabilities() const override { return target_->capabilities(); }
  // Public calls run on this decorator, which checks the inputs by the
  // target's rules and forwards to the target's public calls.
  Status validate_store_mutex(std::string_view mutex) const override {
    return target_->validate_mutex(mutex);
  }
  Status validate_store_contender_id(std::string_view id) const override {
    return target_->validate_contender_id(id);
  }
  Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                          Deadline deadline) override;
  Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                            Deadline deadline) override;
  Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                          std::uint64_t fencing_token, Deadline deadline) override;
  Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) override;
  Status do_leave(std::string_view mutex, std::string_view contender_id,
                  Deadline deadline) override;
  Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) override;
  Result<std::vector<ListedMutex>> do_list(Deadline deadline) override;
  Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline) override;
  Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override;
  // Delivers `event` to every listener subscribed through this backend to
  // event.mutex, as a store's push would.
  void push(const MutexEvent& event);

 private:
  // Runs the action set for the next acquire reply (once) and returns the
  // lease stretch to apply to the reply.
  std::chrono::milliseconds after_acquire_reply();
  // OK to forward, or the injected error.
  Status gate(Mode FaultInjectingBackend::*which, Deadline deadline);
  // Keeps `call` for deliver_held_back() and returns true while releases are
  // held back.
  bool hold_back(std::function<void()> call);

  std::shared_ptr<Backend> target_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Mode mode_ = Mode::kPass;
  Mode acquire_mode_ = Mode::kPass;
  std::optional<std::chrono::milliseconds> failure_retry_after_;
  Status failure_status_ = unavailable_error("injected failure");
  std::function<void()> before_next_acquire_reply_;
  std::chrono::milliseconds lease_stretch_{0};
  std::shared_ptr<const HoldBound> hold_bound_;
  std::atomic<int> acquire_calls_{0};
  std::atomic<int> once_acquire_calls_{0};
  std::atomic<int> hanging_calls_{0};
  std::atomic<int> release_calls_{0};
  std::atomic<int> leave_calls_{0};
  bool releases_held_back_ = false;
  std::vector<std::function<void()>> held_back_;
  std::atomic<std::uint64_t> last_release_token_{0};
  // Listeners by mutex, for push().
  std::shared_ptr<struct FaultListeners> listeners_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_FAULT_INJECTING_BACKEND_H_
