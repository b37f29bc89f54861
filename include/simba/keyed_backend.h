// File: simba/keyed_backend.h
//
// The storage interface of keyed locks (the keyed SPI). A keyed-lock backend
// only takes and frees one key at the store; everything a user relies on
// beyond that lives once in the core (simba/keyed_lock.h): per-(thread, key)
// reentrancy, the max_hold watchdog, release arbitration, loss signals.
//
//   acquire   wait until the key is held, the wait deadline passes, or the
//             caller cancels; returns a KeyHold
//   KeyHold   one store-level hold: its fencing token (where the store mints
//             one) and release()
//
// Stores with a native lock use it (PostgreSQL pg_advisory_lock, MySQL /
// MariaDB GET_LOCK); the others hold a key as a lease through the contention
// SPI (simba/backend.h), renewed while held, so a crashed holder's key frees
// itself when its lease ends; memory:// is a per-key FIFO inside the process.
//
// A backend is shared by every lock of a provider and must be thread-safe.

#ifndef SIMBA_KEYED_BACKEND_H_
#define SIMBA_KEYED_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>

#include "simba/backend.h"
#include "simba/contend_service.h"
#include "simba/status.h"

namespace simba {

namespace internal {
class Runtime;
class KeyedProviderState;
}  // namespace internal

// What a keyed-lock backend can and cannot do. The README's backend table
// and KeyedLockProvider::capabilities() show it, so nothing is silently
// missing.
struct KeyedLockCapabilities {
  // How the store holds a key, e.g. "pg_advisory_lock (session)".
  std::string mechanism;
  // Processes (on other hosts, unless only one host can reach the store)
  // exclude each other.
  bool cross_process = false;
  // KeyHold::fencing_token() is a number greater than every earlier hold's
  // of the same key. False: it is always 0 (GET_LOCK mints none).
  bool fencing_tokens = false;
  // Waiters for one key get it in the order they asked.
  bool fifo = false;
  // A release wakes the next waiter at once (false: waiters poll).
  bool push_handoff = false;
  // When the holder's process dies, the key is freed as soon as the store
  // notices (its session ends) rather than when a lease runs out.
  bool freed_with_session = false;
  // Longest key in bytes (longer keys are kInvalidArgument, never truncated;
  // a backend that hashes long keys says so in `mechanism` and allows them).
  std::size_t max_key_length = 255;
  // The backend reports each hold to metrics and lock events itself (the
  // lease backend, whose holds are contend services). Otherwise the
  // provider reports them (KeyedLockOptions::metrics and ::events).
  bool reports_holds = false;
  // What a failover of the store's replication keeps of the guarantees (as
  // Capabilities::failover); empty when there is nothing to say.
  std::string failover{};
};

// One store-level hold of a key. Destroying it without release() must still
// free the key, as well as the store allows (closing the session, ending the
// lease early); it must not block longer than the backend's operation timeout.
class KeyHold {
 public:
  virtual ~KeyHold() = default;
  // 0 when the store mints none (capabilities().fencing_tokens is false).
  virtual std::uint64_t fencing_token() const = 0;
  // Whether the hold still stands as far as this process can tell without
  // a store call: false once a lease's deadline has passed, even before
  // on_lost has been delivered. Stores whose holds end only with a session
  // keep the default (on_lost tells when the session ends).
  virtual bool is_held() const { return true; }
  // Frees the key at the store by `deadline`. Called at most once, from any
  // thread. An error means the store may still hold the key until the
  // session or lease ends.
  virtual Status release(Deadline deadline) = 0;
};

struct KeyAcquireRequest {
  std::string_view key;
  // The cap the core enforces with its watchdog. A store may use it as the
  // lease it asks for; it must not hold the key longer than the core would.
  std::chrono::milliseconds max_hold{0};
  // Stop waiting at this instant (real monotonic clock). Deadline::max()
  // waits until `cancel` is stopped.
  Deadline wait_deadline = Deadline::max();
  std::stop_token cancel;
  // Called at most once, on any thread, if the store ends the hold before
  // release() (session lost, lease lost). Must not block.
  std::function<void()> on_lost;
};

class KeyedLockBackend {
 public:
  virtual ~KeyedLockBackend() = default;

  // "memory", "postgresql", ...
  virtual std::string_view scheme() const = 0;
  virtual const KeyedLockCapabilities& capabilities() const = 0;

  // Checks a key against this store's rules. The default accepts non-empty
  // valid UTF-8 without control characters, up to
  // capabilities().max_key_length bytes. Errors are kInvalidArgument naming
  // the parameter ("key").
  virtual Status validate_key(std::string_view key) const;

  // Waits until `request.key` is held and returns the hold; returns nullptr
  // when `wait_deadline` passes first (a key free on arrival is taken even
  // with a deadline already past); kCancelled when `cancel` is stopped
  // first; the store's error (kUnavailable, kDeadlineExceeded for a store
  // call that timed out, ...) when it cannot be asked. Never returns with
  // the key held at the store but no hold returned.
  virtual Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) = 0;

 private:
  friend class internal::KeyedProviderState;
  // The library's threads this backend already runs on (a lease backend's:
  // its factory's), which the provider then uses for its watchdogs and
  // background releases instead of starting threads of its own. Backends
  // outside the library keep the default: none.
  virtual std::shared_ptr<internal::Runtime> shared_runtime() const { return nullptr; }
};

// Keyed locks over any contention backend: a key is a mutex of that store,
// held by a contender of its own under a lease of `lease.ttl` renewed in the
// background (push hand-off, fencing tokens and loss signals as the store
// gives them). A crashed holder's key frees itself ttl + transition after its
// last renewal. Each hold reports to `metrics` and `events` (either may be
// null) as a contend service does, under its key's name. Errors:
// kInvalidArgument for bad lease options.
Result<std::shared_ptr<KeyedLockBackend>> new_lease_keyed_lock_backend(
    std::shared_ptr<Backend> backend, ContendOptions lease,
    std::shared_ptr<Metrics> metrics = nullptr,
    std::shared_ptr<LockEventListener> events = nullptr);

// Keyed locks inside one process (memory://NAME): a per-key FIFO queue, no
// store. Backends with the same name share their keys. Tokens come from one
// counter per name.
Result<std::shared_ptr<KeyedLockBackend>> new_memory_keyed_lock_backend(std::string name);

}  // namespace simba

#endif  // SIMBA_KEYED_BACKEND_H_
