// File: simba/clustered_lock.h
//
// Asynchronous clustered locks (Infinispan's ClusteredLock API) on every
// store: locks owned by a process ("node"), whose every operation returns a
// future or takes a completion callback, so no caller has to park a thread.
//
//   ClusteredLockManager   one per node and store: define/get/remove locks
//   ClusteredLock          lock(), try_lock(), try_lock(timeout), unlock(),
//                          is_locked(), is_locked_by_me()
//
// Semantics (the same on every store):
// * A lock is owned by the NODE (the manager), not by a thread or a call:
//   any thread of the node may unlock() it, and unlock() by a node that does
//   not hold it resolves to false.
// * Non-reentrant, like Infinispan: a lock() from the node that holds the lock
//   waits until it is unlocked.
// * Within a node, waiting lock()/try_lock(timeout) calls queue FIFO and
//   resolve one at a time; the node contends for the lock at the store with
//   one contender (the node id), not one per call. Across nodes the order is
//   whatever the store's contention gives (see docs/clustered-locks.md): on
//   stores that push releases the next node moves at once; on a polling store
//   (MySQL/MariaDB) a node that unlocks and locks again at once is likely to
//   win again.
// * A hold is a lease renewed in the background. A node that dies frees its
//   locks when the lease (ttl + transition) or its session ends. A node that
//   loses a hold while alive (store unreachable past the lease deadline, the
//   store naming another owner) is told: lost_token() is stopped and the loss
//   listeners run; is_held() and fencing_token() turn false/0 at once.
//   Because ownership is the node's, a later lock() of the same node may then
//   be granted, and an unlock() from the code that lost its hold would free
//   that new hold: code that cares compares fencing_token() with the token it
//   was granted.
// * Definitions are per manager: define() makes a name usable through THIS
//   manager; the lock itself is cluster-wide by name (two nodes that define
//   "orders" contend for the same lock). Using a name this manager has not
//   defined is an error (kNotFound), as in Infinispan.
//
// How it is built: every lock is a MutexContendService (contend_service.h)
// run for the node id only while the node holds or wants the lock; unlock()
// stops it (releasing at the store, which pushes the hand-off to the next
// node where it can). The manager owns a fixed set of threads (a timer, two
// I/O threads for store calls and service start/stop, and callback threads):
// threads do not grow with locks or with waiting calls, and no thread waits
// for a lock on a caller's behalf.
//
// Example:
//   auto locks = simba::ClusteredLockManager::open("redis://cache:6379").value();
//   (void)locks->define("orders-export");
//   auto lock = locks->get("orders-export").value();
//   lock->lock([lock](simba::Status acquired) {
//     if (!acquired.ok()) return Report(acquired);
//     Export(lock->fencing_token(), lock->lost_token());
//     lock->unlock([](simba::Result<bool> released) { Log(released); });
//   });
//   // or, blocking a thread of your own:
//   if (lock->try_lock(std::chrono::seconds(5)).get().value_or(false)) { ...; lock->unlock(); }
//
// Futures and callbacks: every operation has a future form and a callback
// form. Futures are made ready from a library thread; callbacks run on the
// manager's callback threads (never the caller's thread, never while Simba
// holds a lock), one at a time per lock, in the order their operations were
// decided. A callback must not block waiting for another callback of the
// same lock. A future is always made ready: with a value, or an error when
// the lock is removed or the manager destroyed while it waits. (Once the
// manager is destroyed its threads are gone: a callback then runs on the
// thread that made the call or destroyed the manager.)
//
// Thread safety: managers and locks are safe to use from any thread. A
// ClusteredLock may outlive its manager; its operations then fail with
// kFailedPrecondition.

#ifndef SIMBA_CLUSTERED_LOCK_H_
#define SIMBA_CLUSTERED_LOCK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "simba/backend.h"
#include "simba/clock.h"
#include "simba/contend_service.h"
#include "simba/status.h"

namespace simba {

namespace internal {
class ClusteredLockCore;
struct ClusteredShared;
}  // namespace internal

// Settings of one lock, given to define().
struct ClusteredLockConfig {
  // Lease of this lock's holds. Default: ClusteredLockOptions::lease.
  std::optional<ContendOptions> lease;
};

// Settings of a manager.
struct ClusteredLockOptions {
  // Lease of every hold: renewed every ttl, lost (and freed at the store)
  // ttl + transition after the last successful renewal, so a dead node's
  // locks free themselves within that time. Default: the factory's
  // ContendOptions (for open(): ttl 10 s, transition 6 s).
  std::optional<ContendOptions> lease;
  // This node's id at the store: every lock of this manager is held under
  // it. Must be unique per manager (two managers with one id would share
  // ownership). Default: a fresh id (MutexContender::generate_host_contender_id).
  // Checked by the store's contender id rules (kInvalidArgument).
  std::string node_id;
  // Time source of the try_lock(timeout) timers and, for open() and
  // create(backend), of the factory's leases. Default: the factory's clock
  // (for open(): Clock::steady()).
  std::shared_ptr<Clock> clock;
  // Threads running completion callbacks, shared by all locks of the
  // manager. In [1, 64]. Default: 2. A manager runs on its factory's
  // threads: open() and create(backend) give the factory this many callback
  // threads; a manager over an existing factory uses that factory's
  // (FactoryOptions::callback_threads), unless `clock` is not the factory's
  // clock, when it starts threads of its own (this many).
  int callback_threads = 2;
  // For open() and create(backend): where the factory's holds report
  // (FactoryOptions::metrics and ::events). A manager made over a factory
  // reports where that factory does. Default: none.
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<LockEventListener> events;
};

// One clustered lock as seen from this node. Obtained from
// ClusteredLockManager::get(); every get() of a name returns the same object.
class ClusteredLock {
 public:
  using StatusCallback = std::function<void(Status)>;
  using BoolCallback = std::function<void(Result<bool>)>;
  using LossListener = std::function<void(const Status& reason)>;
  using ListenerId = std::uint64_t;

  ~ClusteredLock();
  ClusteredLock(const ClusteredLock&) = delete;
  ClusteredLock& operator=(const ClusteredLock&) = delete;

  const std::string& name() const;
  // The id this node holds locks under.
  const std::string& node_id() const;

  // Resolves (OK) when this node holds the lock for this call: waits, without
  // a thread, behind the holder and behind earlier calls of this node.
  // Errors: kCancelled when the lock is removed or the manager destroyed
  // first; kFailedPrecondition when it was removed before the call. A store
  // that cannot be reached (down, failing over) is waited for; one that
  // refuses the call (credentials, TLS verification: an error that is not
  // is_retryable) fails every waiting call with that error.
  std::future<Status> lock();
  void lock(StatusCallback done);

  // One attempt: true if this node now holds the lock for this call; false
  // if it is held (by another node, or by this node: non-reentrant) or
  // another call of this node is waiting ahead. A store error is returned as
  // the error.
  std::future<Result<bool>> try_lock();
  void try_lock(BoolCallback done);
  // Waits at most `timeout` (measured on the manager's clock by a timer):
  // true if held in time, false otherwise; kUnavailable, naming the hosts
  // tried and their causes, when the time ran out while the store could not
  // be reached; a refusing store's error as lock(). A zero timeout is
  // try_lock(); a negative one is kInvalidArgument.
  std::future<Result<bool>> try_lock(std::chrono::milliseconds timeout);
  void try_lock(std::chrono::milliseconds timeout, BoolCallback done);

  // Releases this node's hold. true once the store has released it (the next
  // node is woken where the store pushes); false if this node does not hold
  // the lock. An error means the node gave the hold up but the store could
  // not be told: the lock frees itself when its lease ends.
  std::future<Result<bool>> unlock();
  void unlock(BoolCallback done);

  // Asks the store whether any node holds the lock.
  std::future<Result<bool>> is_locked();
  void is_locked(BoolCallback done);
  // Whether this node holds the lock: held locally and confirmed by the store.
  std::future<Result<bool>> is_locked_by_me();
  void is_locked_by_me(BoolCallback done);

  // Local, immediate: this node holds the lock and its lease deadline has
  // not passed (no store call).
  bool is_held() const;

  // Local, immediate: when the current hold's lease ends unless a renewal
  // moves it later, on the manager's clock; nullopt when not held. is_held()
  // is false from that instant on; work that must finish while the hold
  // lasts can be bounded by it.
  std::optional<Clock::TimePoint> lease_deadline() const;
  // The fencing token of the current hold (strictly greater than every
  // earlier hold's, on every store); 0 when not held.
  std::uint64_t fencing_token() const;
  // Stopped when the current hold ends other than by unlock(): lost lease,
  // removal, manager destroyed. Each hold gets a fresh token; when not held,
  // the last hold's token.
  std::stop_token lost_token() const;

  // Runs `listener` (on a callback thread) whenever a hold of this node ends
  // other than by unlock(), with the reason (kAborted for a lost lease,
  // kCancelled for removal or a destroyed manager). Returns an id for
  // remove_loss_listener().
  ListenerId add_loss_listener(LossListener listener);
  void remove_loss_listener(ListenerId id);

 private:
  friend class ClusteredLockManager;
  explicit ClusteredLock(std::shared_ptr<internal::ClusteredLockCore> core);
  std::shared_ptr<internal::ClusteredLockCore> core_;
};

class ClusteredLockManager {
 public:
  // Opens the store named by `uri` (the schemes of
  // MutexContendServiceFactory::open) with a factory of its own. Defined in
  // simba::simba. Errors: those of MutexContendServiceFactory::open, and
  // kInvalidArgument for bad options.
  static Result<std::unique_ptr<ClusteredLockManager>> open(std::string_view uri,
                                                            ClusteredLockOptions options = {});
  // A manager over an existing factory (shared), or over an opened backend.
  static Result<std::unique_ptr<ClusteredLockManager>> create(
      std::shared_ptr<MutexContendServiceFactory> factory, ClusteredLockOptions options = {});
  static Result<std::unique_ptr<ClusteredLockManager>> create(std::shared_ptr<Backend> backend,
                                                              ClusteredLockOptions options = {});

  // Fails every pending call with kCancelled, tells holders (loss listeners,
  // lost_token) and releases every hold at the store; returns once the
  // releases are done (each bounded by the lease's operation_timeout).
  // Must not run on one of the manager's own callback threads (from inside
  // a callback or loss listener).
  ~ClusteredLockManager();
  ClusteredLockManager(const ClusteredLockManager&) = delete;
  ClusteredLockManager& operator=(const ClusteredLockManager&) = delete;

  // Makes `name` usable through this manager. true if newly defined, false
  // if it was defined already (the first config stays). kInvalidArgument
  // for a name the store cannot hold (naming "mutex") or a bad lease.
  Result<bool> define(const std::string& name, ClusteredLockConfig config = {});
  bool is_defined(const std::string& name) const;
  // The lock `name`: kNotFound, naming it, when it is not defined here.
  Result<std::shared_ptr<ClusteredLock>> get(const std::string& name) const;
  // Forgets `name`: fails its pending calls with kCancelled, ends this
  // node's hold (its holder is told, as for a loss) and releases it at the
  // store. Resolves to true once released, false if `name` was not defined,
  // or the store's error if the release failed (the lease then expires).
  std::future<Result<bool>> remove(const std::string& name);

  const std::string& node_id() const;
  const std::shared_ptr<MutexContendServiceFactory>& factory() const;

 private:
  ClusteredLockManager(std::shared_ptr<internal::ClusteredShared> shared);

  std::shared_ptr<internal::ClusteredShared> shared_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ClusteredLock>, std::less<>> locks_;
};

}  // namespace simba

#endif  // SIMBA_CLUSTERED_LOCK_H_
