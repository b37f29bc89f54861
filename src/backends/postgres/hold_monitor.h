// Notices when the server ends a session that holds an advisory lock
// (pg_terminate_backend, a restart, a reset connection): the lock is gone
// with it, and its holder must be told at once. One thread per backend,
// whatever the number of holds, polling the sockets of the held connections
// while they are idle: an idle session hears nothing from its server unless
// the server is ending it.
#ifndef SIMBA_BACKENDS_POSTGRES_HOLD_MONITOR_H_
#define SIMBA_BACKENDS_POSTGRES_HOLD_MONITOR_H_

#include <libpq-fe.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "backends/postgres/pg_connection.h"

namespace simba::internal::pg {

// Thread-safe. The thread starts with the first Watch().
class HoldMonitor {
 public:
  using WatchId = std::uint64_t;

  HoldMonitor();
  ~HoldMonitor();
  HoldMonitor(const HoldMonitor&) = delete;
  HoldMonitor& operator=(const HoldMonitor&) = delete;

  // Watches `conn`, an idle connection that holds a lock; nobody else may
  // use it until Unwatch(). If the session ends first, `on_lost` runs once,
  // on the monitor's thread, and must not block.
  WatchId Watch(PGconn* conn, std::function<void()> on_lost);
  // Stops watching: `conn` is the caller's again (the monitor no longer
  // touches it once this returns). False when the monitor found the session
  // ended first (its on_lost ran or is running).
  bool Unwatch(WatchId id);

 private:
  struct Watched {
    PGconn* conn;
    std::function<void()> on_lost;
  };
  // What the thread shares with us: it keeps the state alive by itself, so
  // the monitor may be destroyed from an on_lost callback (on its thread).
  struct State {
    std::mutex mu;
    std::map<WatchId, Watched> watched;  // guarded by mu
    WatchId next_id = 1;                 // guarded by mu
    bool stopping = false;               // guarded by mu
    WakeFd wake;                         // a Watch() or the end
  };
  static void Run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;  // guarded by state_->mu until the destructor
};

}  // namespace simba::internal::pg

#endif  // SIMBA_BACKENDS_POSTGRES_HOLD_MONITOR_H_
