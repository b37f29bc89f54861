// File: simba/backend.h
//
// The storage interface every store implements (the SPI). It is small on
// purpose: the protocol (when to renew, when to contend, lease deadlines,
// callbacks) lives once in the core; a backend answers a few atomic
// questions about one mutex and declares what it can do.
//
//   acquire_or_renew  take the mutex if its hard lease is over (or renew it if
//                     the caller already owns it) and return the owner
//                     afterwards, with the store's time and fencing token
//   release           free the mutex if the caller owns it
//   read              the current owner, without changing anything
//   list              every mutex the store holds (for `simba status`)
//   waiters           optional: who waits for a mutex (for the dashboard)
//   subscribe         optional push: tell me when a mutex is released
//
// Every call takes a deadline on the real monotonic clock and must return by
// it (kDeadlineExceeded or kUnavailable) even if the store hangs.
//
// A backend is shared by all services of a factory and must be thread-safe.
// See docs/backends.md for how to write one.

#ifndef SIMBA_BACKEND_H_
#define SIMBA_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "simba/mutex_owner.h"
#include "simba/status.h"

namespace simba {

// A deadline for one store call, on the real monotonic clock.
using Deadline = std::chrono::steady_clock::time_point;

// What a backend can do; the core and the conformance suite read this.
struct Capabilities {
  // subscribe() delivers releases, so waiters move at once instead of at
  // their next poll.
  bool push_release = false;
  // Several processes (on one host at least) can share a mutex.
  bool cross_process = false;
  // Waiters get the mutex in the order they first asked (a queue at the
  // store), not whoever asks first after a release.
  bool fifo = false;
  // A holder's process dying ends its hold as soon as the store notices its
  // session is gone, not only when the lease runs out.
  bool ends_with_session = false;
  // Where the fencing token comes from, for docs and `simba status`.
  std::string fencing_source;
  // Limits a name must respect (bytes).
  std::size_t max_mutex_length = 255;
  std::size_t max_contender_id_length = 128;
};

// The owner of a mutex together with the store's time when it was read, so
// the caller can measure the lease left without comparing clocks.
struct OwnerRecord {
  MutexOwner owner;
  StoreTime store_now{0};
};

// One mutex as listed by list().
struct ListedMutex {
  std::string mutex;
  OwnerRecord record;
};

struct AcquireRequest {
  std::string_view mutex;
  std::string_view contender_id;
  std::chrono::milliseconds ttl;
  std::chrono::milliseconds transition;
};

// What an operator's forced release did.
struct ForcedRelease {
  // The owner that was removed (MutexOwner::None() if the mutex was free).
  MutexOwner previous;
  // Every later acquisition of the mutex gets a token greater than this
  // (and this is greater than previous.fencing_token): tell the protected
  // resource, and it can reject the old holder's writes at once.
  std::uint64_t fencing_floor = 0;
  StoreTime store_now{0};
};

// A push notification about one mutex.
struct MutexEvent {
  enum class Kind {
    kReleased,  // the owner released it: waiters should try now
    kAcquired,  // `owner_id` acquired it
    // The store ended a hold before its lease said so: a session or lease
    // was lost, the connection was cut, an operator forced a release. An
    // owner this matches stops believing it owns the mutex at once (and
    // contends again) instead of waiting for its next renewal or its lease
    // deadline. `owner_id` empty matches every owner; `fencing_token` 0
    // matches every tenure, otherwise only the one that token was given to.
    kLost,
  };
  Kind kind;
  std::string mutex;
  std::string owner_id;
  std::uint64_t fencing_token = 0;
  // kLost: the store knows the hold was taken away (force_release, a deleted
  // key or node) rather than ended by its lease. Only for metrics and
  // events (LossCause::kForcedRelease); the core acts the same either way.
  bool forced = false;
};

// Ends a subscription when destroyed. After the destructor returns the
// listener is not called again.
class Subscription {
 public:
  virtual ~Subscription() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "memory", "sqlite", ...
  virtual std::string_view scheme() const = 0;
  virtual const Capabilities& capabilities() const = 0;

  // Checks a mutex name against this store's rules. The default accepts
  // non-empty valid UTF-8 without control characters, up to
  // capabilities().max_mutex_length bytes. Errors are kInvalidArgument and
  // name the parameter ("mutex").
  virtual Status validate_mutex(std::string_view mutex) const;
  // The same for a contender id ("contender_id").
  virtual Status validate_contender_id(std::string_view contender_id) const;

  // Atomically: if the mutex is free or its hard lease has ended (by the
  // store's clock), make `contender_id` the owner with a new fencing token;
  // if `contender_id` already owns it and its hard lease has not ended, renew
  // it keeping the token; otherwise change nothing. In every case return the
  // owner afterwards and the store's time of the decision.
  // On success: owner.ttl_at = now + ttl, transition_at = now + ttl +
  // transition.
  virtual Result<OwnerRecord> acquire_or_renew(const AcquireRequest& request,
                                               Deadline deadline) = 0;

  // Frees the mutex if `contender_id` owns it (whatever its lease times)
  // and, unless `fencing_token` is 0, only if its ownership is the one that
  // token was given to. Returns whether it did. Push-capable stores notify
  // waiters.
  //
  // The token matters when a release arrives late: a request held up in the
  // network after its caller gave up on it may reach the store after the
  // same contender acquired the mutex again, and must not end that newer
  // ownership (the fault runs caught exactly this; docs/reliability.md).
  virtual Result<bool> release(std::string_view mutex, std::string_view contender_id,
                               std::uint64_t fencing_token, Deadline deadline) = 0;
  // Any ownership of `contender_id` (fencing_token 0).
  Result<bool> release(std::string_view mutex, std::string_view contender_id,
                       Deadline deadline) {
    return release(mutex, contender_id, 0, deadline);
  }

  // An operator's release of a stuck lease: frees the mutex whoever owns it
  // and bumps its fencing counter, so the next owner's token exceeds
  // `fencing_floor` and every token the old holder was given. Push-capable
  // stores notify waiters. The old holder learns at its next renewal, or at
  // once on stores that push kLost with `forced` (memory, ZooKeeper, etcd).
  virtual Result<ForcedRelease> force_release(std::string_view mutex, Deadline deadline) = 0;

  // The current owner (MutexOwner::None() for an unknown or free mutex).
  virtual Result<OwnerRecord> read(std::string_view mutex, Deadline deadline) = 0;

  // Every mutex the store has a record of, free ones included.
  virtual Result<std::vector<ListedMutex>> list(Deadline deadline) = 0;

  // The contenders waiting for `mutex`, first in line first, on stores that
  // keep a wait queue (for the dashboard). The default, for stores where
  // waiters just poll and leave no trace, is kUnimplemented.
  virtual Result<std::vector<std::string>> waiters(std::string_view mutex, Deadline deadline);

  // Push: calls `listener` (on any thread; it must not block) when `mutex`
  // changes hands. Backends without push return kUnimplemented; the core then
  // relies on polling.
  //
  // `contender_id` is the subscribing contender (empty for a retriever).
  // Stores that hand a released mutex to one waiter at a time (Redis wakes
  // the oldest live waiter, not all of them) address that waiter by its id;
  // others ignore it. A contender must subscribe before its first
  // acquire_or_renew (as a contend service does), or ask again once
  // subscribed (as a keyed lease does), or it may miss its wake-up.
  virtual Result<std::unique_ptr<Subscription>> subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener);
  // The same for a retriever (no contender id).
  Result<std::unique_ptr<Subscription>> subscribe(
      std::string_view mutex, std::function<void(const MutexEvent&)> listener) {
    return subscribe(mutex, std::string_view(), std::move(listener));
  }
};

// Checks `name` (the parameter `what`) against the default rules used by
// Backend::validate_mutex: non-empty, at most `max_length` bytes, valid
// UTF-8, no control characters.
Status ValidateName(std::string_view what, std::string_view name,
                    std::size_t max_length);

}  // namespace simba

#endif  // SIMBA_BACKEND_H_
