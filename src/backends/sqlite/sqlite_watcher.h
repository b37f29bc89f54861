// Internal to the SQLite driver: the push watcher.
//
// SQLite has no notifications between processes, but `PRAGMA data_version`
// tells a connection, cheaply, whether any *other* connection committed
// since it last asked. The watcher is one thread per backend with a
// connection of its own (so it never waits for the calls' connection, and
// so the calls' own commits count as "another connection"); it asks every
// tick and, when the answer changed, reads the owner and version of the
// watched mutexes in one query and reports each mutex that was released or
// whose holder lost it since it last looked. It is the SQL protocol's
// Listener for SQLite (backends/sql/sql_backend.h), which owns the
// subscriptions and calls the listeners.
//
// Between ticks, the kernel says when the file or its write-ahead log was
// written (inotify on their directory): a commit by any process on this
// host wakes the watcher at once. The write comes just before the commit is
// published (the WAL is synced, then its index updated), so after a write
// the watcher looks again a few times at growing intervals (from 250 µs)
// until the version moves. The tick stays, for file systems that do not
// report writes (network mounts, writers on other hosts).

#ifndef SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_
#define SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "backends/sqlite/host_locks.h"
#include "core/net/stream.h"
#include "core/worker.h"
#include "simba/backend.h"

namespace simba::internal::sql::sqlite {

// The watched names live in a table private to the watcher's connection
// (TEMP: never written to the file, never locked against other processes),
// so one join reads exactly the watched rows however many there are.
inline constexpr char kCreateWatchedSql[] =
    "CREATE TEMP TABLE IF NOT EXISTS simba_watched (mutex TEXT PRIMARY KEY)";

// See the file comment. Shared (std::shared_ptr) by the driver, its
// sessions (which Poke it after a commit), the listener handle and the
// thread itself, so the backend may be destroyed on the watcher thread
// (from inside a listener) without anything dangling.
class Watcher : public std::enable_shared_from_this<Watcher> {
 public:
  using OnEvent = std::function<void(const MutexEvent&)>;

  // What the watcher knows of one mutex's row: its owner ('' = free), its
  // version (+1 on every acquisition and release, ours and JVM Simba's
  // alike), and the version its last forced release left (-1: none). The
  // version is what makes a release detectable even when the watcher never
  // saw the row held: a free row whose version moved since the last look
  // was released (or force-released) after that look.
  struct RowState {
    std::string owner;
    std::int64_t version = 0;
    std::int64_t forced_version = -1;
    // The version whose tenure is recorded as backed by this host's kernel
    // lock of the mutex (host_locks.h; -1: none, or another lock's).
    std::int64_t backed_version = -1;
  };

  // Opens the watcher's own connection to the file (the driver's session,
  // which never waits for a lock: a busy file only means "ask again next
  // tick"), with the TEMP table kCreateWatchedSql made.
  using OpenConnection = std::function<Result<std::unique_ptr<SqlSession>>()>;

  // How often the watcher asks when no write is reported: a tick costs a
  // few microseconds when nothing changed.
  static constexpr std::chrono::milliseconds kDefaultTick{15};

  // `path` is the database file: for messages, and whose writes (and its
  // WAL's) wake the watcher.
  Watcher(std::string path, OpenConnection open, std::chrono::milliseconds tick = kDefaultTick)
      : path_(std::move(path)), open_(std::move(open)), tick_(tick) {}
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The kernel locks whose holders' deaths the watcher looks for (null:
  // none). Before start().
  void probe_with(std::shared_ptr<HostLocks> host_locks);
  // Starts the thread, which reports to `on_event` (one call at a time)
  // until Shutdown.
  void start(OnEvent on_event);
  // Watches `mutex` from `seen` (the row as read when subscribing; nullopt
  // if unknown, then the first look is the baseline).
  void watch(const std::string& mutex, std::optional<RowState> seen);
  void unwatch(const std::string& mutex);
  // Makes the thread look now rather than at its next tick: a release made
  // through this backend reaches local waiters at once.
  void poke();
  // Stops the thread: on_event is not called after this returns (unless it
  // is called from on_event, on the watcher thread: then the thread ends
  // as soon as that call returns, making no other).
  void shutdown();

 private:
  void run();
  // Compares what a look saw with what was seen before. REQUIRES: mu_.
  void observe_locked(const std::vector<std::pair<std::string, RowState>>& rows,
                      std::vector<MutexEvent>* events);
  // Reports, as released, the held rows whose recorded kernel lock nobody
  // holds any more: their holders died. A lock found free is first only
  // suspected: a holder that released frees its lock right after its
  // commit, which the look before the probe may have missed. Returns true
  // when a look must follow at once to settle a suspicion (the next probe
  // reports it if the row is still at that version). REQUIRES: mu_.
  bool probe_locked(std::vector<MutexEvent>* events);

  const std::string path_;
  const OpenConnection open_;
  const std::chrono::milliseconds tick_;
  // Posted with every notify of wake_: the thread waits on it beside the
  // file's change notifications.
  WakeFd wake_fd_;

  std::mutex mu_;
  std::condition_variable wake_;
  OnEvent on_event_;      // set once, before the thread starts
  bool stopped_ = false;  // guarded by mu_
  bool poked_ = false;    // guarded by mu_
  // Bumped whenever the set of watched mutexes changes. Guarded by mu_.
  std::uint64_t membership_ = 0;
  // The row as last seen (nullopt until a look or Watch). Guarded by mu_.
  std::map<std::string, std::optional<RowState>, std::less<>> watched_;
  std::shared_ptr<HostLocks> host_locks_;  // set before the thread starts
  // Per watched mutex, the backed version whose lock a probe found free
  // (suspected), and the one whose holder was reported gone (told once).
  // Guarded by mu_.
  std::map<std::string, std::int64_t, std::less<>> suspected_gone_;
  std::map<std::string, std::int64_t, std::less<>> told_gone_;
  // Where the next probe round starts (rounds are bounded). Guarded by mu_.
  std::string probe_from_;
  // stopped_, readable between on_event calls without taking mu_.
  std::atomic<bool> stopping_{false};
  Worker worker_;  // runs Run() with a reference to this watcher
};

// Opens the watcher's own connection to the database file at `path` (the
// SQLite driver's, defined beside it).
Watcher::OpenConnection watcher_connection(const std::string& path);

}  // namespace simba::internal::sql::sqlite

#endif  // SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_
