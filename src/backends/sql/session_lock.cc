#include "backends/sql/session_lock.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/net/stream.h"
#include "core/store_errors.h"
#include "core/worker.h"

namespace simba::internal::sql {

bool LockSession::ended(short revents) { return revents != 0; }

// A server says nothing to an idle session but its goodbye (whose end of
// stream may not be here yet), so anything to read disqualifies it; a rare
// notice only costs a new session.
bool LockSession::ended_while_idle() const {
  const int fd = socket();
  if (fd < 0) return true;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) != 0;
}

Result<int> take_lock_connections(std::string_view store, Uri& uri) {
  const auto it = uri.query.find("lock_connections");
  if (it == uri.query.end()) return kDefaultLockConnections;
  const std::string value = it->second;
  uri.query.erase(it);
  int n = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size() || n < 1 ||
      n > kMaxLockConnections) {
    return invalid_argument_error(std::string(store) + ": lock_connections must be 1.." +
                                  std::to_string(kMaxLockConnections) + ", not '" + value + "'");
  }
  return n;
}

Status SessionLockDriver::prepare(LockSession& /*session*/) { return ok_status(); }

namespace {

using std::chrono::steady_clock;

using Pool = SessionPool<LockSession>;
using Loan = Pool::Loan;

// ---- lost sessions ----------------------------------------------------------------

// Notices when the server ends a session that holds a key (killed, a
// restart, a reset connection): the key is gone with it, and its holder must
// be told at once. One thread, started by the first watch, whatever the
// number of holds. Thread-safe.
class HoldMonitor {
 public:
  using WatchId = std::uint64_t;

  HoldMonitor() : state_(std::make_shared<State>()) {}
  ~HoldMonitor() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stopping = true;
    }
    state_->wake.post();
    worker_.join();  // from an on_lost (on the thread itself) the loop ends by itself
  }
  HoldMonitor(const HoldMonitor&) = delete;
  HoldMonitor& operator=(const HoldMonitor&) = delete;

  bool ok() const { return state_->wake.ok(); }

  // Watches `session`, idle and holding a key; nobody else may use it until
  // unwatch(). If the session ends first, `on_lost` runs once, on the
  // monitor's thread, and must not block.
  WatchId watch(LockSession* session, std::function<void()> on_lost) {
    WatchId id = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      id = state_->next_id++;
      state_->watched.emplace(id, Watched{session, std::move(on_lost)});
      if (!worker_.running()) worker_.start("session-watch", [state = state_] { run(state); });
    }
    state_->wake.post();  // poll the new socket too
    return id;
  }

  // Stops watching: the session is the caller's again (the monitor no
  // longer touches it once this returns). False when the monitor found the
  // session ended first (its on_lost ran or is running).
  bool unwatch(WatchId id) {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->watched.erase(id) == 1;
  }

 private:
  struct Watched {
    LockSession* session;
    std::function<void()> on_lost;
  };
  // What the thread shares with us: it keeps the state alive by itself, so
  // the monitor may be destroyed from an on_lost callback (on its thread).
  struct State {
    std::mutex mu;
    std::map<WatchId, Watched> watched;  // guarded by mu
    WatchId next_id = 1;                 // guarded by mu
    bool stopping = false;               // guarded by mu
    WakeFd wake;                         // a watch() or the end
  };

  static void run(const std::shared_ptr<State>& state) {
    std::vector<pollfd> fds;
    std::vector<WatchId> ids;
    for (;;) {
      // The poll set is rebuilt each time around: a socket unwatched while
      // we slept may wake us once more, and is then skipped by its id.
      fds.assign(1, pollfd{state->wake.fd(), POLLIN, 0});
      ids.assign(1, 0);
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (state->stopping) return;
        for (const auto& [id, watched] : state->watched) {
          fds.push_back(pollfd{watched.session->socket(), POLLIN | POLLRDHUP, 0});
          ids.push_back(id);
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        SIMBA_LOG(kWarn, "keyed locks: hold monitor: poll failed (errno " << errno << ")");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      if (fds[0].revents != 0) state->wake.drain();
      std::vector<std::function<void()>> lost;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          auto it = state->watched.find(ids[i]);
          if (it == state->watched.end()) continue;
          // Reading here is safe: nobody else uses a watched session.
          if (!it->second.session->ended(fds[i].revents)) continue;
          lost.push_back(std::move(it->second.on_lost));
          state->watched.erase(it);
        }
      }
      // Outside the lock: a callback may release or destroy holds.
      for (auto& on_lost : lost) {
        if (on_lost) on_lost();
      }
    }
  }

  std::shared_ptr<State> state_;
  Worker worker_;  // started by the first watch()
};

// ---- the hold ---------------------------------------------------------------------

// What the backend and its holds share (a hold may outlive its backend).
struct Engine {
  Engine(SessionLockConfig config_in, std::shared_ptr<SessionLockDriver> driver_in)
      : config(std::move(config_in)),
        driver(std::move(driver_in)),
        pool(std::make_shared<Pool>(
            [driver = driver, call_timeout = config.store_call_timeout](Deadline wait_deadline,
                                                                        int wake_fd) {
              // By the caller's wait deadline, but a try-once (a deadline
              // already past) still gets a call's time to connect; the
              // driver bounds it by its connect timeout too.
              return driver->open_session(
                  std::max(wait_deadline, steady_clock::now() + call_timeout), wake_fd);
            },
            config.description, config.budget)) {}

  const SessionLockConfig config;
  const std::shared_ptr<SessionLockDriver> driver;
  const std::shared_ptr<Pool> pool;
  HoldMonitor monitor;
};

// One held key: its session, pinned until release, watched for its end
// meanwhile.
class SessionKeyHold final : public KeyHold {
 public:
  SessionKeyHold(std::shared_ptr<Engine> engine, Loan loan, std::uint64_t token,
                 std::function<void()> on_lost)
      : engine_(std::move(engine)), loan_(std::move(loan)), token_(token) {
    watch_ = engine_->monitor.watch(&*loan_, std::move(on_lost));
  }

  ~SessionKeyHold() override {
    if (freed_.exchange(true)) return;
    const Status status = free(Deadline::max());
    if (!status.ok()) SIMBA_LOG(kWarn, "dropping a key hold: " << status);
  }

  std::uint64_t fencing_token() const override { return token_; }

  Status release(Deadline deadline) override {
    if (freed_.exchange(true)) return ok_status();
    return free(deadline);
  }

 private:
  Status free(Deadline deadline) {
    if (!engine_->monitor.unwatch(watch_)) {
      // The session ended (on_lost said so), and its key with it.
      loan_.discard();
      return ok_status();
    }
    deadline = std::min(deadline, steady_clock::now() + engine_->config.store_call_timeout);
    const Status unlocked = engine_->driver->unlock(*loan_, deadline);
    if (!unlocked.ok()) {
      // Ending the session frees the key, as soon as the server sees it.
      loan_.discard();
      return unlocked.with_context(engine_->config.description + ": releasing a key");
    }
    loan_.give_back();  // for the next acquire, even while this hold object lives on
    return ok_status();
  }

  const std::shared_ptr<Engine> engine_;
  Loan loan_;
  const std::uint64_t token_;
  HoldMonitor::WatchId watch_ = 0;
  std::atomic<bool> freed_{false};
};

// ---- the backend ------------------------------------------------------------------

class SessionLockBackend final : public KeyedLockBackend {
 public:
  explicit SessionLockBackend(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

  std::string_view scheme() const override { return engine_->config.scheme; }
  const KeyedLockCapabilities& capabilities() const override {
    return engine_->config.capabilities;
  }

  Result<std::unique_ptr<KeyHold>> acquire(const KeyAcquireRequest& request) override {
    SIMBA_RETURN_IF_ERROR(validate_key(request.key));
    if (request.cancel.stop_requested()) return cancelled();
    // A cancel posts here; the waits below (for a session, for the server)
    // watch it. It belongs to this call, not to a session: it outlives the
    // stop_callback (declared after it), so a late cancel can neither touch
    // a closed session nor interrupt its next user.
    WakeFd wake;
    if (!wake.ok()) {
      return unavailable_error(engine_->config.description + ": eventfd: " + std::strerror(errno));
    }
    std::stop_callback on_cancel(request.cancel, [&wake] { wake.post(); });
    // A transient failure (the server not reached yet, a session that broke
    // while it waited, a failover, a standby where the primary is wanted)
    // is no reason to fail the call: it is tried again, with a new session
    // (on the new primary of a multi-host URI), with a jittered backoff, as
    // long as the wait deadline allows. A refusal (credentials, TLS
    // verification, a missing privilege) fails at once.
    Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
    std::minstd_rand jitter(std::random_device{}());
    int failures = 0;
    for (;;) {
      Result<std::unique_ptr<KeyHold>> result = attempt(request, wake);
      if (result.ok() || !is_retryable(result.status())) return result;
      ++failures;
      const Deadline now = steady_clock::now();
      if (request.wait_deadline != Deadline::max() && now >= request.wait_deadline) {
        // A single try (no time to wait) answers with its own error.
        if (failures == 1) return result;
        return unreachable_after(failures, result.status());
      }
      const std::chrono::milliseconds delay = backoff.failed(result.status());
      // The last try is at the deadline, not a backoff before it: the caller
      // asked to wait that long, and the store may be back by then (the
      // fault runs count an acquisition that gives up early as a failure).
      const Deadline next =
          std::min(now + delay + std::chrono::milliseconds(jitter() % (delay.count() / 4 + 1)),
                   request.wait_deadline);
      if (failures == 1 || failures % 10 == 0) {
        SIMBA_LOG(kWarn, "key '" << request.key << "': store unreachable, retrying in "
                                 << std::chrono::duration_cast<std::chrono::milliseconds>(
                                        next - steady_clock::now())
                                        .count()
                                 << " ms (" << failures << " in a row): " << result.status());
      }
      wait_fd(wake.fd(), POLLIN, next);
      if (request.cancel.stop_requested()) return cancelled();
    }
  }

 private:
  Result<std::unique_ptr<KeyHold>> attempt(const KeyAcquireRequest& request, const WakeFd& wake) {
    SIMBA_ASSIGN_OR_RETURN(std::optional<Loan> loan,
                           engine_->pool->borrow(request.wait_deadline, request.cancel, wake.fd()));
    if (!loan) return not_acquired();
    if (Status prepared = engine_->driver->prepare(**loan); !prepared.ok()) return prepared;
    // A cancel that came while we set up is answered here (a cancel request
    // sent before the session has read the lock call may be ignored).
    if (request.cancel.stop_requested()) return cancelled();
    Result<std::optional<std::uint64_t>> token =
        engine_->driver->lock(**loan, request.key, request.wait_deadline, wake.fd());
    if (request.cancel.stop_requested()) {
      if (token.ok() && token->has_value() && (**loan).healthy()) {
        // Granted as the cancel came: freed again (or the session closed).
        const Deadline deadline = steady_clock::now() + engine_->config.store_call_timeout;
        if (!engine_->driver->unlock(**loan, deadline).ok()) loan->discard();
      }
      return cancelled();  // a broken session is closed by the loan, freeing a grant
    }
    if (!token.ok()) return token.status();
    if (!token->has_value()) return not_acquired();
    return std::unique_ptr<KeyHold>(
        std::make_unique<SessionKeyHold>(engine_, std::move(*loan), **token, request.on_lost));
  }

  static Result<std::unique_ptr<KeyHold>> not_acquired() { return std::unique_ptr<KeyHold>(); }
  Status cancelled() const {
    return cancelled_error(engine_->config.description + ": acquire cancelled");
  }

  const std::shared_ptr<Engine> engine_;
};

}  // namespace

Result<std::shared_ptr<KeyedLockBackend>> new_session_lock_backend(
    SessionLockConfig config, std::shared_ptr<SessionLockDriver> driver) {
  if (config.budget < 1 || config.budget > kMaxLockConnections) {
    return invalid_argument_error(config.scheme + ": lock_connections must be 1.." +
                                  std::to_string(kMaxLockConnections) + ", not " +
                                  std::to_string(config.budget));
  }
  config.capabilities.cross_process = true;
  config.capabilities.freed_with_session = true;
  auto engine = std::make_shared<Engine>(std::move(config), std::move(driver));
  if (!engine->monitor.ok()) {
    return unavailable_error(engine->config.description + ": eventfd: " + std::strerror(errno));
  }
  return std::shared_ptr<KeyedLockBackend>(std::make_shared<SessionLockBackend>(engine));
}

}  // namespace simba::internal::sql
