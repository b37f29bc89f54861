// Keyed locks held by server sessions (PostgreSQL pg_advisory_lock, MySQL /
// MariaDB GET_LOCK), written once: the engine below owns everything but the
// store's own calls, which a small driver supplies.
//
//   the budget    at most `budget` sessions (connections) exist at once,
//                 opened lazily, kept for reuse; acquirers wait for one in
//                 arrival order, within their deadline and cancellable
//   the hold      one key per session: a hold pins its session until release
//   cancellation  a stop_callback only posts to an eventfd; the waiting
//                 thread, polling it beside its socket, gives up (the driver
//                 says how: a cancel request, or closing the session)
//   loss          one monitor thread per backend polls the sockets of held,
//                 idle sessions: an idle session hears from its server only
//                 when the server ends it, and the hold's on_lost runs then
//
// A session whose state is unknown (a call broke, was abandoned, or may have
// left a key held) is closed, never reused: its end frees whatever it held.
#ifndef SIMBA_BACKENDS_SQL_SESSION_LOCK_H_
#define SIMBA_BACKENDS_SQL_SESSION_LOCK_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backends/sql/session_pool.h"
#include "simba/keyed_backend.h"
#include "simba/status.h"
#include "simba/uri.h"

namespace simba::internal::sql {

// One server session (a connection) of the budget; the driver's subclass
// holds the store's handle and remembers the key it holds, if any. Used by
// one thread at a time.
class LockSession : public PooledSession {
 public:
  // The session's socket (-1 when it has none: it is then treated as ended).
  virtual int socket() const = 0;
  // Whether an idle session whose socket reported `revents` (poll events) is
  // over. The default: any event is (an idle session hears only its
  // server's goodbye).
  virtual bool ended(short revents);
  // It has no socket, or its socket has something to say.
  bool ended_while_idle() const override;
};

// A store's calls. Thread-safe: called from every acquiring thread at once,
// each with a session of its own.
class SessionLockDriver {
 public:
  virtual ~SessionLockDriver() = default;

  // Opens a session by `deadline`, and by the store's connect timeout;
  // `wake_fd` readable (the caller cancelled) gives up with kCancelled.
  virtual Result<std::unique_ptr<LockSession>> open_session(Deadline deadline, int wake_fd) = 0;

  // Runs before every lock call (e.g. one-time setup the first lock needs).
  virtual Status prepare(LockSession& session);

  // Takes `key` in `session`, waiting until `wait_deadline` (one look when
  // it has passed). Returns the fencing token (0 when the store mints none)
  // once the key is held; nullopt when it was not held by the deadline; an
  // error otherwise. When `wake_fd` becomes readable the caller cancelled:
  // give up promptly. A session that may hold the key after an error, or
  // that a cancel may still reach, must be marked broken.
  virtual Result<std::optional<std::uint64_t>> lock(LockSession& session, std::string_view key,
                                                    Deadline wait_deadline, int wake_fd) = 0;

  // Frees the key `session` holds, by `deadline`. On an error the session
  // is closed (which frees the key).
  virtual Status unlock(LockSession& session, Deadline deadline) = 0;
};

constexpr int kDefaultLockConnections = 8;
constexpr int kMaxLockConnections = 1024;

// The budget's URI key, lock_connections (1..1024, default 8): taken out of
// `uri` (so the contention backend's parser, which does not know it, can
// check the rest). kInvalidArgument, naming `store`, for a bad value.
Result<int> take_lock_connections(std::string_view store, Uri& uri);

struct SessionLockConfig {
  std::string scheme;       // KeyedLockBackend::scheme()
  std::string description;  // "postgresql at host:port/db", to start messages
  // cross_process and freed_with_session are set here: a session's end frees
  // its keys, wherever its process ran.
  KeyedLockCapabilities capabilities;
  // The most sessions at once (idle, lent and being opened), 1..1024
  // (lock_connections; NewSessionLockBackend checks it).
  int budget = kDefaultLockConnections;
  // Bounds a release (and a hold destroyed without one) and the unlock of a
  // key granted as the caller cancelled.
  std::chrono::milliseconds store_call_timeout{10000};
};

// A keyed-lock backend on `driver`'s sessions. A hold may outlive it.
Result<std::shared_ptr<KeyedLockBackend>> new_session_lock_backend(
    SessionLockConfig config, std::shared_ptr<SessionLockDriver> driver);

}  // namespace simba::internal::sql

#endif  // SIMBA_BACKENDS_SQL_SESSION_LOCK_H_
