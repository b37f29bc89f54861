// File: simba/keyed_lock.h
//
// Keyed locks with leases (Ekbatan's KeyedLockProvider contract): a mutex per
// key, taken by a thread for at most `max_hold`.
//
//   KeyedLockProvider::open(uri)   one per store; its own connections, so
//                                  lock traffic cannot starve other queries
//   acquire(key, max_hold)         block until held (or cancelled)
//   try_acquire(key, max_wait, max_hold)
//                                  wait at most max_wait; nullopt if not held
//   Lease                          RAII: released when destroyed
//
// The contract, the same on every store:
// * Two acquirers of one key exclude each other; different keys never block
//   each other.
// * Reentrancy per (thread, key): a thread that holds a key gets it again at
//   once. The key is freed at the store when the outermost lease is released,
//   and the FIRST acquire's max_hold governs: re-entries neither shorten nor
//   lengthen it.
// * max_hold is a hard cap: when it elapses a watchdog frees the key, whatever
//   the holder is doing; is_held() turns false and lost_token() is stopped.
//   The same happens when the store ends the hold (a lost session or lease).
// * A holder's crash frees its keys: at once on stores whose locks live in a
//   session (PostgreSQL, MySQL/MariaDB, ZooKeeper), at the end of the lease
//   elsewhere (KeyedLockOptions::lease).
// * What a store cannot do (a fencing token from GET_LOCK, FIFO waiting) is in
//   capabilities(), never silently missing.
//
// Example (a wallet deposit, serialized per wallet):
//   auto locks = simba::KeyedLockProvider::open("postgresql://app@db/app").value();
//   auto lease = locks->try_acquire("wallet:" + id, 2s, 10s);
//   if (!lease.ok()) return lease.status();      // the store failed
//   if (!lease->has_value()) return busy(id);     // held elsewhere for 2 s
//   Deposit(id, amount, (*lease)->fencing_token());
//   // ~Lease releases.
//
// Thread safety: a provider is safe to use from any thread. A Lease is a
// value owned by one thread at a time; is_held(), fencing_token() and
// lost_token() may be called from any thread. Destroying the provider frees
// every key its leases still hold (they then report not held).

#ifndef SIMBA_KEYED_LOCK_H_
#define SIMBA_KEYED_LOCK_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "simba/clock.h"
#include "simba/contend_service.h"
#include "simba/keyed_backend.h"
#include "simba/status.h"

namespace simba {

namespace internal {
class KeyedHold;
class KeyedLockProviderImpl;
}  // namespace internal

struct KeyedLockOptions {
  // Stores that hold a key as a lease (SQLite, Redis, ZooKeeper, etcd): the
  // lease renewed while the key is held. A crashed holder's key frees itself
  // ttl + transition after its last renewal. Default: ttl 5 s, transition 2 s.
  ContendOptions lease = [] {
    ContendOptions o;
    o.ttl = std::chrono::seconds(5);
    o.transition = std::chrono::seconds(2);
    return o;
  }();
  // Time source of the max_hold watchdog. Default: Clock::steady().
  std::shared_ptr<Clock> clock;
  // Where holds report, as FactoryOptions::metrics and ::events; each key is
  // a mutex there. On lease stores (SQLite, Redis, ZooKeeper, etcd) a hold
  // is a contend service and reports as one (renewals included). On the
  // servers' own locks (PostgreSQL, MySQL, memory) the provider reports:
  // acquired (with the wait), released, lost (kOtherOwner when the store
  // ended the hold, kDeadlinePassed at max_hold) and store errors, with the
  // provider's contender id, on the thread where each happens. Default: none.
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<LockEventListener> events;
};

// One hold of a key by one thread (or one re-entry of it). Move-only.
class Lease {
 public:
  // An empty lease: not held.
  Lease() = default;
  Lease(Lease&& other) noexcept;
  // Releases what this lease held first.
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  // Releases (errors are logged: the store's session or lease frees the key).
  ~Lease();

  // Held at the store, not past max_hold, not lost, not released.
  bool is_held() const;
  // The hold's fencing token; 0 when not held or when the store mints none
  // (capabilities().fencing_tokens).
  std::uint64_t fencing_token() const;
  // Stopped when the hold ends other than by release(): the max_hold
  // watchdog, or the store losing it.
  std::stop_token lost_token() const;
  // When the watchdog frees the key (the first acquire's max_hold), on the
  // provider's clock.
  Clock::TimePoint hold_deadline() const;
  const std::string& key() const;

  // Gives this lease up. Only the outermost lease of a thread's re-entries
  // frees the key at the store. Idempotent; OK for an empty lease. Returns
  // the store's error if freeing failed (the key is then freed when the
  // store's session or lease ends).
  Status release();

 private:
  friend class internal::KeyedLockProviderImpl;
  explicit Lease(std::shared_ptr<internal::KeyedHold> hold);
  // Shared by the re-entries of one (thread, key) acquisition.
  std::shared_ptr<internal::KeyedHold> hold_;
  bool released_ = false;
};

class KeyedLockProvider {
 public:
  // Opens the store named by `uri` (the schemes of
  // MutexContendServiceFactory::open; PostgreSQL and MySQL/MariaDB use their
  // native locks and take a `lock_connections` query key, the most
  // connections this provider opens, default 8). Errors: kInvalidArgument
  // for a bad URI or options, kUnimplemented for a scheme not compiled in,
  // kUnavailable / kPermissionDenied when the store cannot be reached.
  static Result<std::unique_ptr<KeyedLockProvider>> open(std::string_view uri,
                                                         KeyedLockOptions options = {});
  // A provider over an already opened keyed backend.
  static Result<std::unique_ptr<KeyedLockProvider>> create(
      std::shared_ptr<KeyedLockBackend> backend, KeyedLockOptions options = {});

  virtual ~KeyedLockProvider() = default;

  // Blocks until `key` is held. max_hold must be > 0. Errors:
  // kInvalidArgument (key, max_hold), kCancelled when `cancel` is stopped
  // first, the store's error when it refuses the call (credentials, TLS
  // verification: not is_retryable). A store that cannot be reached (down,
  // failing over, no primary yet) is waited for.
  virtual Result<Lease> acquire(std::string_view key, std::chrono::milliseconds max_hold,
                                std::stop_token cancel = {}) = 0;
  // Waits at most `max_wait` (>= 0; 0 = one attempt). An empty optional when
  // it runs out while the key is held elsewhere; kUnavailable, naming the
  // hosts tried and their causes, when it runs out while the store cannot
  // be reached (a single attempt: its own error); errors as acquire().
  virtual Result<std::optional<Lease>> try_acquire(std::string_view key,
                                                   std::chrono::milliseconds max_wait,
                                                   std::chrono::milliseconds max_hold,
                                                   std::stop_token cancel = {}) = 0;

  virtual const KeyedLockCapabilities& capabilities() const = 0;
  virtual std::string_view scheme() const = 0;
};

}  // namespace simba

#endif  // SIMBA_KEYED_LOCK_H_
