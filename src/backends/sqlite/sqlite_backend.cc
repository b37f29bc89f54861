// The SQLite driver of the SQL protocol (backends/sql/sql_backend.h):
// Simba's `simba_mutex` table in a local database file, shared by every
// process on the host that opens the same file.
//
// How it stays correct across processes:
//   * Every write is one transaction started with BEGIN IMMEDIATE, which takes
//     the file's write lock before anything is read, so "read the row, decide,
//     write" is atomic against every other connection (this also removes
//     Simba's first-use INSERT race: nobody else can insert in between).
//   * Lease times come from the database clock (SQLite's 'now', the host's
//     clock), read once per call inside the transaction (":now" in every
//     statement of the call), never from our own.
//   * Waiting for the write lock is done by a busy handler bounded by the
//     call's deadline, plus a retry of the whole transaction for the few
//     SQLITE_BUSY cases SQLite returns without calling the handler. Contention
//     therefore shows up as waiting; only a deadline (or busy_timeout) that
//     runs out becomes an error, kDeadlineExceeded or kUnavailable.
//
// One connection per backend (the protocol's pool of one), used by one call
// at a time; it is opened with SQLITE_OPEN_NOMUTEX because that turn-taking
// already serializes it. Push: the data_version watcher (sqlite_watcher.h).
//
// Files written before the SQL protocol served SQLite had a fencing_token
// column and bumped version on renewal; opening one migrates it (Migrate).

#include "simba/backends/sqlite.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "backends/sqlite/host_locks.h"
#include "backends/sqlite/sqlite_errors.h"
#include "backends/sqlite/sqlite_watcher.h"
#include "core/log.h"
#include "core/unique_handle.h"

// ---------------------------------------------------------------------------
// Error translation: the only place SQLite result codes become Status.
// ---------------------------------------------------------------------------

namespace simba::internal {
namespace {

// errno values that mean "not allowed" rather than "not there" or "broken".
bool is_permission_errno(int e) { return e == EACCES || e == EPERM || e == EROFS; }

// "<sqlite text> (sqlite code N[, errno E: text])", for every non-busy error.
std::string describe(const SqliteFailure& failure) {
  std::string text = failure.sqlite_message.empty() ? std::string(sqlite3_errstr(failure.code))
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

Status sqlite_failure_to_status(const SqliteFailure& failure, bool deadline_passed,
                                std::string_view context) {
  const int code = failure.code;
  const int primary = code & 0xff;
  const std::string prefix = context.empty() ? std::string() : std::string(context) + ": ";
  switch (primary) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
      return ok_status();
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      // Contention, not a fault: our own text, so that SQLite's "database is
      // locked" never reaches a user who merely set a short deadline.
      if (deadline_passed) {
        return deadline_exceeded_error(prefix +
                                       "deadline reached while waiting for the database lock "
                                       "(another connection holds it)");
      }
      return unavailable_error(prefix +
                               "busy_timeout elapsed while waiting for the database "
                               "lock (another connection holds it)");
    case SQLITE_READONLY:
      if (code == SQLITE_READONLY_DBMOVED) {
        // Not a permission problem: the file was renamed or deleted while
        // open; reopening the backend may help.
        return unavailable_error(prefix +
                                 "the database file was moved or deleted: " + describe(failure));
      }
      return permission_denied_error(prefix + "the database is read-only: " + describe(failure));
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return permission_denied_error(prefix + "access denied: " + describe(failure));
    case SQLITE_CANTOPEN:
      if (code == SQLITE_CANTOPEN_ISDIR) {
        return invalid_argument_error(prefix + "the path is a directory: " + describe(failure));
      }
      if (is_permission_errno(failure.system_errno)) {
        return permission_denied_error(prefix + "cannot open the database: " + describe(failure));
      }
      if (failure.system_errno == ENOENT || failure.system_errno == ENOTDIR) {
        return not_found_error(prefix + "cannot open the database: " + describe(failure));
      }
      return unavailable_error(prefix + "cannot open the database: " + describe(failure));
    case SQLITE_NOTADB:
      // The path names some other file: a configuration mistake that no retry fixes.
      return invalid_argument_error(prefix +
                                    "the file is not an SQLite database: " + describe(failure));
    case SQLITE_IOERR:
      if (is_permission_errno(failure.system_errno)) {
        return permission_denied_error(prefix + "I/O refused: " + describe(failure));
      }
      return unavailable_error(prefix + "I/O error: " + describe(failure));
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_PROTOCOL:
    case SQLITE_SCHEMA:
    case SQLITE_NOLFS:
      // Environmental and possibly passing (disk space, memory, a WAL lock
      // race, a concurrent schema change): callers may retry.
      return unavailable_error(prefix + describe(failure));
    case SQLITE_INTERRUPT:
      if (deadline_passed) {
        return deadline_exceeded_error(prefix +
                                       "interrupted at the deadline: " + describe(failure));
      }
      return cancelled_error(prefix + "interrupted: " + describe(failure));
    case SQLITE_CORRUPT:
      return internal_error(prefix + "the database is corrupt: " + describe(failure));
    default:
      // SQLITE_ERROR, MISUSE, CONSTRAINT, RANGE, MISMATCH, TOOBIG, ...: our
      // statements are fixed and our rows valid, so these mean a bug (or a
      // table someone else changed).
      return internal_error(prefix + describe(failure));
  }
}

}  // namespace simba::internal

namespace simba::internal::sql::sqlite {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

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
  int bind_text(int index, std::string_view text) const {
    return sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), nullptr);
  }
  std::string column_text(int column) const {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    if (text == nullptr) return std::string();
    return std::string(reinterpret_cast<const char*>(text),
                       static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)));
  }

 private:
  sqlite3_stmt* stmt_;
};

inline bool is_busy(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

// ---- SQL ---------------------------------------------------------------------

// Simba's columns (see the JDBC DDL). SQLite's INTEGER is 64-bit signed:
// enough for epoch milliseconds and for a version that grows by one per
// change.
constexpr char kCreateTableSql[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex ("
    " mutex TEXT PRIMARY KEY,"
    " acquired_at INTEGER NOT NULL,"
    " ttl_at INTEGER NOT NULL,"
    " transition_at INTEGER NOT NULL,"
    " owner_id TEXT NOT NULL,"
    " version INTEGER NOT NULL)";

// The version each forced release left (see ForcedNoticeSql): how the
// watcher tells a forced release from an owner's.
constexpr char kCreateForcedTableSql[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex_forced ("
    " mutex TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL)";

// Which tenures are backed by a kernel lock (host_locks.h): the row's
// version while its holder held the lock named lock_id. Written in the
// acquiring transaction, only by a holder that holds the lock; a version
// that moved on (a release, a takeover, an older Simba's acquisition, which
// knows nothing of this table) makes the record stale, and stale records
// prove nothing.
constexpr char kCreateHostTableSql[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex_host ("
    " mutex TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL,"
    " lock_id TEXT NOT NULL)";

// The token rule before the SQL protocol served SQLite: version + 1 on
// every acquisition, renewal and release, and the acquisition's version
// kept in this column as the token.
constexpr char kHasTokenColumnSql[] =
    "SELECT 1 FROM pragma_table_info('simba_mutex') WHERE name = 'fencing_token'";
// Every token handed out under that rule is at most the row's version, and
// the next acquisition takes version + 1, so tokens keep growing across the
// upgrade. (max: even a row someone edited by hand keeps that promise.)
constexpr char kMigrateVersionSql[] =
    "UPDATE simba_mutex SET version = fencing_token WHERE fencing_token > version";
constexpr char kDropTokenColumnSql[] = "ALTER TABLE simba_mutex DROP COLUMN fencing_token";

// The database clock in epoch milliseconds, read once per call (after the
// transaction began, so never earlier than what it reads) and bound to
// ":now" (now_ms()) in every statement of the call. julianday('now') is fixed
// for the duration of one sqlite3_step(); ROUND undoes the binary rounding
// of the day fraction so the whole millisecond SQLite started from comes
// back. The schema read opens the read snapshot of a deferred transaction
// first. (unixepoch('subsec') would be neater but needs SQLite 3.42.)
constexpr char kNowSql[] =
    "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER),"
    " (SELECT count(*) FROM main.sqlite_master)";
constexpr char kNowParameter[] = ":now";

// Back-off while the write lock is held elsewhere. A commit in WAL mode takes
// tens of microseconds, so start small; cap it so a freed lock is noticed
// quickly even after a long wait.
constexpr std::chrono::microseconds kMinBusyPause{100};
constexpr std::chrono::microseconds kMaxBusyPause{5000};

// Prepared statements kept per connection. The protocol's statements are a
// few dozen texts; the cap is a bound, not a working size.
constexpr std::size_t kMaxCachedStatements = 64;

// Sleeps a little before the next try, never past `until`. Returns false
// (without sleeping) when `until` has already come.
bool pause_before_retry(int attempt, steady_clock::time_point until) {
  const auto now = steady_clock::now();
  if (now >= until) return false;
  auto pause = kMinBusyPause * (1 << std::min(attempt, 6));
  pause = std::min<std::chrono::microseconds>(pause, kMaxBusyPause);
  std::this_thread::sleep_for(std::min<steady_clock::duration>(pause, until - now));
  return true;
}

// sqlite3_busy_handler callback: called by SQLite (on the calling thread,
// during a call that has the connection) when a lock it needs is held by
// another connection. Returning nonzero makes SQLite try again; zero makes
// it give up with SQLITE_BUSY. `arg` points at the current call's wait limit.
int busy_handler(void* arg, int attempts) {
  const auto* until = static_cast<const steady_clock::time_point*>(arg);
  return pause_before_retry(attempts, *until) ? 1 : 0;
}

bool is_success(int rc) { return rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW; }

// The file name handed to SQLite for `path`. Debian's SQLite is built with
// SQLITE_USE_URI, which would read a name starting with "file:" as a URI;
// "./" keeps it a plain relative path.
std::string sqlite_path_of(const std::string& path) {
  if (path.rfind("file:", 0) == 0) return "./" + path;
  return path;
}

// A statement prepared from the protocol's text: {i} became :pi, bound as
// text, and {#i} :pi, bound as an integer. (Named: SQLite numbers a named
// parameter after the highest one before it, so ":now" and ?N would clash.)
struct Prepared {
  StmtPtr stmt;
  std::vector<bool> numeric;  // by protocol parameter
  std::vector<int> index;     // by protocol parameter: SQLite's, 0 if unused
  int now_index = 0;          // of ":now", 0 if unused
};

// One connection. Every call runs in a transaction of its own: BEGIN
// IMMEDIATE to write, BEGIN DEFERRED (one WAL snapshot; readers never wait
// for the writer) to read more than once. Never marked broken: a file moved
// away under us stays an error on every call (reopening by name would
// create a new, empty file); nothing else breaks a connection.
class SqliteSession final : public SqlSession {
 public:
  SqliteSession(DbPtr db, milliseconds busy_timeout, std::shared_ptr<Watcher> watcher)
      : db_(std::move(db)), busy_timeout_(busy_timeout), watcher_(std::move(watcher)) {
    // The handler reads wait_until_ through this pointer; the session lives
    // on the heap and never moves, so the pointer stays valid.
    sqlite3_busy_handler(db_.get(), &busy_handler, &wait_until_);
  }
  ~SqliteSession() override {
    cache_.clear();  // statements before the connection
    now_.reset();
  }

  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    if (steady_clock::now() >= deadline) {
      return deadline_exceeded_error("the deadline had passed before the call");
    }
    set_wait_limit(deadline);
    // (Pointers into the cache: it must not be cleared while they are used.)
    if (cache_.size() + statements.size() > kMaxCachedStatements) cache_.clear();
    std::vector<Prepared*> prepared;
    bool uses_now = false;
    for (const Statement& statement : statements) {
      Prepared* p = nullptr;
      if (const int rc = prepare(statement.sql, &p); rc != SQLITE_OK) {
        if (failure != nullptr &&
            std::string_view(sqlite3_errmsg(db_.get())).rfind("no such table", 0) == 0) {
          *failure = SqlFailure::kNoTable;
        }
        return failed(rc, deadline, "");
      }
      uses_now = uses_now || p->now_index > 0;
      prepared.push_back(p);
    }
    const char* begin = transaction                         ? "BEGIN IMMEDIATE"
                        : statements.size() > 1 || uses_now ? "BEGIN DEFERRED"
                                                            : nullptr;
    const int changes_before = sqlite3_total_changes(db_.get());
    std::vector<SqlResult> results;
    SIMBA_RETURN_IF_ERROR(transact(begin, deadline, "", [&]() -> int {
      results.assign(statements.size(), SqlResult{});
      std::int64_t now = 0;
      if (uses_now) {
        StmtUse use(now_);
        const int rc = sqlite3_step(use.get());
        if (rc != SQLITE_ROW) return rc;
        now = sqlite3_column_int64(use.get(), 0);
      }
      for (std::size_t i = 0; i < statements.size(); ++i) {
        const int rc = step(*prepared[i], statements[i].params, now, &results[i]);
        if (rc != SQLITE_OK) return rc;
      }
      return SQLITE_OK;
    }));
    // Committed: local subscribers hear of it now rather than at the next tick.
    if (watcher_ && sqlite3_total_changes(db_.get()) != changes_before) watcher_->poke();
    return results;
  }

  // Sets up the connection: WAL, durability, the tables (migrating a file
  // of the old token rule). Waits for other connections up to busy_timeout.
  Status init(const std::string& path);

 private:
  void set_wait_limit(Deadline deadline) {
    wait_until_ = std::min<steady_clock::time_point>(deadline, steady_clock::now() + busy_timeout_);
  }

  // The statement for `sql`, prepared once.
  int prepare(const std::string& sql, Prepared** out) {
    auto it = cache_.find(sql);
    if (it == cache_.end()) {
      Prepared prepared;
      const std::string rendered =
          *render_params(sql, [&](std::size_t index, bool number) -> Result<std::string> {
            if (prepared.numeric.size() <= index) prepared.numeric.resize(index + 1);
            prepared.numeric[index] = prepared.numeric[index] || number;
            return ":p" + std::to_string(index);
          });
      sqlite3_stmt* raw = nullptr;
      const int rc = sqlite3_prepare_v3(db_.get(), rendered.c_str(), -1, SQLITE_PREPARE_PERSISTENT,
                                        &raw, nullptr);
      prepared.stmt.reset(raw);
      if (rc != SQLITE_OK) return rc;
      prepared.now_index = sqlite3_bind_parameter_index(raw, kNowParameter);
      for (std::size_t i = 0; i < prepared.numeric.size(); ++i) {
        prepared.index.push_back(
            sqlite3_bind_parameter_index(raw, (":p" + std::to_string(i)).c_str()));
      }
      it = cache_.emplace(sql, std::move(prepared)).first;
    }
    *out = &it->second;
    return SQLITE_OK;
  }

  int step(const Prepared& prepared, const std::vector<std::string>& params, std::int64_t now,
           SqlResult* result) {
    StmtUse use(prepared.stmt);
    int rc = SQLITE_OK;
    for (std::size_t i = 0; i < params.size() && i < prepared.numeric.size(); ++i) {
      const int index = prepared.index[i];
      if (index == 0) continue;
      if (rc == SQLITE_OK && prepared.numeric[i]) {
        std::int64_t value = 0;
        std::from_chars(params[i].data(), params[i].data() + params[i].size(), value);
        rc = sqlite3_bind_int64(use.get(), index, value);
      } else if (rc == SQLITE_OK) {
        rc = use.bind_text(index, params[i]);
      }
    }
    if (rc == SQLITE_OK && prepared.now_index > 0) {
      rc = sqlite3_bind_int64(use.get(), prepared.now_index, now);
    }
    if (rc != SQLITE_OK) return rc;
    const int columns = sqlite3_column_count(use.get());
    while ((rc = sqlite3_step(use.get())) == SQLITE_ROW) {
      SqlRow row;
      row.reserve(static_cast<std::size_t>(columns));
      for (int c = 0; c < columns; ++c) row.push_back(use.column_text(c));
      result->rows.push_back(std::move(row));
    }
    if (rc != SQLITE_DONE) return rc;
    if (sqlite3_stmt_readonly(use.get()) == 0) {
      result->affected_rows = static_cast<std::uint64_t>(sqlite3_changes(db_.get()));
    }
    return SQLITE_OK;
  }

  // A failure as a Status (before anything replaces SQLite's message).
  Status failed(int rc, Deadline deadline, std::string_view context) {
    const std::string message = sqlite3_errmsg(db_.get());
    const SqliteFailure failure{rc, sqlite3_system_errno(db_.get()), message};
    return sqlite_failure_to_status(failure, steady_clock::now() >= deadline, context);
  }

  // Runs `body` (returning an SQLite result code) after `begin` (none:
  // PRAGMA journal_mode cannot run in a transaction) and commits. On
  // SQLITE_BUSY from any step it rolls back and starts over while
  // wait_until_ allows; any other failure rolls back and is translated.
  // `body` may run several times, so it must (re)set all its outputs.
  template <typename Body>
  Status transact(const char* begin, Deadline deadline, std::string_view context, Body&& body) {
    for (int attempt = 0;; ++attempt) {
      int rc = begin == nullptr ? SQLITE_OK : exec(begin);
      if (rc == SQLITE_OK) {
        rc = body();
        if (is_success(rc) && begin != nullptr) rc = exec("COMMIT");
        if (is_success(rc)) return ok_status();
      }
      const std::string message = sqlite3_errmsg(db_.get());
      const SqliteFailure failure{rc, sqlite3_system_errno(db_.get()), message};
      // After some errors (e.g. a failed COMMIT of certain kinds) SQLite has
      // already rolled back; ROLLBACK then would fail, so ask first.
      if (sqlite3_get_autocommit(db_.get()) == 0) exec("ROLLBACK");
      // The busy handler normally did the waiting already; this covers BUSY
      // that SQLite returns without consulting it (e.g. a stale WAL snapshot).
      if (is_busy(rc) && pause_before_retry(attempt, wait_until_)) continue;
      return sqlite_failure_to_status(failure, steady_clock::now() >= deadline, context);
    }
  }

  int exec(const char* sql) { return sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr); }

  // Declared before the statements so it is destroyed after them.
  DbPtr db_;
  const milliseconds busy_timeout_;
  const std::shared_ptr<Watcher> watcher_;
  // Until when the current call may wait for the file lock (read by
  // BusyHandler, which runs inside the call's SQLite calls).
  steady_clock::time_point wait_until_;
  StmtPtr now_;
  std::map<std::string, Prepared, std::less<>> cache_;
};

Status SqliteSession::init(const std::string& path) {
  const std::string context = "sqlite " + internal::in_quotes(path);
  const Deadline deadline = steady_clock::now() + busy_timeout_;
  set_wait_limit(deadline);

  // WAL: readers never wait for the writer, and a commit is one append.
  // Switching an existing database needs a brief exclusive lock, hence the
  // busy-retry wrapper; on a database already in WAL it is a no-op.
  std::string journal_mode;
  SIMBA_RETURN_IF_ERROR(transact(nullptr, deadline, context + ": enabling WAL", [&]() -> int {
    StmtPtr pragma;
    sqlite3_stmt* raw = nullptr;
    int rc = sqlite3_prepare_v2(db_.get(), "PRAGMA journal_mode=WAL", -1, &raw, nullptr);
    pragma.reset(raw);
    if (rc != SQLITE_OK) return rc;
    StmtUse use(pragma);
    rc = sqlite3_step(use.get());
    if (rc != SQLITE_ROW) return rc;
    journal_mode = use.column_text(0);
    return SQLITE_OK;
  }));
  if (journal_mode != "wal") {
    // E.g. a file system without shared memory. Still correct (BEGIN
    // IMMEDIATE and the busy handler still serialize writers); readers
    // wait for writers, though.
    SIMBA_LOG(kWarn, context << ": journal_mode is '" << journal_mode
                             << "', not 'wal'; readers will wait for writers");
  }

  // FULL syncs the WAL on every commit. With NORMAL the last commits can be
  // lost when the OS or the power fails, and a fencing token already handed
  // to an owner could then be handed out again: a broken guarantee, which is
  // worse than one fsync (~0.1 ms on an SSD) per acquire/renew/release.
  SIMBA_RETURN_IF_ERROR(transact(nullptr, deadline, context + ": setting synchronous",
                                 [&] { return exec("PRAGMA synchronous=FULL"); }));

  // The tables, and a file of the old token rule migrated: in one write
  // transaction, so two processes opening it at once migrate it once (the
  // second finds no fencing_token column), and a crash leaves it as it was.
  SIMBA_RETURN_IF_ERROR(
      transact("BEGIN IMMEDIATE", deadline, context + ": creating table simba_mutex", [&] {
        int rc = exec(kCreateTableSql);
        if (rc == SQLITE_OK) rc = exec(kCreateForcedTableSql);
        if (rc == SQLITE_OK) rc = exec(kCreateHostTableSql);
        if (rc != SQLITE_OK) return rc;
        sqlite3_stmt* raw = nullptr;
        rc = sqlite3_prepare_v2(db_.get(), kHasTokenColumnSql, -1, &raw, nullptr);
        StmtPtr check(raw);
        if (rc != SQLITE_OK) return rc;
        StmtUse use(check);
        rc = sqlite3_step(use.get());
        if (rc == SQLITE_DONE) return SQLITE_OK;  // the current rule
        if (rc != SQLITE_ROW) return rc;
        rc = exec(kMigrateVersionSql);
        if (rc == SQLITE_OK) rc = exec(kDropTokenColumnSql);
        return rc;
      }));

  sqlite3_stmt* raw = nullptr;
  const int rc =
      sqlite3_prepare_v3(db_.get(), kNowSql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  now_.reset(raw);
  if (rc != SQLITE_OK) return failed(rc, deadline, context + ": preparing statements");

  // Last guard: SQLite silently opens a file it cannot write read-only.
  if (sqlite3_db_readonly(db_.get(), "main") == 1) {
    return permission_denied_error("sqlite: database file " + internal::in_quotes(path) +
                                   " is read-only");
  }
  return ok_status();
}

// The listener handle: the watcher runs while it lives.
class SqliteListener final : public SqlDriver::Listener {
 public:
  explicit SqliteListener(std::shared_ptr<Watcher> watcher) : watcher_(std::move(watcher)) {}
  ~SqliteListener() override { watcher_->shutdown(); }

  bool watches_rows() const override { return true; }
  void watch(const std::string& mutex, std::optional<Row> seen) override {
    std::optional<Watcher::RowState> state;
    if (seen) state = Watcher::RowState{std::move(seen->owner_id), seen->version};
    watcher_->watch(mutex, std::move(state));
  }
  void unwatch(const std::string& mutex) override { watcher_->unwatch(mutex); }

 private:
  const std::shared_ptr<Watcher> watcher_;
};

Status check_path(const std::string& path);

// SQLite's locks rely on POSIX advisory locks and a shared-memory WAL index,
// which network file systems do not provide faithfully (sqlite.org, "How To
// Corrupt An SQLite Database File", §2): a database there is unsafe.
void add_file_system_finding(StoreReport& report, const std::string& path) {
  std::filesystem::path probe = path;
  std::error_code error;
  if (!std::filesystem::exists(probe, error)) probe = probe.parent_path();
  if (probe.empty()) probe = ".";
  struct statfs fs {};
  if (::statfs(probe.c_str(), &fs) != 0) {
    report.add(StoreFinding::Severity::kNote, "file system",
               "cannot tell which file system holds it: " + std::string(std::strerror(errno)));
    return;
  }
  struct Kind {
    long magic;
    const char* name;
  };
  constexpr Kind kNetwork[] = {{0x6969, "NFS"},      {0x517B, "SMB"},      {0xFF534D42, "CIFS"},
                               {0xFE534D42, "SMB2"}, {0x65735546, "FUSE"}, {0x00C36400, "Ceph"},
                               {0x01021997, "9P"},   {0x47504653, "GPFS"}, {0x0BD00BD0, "Lustre"},
                               {0x73757245, "Coda"}, {0x5346414F, "AFS"}};
  for (const Kind& kind : kNetwork) {
    if (static_cast<long>(fs.f_type) == kind.magic) {
      report.add(StoreFinding::Severity::kUnsafe, "file system",
                 std::string("on ") + kind.name +
                     ": SQLite's file locks are not reliable on a network file system; two "
                     "hosts may both hold a mutex");
      return;
    }
  }
  report.add(StoreFinding::Severity::kOk, "file system", "a local file system");
}

class SqliteDriver final : public SqlDriver {
 public:
  SqliteDriver(SqliteOptions options, std::unique_ptr<SqliteSession> first,
               std::shared_ptr<Watcher> watcher, std::shared_ptr<HostLocks> host_locks)
      : options_(std::move(options)),
        description_("sqlite " + internal::in_quotes(options_.path)),
        first_(std::move(first)),
        watcher_(std::move(watcher)),
        host_locks_(std::move(host_locks)) {}

  std::string_view scheme() const override { return "sqlite"; }
  const std::string& description() const override { return description_; }

  // The connection NewSqliteBackend opened (the pool has one and keeps it).
  Result<std::unique_ptr<SqlSession>> connect(Deadline /*deadline*/) override {
    if (first_) return std::unique_ptr<SqlSession>(std::move(first_));
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<SqliteSession> session, open(options_, watcher_));
    return std::unique_ptr<SqlSession>(std::move(session));
  }

  std::string now_ms() const override { return kNowParameter; }
  std::string transport() const override { return "local file"; }
  Status inspect(SqlSession& session, StoreReport& report, Deadline deadline) const override {
    SIMBA_ASSIGN_OR_RETURN(std::vector<SqlResult> results,
                           session.run({{"SELECT sqlite_version()", {}},
                                        {"PRAGMA journal_mode", {}},
                                        {"PRAGMA synchronous", {}}},
                                       false, deadline));
    const auto first = [&](std::size_t i) {
      return results.at(i).rows.empty() || results.at(i).rows[0].empty() ? std::string("?")
                                                                         : results.at(i).rows[0][0];
    };
    report.add(StoreFinding::Severity::kOk, "server", "SQLite " + first(0) + ", " + options_.path);
    report.add(StoreFinding::Severity::kOk, "topology",
               "one file: processes on this host that open it exclude each other");
    // 2 is FULL, 3 EXTRA: a commit is on disk before it is acknowledged.
    const std::string synchronous = first(2);
    report.add(synchronous == "2" || synchronous == "3" ? StoreFinding::Severity::kOk
                                                        : StoreFinding::Severity::kUnsafe,
               "durability",
               "journal_mode=" + first(1) + ", synchronous=" + synchronous +
                   (synchronous == "2" || synchronous == "3"
                        ? " (FULL: an acquisition is on disk before it counts)"
                        : ": a power loss may forget an acquisition and hand out its token again"));
    add_file_system_finding(report, options_.path);
    report.add(host_locks_ ? StoreFinding::Severity::kOk : StoreFinding::Severity::kNote,
               "holder death",
               host_locks_ ? "seen at once on this host: each holder keeps a kernel lock in " +
                                 internal::in_quotes(options_.path + HostLocks::kFileSuffix) +
                                 " (a paused holder keeps it; the lease still decides across hosts)"
                           : "no kernel locks beside the rows (the log says why): a holder that "
                             "dies is replaced when its lease ends");
    return ok_status();
  }
  std::string create_table_sql() const override { return kCreateTableSql; }
  // (The default upsert: under BEGIN IMMEDIATE nothing changes between its
  // two statements; in DO UPDATE, bare column names are the existing row's.)
  // The write transaction holds the whole file.
  std::string for_update_sql() const override { return ""; }

  bool pushes() const override { return true; }
  // A renewal goes through begin_acquire (the kernel lock and its record):
  // one at a time. (No round trip to save: the store is a local file.)
  bool batches_renewals() const override { return false; }
  std::unique_ptr<Listener> make_listener(
      std::function<void(const MutexEvent&)> on_event) override {
    watcher_->start(std::move(on_event));
    return std::make_unique<SqliteListener>(watcher_);
  }
  // The kernel lock of the mutex (host_locks.h), taken before the
  // transaction. Having taken it proves that the holder a record names is
  // gone, so the row is taken over; holding it, the new tenure is recorded
  // as backed by it; not holding it, any record of the caller's is removed
  // (a tenure that renews without its lock must not look backed).
  std::optional<HostHold> begin_acquire(const std::string& mutex, const std::string& contender,
                                        std::size_t param) override {
    if (!host_locks_) return std::nullopt;
    const HostLocks::Taken taken = host_locks_->take(mutex, contender);
    const std::string lock_id = "{" + std::to_string(param) + "}";
    HostHold hold;
    hold.param = host_locks_->lock_id(mutex);
    hold.end = [locks = host_locks_, mutex, contender,
                taken](const std::optional<std::string>& owner) {
      locks->end_acquire(mutex, contender, taken, owner);
    };
    if (taken.take == HostLocks::Take::kNew) {
      hold.takeover =
          "(owner_id <> '' AND owner_id <> {1} AND version = (SELECT h.version FROM "
          "simba_mutex_host AS h WHERE h.mutex = {0} AND h.lock_id = " +
          lock_id + "))";
    }
    if (taken.take == HostLocks::Take::kBusy) {
      hold.record = {
          {"DELETE FROM simba_mutex_host WHERE mutex = {0} AND EXISTS (SELECT 1 FROM "
           "simba_mutex AS m WHERE m.mutex = {0} AND m.owner_id = {1})",
           {}}};
    } else {
      // (Written only when it changes: a renewal finds it recorded.)
      hold.record = {
          {"INSERT OR REPLACE INTO simba_mutex_host (mutex, version, lock_id) SELECT "
           "m.mutex, m.version, " +
               lock_id +
               " FROM simba_mutex AS m WHERE m.mutex = {0} AND m.owner_id = {1} AND NOT "
               "EXISTS (SELECT 1 FROM simba_mutex_host AS h WHERE h.mutex = {0} AND "
               "h.version = m.version AND h.lock_id = " +
               lock_id + ")",
           {}}};
    }
    return hold;
  }
  void end_release(const std::string& mutex, const std::string& contender) override {
    if (host_locks_) host_locks_->give_up(mutex, contender);
  }

  // Records the version the force leaves (the row's, + 1) for the watcher.
  std::string forced_notice_sql() const override {
    return "INSERT OR REPLACE INTO simba_mutex_forced (mutex, version) SELECT mutex, "
           "version + 1 FROM simba_mutex WHERE mutex = {0} AND owner_id <> ''";
  }

  // Opens and sets up a connection to the file.
  static Result<std::unique_ptr<SqliteSession>> open(const SqliteOptions& options,
                                                     std::shared_ptr<Watcher> watcher) {
    SIMBA_RETURN_IF_ERROR(check_path(options.path));
    SIMBA_ASSIGN_OR_RETURN(
        std::unique_ptr<SqliteSession> session,
        open_file(options.path, SQLITE_OPEN_CREATE, options.busy_timeout, std::move(watcher)));
    SIMBA_RETURN_IF_ERROR(session->init(options.path));
    return session;
  }

  // The watcher's connection. READWRITE without CREATE: the backend created
  // the file; if it has gone, watching a new empty one would be wrong. (A
  // read-only handle would do for the reads, but WAL readers may need to
  // write -shm.) It never waits for a lock (busy_timeout 0).
  static Result<std::unique_ptr<SqlSession>> open_for_watcher(const std::string& path) {
    SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<SqliteSession> session,
                           open_file(path, 0, milliseconds::zero(), nullptr));
    SIMBA_RETURN_IF_ERROR(session
                              ->run({{kCreateWatchedSql, {}}}, false,
                                    steady_clock::now() + milliseconds(1000), nullptr)
                              .status());
    return std::unique_ptr<SqlSession>(std::move(session));
  }

 private:
  static Result<std::unique_ptr<SqliteSession>> open_file(const std::string& path, int create,
                                                          milliseconds busy_timeout,
                                                          std::shared_ptr<Watcher> watcher) {
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(sqlite_path_of(path).c_str(), &raw,
                                   SQLITE_OPEN_READWRITE | create | SQLITE_OPEN_NOMUTEX, nullptr);
    DbPtr db(raw);  // owns the handle even when the open failed
    if (rc != SQLITE_OK) {
      const std::string message = db != nullptr ? sqlite3_errmsg(db.get()) : "";
      const SqliteFailure failure{db != nullptr ? sqlite3_extended_errcode(db.get()) : rc,
                                  db != nullptr ? sqlite3_system_errno(db.get()) : 0, message};
      return sqlite_failure_to_status(failure, false,
                                      "sqlite: opening " + internal::in_quotes(path));
    }
    sqlite3_extended_result_codes(db.get(), 1);
    return std::make_unique<SqliteSession>(std::move(db), busy_timeout, std::move(watcher));
  }

  const SqliteOptions options_;
  const std::string description_;
  std::unique_ptr<SqliteSession> first_;
  const std::shared_ptr<Watcher> watcher_;
  // Null where the kernel locks cannot be had: the lease decides alone.
  const std::shared_ptr<HostLocks> host_locks_;
};

// ---- opening ---------------------------------------------------------------------

// Checks the path before SQLite sees it, because sqlite3_open_v2 reports
// every one of these as the same "unable to open database file".
Status check_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  if (!file.has_filename()) {
    return invalid_argument_error("sqlite: path " + internal::in_quotes(path) +
                                  " names a directory, not a database file");
  }
  std::string dir = file.parent_path().string();
  if (dir.empty()) dir = ".";

  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
      return not_found_error("sqlite: directory " + internal::in_quotes(dir) + " does not exist");
    }
    if (is_permission_errno(e)) {
      return permission_denied_error("sqlite: directory " + internal::in_quotes(dir) +
                                     " of the database file " + internal::in_quotes(path) +
                                     " cannot be searched: permission denied");
    }
    return unavailable_error("sqlite: cannot inspect directory " + internal::in_quotes(dir) + ": " +
                             std::error_code(e, std::generic_category()).message());
  }
  if (!S_ISDIR(st.st_mode)) {
    return not_found_error("sqlite: directory " + internal::in_quotes(dir) +
                           " does not exist (it is not a directory)");
  }

  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return invalid_argument_error("sqlite: path " + internal::in_quotes(path) +
                                    " is a directory, not a database file");
    }
    // AT_EACCESS: judge by the effective ids, as open() will.
    if (::faccessat(AT_FDCWD, path.c_str(), R_OK | W_OK, AT_EACCESS) != 0 &&
        is_permission_errno(errno)) {
      return permission_denied_error("sqlite: database file " + internal::in_quotes(path) +
                                     " is read-only (it must be readable and writable)");
    }
  }
  // Also needed when the file exists: WAL mode creates <path>-wal and
  // <path>-shm beside it.
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0 &&
      is_permission_errno(errno)) {
    return permission_denied_error("sqlite: directory " + internal::in_quotes(dir) +
                                   " is read-only (SQLite creates " + internal::in_quotes(path) +
                                   " and its -wal and -shm files there)");
  }
  return ok_status();
}

}  // namespace

Watcher::OpenConnection watcher_connection(const std::string& path) {
  return [path] { return SqliteDriver::open_for_watcher(path); };
}

}  // namespace simba::internal::sql::sqlite

namespace simba {

Result<std::shared_ptr<Backend>> new_sqlite_backend(SqliteOptions options) {
  if (options.path.empty()) return invalid_argument_error("sqlite: path must not be empty");
  if (options.path == ":memory:") {
    // SQLite would give each backend a private in-memory database, which
    // shares nothing: not what a lock store is for.
    return invalid_argument_error(
        "sqlite: ':memory:' is not supported (nothing would be shared); use memory:// "
        "for an in-process store");
  }
  if (options.busy_timeout < std::chrono::milliseconds::zero()) {
    return invalid_argument_error("sqlite: busy_timeout must not be negative, got " +
                                  std::to_string(options.busy_timeout.count()) + "ms");
  }
  if (sqlite3_threadsafe() == 0) {
    return failed_precondition_error(
        "sqlite: the linked SQLite library was built without thread support "
        "(SQLITE_THREADSAFE=0)");
  }
  auto watcher = std::make_shared<internal::sql::sqlite::Watcher>(
      options.path, internal::sql::sqlite::watcher_connection(options.path));
  // Opened now, so a bad path or file fails here rather than at first use.
  SIMBA_ASSIGN_OR_RETURN(std::unique_ptr<internal::sql::sqlite::SqliteSession> session,
                         internal::sql::sqlite::SqliteDriver::open(options, watcher));
  // After the database, whose mode the lock file takes.
  std::shared_ptr<internal::sql::sqlite::HostLocks> host_locks =
      internal::sql::sqlite::HostLocks::open(options.path);
  watcher->probe_with(host_locks);
  internal::sql::SqlBackendOptions sql;
  // Calls share one connection, one at a time (BEGIN IMMEDIATE serializes
  // writers anyway).
  sql.connections = 1;
  sql.ends_with_session = host_locks != nullptr;
  return internal::sql::new_sql_backend(
      std::make_unique<internal::sql::sqlite::SqliteDriver>(
          std::move(options), std::move(session), std::move(watcher), std::move(host_locks)),
      sql);
}

Result<SqliteOptions> sqlite_options_from_uri(const Uri& uri) {
  constexpr char kForms[] = "sqlite:///abs/path.db or sqlite://rel/path.db";
  if (uri.scheme != "sqlite") {
    return invalid_argument_error("sqlite: URI scheme is " + internal::in_quotes(uri.scheme) +
                                  ", expected 'sqlite'");
  }
  if (uri.user.has_value() || uri.password.has_value()) {
    return invalid_argument_error("sqlite: URI must not carry a user or password");
  }
  if (uri.hosts.size() > 1) {
    return invalid_argument_error(std::string("sqlite: URI names several hosts; expected ") +
                                  kForms);
  }
  if (!uri.hosts.empty() && uri.hosts.front().port.has_value()) {
    return invalid_argument_error(std::string("sqlite: URI must not have a port; expected ") +
                                  kForms);
  }
  SIMBA_RETURN_IF_ERROR(uri.check_query_keys({"busy_timeout"}).with_context("sqlite"));

  SqliteOptions options;
  // sqlite://rel/dir/x.db parses as host "rel" + path "/dir/x.db"; joined,
  // they are the relative path. sqlite:///abs.db has no host.
  options.path = (uri.hosts.empty() ? std::string() : uri.hosts.front().host) + uri.path;
  if (options.path.empty() || options.path.back() == '/') {
    return invalid_argument_error(std::string("sqlite: URI has no database file path; expected ") +
                                  kForms);
  }
  if (const std::optional<std::string> value = uri.query_value("busy_timeout")) {
    SIMBA_ASSIGN_OR_RETURN(options.busy_timeout, parse_duration("busy_timeout", *value));
    if (options.busy_timeout < std::chrono::milliseconds::zero()) {
      return invalid_argument_error("sqlite: busy_timeout must not be negative");
    }
  }
  return options;
}

}  // namespace simba
