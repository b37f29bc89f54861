// The SQLite backend: Simba's `simba_mutex` table in a local database file,
// shared by every process on the host that opens the same file.
//
// How it stays correct across processes:
//   * Every write is one transaction started with BEGIN IMMEDIATE, which takes
//     the file's write lock before anything is read, so "read the row, decide,
//     write" is atomic against every other connection (this also removes
//     Simba's first-use INSERT race: nobody else can insert in between).
//   * Lease times come from the database clock (SQLite's 'now', the host's
//     clock), read once per call inside the transaction, never from our own.
//   * Waiting for the write lock is done by a busy handler bounded by the
//     call's deadline, plus a retry of the whole transaction for the few
//     SQLITE_BUSY cases SQLite returns without calling the handler. Contention
//     therefore shows up as waiting; only a deadline (or busy_timeout) that
//     runs out becomes an error, kDeadlineExceeded or kUnavailable.
//
// One connection per backend, used by one call at a time (waiting for one's
// turn also respects the call's deadline). The connection is opened with
// SQLITE_OPEN_NOMUTEX because that turn-taking already serializes it.
//
// Push (subscribe): SQLite has no notifications between processes, but
// `PRAGMA data_version` tells a connection, cheaply, whether any *other*
// connection committed since it last asked. One watcher thread per backend,
// with a connection of its own (so it never waits for the calls' connection,
// and so the calls' own commits count as "another connection"), asks every
// few milliseconds; when the answer changed it reads the owner and version
// of the subscribed mutexes in one query and tells the listeners of each
// mutex that is free now and changed since it last looked (released, or
// force-released). See Watcher below.

#include "simba/backends/sqlite.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "backends/sqlite/sqlite_errors.h"
#include "core/log.h"

// ---------------------------------------------------------------------------
// Error translation: the only place SQLite result codes become Status.
// ---------------------------------------------------------------------------

namespace simba {
namespace {

// errno values that mean "not allowed" rather than "not there" or "broken".
bool IsPermissionErrno(int e) { return e == EACCES || e == EPERM || e == EROFS; }

}  // namespace
}  // namespace simba

namespace simba::internal {
namespace {

// "<sqlite text> (sqlite code N[, errno E: text])", for every non-busy error.
std::string Describe(const SqliteFailure& failure) {
  std::string text = failure.sqlite_message.empty()
                         ? std::string(sqlite3_errstr(failure.code))
                         : std::string(failure.sqlite_message);
  text += " (sqlite code " + std::to_string(failure.code);
  if (failure.system_errno != 0) {
    // std::error_code rather than strerror: thread-safe.
    text += ", errno " + std::to_string(failure.system_errno) + ": " +
            std::error_code(failure.system_errno, std::generic_category()).message();
  }
  text += ")";
  return text;
}

}  // namespace

Status SqliteFailureToStatus(const SqliteFailure& failure, bool deadline_passed,
                             std::string_view context) {
  const int code = failure.code;
  const int primary = code & 0xff;
  const std::string prefix = std::string(context) + ": ";
  switch (primary) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
      return OkStatus();
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      // Contention, not a fault: our own text, so that SQLite's "database is
      // locked" never reaches a user who merely set a short deadline.
      if (deadline_passed) {
        return DeadlineExceededError(
            prefix + "deadline reached while waiting for the database lock "
                     "(another connection holds it)");
      }
      return UnavailableError(prefix +
                              "busy_timeout elapsed while waiting for the database "
                              "lock (another connection holds it)");
    case SQLITE_READONLY:
      if (code == SQLITE_READONLY_DBMOVED) {
        // Not a permission problem: the file was renamed or deleted while
        // open; reopening the backend may help.
        return UnavailableError(prefix + "the database file was moved or deleted: " +
                                Describe(failure));
      }
      return PermissionDeniedError(prefix + "the database is read-only: " +
                                   Describe(failure));
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return PermissionDeniedError(prefix + "access denied: " + Describe(failure));
    case SQLITE_CANTOPEN:
      if (code == SQLITE_CANTOPEN_ISDIR) {
        return InvalidArgumentError(prefix + "the path is a directory: " +
                                    Describe(failure));
      }
      if (IsPermissionErrno(failure.system_errno)) {
        return PermissionDeniedError(prefix + "cannot open the database: " +
                                     Describe(failure));
      }
      if (failure.system_errno == ENOENT || failure.system_errno == ENOTDIR) {
        return NotFoundError(prefix + "cannot open the database: " + Describe(failure));
      }
      return UnavailableError(prefix + "cannot open the database: " + Describe(failure));
    case SQLITE_NOTADB:
      // The path names some other file: a configuration mistake that no retry fixes.
      return InvalidArgumentError(prefix + "the file is not an SQLite database: " +
                                  Describe(failure));
    case SQLITE_IOERR:
      if (IsPermissionErrno(failure.system_errno)) {
        return PermissionDeniedError(prefix + "I/O refused: " + Describe(failure));
      }
      return UnavailableError(prefix + "I/O error: " + Describe(failure));
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_PROTOCOL:
    case SQLITE_SCHEMA:
    case SQLITE_NOLFS:
      // Environmental and possibly passing (disk space, memory, a WAL lock
      // race, a concurrent schema change): callers may retry.
      return UnavailableError(prefix + Describe(failure));
    case SQLITE_INTERRUPT:
      if (deadline_passed) {
        return DeadlineExceededError(prefix + "interrupted at the deadline: " +
                                     Describe(failure));
      }
      return CancelledError(prefix + "interrupted: " + Describe(failure));
    case SQLITE_CORRUPT:
      return InternalError(prefix + "the database is corrupt: " + Describe(failure));
    default:
      // SQLITE_ERROR, MISUSE, CONSTRAINT, RANGE, MISMATCH, TOOBIG, ...: our
      // statements are fixed and our rows valid, so these mean a bug (or a
      // table someone else changed).
      return InternalError(prefix + Describe(failure));
  }
}

}  // namespace simba::internal

namespace simba {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

using internal::SqliteFailure;
using internal::SqliteFailureToStatus;

// ---- SQL ---------------------------------------------------------------------

// Simba's columns (see the JDBC DDL) plus fencing_token, which JVM Simba
// ignores. SQLite's INTEGER is 64-bit signed: enough for epoch milliseconds
// and for a version that grows by one per change.
constexpr char kCreateTableSql[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex ("
    " mutex TEXT PRIMARY KEY,"
    " acquired_at INTEGER NOT NULL,"
    " ttl_at INTEGER NOT NULL,"
    " transition_at INTEGER NOT NULL,"
    " owner_id TEXT NOT NULL,"
    " version INTEGER NOT NULL,"
    " fencing_token INTEGER NOT NULL DEFAULT 0)";

// A table created by other tooling from Simba's DDL lacks our column.
constexpr char kHasTokenColumnSql[] =
    "SELECT 1 FROM pragma_table_info('simba_mutex') WHERE name = 'fencing_token'";
constexpr char kAddTokenColumnSql[] =
    "ALTER TABLE simba_mutex ADD COLUMN fencing_token INTEGER NOT NULL DEFAULT 0";

// The database clock in epoch milliseconds. julianday('now') is fixed for
// the duration of one sqlite3_step(); ROUND undoes the binary rounding of
// the day fraction so the whole millisecond SQLite started from comes back.
// (unixepoch('subsec') would be neater but needs SQLite 3.42.)
constexpr char kNowSql[] =
    "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

constexpr char kBeginReadSql[] = "BEGIN DEFERRED";
// Takes the write lock before the first read: see the file comment.
constexpr char kBeginWriteSql[] = "BEGIN IMMEDIATE";
constexpr char kCommitSql[] = "COMMIT";
constexpr char kRollbackSql[] = "ROLLBACK";

constexpr char kSelectOneSql[] =
    "SELECT acquired_at, ttl_at, transition_at, owner_id, version, fencing_token"
    " FROM simba_mutex WHERE mutex = ?1";

constexpr char kSelectAllSql[] =
    "SELECT acquired_at, ttl_at, transition_at, owner_id, version, fencing_token,"
    " mutex FROM simba_mutex ORDER BY mutex";

// Insert-or-update in one statement; safe because BEGIN IMMEDIATE already
// excludes every other writer between our SELECT and this write.
constexpr char kUpsertSql[] =
    "INSERT INTO simba_mutex"
    " (mutex, acquired_at, ttl_at, transition_at, owner_id, version, fencing_token)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    " ON CONFLICT (mutex) DO UPDATE SET"
    " acquired_at = excluded.acquired_at, ttl_at = excluded.ttl_at,"
    " transition_at = excluded.transition_at, owner_id = excluded.owner_id,"
    " version = excluded.version, fencing_token = excluded.fencing_token";

// Simba's RELEASE: free values, version + 1; fencing_token is kept so the
// next acquisition's token (its new version) is still strictly greater.
// ?3: the ownership's token, or 0 for any (see Backend::release).
constexpr char kReleaseSql[] =
    "UPDATE simba_mutex SET acquired_at = 0, ttl_at = 0, transition_at = 0,"
    " owner_id = '', version = version + 1"
    " WHERE mutex = ?1 AND owner_id = ?2 AND (?3 = 0 OR fencing_token = ?3)";

// ---- SQL of the push watcher (its own connection) --------------------------------

// Changes whenever another connection (another process, or this backend's
// own calls, which use a different connection) has committed to the file
// since this connection last asked. In WAL mode it reads a counter from
// the shared-memory index: no write lock, no disk I/O.
constexpr char kDataVersionSql[] = "PRAGMA data_version";

// The subscribed names live in a table private to the watcher's connection
// (TEMP: never written to the file, never locked against other processes),
// so one join reads exactly the watched rows however many there are.
constexpr char kCreateWatchedSql[] =
    "CREATE TEMP TABLE IF NOT EXISTS simba_watched (mutex TEXT PRIMARY KEY)";
constexpr char kClearWatchedSql[] = "DELETE FROM temp.simba_watched";
constexpr char kInsertWatchedSql[] =
    "INSERT OR IGNORE INTO temp.simba_watched (mutex) VALUES (?1)";
// owner_id, version and fencing_token are NULL for a watched mutex without
// a row (never used): free, version 0.
constexpr char kSelectWatchedSql[] =
    "SELECT w.mutex, m.owner_id, m.version, m.fencing_token FROM temp.simba_watched AS w"
    " LEFT JOIN main.simba_mutex AS m ON m.mutex = w.mutex";

// Column order shared by kSelectOneSql and kSelectAllSql.
enum RowColumn : int {
  kColAcquiredAt = 0,
  kColTtlAt,
  kColTransitionAt,
  kColOwnerId,
  kColVersion,
  kColFencingToken,
  kColMutex,  // kSelectAllSql only
};

// ---- limits --------------------------------------------------------------------

// Simba's varchar(66), so a name used here also fits the MySQL backend's
// table and a JVM Simba fleet.
constexpr std::size_t kMaxMutexLength = 66;
constexpr std::size_t kMaxContenderIdLength = 128;

// ttl and transition above this would overflow now + ttl + transition in
// 64-bit milliseconds (now is about 2^41); no real lease comes close.
constexpr milliseconds kMaxLeasePart{std::numeric_limits<std::int64_t>::max() / 4};

// Back-off while the write lock is held elsewhere. A commit in WAL mode takes
// tens of microseconds, so start small; cap it so a freed lock is noticed
// quickly even after a long wait.
constexpr std::chrono::microseconds kMinBusyPause{100};
constexpr std::chrono::microseconds kMaxBusyPause{5000};

// How often the watcher asks PRAGMA data_version. A tick costs a few
// microseconds when nothing changed, so waiters learn of a release within
// ~15 ms (at once for releases made through this backend, which wake the
// watcher) instead of at their next poll, seconds later.
constexpr milliseconds kWatchTick{15};

// How long subscribe() may wait for this backend's connection to read the
// row it starts from (see SqliteBackend::subscribe).
constexpr milliseconds kSubscribeReadBound{1000};

// SQLITE_STATIC (the value 0) spelled without the C-style cast in sqlite3.h:
// SQLite will not copy the bound text, which stays alive until the statement
// is reset (StmtUse below resets and clears bindings).
constexpr sqlite3_destructor_type kSqliteStatic = nullptr;

// ---- RAII over the C handles ---------------------------------------------------

struct DbCloser {
  // close_v2 tolerates statements not yet finalized (it defers the close),
  // so destruction order mistakes cannot leak the connection.
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// One use of a cached statement. Resetting at the end matters beyond reuse:
// a SELECT left un-reset keeps its read transaction (and WAL snapshot) open.
class StmtUse {
 public:
  explicit StmtUse(const StmtPtr& stmt) : stmt_(stmt.get()) {}
  ~StmtUse() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  StmtUse(const StmtUse&) = delete;
  StmtUse& operator=(const StmtUse&) = delete;

  sqlite3_stmt* get() const { return stmt_; }

  int BindText(int index, std::string_view text) const {
    return sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()),
                             kSqliteStatic);
  }
  int BindInt(int index, std::int64_t value) const {
    return sqlite3_bind_int64(stmt_, index, value);
  }

 private:
  sqlite3_stmt* stmt_;
};

bool IsBusy(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

bool IsSuccess(int rc) { return rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW; }

// Sleeps a little before the next try, never past `until`. Returns false
// (without sleeping) when `until` has already come.
bool PauseBeforeRetry(int attempt, steady_clock::time_point until) {
  const auto now = steady_clock::now();
  if (now >= until) return false;
  auto pause = kMinBusyPause * (1 << std::min(attempt, 6));
  pause = std::min<std::chrono::microseconds>(pause, kMaxBusyPause);
  std::this_thread::sleep_for(std::min<steady_clock::duration>(pause, until - now));
  return true;
}

// sqlite3_busy_handler callback: called by SQLite (on the calling thread,
// during a call that has the connection) when a lock it needs is held by another connection.
// Returning nonzero makes SQLite try again; zero makes it give up with
// SQLITE_BUSY. `arg` points at the current call's wait limit.
int BusyHandler(void* arg, int attempts) {
  const auto* until = static_cast<const steady_clock::time_point*>(arg);
  return PauseBeforeRetry(attempts, *until) ? 1 : 0;
}

// A row of simba_mutex.
struct StoredRow {
  MutexOwner owner;
  std::int64_t version = 0;
};

StoredRow ReadRow(sqlite3_stmt* stmt) {
  StoredRow row;
  row.owner.acquired_at = milliseconds(sqlite3_column_int64(stmt, kColAcquiredAt));
  row.owner.ttl_at = milliseconds(sqlite3_column_int64(stmt, kColTtlAt));
  row.owner.transition_at = milliseconds(sqlite3_column_int64(stmt, kColTransitionAt));
  const unsigned char* owner = sqlite3_column_text(stmt, kColOwnerId);
  if (owner != nullptr) {
    row.owner.owner_id.assign(reinterpret_cast<const char*>(owner),
                              static_cast<std::size_t>(sqlite3_column_bytes(stmt, kColOwnerId)));
  }
  row.version = sqlite3_column_int64(stmt, kColVersion);
  row.owner.fencing_token = static_cast<std::uint64_t>(sqlite3_column_int64(stmt, kColFencingToken));
  return row;
}

// Who owns a row at the store's time `now`, as read(), list() and
// force_release() report it: MutexOwner::None() (token 0, "no owner") for a
// released row (owner '') and for a row whose hard lease has ended
// (transition_at < now), because acquire_or_renew would hand either to the
// next caller; otherwise the row as stored. One rule for all three, the
// same as acquire_or_renew's notion of "free" and the memory backend's.
MutexOwner Visible(const StoredRow& row, std::int64_t now) {
  if (!row.owner.has_owner_id() || row.owner.transition_at.count() < now) {
    return MutexOwner::None();
  }
  return row.owner;
}

// The file name handed to SQLite for `path`. Debian's SQLite is built with
// SQLITE_USE_URI, which would read a name starting with "file:" as a URI;
// "./" keeps it a plain relative path.
std::string SqlitePathOf(const std::string& path) {
  if (path.rfind("file:", 0) == 0) return "./" + path;
  return path;
}

std::string Quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

// ---- push: the watcher ----------------------------------------------------------

using Listener = std::function<void(const MutexEvent&)>;

// What the watcher knows of one mutex's row: its owner ('' = free) and its
// version, which every acquire, renew, release and forced release bumps
// (ours and JVM Simba's alike). The version is what makes a release
// detectable even when the watcher never saw the row held: a free row whose
// version moved since the last look was released (or force-released) after
// that look, however briefly it was held in between.
struct RowState {
  std::string owner;
  std::int64_t version = 0;
  std::int64_t fencing_token = 0;
};

// The watcher's own connection: opened, used and closed on the watcher
// thread only. Every method returns an SQLite result code; none waits for a
// lock (no busy handler), because a busy file only means "ask again next
// tick".
class WatchConnection {
 public:
  explicit WatchConnection(std::string sqlite_path) : sqlite_path_(std::move(sqlite_path)) {}

  bool is_open() const { return db_ != nullptr; }

  int Open() {
    sqlite3* raw = nullptr;
    // READWRITE without CREATE: the backend created the file; if it has
    // gone, watching a new empty one would be wrong. (A read-only handle
    // would do for the reads, but WAL readers may need to write -shm.)
    const int rc = sqlite3_open_v2(sqlite_path_.c_str(), &raw,
                                   SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
    db_.reset(raw);  // owns the handle even when the open failed
    if (rc != SQLITE_OK) return FailAndClose(rc);
    sqlite3_extended_result_codes(db_.get(), 1);
    int step = sqlite3_exec(db_.get(), kCreateWatchedSql, nullptr, nullptr, nullptr);
    for (const auto& [sql, stmt] :
         {std::pair{kDataVersionSql, &data_version_}, std::pair{kClearWatchedSql, &clear_},
          std::pair{kInsertWatchedSql, &insert_}, std::pair{kSelectWatchedSql, &select_}}) {
      if (step != SQLITE_OK) break;
      sqlite3_stmt* prepared = nullptr;
      step = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &prepared,
                                nullptr);
      stmt->reset(prepared);
    }
    if (step != SQLITE_OK) return FailAndClose(step);
    return SQLITE_OK;
  }

  // Statements before the connection: a connection closes for good only
  // once they are finalized.
  void Close() {
    data_version_.reset();
    clear_.reset();
    insert_.reset();
    select_.reset();
    db_.reset();
  }

  // Makes temp.simba_watched hold exactly `names`, in one transaction on
  // the temp database (the file is not touched).
  int ReplaceWatched(const std::vector<std::string>& names) {
    int rc = sqlite3_exec(db_.get(), "BEGIN", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) {
      StmtUse use(clear_);
      rc = sqlite3_step(use.get());
      if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    for (const std::string& name : names) {
      if (rc != SQLITE_OK) break;
      StmtUse use(insert_);
      rc = use.BindText(1, name);
      if (rc == SQLITE_OK) rc = sqlite3_step(use.get());
      if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    if (rc == SQLITE_OK) rc = sqlite3_exec(db_.get(), "COMMIT", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return SQLITE_OK;
    rc = Fail(rc);
    if (sqlite3_get_autocommit(db_.get()) == 0) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return rc;
  }

  int DataVersion(std::int64_t* version) {
    StmtUse use(data_version_);
    const int rc = sqlite3_step(use.get());
    if (rc != SQLITE_ROW) return Fail(rc);
    *version = sqlite3_column_int64(use.get(), 0);
    return SQLITE_OK;
  }

  // The row state of every watched mutex (free, version 0 when it has no
  // row). One statement, so one consistent snapshot of the file.
  int ReadRows(std::vector<std::pair<std::string, RowState>>* rows) {
    rows->clear();
    StmtUse use(select_);
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(use.get())) == SQLITE_ROW) {
      rows->emplace_back(ColumnText(use.get(), 0),
                         RowState{ColumnText(use.get(), 1), sqlite3_column_int64(use.get(), 2),
                                  sqlite3_column_int64(use.get(), 3)});
    }
    if (rc != SQLITE_DONE) return Fail(rc);
    return SQLITE_OK;
  }

  // What the last failing call reported, for the log.
  const SqliteFailure& failure() const { return failure_; }

 private:
  static std::string ColumnText(sqlite3_stmt* stmt, int column) {
    const unsigned char* text = sqlite3_column_text(stmt, column);
    if (text == nullptr) return std::string();
    return std::string(reinterpret_cast<const char*>(text),
                       static_cast<std::size_t>(sqlite3_column_bytes(stmt, column)));
  }

  // Records the failure (before anything else replaces SQLite's message).
  int Fail(int rc) {
    message_ = db_ != nullptr ? sqlite3_errmsg(db_.get()) : sqlite3_errstr(rc);
    failure_ = SqliteFailure{rc, db_ != nullptr ? sqlite3_system_errno(db_.get()) : 0, message_};
    return rc;
  }
  // For a failed Open: is_open() must not report a half-made connection.
  int FailAndClose(int rc) {
    Fail(rc);
    Close();
    return rc;
  }

  const std::string sqlite_path_;
  std::string message_;  // failure_.sqlite_message points into it
  SqliteFailure failure_;
  // Declared before the statements so it is destroyed after them.
  DbPtr db_;
  StmtPtr data_version_, clear_, insert_, select_;
};

// Delivers releases of subscribed mutexes, for one backend: one thread and
// one connection however many mutexes and subscriptions there are.
//
// Shared (std::shared_ptr) by the backend, every Subscription and the
// thread itself, so a Subscription may outlive the backend and the backend
// may be destroyed on the watcher thread (from inside a listener) without
// anything dangling.
//
// Locks: mu_ guards the bookkeeping and is never held while a listener runs
// or while SQLite is called. Each subscription has its own recursive mutex,
// held while its listener runs; the Subscription's destructor takes it too,
// which is what makes "after the destructor returns the listener is not
// called again" true. Recursive, so that a listener destroying its own
// Subscription (on the watcher thread, already holding it) does not
// deadlock; a listener destroying another subscription takes that one's
// mutex, which is free because listeners run one at a time. Destroying a
// Subscription on another thread waits for a running call of its listener;
// listeners must not block, and must not wait for a lock that the thread
// destroying the Subscription holds.
class Watcher : public std::enable_shared_from_this<Watcher> {
 public:
  // `path` is for messages; `sqlite_path` is what SQLite opens.
  Watcher(std::string path, std::string sqlite_path)
      : path_(std::move(path)), sqlite_path_(std::move(sqlite_path)) {}

  // The thread is joined or detached by Shutdown (the backend's destructor
  // calls it before dropping its reference), and Shutdown moves it out, so
  // this never destroys a joinable std::thread.
  ~Watcher() = default;

  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Starts the thread on first use. `seen` is the mutex's row as read when
  // subscribing (nullopt if that read failed): releases committed after it
  // are delivered, even if they happen before the watcher's next look.
  Result<std::unique_ptr<Subscription>> Subscribe(std::string mutex, Listener listener,
                                                  std::optional<RowState> seen);

  // Makes the thread look now rather than at its next tick: a release made
  // through this backend reaches local waiters at once.
  void Poke() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      poked_ = true;
    }
    wake_.notify_one();
  }

  // Stops the thread: no listener is called after this returns (unless it
  // is called from a listener, on the watcher thread: then the thread is
  // detached and ends as soon as that listener returns, calling no other).
  void Shutdown();

 private:
  class WatchSubscription;

  struct Slot {
    explicit Slot(Listener l) : listener(std::move(l)) {}
    std::recursive_mutex mu;  // held while `listener` runs
    bool active = true;       // guarded by mu
    const Listener listener;
  };

  struct Watched {
    // The row as last seen (by a look or by Subscribe); nullopt until then.
    // Shared by every subscription to the mutex.
    std::optional<RowState> seen;
    std::vector<std::shared_ptr<Slot>> slots;
  };

  struct Delivery {
    std::shared_ptr<Slot> slot;
    MutexEvent event;
  };

  void Unsubscribe(const std::string& mutex, const std::shared_ptr<Slot>& slot);
  void Run();
  // Compares what a look saw with what was seen before. REQUIRES: mu_.
  void ObserveLocked(const std::vector<std::pair<std::string, RowState>>& rows,
                     std::vector<Delivery>* deliveries);
  void Deliver(const std::vector<Delivery>& deliveries);
  void ReportFailure(const SqliteFailure& failure, bool* failing);

  const std::string path_;
  const std::string sqlite_path_;

  std::mutex mu_;
  std::condition_variable wake_;
  bool started_ = false;  // guarded by mu_
  bool stopped_ = false;  // guarded by mu_
  bool poked_ = false;    // guarded by mu_
  // Bumped whenever the set of watched mutexes changes. Guarded by mu_.
  std::uint64_t membership_ = 0;
  std::map<std::string, Watched, std::less<>> watched_;  // guarded by mu_
  std::thread thread_;                                   // guarded by mu_
  // stopped_, readable between listener calls without taking mu_.
  std::atomic<bool> stopping_{false};
};

class Watcher::WatchSubscription final : public Subscription {
 public:
  WatchSubscription(std::shared_ptr<Watcher> watcher, std::string mutex,
                    std::shared_ptr<Slot> slot)
      : watcher_(std::move(watcher)), mutex_(std::move(mutex)), slot_(std::move(slot)) {}
  ~WatchSubscription() override { watcher_->Unsubscribe(mutex_, slot_); }

  WatchSubscription(const WatchSubscription&) = delete;
  WatchSubscription& operator=(const WatchSubscription&) = delete;

 private:
  const std::shared_ptr<Watcher> watcher_;
  const std::string mutex_;
  const std::shared_ptr<Slot> slot_;
};

Result<std::unique_ptr<Subscription>> Watcher::Subscribe(std::string mutex, Listener listener,
                                                         std::optional<RowState> seen) {
  auto slot = std::make_shared<Slot>(std::move(listener));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) {
      return FailedPreconditionError("sqlite " + Quoted(path_) +
                                     ": subscribe: the backend is being destroyed");
    }
    if (!started_) {
      try {
        // The thread holds a reference, so the watcher outlives it even when
        // Shutdown had to detach it.
        thread_ = std::thread([self = shared_from_this()] { self->Run(); });
      } catch (const std::system_error& e) {
        return UnavailableError("sqlite " + Quoted(path_) +
                                ": subscribe: cannot start the watcher thread: " + e.what());
      }
      started_ = true;
    }
    auto [it, inserted] = watched_.try_emplace(mutex);
    if (inserted) ++membership_;
    Watched& watched = it->second;
    // Adopt the caller's reading when nothing is known yet, or when it shows
    // a newer holder. Never a newer *free* row over an older one: that would
    // hide a release the other subscribers have not been told of yet. (A
    // newer holder hides nothing worth telling: the mutex is taken again.)
    if (seen.has_value() &&
        (!watched.seen.has_value() ||
         (seen->version > watched.seen->version && !seen->owner.empty()))) {
      watched.seen = std::move(seen);
    }
    watched.slots.push_back(slot);
  }
  wake_.notify_one();
  return std::unique_ptr<Subscription>(
      std::make_unique<WatchSubscription>(shared_from_this(), std::move(mutex), std::move(slot)));
}

void Watcher::Unsubscribe(const std::string& mutex, const std::shared_ptr<Slot>& slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watched_.find(mutex);
    if (it != watched_.end()) {
      std::erase(it->second.slots, slot);
      if (it->second.slots.empty()) {
        watched_.erase(it);
        ++membership_;
      }
    }
  }
  // Waits for a call of this listener running on the watcher thread; does
  // not block when this *is* that call (recursive mutex, see the class
  // comment).
  std::lock_guard<std::recursive_mutex> lock(slot->mu);
  slot->active = false;
}

void Watcher::Shutdown() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stopping_.store(true);
    thread = std::move(thread_);
  }
  wake_.notify_all();
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    // The backend is being destroyed by one of the listeners (it dropped the
    // last reference): joining ourselves would throw. The thread sees
    // stopping_ once the listener returns and ends on its own.
    thread.detach();
  } else {
    thread.join();
  }
}

void Watcher::Run() {
  WatchConnection connection(sqlite_path_);
  // The data_version of the last successful look; when !have_seen, look at
  // the next tick whatever the version. (Not std::optional: GCC 12 warns
  // that it "may be used uninitialized".)
  bool have_seen = false;
  std::int64_t seen_version = 0;
  std::uint64_t synced_membership = 0;  // the membership_ temp.simba_watched holds
  bool failing = false;
  std::vector<std::pair<std::string, RowState>> rows;
  std::vector<Delivery> deliveries;

  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (watched_.empty()) {
      // Nothing to watch: sleep until a subscription (no ticking, no I/O).
      wake_.wait(lock, [this] { return stopped_ || !watched_.empty(); });
    } else {
      wake_.wait_for(lock, kWatchTick, [this] { return stopped_ || poked_; });
    }
    if (stopped_) break;
    poked_ = false;
    const std::uint64_t membership = membership_;
    std::vector<std::string> names;
    if (membership != synced_membership) {
      names.reserve(watched_.size());
      for (const auto& entry : watched_) names.push_back(entry.first);
    }
    lock.unlock();

    // Outside mu_: SQLite may take a moment, and subscribers must not wait.
    int rc = connection.is_open() ? SQLITE_OK : connection.Open();
    if (rc == SQLITE_OK && membership != synced_membership) {
      rc = connection.ReplaceWatched(names);
      if (rc == SQLITE_OK) {
        synced_membership = membership;
        have_seen = false;  // new names: look at their rows now
      }
    }
    std::int64_t version = 0;
    bool looked = false;
    if (rc == SQLITE_OK) rc = connection.DataVersion(&version);
    if (rc == SQLITE_OK && (!have_seen || seen_version != version)) {
      // data_version was read first: a commit landing between the two reads
      // is in what we read now and changes the version again, so at worst
      // we look once more next tick; we never miss one.
      rc = connection.ReadRows(&rows);
      if (rc == SQLITE_OK) {
        have_seen = true;
        seen_version = version;
        looked = true;
      }
    }
    if (rc != SQLITE_OK) {
      ReportFailure(connection.failure(), &failing);
      have_seen = false;
      if (!IsBusy(rc)) {
        // Not mere contention (file moved, I/O error, ...): start afresh
        // next tick with a new connection, whose temp table is empty.
        connection.Close();
        synced_membership = 0;
      }
    } else if (failing) {
      failing = false;
      SIMBA_LOG(kInfo, "sqlite " << Quoted(path_) << ": push watcher recovered");
    }

    lock.lock();
    if (looked) ObserveLocked(rows, &deliveries);
    if (!deliveries.empty()) {
      lock.unlock();
      Deliver(deliveries);
      deliveries.clear();
      lock.lock();
    }
  }
  lock.unlock();
  connection.Close();
}

void Watcher::ObserveLocked(const std::vector<std::pair<std::string, RowState>>& rows,
                            std::vector<Delivery>* deliveries) {
  for (const auto& [mutex, row] : rows) {
    auto it = watched_.find(mutex);
    if (it == watched_.end()) continue;  // unsubscribed meanwhile
    Watched& watched = it->second;
    if (!watched.seen.has_value()) {
      // The first reading is the baseline, not news.
      watched.seen = row;
      continue;
    }
    // Versions only grow; an older reading (a Subscribe's was newer) says
    // nothing new.
    if (row.version < watched.seen->version) continue;
    // Free now and changed since last seen: released (or force-released)
    // since. A row held now, by anyone, is not news to a waiter: nobody can
    // take it until it is released, which a later look will catch.
    const RowState& seen = *watched.seen;
    // A free row whose token is its version was freed by force_release (a
    // release leaves the token below the version).
    const bool forced = row.owner.empty() && row.version != seen.version &&
                        row.fencing_token == row.version;
    // The holder last seen holds it no more, and not by its own release: it
    // was forced out, or its lease ran out and another took the mutex. Its
    // own release never reaches it here (a service ends its subscription
    // before it releases), so a subscriber with its id hears of a hold that
    // ended without it, at once rather than at its next renewal. (Everyone
    // else ignores a loss naming another id.)
    const bool holder_gone =
        !seen.owner.empty() && row.owner != seen.owner && (forced || !row.owner.empty());
    // Forced out of a hold this watcher never saw (taken and forced between
    // two looks: the version moved more than the force's one step): the row
    // is free, so whoever believes it owns the mutex is wrong; the loss
    // names nobody, which matches every owner. (One that acquired after
    // this look is told too, and simply contends again.) A force of a mutex
    // that was free all along tells nobody.
    const bool unseen_hold_forced = seen.owner.empty() && forced && row.version > seen.version + 1;
    if (holder_gone || unseen_hold_forced) {
      MutexEvent lost{MutexEvent::Kind::kLost, mutex, seen.owner};
      lost.fencing_token = static_cast<std::uint64_t>(seen.owner.empty() ? 0 : seen.fencing_token);
      lost.forced = forced;
      for (const std::shared_ptr<Slot>& slot : watched.slots) {
        deliveries->push_back(Delivery{slot, lost});
      }
    }
    if (row.owner.empty() && row.version != seen.version) {
      // The holder the watcher last saw; '' if it never saw one (the whole
      // hold fell between two looks).
      const std::string& previous = seen.owner;
      for (const std::shared_ptr<Slot>& slot : watched.slots) {
        deliveries->push_back(
            Delivery{slot, MutexEvent{MutexEvent::Kind::kReleased, mutex, previous}});
      }
    }
    watched.seen = row;
  }
}

void Watcher::Deliver(const std::vector<Delivery>& deliveries) {
  for (const Delivery& delivery : deliveries) {
    // The backend was destroyed (possibly by the previous listener).
    if (stopping_.load()) return;
    std::lock_guard<std::recursive_mutex> lock(delivery.slot->mu);
    if (!delivery.slot->active) continue;
    try {
      delivery.slot->listener(delivery.event);
    } catch (const std::exception& e) {
      // Listeners must not throw; one that does must not end the watching
      // for everyone else.
      SIMBA_LOG(kError, "sqlite " << Quoted(path_) << ": a release listener for mutex "
                                  << Quoted(delivery.event.mutex) << " threw: " << e.what());
    } catch (...) {
      SIMBA_LOG(kError, "sqlite " << Quoted(path_) << ": a release listener for mutex "
                                  << Quoted(delivery.event.mutex) << " threw");
    }
  }
}

void Watcher::ReportFailure(const SqliteFailure& failure, bool* failing) {
  // Once per run of failures: the watcher retries every tick, and the log
  // must not get a line each time.
  if (*failing) return;
  *failing = true;
  SIMBA_LOG(kWarn, SqliteFailureToStatus(failure, false,
                                         "sqlite " + Quoted(path_) + ": push watcher")
                       << " (retrying every tick; waiters fall back to polling meanwhile)");
}

enum class TxKind {
  kNone,   // no BEGIN/COMMIT: PRAGMA journal_mode cannot run in a transaction
  kRead,   // BEGIN DEFERRED: a WAL snapshot; readers never wait for writers
  kWrite,  // BEGIN IMMEDIATE
};

class SqliteBackend final : public Backend {
 public:
  SqliteBackend(SqliteOptions options, DbPtr db)
      : options_(std::move(options)),
        watcher_(std::make_shared<Watcher>(options_.path, SqlitePathOf(options_.path))),
        db_(std::move(db)) {
    // Through the watcher: see the file comment.
    capabilities_.push_release = true;
    capabilities_.cross_process = true;
    capabilities_.fencing_source = "row version at acquisition (simba_mutex.fencing_token)";
    capabilities_.max_mutex_length = kMaxMutexLength;
    capabilities_.max_contender_id_length = kMaxContenderIdLength;
    // The handler reads wait_until_ through this pointer; the backend lives
    // on the heap and never moves, so the pointer stays valid.
    sqlite3_busy_handler(db_.get(), &BusyHandler, &wait_until_);
  }

  // Stops the watcher thread (Subscriptions still alive stay valid objects
  // whose listeners are no longer called).
  ~SqliteBackend() override { watcher_->Shutdown(); }

  SqliteBackend(const SqliteBackend&) = delete;
  SqliteBackend& operator=(const SqliteBackend&) = delete;

  // Sets up the connection: WAL, the table, the cached statements. Waits for
  // other connections up to options_.busy_timeout.
  Status Init();

  std::string_view scheme() const override { return "sqlite"; }
  const Capabilities& capabilities() const override { return capabilities_; }

  Result<OwnerRecord> acquire_or_renew(const AcquireRequest& request,
                                       Deadline deadline) override;
  Result<bool> release(std::string_view mutex, std::string_view contender_id,
                       std::uint64_t fencing_token, Deadline deadline) override;
  Result<ForcedRelease> force_release(std::string_view mutex, Deadline deadline) override;
  Result<OwnerRecord> read(std::string_view mutex, Deadline deadline) override;
  Result<std::vector<ListedMutex>> list(Deadline deadline) override;
  using Backend::subscribe;
  // Every subscriber hears every release (the contender id is not needed).
  Result<std::unique_ptr<Subscription>> subscribe(
      std::string_view mutex, std::string_view contender_id,
      std::function<void(const MutexEvent&)> listener) override;

 private:
  // "sqlite '<path>': <op>", the start of every error message.
  std::string Context(std::string_view op) const {
    return "sqlite " + Quoted(options_.path) + ": " + std::string(op);
  }

  // Waits (until `deadline`) for this call's turn on the connection and
  // sets the call's lock-wait limit. On OK the caller owns the connection
  // until the returned Turn is destroyed.
  class Turn;
  Result<Turn> Enter(std::string_view op, Deadline deadline);

  // Runs `body` (returning an SQLite result code) in a transaction of
  // `kind` and commits. On SQLITE_BUSY from any step (BEGIN, body, COMMIT)
  // it rolls back and starts over while wait_until_ allows; any other
  // failure rolls back and is translated. `body` may run several times, so
  // it must (re)set all its outputs. REQUIRES: the caller has the turn.
  template <typename Body>
  Status Transact(TxKind kind, std::string_view op, Deadline deadline, Body&& body);

  void RollbackIfOpen();
  int Prepare(const char* sql, StmtPtr* out);
  int Step(const StmtPtr& stmt);  // a statement without parameters or rows
  int ReadNow(std::int64_t* now);
  int SelectOne(std::string_view mutex, std::optional<StoredRow>* row);
  // The row's owner and version as the watcher tracks them.
  Result<RowState> ReadRowState(std::string_view mutex, Deadline deadline);

  const SqliteOptions options_;
  Capabilities capabilities_;
  // Push. Thread-safe on its own; shared with the Subscriptions it hands out.
  const std::shared_ptr<Watcher> watcher_;

  // Turn-taking on the connection: a call holds the turn (in_use_) for its
  // whole duration, which may include waiting for the file lock, so mu_
  // itself is held only briefly. (Not std::timed_mutex: its steady-clock
  // try_lock_until uses pthread_mutex_clocklock, which GCC 12's TSan does
  // not intercept, so every lock would be reported as a bad unlock.)
  std::mutex mu_;
  std::condition_variable turn_done_;
  bool in_use_ = false;  // guarded by mu_

  // Everything below is used only by the call that has the turn.

  // Until when the current call may wait for the file lock (read by
  // BusyHandler, which runs inside the call's SQLite calls).
  steady_clock::time_point wait_until_;
  // Declared before the statements so it is destroyed after them.
  DbPtr db_;
  StmtPtr begin_read_, begin_write_, commit_, rollback_, now_, select_one_,
      select_all_, upsert_, release_;
};

// The right to use the connection, held for one call.
class SqliteBackend::Turn {
 public:
  explicit Turn(SqliteBackend* backend) : backend_(backend) {}
  Turn(Turn&& other) noexcept : backend_(std::exchange(other.backend_, nullptr)) {}
  Turn& operator=(Turn&&) = delete;
  ~Turn() {
    if (backend_ == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(backend_->mu_);
      backend_->in_use_ = false;
    }
    backend_->turn_done_.notify_one();
  }

 private:
  SqliteBackend* backend_;
};

Result<SqliteBackend::Turn> SqliteBackend::Enter(std::string_view op, Deadline deadline) {
  if (steady_clock::now() >= deadline) {
    return DeadlineExceededError(Context(op) + ": the deadline had passed before the call");
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!turn_done_.wait_until(lock, deadline, [this] { return !in_use_; })) {
      return DeadlineExceededError(
          Context(op) + ": deadline reached while waiting for this backend's connection "
                        "(another call on it is still waiting for the database)");
    }
    in_use_ = true;
  }
  wait_until_ = std::min<steady_clock::time_point>(
      deadline, steady_clock::now() + options_.busy_timeout);
  return Turn(this);
}

void SqliteBackend::RollbackIfOpen() {
  // After some errors (e.g. a failed COMMIT of certain kinds) SQLite has
  // already rolled back; ROLLBACK then would fail, so ask first.
  if (sqlite3_get_autocommit(db_.get()) == 0) {
    if (rollback_ != nullptr) {
      Step(rollback_);
    } else {
      sqlite3_exec(db_.get(), kRollbackSql, nullptr, nullptr, nullptr);
    }
  }
}

int SqliteBackend::Prepare(const char* sql, StmtPtr* out) {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  out->reset(raw);
  return rc;
}

int SqliteBackend::Step(const StmtPtr& stmt) {
  StmtUse use(stmt);
  return sqlite3_step(use.get());
}

int SqliteBackend::ReadNow(std::int64_t* now) {
  StmtUse use(now_);
  const int rc = sqlite3_step(use.get());
  if (rc != SQLITE_ROW) return rc;
  *now = sqlite3_column_int64(use.get(), 0);
  return SQLITE_OK;
}

int SqliteBackend::SelectOne(std::string_view mutex, std::optional<StoredRow>* row) {
  StmtUse use(select_one_);
  if (const int rc = use.BindText(1, mutex); rc != SQLITE_OK) return rc;
  const int rc = sqlite3_step(use.get());
  if (rc == SQLITE_DONE) {
    row->reset();
    return SQLITE_OK;
  }
  if (rc != SQLITE_ROW) return rc;
  *row = ReadRow(use.get());
  return SQLITE_OK;
}

template <typename Body>
Status SqliteBackend::Transact(TxKind kind, std::string_view op, Deadline deadline,
                               Body&& body) {
  for (int attempt = 0;; ++attempt) {
    int rc = SQLITE_DONE;
    if (kind == TxKind::kRead) rc = Step(begin_read_);
    if (kind == TxKind::kWrite) rc = Step(begin_write_);
    if (rc == SQLITE_DONE) {
      rc = body();
      if (IsSuccess(rc) && kind != TxKind::kNone) rc = Step(commit_);
      if (IsSuccess(rc)) return OkStatus();
    }
    // Copy the message before ROLLBACK replaces it.
    const std::string message = sqlite3_errmsg(db_.get());
    const SqliteFailure failure{rc, sqlite3_system_errno(db_.get()), message};
    RollbackIfOpen();
    // The busy handler normally did the waiting already; this covers BUSY
    // that SQLite returns without consulting it (e.g. a stale WAL snapshot).
    if (IsBusy(rc) && PauseBeforeRetry(attempt, wait_until_)) continue;
    return SqliteFailureToStatus(failure, steady_clock::now() >= deadline, Context(op));
  }
}

Status SqliteBackend::Init() {
  const Deadline deadline = steady_clock::now() + options_.busy_timeout;
  wait_until_ = deadline;

  // WAL: readers never wait for the writer, and a commit is one append.
  // Switching an existing database needs a brief exclusive lock, hence the
  // busy-retry wrapper; on a database already in WAL it is a no-op.
  std::string journal_mode;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kNone, "enabling WAL", deadline, [&]() -> int {
    StmtPtr pragma;
    if (const int rc = Prepare("PRAGMA journal_mode=WAL", &pragma); rc != SQLITE_OK) return rc;
    StmtUse use(pragma);
    const int rc = sqlite3_step(use.get());
    if (rc != SQLITE_ROW) return rc;
    const unsigned char* text = sqlite3_column_text(use.get(), 0);
    journal_mode = text == nullptr ? "" : reinterpret_cast<const char*>(text);
    return SQLITE_OK;
  }));
  if (journal_mode != "wal") {
    // E.g. a file system without shared memory. Still correct (BEGIN
    // IMMEDIATE and the busy handler still serialize writers); readers
    // wait for writers, though.
    SIMBA_LOG(kWarn, "sqlite " << Quoted(options_.path) << ": journal_mode is '" << journal_mode
                               << "', not 'wal'; readers will wait for writers");
  }

  // FULL syncs the WAL on every commit. With NORMAL the last commits can be
  // lost when the OS or the power fails, and a fencing token already handed
  // to an owner could then be handed out again: a broken guarantee, which is
  // worse than one fsync (~0.1 ms on an SSD) per acquire/renew/release.
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kNone, "setting synchronous", deadline, [&]() -> int {
    return sqlite3_exec(db_.get(), "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr);
  }));

  // Transaction statements first: Transact(kWrite) below needs them.
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kNone, "preparing statements", deadline, [&]() -> int {
    for (const auto& [sql, stmt] : {std::pair{kBeginReadSql, &begin_read_},
                                    std::pair{kBeginWriteSql, &begin_write_},
                                    std::pair{kCommitSql, &commit_},
                                    std::pair{kRollbackSql, &rollback_},
                                    std::pair{kNowSql, &now_}}) {
      if (const int rc = Prepare(sql, stmt); rc != SQLITE_OK) return rc;
    }
    return SQLITE_OK;
  }));

  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kWrite, "creating table simba_mutex", deadline,
                                 [&]() -> int {
    int rc = sqlite3_exec(db_.get(), kCreateTableSql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return rc;
    bool has_token = false;
    {
      StmtPtr check;
      if (rc = Prepare(kHasTokenColumnSql, &check); rc != SQLITE_OK) return rc;
      StmtUse use(check);
      rc = sqlite3_step(use.get());
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rc;
      has_token = rc == SQLITE_ROW;
    }
    if (has_token) return SQLITE_OK;
    return sqlite3_exec(db_.get(), kAddTokenColumnSql, nullptr, nullptr, nullptr);
  }));

  // Prepared after the table exists (preparing checks the columns).
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kNone, "preparing statements", deadline, [&]() -> int {
    for (const auto& [sql, stmt] :
         {std::pair{kSelectOneSql, &select_one_}, std::pair{kSelectAllSql, &select_all_},
          std::pair{kUpsertSql, &upsert_}, std::pair{kReleaseSql, &release_}}) {
      if (const int rc = Prepare(sql, stmt); rc != SQLITE_OK) return rc;
    }
    return SQLITE_OK;
  }));

  // Last guard: SQLite silently opens a file it cannot write read-only.
  if (sqlite3_db_readonly(db_.get(), "main") == 1) {
    return PermissionDeniedError("sqlite: database file " + Quoted(options_.path) +
                                 " is read-only");
  }
  return OkStatus();
}

Result<OwnerRecord> SqliteBackend::acquire_or_renew(const AcquireRequest& request,
                                                    Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(request.mutex));
  SIMBA_RETURN_IF_ERROR(validate_contender_id(request.contender_id));
  if (request.ttl <= milliseconds::zero()) {
    return InvalidArgumentError("ttl must be positive, got " +
                                std::to_string(request.ttl.count()) + "ms");
  }
  if (request.transition < milliseconds::zero()) {
    return InvalidArgumentError("transition must not be negative, got " +
                                std::to_string(request.transition.count()) + "ms");
  }
  if (request.ttl > kMaxLeasePart || request.transition > kMaxLeasePart) {
    return InvalidArgumentError("ttl and transition must each be at most " +
                                std::to_string(kMaxLeasePart.count()) + "ms");
  }

  const std::string op = "acquire_or_renew(" + Quoted(request.mutex) + ")";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));

  OwnerRecord result;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kWrite, op, deadline, [&]() -> int {
    // Under the write lock: nothing changes between this read and our write.
    std::int64_t now = 0;
    if (const int rc = ReadNow(&now); rc != SQLITE_OK) return rc;
    std::optional<StoredRow> row;
    if (const int rc = SelectOne(request.mutex, &row); rc != SQLITE_OK) return rc;
    result.store_now = milliseconds(now);

    const bool free = !row.has_value() || !row->owner.has_owner_id() ||
                      row->owner.transition_at.count() < now;
    // `>=`: the owner may renew up to and including transition_at, which is
    // exactly when others are still excluded. Simba's `>` left a 1 ms gap
    // where neither the owner nor anyone else could take the mutex.
    const bool renew = !free && row->owner.owner_id == request.contender_id &&
                       row->owner.transition_at.count() >= now;
    if (!free && !renew) {
      result.owner = row->owner;
      return SQLITE_OK;
    }

    // version counts every change (as in Simba); a new acquisition's token
    // is the new version, so it exceeds every earlier token of this row.
    const std::int64_t version = (row.has_value() ? row->version : 0) + 1;
    MutexOwner owner;
    owner.owner_id = std::string(request.contender_id);
    owner.acquired_at = milliseconds(now);
    owner.ttl_at = owner.acquired_at + request.ttl;
    owner.transition_at = owner.ttl_at + request.transition;
    owner.fencing_token = renew ? row->owner.fencing_token : static_cast<std::uint64_t>(version);

    StmtUse use(upsert_);
    int rc = SQLITE_OK;
    if (rc == SQLITE_OK) rc = use.BindText(1, request.mutex);
    if (rc == SQLITE_OK) rc = use.BindInt(2, owner.acquired_at.count());
    if (rc == SQLITE_OK) rc = use.BindInt(3, owner.ttl_at.count());
    if (rc == SQLITE_OK) rc = use.BindInt(4, owner.transition_at.count());
    if (rc == SQLITE_OK) rc = use.BindText(5, request.contender_id);
    if (rc == SQLITE_OK) rc = use.BindInt(6, version);
    if (rc == SQLITE_OK) {
      rc = use.BindInt(7, static_cast<std::int64_t>(owner.fencing_token));
    }
    if (rc == SQLITE_OK) rc = sqlite3_step(use.get());
    if (rc != SQLITE_DONE) return rc;
    result.owner = std::move(owner);
    return SQLITE_OK;
  }));
  return result;
}

Result<bool> SqliteBackend::release(std::string_view mutex, std::string_view contender_id,
                                    std::uint64_t fencing_token, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  SIMBA_RETURN_IF_ERROR(validate_contender_id(contender_id));

  const std::string op = "release(" + Quoted(mutex) + ")";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));

  bool released = false;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kWrite, op, deadline, [&]() -> int {
    StmtUse use(release_);
    int rc = use.BindText(1, mutex);
    if (rc == SQLITE_OK) rc = use.BindText(2, contender_id);
    if (rc == SQLITE_OK) {
      rc = sqlite3_bind_int64(use.get(), 3, static_cast<sqlite3_int64>(fencing_token));
    }
    if (rc == SQLITE_OK) rc = sqlite3_step(use.get());
    if (rc != SQLITE_DONE) return rc;
    released = sqlite3_changes(db_.get()) > 0;
    return SQLITE_OK;
  }));
  // Committed: local subscribers hear of it now rather than at the next tick.
  if (released) watcher_->Poke();
  return released;
}

Result<ForcedRelease> SqliteBackend::force_release(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));

  const std::string op = "force_release(" + Quoted(mutex) + ")";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));

  ForcedRelease result;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kWrite, op, deadline, [&]() -> int {
    std::int64_t now = 0;
    if (const int rc = ReadNow(&now); rc != SQLITE_OK) return rc;
    std::optional<StoredRow> row;
    if (const int rc = SelectOne(mutex, &row); rc != SQLITE_OK) return rc;
    result.store_now = milliseconds(now);
    // Who is removed, by read()'s rule: an ended lease is nobody's.
    result.previous = row.has_value() ? Visible(*row, now) : MutexOwner::None();

    // The free row (created if the mutex was never used) with its version
    // moved on, and that version recorded as the fencing token: every token
    // ever handed out is at most the old version, and the next acquisition
    // takes version + 1, so this version is a floor between the two.
    const std::int64_t version = (row.has_value() ? row->version : 0) + 1;
    StmtUse use(upsert_);
    int rc = use.BindText(1, mutex);
    if (rc == SQLITE_OK) rc = use.BindInt(2, 0);
    if (rc == SQLITE_OK) rc = use.BindInt(3, 0);
    if (rc == SQLITE_OK) rc = use.BindInt(4, 0);
    if (rc == SQLITE_OK) rc = use.BindText(5, "");
    if (rc == SQLITE_OK) rc = use.BindInt(6, version);
    if (rc == SQLITE_OK) rc = use.BindInt(7, version);
    if (rc == SQLITE_OK) rc = sqlite3_step(use.get());
    if (rc != SQLITE_DONE) return rc;
    result.fencing_floor = static_cast<std::uint64_t>(version);
    return SQLITE_OK;
  }));
  watcher_->Poke();
  return result;
}

Result<OwnerRecord> SqliteBackend::read(std::string_view mutex, Deadline deadline) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));

  const std::string op = "read(" + Quoted(mutex) + ")";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));

  OwnerRecord result;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kRead, op, deadline, [&]() -> int {
    // Row first, then now: the snapshot starts at the first table read, so
    // store_now is never earlier than what the row reflects.
    std::optional<StoredRow> row;
    if (const int rc = SelectOne(mutex, &row); rc != SQLITE_OK) return rc;
    std::int64_t now = 0;
    if (const int rc = ReadNow(&now); rc != SQLITE_OK) return rc;
    result.owner = row.has_value() ? Visible(*row, now) : MutexOwner::None();
    result.store_now = milliseconds(now);
    return SQLITE_OK;
  }));
  return result;
}

Result<std::vector<ListedMutex>> SqliteBackend::list(Deadline deadline) {
  const std::string op = "list()";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));

  std::vector<ListedMutex> result;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kRead, op, deadline, [&]() -> int {
    result.clear();
    std::vector<StoredRow> rows;
    {
      StmtUse use(select_all_);
      int rc = SQLITE_ROW;
      while ((rc = sqlite3_step(use.get())) == SQLITE_ROW) {
        ListedMutex listed;
        const unsigned char* name = sqlite3_column_text(use.get(), kColMutex);
        if (name != nullptr) {
          listed.mutex.assign(
              reinterpret_cast<const char*>(name),
              static_cast<std::size_t>(sqlite3_column_bytes(use.get(), kColMutex)));
        }
        rows.push_back(ReadRow(use.get()));
        result.push_back(std::move(listed));
      }
      if (rc != SQLITE_DONE) return rc;
    }
    // One clock reading for the whole listing, taken after the rows as in
    // read(), and each row judged by it.
    std::int64_t now = 0;
    if (const int rc = ReadNow(&now); rc != SQLITE_OK) return rc;
    for (std::size_t i = 0; i < result.size(); ++i) {
      result[i].record.owner = Visible(rows[i], now);
      result[i].record.store_now = milliseconds(now);
    }
    return SQLITE_OK;
  }));
  return result;
}

Result<std::unique_ptr<Subscription>> SqliteBackend::subscribe(
    std::string_view mutex, std::string_view /*contender_id*/,
    std::function<void(const MutexEvent&)> listener) {
  SIMBA_RETURN_IF_ERROR(validate_mutex(mutex));
  if (!listener) return InvalidArgumentError("listener must not be empty");
  // The row as of now, so a release committed after this call returns is
  // delivered even if it comes before the watcher first looks (a hand-over
  // can take a millisecond; the watcher looks every kWatchTick). A read
  // never waits for writers; the bound only covers waiting for this
  // backend's connection. Failing it costs only that guarantee (the first
  // look becomes the baseline), so it does not fail the subscription.
  std::optional<RowState> seen;
  Result<RowState> row = ReadRowState(mutex, steady_clock::now() + kSubscribeReadBound);
  if (row.ok()) {
    seen = std::move(*row);
  } else {
    SIMBA_LOG(kDebug, row.status() << " (subscribing anyway)");
  }
  return watcher_->Subscribe(std::string(mutex), std::move(listener), std::move(seen));
}

Result<RowState> SqliteBackend::ReadRowState(std::string_view mutex, Deadline deadline) {
  const std::string op = "subscribe(" + Quoted(mutex) + "): reading the row";
  SIMBA_ASSIGN_OR_RETURN(const Turn turn, Enter(op, deadline));
  RowState state;
  SIMBA_RETURN_IF_ERROR(Transact(TxKind::kRead, op, deadline, [&]() -> int {
    std::optional<StoredRow> row;
    if (const int rc = SelectOne(mutex, &row); rc != SQLITE_OK) return rc;
    state = row.has_value() ? RowState{row->owner.owner_id, row->version,
                                       static_cast<std::int64_t>(row->owner.fencing_token)}
                            : RowState{};
    return SQLITE_OK;
  }));
  return state;
}

// ---- opening ---------------------------------------------------------------------

// Checks the path before SQLite sees it, because sqlite3_open_v2 reports
// every one of these as the same "unable to open database file".
Status CheckPath(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  if (!file.has_filename()) {
    return InvalidArgumentError("sqlite: path " + Quoted(path) +
                                " names a directory, not a database file");
  }
  std::string dir = file.parent_path().string();
  if (dir.empty()) dir = ".";

  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
      return NotFoundError("sqlite: directory " + Quoted(dir) + " does not exist");
    }
    if (IsPermissionErrno(e)) {
      return PermissionDeniedError("sqlite: directory " + Quoted(dir) +
                                   " of the database file " + Quoted(path) +
                                   " cannot be searched: permission denied");
    }
    return UnavailableError("sqlite: cannot inspect directory " + Quoted(dir) + ": " +
                            std::error_code(e, std::generic_category()).message());
  }
  if (!S_ISDIR(st.st_mode)) {
    return NotFoundError("sqlite: directory " + Quoted(dir) +
                         " does not exist (it is not a directory)");
  }

  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return InvalidArgumentError("sqlite: path " + Quoted(path) +
                                  " is a directory, not a database file");
    }
    // AT_EACCESS: judge by the effective ids, as open() will.
    if (::faccessat(AT_FDCWD, path.c_str(), R_OK | W_OK, AT_EACCESS) != 0 &&
        IsPermissionErrno(errno)) {
      return PermissionDeniedError("sqlite: database file " + Quoted(path) +
                                   " is read-only (it must be readable and writable)");
    }
  }
  // Also needed when the file exists: WAL mode creates <path>-wal and
  // <path>-shm beside it.
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0 &&
      IsPermissionErrno(errno)) {
    return PermissionDeniedError("sqlite: directory " + Quoted(dir) +
                                 " is read-only (SQLite creates " + Quoted(path) +
                                 " and its -wal and -shm files there)");
  }
  return OkStatus();
}

}  // namespace

Result<std::shared_ptr<Backend>> NewSqliteBackend(SqliteOptions options) {
  if (options.path.empty()) return InvalidArgumentError("sqlite: path must not be empty");
  if (options.path == ":memory:") {
    // SQLite would give each backend a private in-memory database, which
    // shares nothing: not what a lock store is for.
    return InvalidArgumentError(
        "sqlite: ':memory:' is not supported (nothing would be shared); use memory:// "
        "for an in-process store");
  }
  if (options.busy_timeout < milliseconds::zero()) {
    return InvalidArgumentError("sqlite: busy_timeout must not be negative, got " +
                                std::to_string(options.busy_timeout.count()) + "ms");
  }
  if (sqlite3_threadsafe() == 0) {
    return FailedPreconditionError(
        "sqlite: the linked SQLite library was built without thread support "
        "(SQLITE_THREADSAFE=0)");
  }
  SIMBA_RETURN_IF_ERROR(CheckPath(options.path));

  const std::string sqlite_path = SqlitePathOf(options.path);

  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(sqlite_path.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  DbPtr db(raw);  // owns the handle even when the open failed
  if (rc != SQLITE_OK) {
    const std::string message = db != nullptr ? sqlite3_errmsg(db.get()) : "";
    const SqliteFailure failure{
        db != nullptr ? sqlite3_extended_errcode(db.get()) : rc,
        db != nullptr ? sqlite3_system_errno(db.get()) : 0, message};
    return SqliteFailureToStatus(failure, false, "sqlite: opening " + Quoted(options.path));
  }
  sqlite3_extended_result_codes(db.get(), 1);

  auto backend =
      std::make_shared<SqliteBackend>(std::move(options), std::move(db));
  SIMBA_RETURN_IF_ERROR(backend->Init());
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<SqliteOptions> SqliteOptionsFromUri(const Uri& uri) {
  constexpr char kForms[] = "sqlite:///abs/path.db or sqlite://rel/path.db";
  if (uri.scheme != "sqlite") {
    return InvalidArgumentError("sqlite: URI scheme is " + Quoted(uri.scheme) +
                                ", expected 'sqlite'");
  }
  if (uri.user.has_value() || uri.password.has_value()) {
    return InvalidArgumentError("sqlite: URI must not carry a user or password");
  }
  if (uri.hosts.size() > 1) {
    return InvalidArgumentError(std::string("sqlite: URI names several hosts; expected ") +
                                kForms);
  }
  if (!uri.hosts.empty() && uri.hosts.front().port.has_value()) {
    return InvalidArgumentError(std::string("sqlite: URI must not have a port; expected ") +
                                kForms);
  }
  SIMBA_RETURN_IF_ERROR(uri.CheckQueryKeys({"busy_timeout"}).WithContext("sqlite"));

  SqliteOptions options;
  // sqlite://rel/dir/x.db parses as host "rel" + path "/dir/x.db"; joined,
  // they are the relative path. sqlite:///abs.db has no host.
  options.path = (uri.hosts.empty() ? std::string() : uri.hosts.front().host) + uri.path;
  if (options.path.empty() || options.path.back() == '/') {
    return InvalidArgumentError(std::string("sqlite: URI has no database file path; expected ") +
                                kForms);
  }
  if (const std::optional<std::string> value = uri.Query("busy_timeout")) {
    SIMBA_ASSIGN_OR_RETURN(options.busy_timeout, ParseDuration("busy_timeout", *value));
    if (options.busy_timeout < milliseconds::zero()) {
      return InvalidArgumentError("sqlite: busy_timeout must not be negative");
    }
  }
  return options;
}

}  // namespace simba
