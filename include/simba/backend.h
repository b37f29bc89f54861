// File: simba/backend.h
//
// The storage interface every store implements (the SPI). It is small on
// purpose: the protocol (when to renew, when to contend, lease deadlines,
// callbacks) lives once in the core; a backend answers a few atomic
// questions about one mutex and declares what it can do.
//
// The hot path (what contend and retrieval services call):
//   acquire_or_renew  take the mutex if its hard lease is over (or renew it if
//                     the caller already owns it) and return the owner
//                     afterwards, with the store's time and fencing token
//   release           free the mutex if the caller owns it
//   read              the current owner, without changing anything
//   subscribe         optional push: tell me when a mutex is released
// Operator calls (for `simba status`, `simba release`, the dashboard; never
// on the hot path):
//   list              every mutex the store holds
//   waiters           optional: who waits for a mutex
//   force_release     free a stuck mutex whoever owns it
//
// The public calls are not virtual: each checks its inputs once (names,
// ttl and transition, the listener) and then calls the store's protected
// do_* virtual, which can rely on valid inputs. A store adds its own name
// rules through validate_store_mutex / validate_store_contender_id and its
// lease limits through Capabilities.
//
// Every call takes a deadline on the real monotonic clock and must return by
// it (kDeadlineExceeded or kUnavailable) even if the store hangs.
//
// A backend is shared by all services of a factory and must be thread-safe.
// See docs/backends.md for how to write one.

#ifndef SIMBA_BACKEND_H_
#define SIMBA_BACKEND_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
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
  // waiters() lists who waits (the store keeps a wait queue). Otherwise
  // waiters() is kUnimplemented for every name, and do_waiters is never
  // called.
  bool lists_waiters = false;
  // renew() renews many leases in one store call: the core then sends a
  // factory's renewals together (see RenewalBatcher), O(1) calls per
  // renewal period instead of one per held lease.
  bool batch_renewals = false;
  // Where the fencing token comes from, for docs and `simba status`.
  std::string fencing_source;
  // How this backend reaches its store, for `simba status` and the
  // dashboard: "in process", "local file", "plain text", or
  // TlsOptions::describe() ("TLS (verify)", ...). Never a path or secret.
  std::string transport = "plain text";
  // What a failover of the store's replication (a standby promoted, a new
  // leader) keeps of the guarantees, for docs and `simba status`; empty when
  // the backend has nothing to say (one server, or a consensus store that
  // keeps them all; etcd 3.4 says what a stalled leader may break).
  std::string failover{};
  // Limits a name must respect (bytes).
  std::size_t max_mutex_length = 255;
  std::size_t max_contender_id_length = 128;
  // Limits of AcquireRequest::ttl and ::transition. The default only keeps
  // now + ttl + transition from overflowing 64-bit milliseconds (now is
  // about 2^41); no real lease comes close.
  std::chrono::milliseconds max_ttl{std::numeric_limits<std::int64_t>::max() / 4};
  std::chrono::milliseconds max_transition{std::numeric_limits<std::int64_t>::max() / 4};
};

// A second bound on believing one's own hold, beside its lease, for a store
// that can hand a hold over before its lease ends: PostgreSQL and MySQL take
// over a tenure whose holder's session (the one holding its wait-line lock)
// has ended, a grace after they saw it end. The holder's backend keeps
// moving until() forward while it hears from that session; the core believes
// the hold only while the real monotonic clock is before until(), checked
// each time it is asked, so a holder that was paused (or cut off) stops
// believing the moment it runs again. Once it has passed, the tenure is over
// for good: the backend reports the loss (MutexEvent::kLost) and the core
// never believes that tenure again, even if a later renewal names it.
class HoldBound {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // max(): not bounded yet (the tenure does not depend on a session).
  TimePoint until() const { return TimePoint(TimePoint::duration(until_.load())); }
  bool passed(TimePoint now) const { return now >= until(); }
  // The backend's side: believed until `until` from now on.
  void set_until(TimePoint until) { until_.store(until.time_since_epoch().count()); }

 private:
  std::atomic<TimePoint::rep> until_{TimePoint::max().time_since_epoch().count()};
};

// The owner of a mutex together with the store's time when it was read, so
// the caller can measure the lease left without comparing clocks.
struct OwnerRecord {
  MutexOwner owner;
  StoreTime store_now{0};
  // Set when the store cannot know when another owner's hold ends (a
  // ZooKeeper participant of JVM Simba, whose session is its lease; the
  // owner ahead of an etcd waiter). The owner's ttl_at and transition_at
  // are then 0 ("unknown"), never invented: the owner holds the mutex until
  // the store says otherwise (a pushed release, a later answer). The value
  // is the store time by which a contender must call acquire_or_renew again
  // for the store's sake (an etcd waiter keeps its own key's lease alive by
  // calling); the core comes back before it, with its own margin and
  // jitter (ContendPeriod). From read(), list() and force_release() it is
  // the store's now: only the "unknown" matters there.
  // Never set for the caller's own ownership, whose times are always known.
  std::optional<StoreTime> ask_again_at{};
  // For the caller's own hold only, and only where the store can hand the
  // hold over before its lease ends (see HoldBound); null: the lease alone.
  // A renewal answered without one keeps the bound its acquisition gave.
  std::shared_ptr<const HoldBound> bound{};

  // The owner's times are unknown (see ask_again_at).
  bool owner_times_unknown() const { return ask_again_at.has_value(); }
  // Somebody holds the mutex at store_now: its hard lease has not ended,
  // or its times are unknown and the store names an owner.
  bool held() const {
    return owner.has_owner_id() && (owner_times_unknown() || owner.has_owner(store_now));
  }
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
  // The caller asks once and will not wait (Locker::try_acquire): a
  // backend that queues a refused contender for a push (a wait line) need
  // not, since nobody would wait in that place; the answer is the same.
  bool once = false;
};

// What an operator's forced release did.
struct ForcedRelease {
  // The owner that was removed (MutexOwner::none() if the mutex was free).
  // Its ttl_at and transition_at are 0 when the store could not know them
  // (a ZooKeeper participant of JVM Simba).
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
  // kReleased: the backend already holds the answer to this contender's
  // next attempt (a hold a wait line took for it as its lock was granted),
  // so the contender's service may ask on the delivering thread: no round
  // trip, one thread hop less. Empty: ask as usual.
  std::string answered_for{};
};

// One line of what `simba doctor` found about a store (StoreReport).
struct StoreFinding {
  enum class Severity {
    kOk,      // a fact, nothing to do ("server: Redis 7.0.15")
    kNote,    // works, with a trade-off the operator should know
    kUnsafe,  // a guarantee of DESIGN §2 is at risk in this deployment
  };
  Severity severity = Severity::kOk;
  // What it is about: "server", "topology", "primary", "members",
  // "transport", "durability", "clock", "pooler", ...
  std::string topic;
  // One line, for people. Never a password, token or key.
  std::string text;
};

// "ok", "note", "unsafe".
const char* severity_name(StoreFinding::Severity severity);

// What a store is and how it is deployed, as far as the backend can tell by
// asking it (Backend::inspect). Findings in the order the backend found them.
struct StoreReport {
  std::vector<StoreFinding> findings;

  void add(StoreFinding::Severity severity, std::string topic, std::string text) {
    findings.push_back(StoreFinding{severity, std::move(topic), std::move(text)});
  }
  // Whether any finding is kUnsafe.
  bool unsafe() const;
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

  // Checks a mutex name: non-empty valid UTF-8 without control characters,
  // up to capabilities().max_mutex_length bytes, then the store's own rules
  // (validate_store_mutex). Errors are kInvalidArgument and name the
  // parameter ("mutex"). Every call below runs it; the factory runs it too,
  // to refuse a service up front.
  Status validate_mutex(std::string_view mutex) const;
  // The same for a contender id ("contender_id").
  Status validate_contender_id(std::string_view contender_id) const;

  // ---- the hot path ------------------------------------------------------

  // Atomically: if the mutex is free or its hard lease has ended (by the
  // store's clock), make `contender_id` the owner with a new fencing token;
  // if `contender_id` already owns it and its hard lease has not ended, renew
  // it keeping the token; otherwise change nothing. In every case return the
  // owner afterwards and the store's time of the decision.
  // On success: owner.ttl_at = now + ttl, transition_at = now + ttl +
  // transition. Another owner's times are its real lease, or unknown with
  // ask_again_at set (see OwnerRecord).
  // Checks: both names, ttl positive, transition not negative, each within
  // capabilities().max_ttl / max_transition (kInvalidArgument naming it).
  Result<OwnerRecord> acquire_or_renew(const AcquireRequest& request, Deadline deadline);

  // Renews each of `requests` whose contender owns its mutex with a hard
  // lease that has not ended (by the store's clock), as acquire_or_renew
  // does for such an owner: the token kept, ttl_at = now + ttl (never
  // earlier than before), transition_at = ttl_at + transition. A request
  // whose contender does not own its mutex (any more) changes nothing and
  // acquires nothing, even a free mutex: its answer names the owner the
  // store has. One answer per request, in their order, each with the
  // store's time of the decision; a store error fails them all. Called
  // only when capabilities().batch_renewals; inputs are checked as by
  // acquire_or_renew. A store may split a long list into several calls.
  Result<std::vector<OwnerRecord>> renew(const std::vector<AcquireRequest>& requests,
                                         Deadline deadline);

  // Frees the mutex if `contender_id` owns it (whatever its lease times)
  // and, unless `fencing_token` is 0, only if its ownership is the one that
  // token was given to. Returns whether it did. Push-capable stores notify
  // waiters.
  //
  // The token matters when a release arrives late: a request held up in the
  // network after its caller gave up on it may reach the store after the
  // same contender acquired the mutex again, and must not end that newer
  // ownership (the fault runs caught exactly this; docs/reliability.md).
  Result<bool> release(std::string_view mutex, std::string_view contender_id,
                       std::uint64_t fencing_token, Deadline deadline);
  // Any ownership of `contender_id` (fencing_token 0).
  Result<bool> release(std::string_view mutex, std::string_view contender_id, Deadline deadline) {
    return release(mutex, contender_id, 0, deadline);
  }

  // Withdraws `contender_id` from waiting for `mutex`: what its waiting left
  // at the store goes (its place in a wait queue), and never an ownership it
  // was given by another request. A contend service that stops owning
  // nothing it knows of sends this, not a release naming no token: sent by a
  // waiter that gave up during a partition, it may reach the store after the
  // heal, when the same contender id has acquired again (a clustered lock's
  // next hold, a keyed lease's next core), and a release there would end
  // that ownership (the clustered fault runs on PostgreSQL caught it;
  // docs/reliability.md). An acquisition of its own still in flight is
  // given back by its token when its answer comes.
  // Stores whose queue entry becomes the ownership when it is first in line
  // (etcd, ZooKeeper) remove the entry this backend made for the contender:
  // a later acquisition makes a new entry, which this leaves alone.
  // The default does nothing: a store where waiters leave no trace.
  Status leave(std::string_view mutex, std::string_view contender_id, Deadline deadline);

  // The current owner (MutexOwner::none() for an unknown or free mutex).
  Result<OwnerRecord> read(std::string_view mutex, Deadline deadline);

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
  Result<std::unique_ptr<Subscription>> subscribe(std::string_view mutex,
                                                  std::string_view contender_id,
                                                  std::function<void(const MutexEvent&)> listener);
  // The same for a retriever (no contender id).
  Result<std::unique_ptr<Subscription>> subscribe(std::string_view mutex,
                                                  std::function<void(const MutexEvent&)> listener) {
    return subscribe(mutex, std::string_view(), std::move(listener));
  }

  // ---- operator calls ----------------------------------------------------
  // For `simba status`, `simba release` and the dashboard: never called by
  // the services, so a store may make them as slow (full scans, one lease
  // lookup per mutex) as it needs.

  // Every mutex the store has a record of, free ones included.
  Result<std::vector<ListedMutex>> list(Deadline deadline);

  // The contenders waiting for `mutex`, first in line first, on stores that
  // keep a wait queue (capabilities().lists_waiters). Stores where waiters
  // just poll and leave no trace answer kUnimplemented, whatever the name.
  Result<std::vector<std::string>> waiters(std::string_view mutex, Deadline deadline);

  // An operator's release of a stuck lease: frees the mutex whoever owns it
  // and bumps its fencing counter, so the next owner's token exceeds
  // `fencing_floor` and every token the old holder was given. Push-capable
  // stores notify waiters. The old holder learns at its next renewal, or at
  // once on stores that push kLost with `forced` (memory, ZooKeeper, etcd).
  Result<ForcedRelease> force_release(std::string_view mutex, Deadline deadline);

  // For `simba doctor`: asks the store what it is and how it is deployed
  // (server version, topology and primary, members, TLS, durability
  // settings) and says what of that puts a guarantee at risk. Store errors
  // as for every call (kUnavailable naming the store, ...). Every report
  // starts with the transport (capabilities().transport).
  Result<StoreReport> inspect(Deadline deadline);

 protected:
  // A store's own name rules, after the default ones passed (Redis refuses
  // '{', '}' and "@@", ZooKeeper '/'). kInvalidArgument naming the
  // parameter. The defaults accept everything.
  virtual Status validate_store_mutex(std::string_view mutex) const;
  virtual Status validate_store_contender_id(std::string_view contender_id) const;
  // acquire_or_renew's checks of a request.
  Status check_request(const AcquireRequest& request) const;

  // The calls above, with their inputs already checked.
  virtual Result<OwnerRecord> do_acquire_or_renew(const AcquireRequest& request,
                                                  Deadline deadline) = 0;
  virtual Result<bool> do_release(std::string_view mutex, std::string_view contender_id,
                                  std::uint64_t fencing_token, Deadline deadline) = 0;
  // The default: kUnimplemented (capabilities().batch_renewals is false).
  virtual Result<std::vector<OwnerRecord>> do_renew(const std::vector<AcquireRequest>& requests,
                                                    Deadline deadline);
  virtual Result<OwnerRecord> do_read(std::string_view mutex, Deadline deadline) = 0;
  // The default: OK, nothing done (waiters leave no trace).
  virtual Status do_leave(std::string_view mutex, std::string_view contender_id, Deadline deadline);
  // The default: kUnimplemented (no push).
  virtual Result<std::unique_ptr<Subscription>> do_subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener);

  virtual Result<std::vector<ListedMutex>> do_list(Deadline deadline) = 0;
  // Called only when capabilities().lists_waiters. The default:
  // kUnimplemented.
  virtual Result<std::vector<std::string>> do_waiters(std::string_view mutex, Deadline deadline);
  virtual Result<ForcedRelease> do_force_release(std::string_view mutex, Deadline deadline) = 0;
  // Adds the store's own findings to `report` (which has the transport
  // already). The default adds nothing: a store that cannot be asked.
  virtual Status do_inspect(StoreReport& report, Deadline deadline);
};

// Checks `name` (the parameter `what`) against the default rules of
// Backend::validate_mutex: non-empty, at most `max_length` bytes, valid
// UTF-8, no control characters.
Status validate_name(std::string_view what, std::string_view name, std::size_t max_length);

}  // namespace simba

#endif  // SIMBA_BACKEND_H_
