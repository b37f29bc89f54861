// Internal to the SQLite driver: the C handles' RAII and the push watcher.
//
// SQLite has no notifications between processes, but `PRAGMA data_version`
// tells a connection, cheaply, whether any *other* connection committed
// since it last asked. The watcher is one thread per backend with a
// connection of its own (so it never waits for the calls' connection, and
// so the calls' own commits count as "another connection"); it asks every
// kWatchTick and, when the answer changed, reads the owner and version of
// the watched mutexes in one query and reports each mutex that was
// released or whose holder lost it since it last looked. It is the SQL
// protocol's Listener for SQLite (backends/sql/sql_backend.h), which owns
// the subscriptions and calls the listeners.

#ifndef SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_
#define SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_

#include <sqlite3.h>

#include <atomic>
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

#include "core/unique_handle.h"
#include "core/worker.h"
#include "simba/backend.h"

namespace simba::internal::sql::sqlite {

// close_v2 tolerates statements not yet finalized (it defers the close), so
// destruction order mistakes cannot leak the connection.
using DbPtr = UniqueHandle<sqlite3, sqlite3_close_v2>;
using StmtPtr = UniqueHandle<sqlite3_stmt, sqlite3_finalize>;

// One use of a prepared statement. Resetting at the end matters beyond
// reuse: a SELECT left un-reset keeps its read transaction (and WAL
// snapshot) open.
class StmtUse {
 public:
  explicit StmtUse(sqlite3_stmt* stmt) : stmt_(stmt) {}
  explicit StmtUse(const StmtPtr& stmt) : stmt_(stmt.get()) {}
  ~StmtUse() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  StmtUse(const StmtUse&) = delete;
  StmtUse& operator=(const StmtUse&) = delete;

  sqlite3_stmt* get() const { return stmt_; }
  // SQLITE_STATIC (nullptr): `text` must outlive this use.
  int BindText(int index, std::string_view text) const {
    return sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), nullptr);
  }
  std::string ColumnText(int column) const;

 private:
  sqlite3_stmt* stmt_;
};

inline bool IsBusy(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

// The table recording the version each forced release left (the SQLite
// driver's ForcedNoticeSql writes it): a free row whose version is recorded
// there was freed by force, not by its owner.
inline constexpr char kForcedTable[] = "simba_mutex_forced";

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
  };

  // `path` is for messages; `sqlite_path` is what SQLite opens.
  Watcher(std::string path, std::string sqlite_path)
      : path_(std::move(path)), sqlite_path_(std::move(sqlite_path)) {}
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Starts the thread, which reports to `on_event` (one call at a time)
  // until Shutdown.
  void Start(OnEvent on_event);
  // Watches `mutex` from `seen` (the row as read when subscribing; nullopt
  // if unknown, then the first look is the baseline).
  void Watch(const std::string& mutex, std::optional<RowState> seen);
  void Unwatch(const std::string& mutex);
  // Makes the thread look now rather than at its next tick: a release made
  // through this backend reaches local waiters at once.
  void Poke();
  // Stops the thread: on_event is not called after this returns (unless it
  // is called from on_event, on the watcher thread: then the thread ends
  // as soon as that call returns, making no other).
  void Shutdown();

 private:
  void Run();
  // Compares what a look saw with what was seen before. REQUIRES: mu_.
  void ObserveLocked(const std::vector<std::pair<std::string, RowState>>& rows,
                     std::vector<MutexEvent>* events);

  const std::string path_;
  const std::string sqlite_path_;

  std::mutex mu_;
  std::condition_variable wake_;
  OnEvent on_event_;      // set once, before the thread starts
  bool stopped_ = false;  // guarded by mu_
  bool poked_ = false;    // guarded by mu_
  // Bumped whenever the set of watched mutexes changes. Guarded by mu_.
  std::uint64_t membership_ = 0;
  // The row as last seen (nullopt until a look or Watch). Guarded by mu_.
  std::map<std::string, std::optional<RowState>, std::less<>> watched_;
  // stopped_, readable between on_event calls without taking mu_.
  std::atomic<bool> stopping_{false};
  Worker worker_;  // runs Run() with a reference to this watcher
};

}  // namespace simba::internal::sql::sqlite

#endif  // SIMBA_BACKENDS_SQLITE_SQLITE_WATCHER_H_
