// Simba's `simba_mutex` table on an SQL database, written once for every
// dialect. A backend is this protocol plus an SqlDriver: how to connect,
// how to run statements, and the few SQL fragments that differ (the clock,
// placeholders, the upsert, the column types). PostgreSQL, MySQL/MariaDB
// and SQLite are its drivers.
//
// The table (JVM Simba's, simba-behaviour.md §3.1.1):
//   mutex varchar(66) PRIMARY KEY, acquired_at, ttl_at, transition_at
//   (database epoch milliseconds, 0 when free), owner_id varchar(128) (''
//   when free), version (+1 on every acquisition and release).
//
// The protocol (what differs from JVM Simba is marked *):
//   acquire  one upsert of the row: take it when its hard lease is over
//            (transition_at < now), renew it when the caller owns it and it
//            is not over (transition_at >= now*: no 1 ms dead spot), and
//            create it at once when it is missing* (no first-use insert
//            race); all times from the database clock. The row is returned
//            (or read) in the same transaction.
//   fencing  the token is the row's version after the acquisition*. A
//            renewal by us keeps the version (JVM Simba bumps it, but never
//            reads it), so the token is the acquisition's and grows with
//            every change of owner. One rule for every driver, so a JVM
//            Simba fleet on the same MySQL table keeps working.
//   release  the owner's conditional update to the free row, version + 1.
//   force    the same whoever owns it*; the new version is the floor.

#ifndef SIMBA_BACKENDS_SQL_SQL_BACKEND_H_
#define SIMBA_BACKENDS_SQL_SQL_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sql/session_pool.h"
#include "core/store_options.h"
#include "simba/backend.h"
#include "simba/status.h"

namespace simba::internal::sql {

// One row of text values (our columns are never NULL).
using SqlRow = std::vector<std::string>;

struct SqlResult {
  std::vector<SqlRow> rows;
  std::uint64_t affected_rows = 0;
};

// The first row's column `column` of `result`, or "" when it has none (for
// the short answers of `simba doctor`'s queries).
inline std::string first_cell(const SqlResult& result, std::size_t column = 0) {
  if (result.rows.empty() || result.rows[0].size() <= column) return "";
  return result.rows[0][column];
}

// A statement whose parameters are written {0}, {1}, ... in `sql`; the
// driver renders them ($1 for libpq, escaped literals for a multi-statement
// round trip, ...).
struct Statement {
  std::string sql;
  std::vector<std::string> params;
  // In a run() with `transaction`: this statement and those after it run
  // once the statements before it have committed (still in the same round
  // trip), outside that transaction. A release frees the wait line's lock
  // this way: freed before the commit, the next session in line was woken
  // while the row still read as held, and its attempt (PostgreSQL's
  // upsert reads the row from a snapshot, without waiting for the
  // releaser's row lock) found it taken.
  bool after_commit = false;
};

// `sql` with each placeholder, {i} or {#i} (a number), replaced by what
// `render(i, number)` returns; the first error of `render` ends it.
Result<std::string> render_params(
    const std::string& sql,
    const std::function<Result<std::string>(std::size_t index, bool number)>& render);

// Kinds of failure the protocol must tell apart.
enum class SqlFailure {
  kOther,
  kNoTable,        // simba_mutex does not exist
  kNoPrivilege,    // not allowed to create or use it
  kDuplicateKey,   // a concurrent insert won
  kAlreadyExists,  // a concurrent CREATE TABLE won
  kLockTimeout,    // a lock was not granted within the statement's lock wait
};

// One connection. Used by one call at a time; a driver marks it broken
// (set_broken) when it must be replaced.
class SqlSession : public PooledSession {
 public:
  // Runs the statements in order, inside one transaction when
  // `transaction`, in as few round trips as the driver can, and returns each
  // one's result. On failure, `failure` (if given) says what kind it was.
  virtual Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements,
                                             bool transaction, Deadline deadline,
                                             SqlFailure* failure = nullptr) = 0;
  // While `fd` (>= 0) is set, run() gives up with kCancelled, and marks the
  // session broken, when it becomes readable (a wait that is no longer
  // wanted). Drivers that cannot watch it ignore it (the default).
  virtual void set_wake_fd(int fd) { (void)fd; }
  // The server's number for this session (MySQL's CONNECTION_ID()), which
  // names it in the server's own lock functions; 0 where the driver has
  // none to give.
  virtual std::uint64_t server_id() const { return 0; }
};

// The parts of the acquire statement every dialect shares; a driver puts
// them into its own upsert. Placeholders: {0} mutex, {1} contender id,
// {2} ttl ms, {3} transition ms.
struct AcquireParts {
  // The database clock in epoch ms (the driver's now_ms()).
  std::string now;
  // True when the caller may take or renew the existing row (its columns
  // unqualified, e.g. `transition_at`).
  std::string may_acquire;
  // The new column values, in the order a driver must assign them (MySQL
  // assigns left to right and later expressions see earlier assignments;
  // this order keeps a true `may_acquire` true throughout, and a false one
  // changes nothing to make it true).
  std::vector<std::pair<std::string, std::string>> assignments;
  // The columns read back: acquired_at, ttl_at, transition_at, owner_id,
  // version, and the database clock.
  std::string returning;
  // `INSERT INTO simba_mutex <alias> (...) VALUES (...)` of the acquired row,
  // to which a driver appends its own conflict clause (PostgreSQL needs the
  // alias to name the existing row; others pass none).
  std::string insert_acquired(std::string_view alias = {}) const;
  // The same insert as `INSERT ... SELECT ... WHERE NOT EXISTS` a row of
  // mutex {0} that the caller may not acquire: when another owner holds it,
  // the statement inserts nothing and so touches (and locks) no row. Behind
  // a gate (SqlDriver::acquire_gate), where no other acquisition of the
  // mutex runs meanwhile, a waiter's attempt then writes nothing: no row
  // lock, no transaction id, no commit to flush.
  std::string insert_acquired_if_free(std::string_view alias = {}) const;
  // The statement that reads the decided row back (parameter {0}: the mutex).
  Statement read_back(const std::string& mutex) const;
  // The mutex has a wait line (SqlDriver::line_lock): no acquire gate (its
  // waits would queue behind the line lock's holder), and the insert is
  // insert_acquired_if_free() all the same.
  bool lined = false;
};

// The free row of mutex {0} as an INSERT's column list and VALUES, for a
// driver's insert_free_row_sql() (each adds how it skips an existing row).
constexpr char kInsertFreeRow[] =
    "INSERT INTO simba_mutex (mutex, acquired_at, ttl_at, transition_at, owner_id, version) "
    "VALUES ({0}, 0, 0, 0, '', 0)";

class SqlDriver {
 public:
  virtual ~SqlDriver() = default;
  virtual std::string_view scheme() const = 0;
  // "postgresql at host:port/db" (never a password), to start messages.
  virtual const std::string& description() const = 0;
  virtual Result<std::unique_ptr<SqlSession>> connect(Deadline deadline) = 0;
  // The same, giving up with kCancelled when `wake_fd` (if >= 0) becomes
  // readable. The default ignores it.
  virtual Result<std::unique_ptr<SqlSession>> connect_wakeable(Deadline deadline, int wake_fd) {
    (void)wake_fd;
    return connect(deadline);
  }

  // The database clock as an integer number of epoch milliseconds.
  virtual std::string now_ms() const = 0;
  // How sessions reach the database (Capabilities::transport).
  virtual std::string transport() const { return "plain text"; }
  // `simba doctor`: the database's findings (server, replication role,
  // durability settings), asked over `session`. The default adds none.
  virtual Status inspect(SqlSession& /*session*/, StoreReport& /*report*/,
                         Deadline /*deadline*/) const {
    return ok_status();
  }
  // CREATE TABLE for simba_mutex, if missing (the DBA's copy too).
  virtual std::string create_table_sql() const = 0;
  // Inserting the free row of mutex {0} unless it exists. The default:
  // kInsertFreeRow + ON CONFLICT (mutex) DO NOTHING.
  virtual std::string insert_free_row_sql() const;
  // Acquire-or-renew as statements run in one transaction; the last
  // returns the row (acquired or not) with the clock: one row of
  // acquired_at, ttl_at, transition_at, owner_id, version, now. The
  // default, for INSERT ... ON CONFLICT (mutex) DO UPDATE ... WHERE
  // may_acquire, then the read-back: the upsert locks the row until the
  // transaction ends even when WHERE rejects the update, so the read sees
  // the row as decided. In the update the existing row's columns are
  // qualified with existing_row_alias() unless it is empty (bare names
  // are the existing row's in SQLite, ambiguous in PostgreSQL).
  virtual std::vector<Statement> acquire_statements(const AcquireParts& parts,
                                                    const std::vector<std::string>& params) const;
  virtual std::string existing_row_alias() const { return {}; }
  // A statement run first in the acquire transaction that makes the
  // acquisitions of one mutex take turns until they commit (PostgreSQL: a
  // transaction-level advisory lock), or nullopt (the default) for none.
  // With a gate, the default acquire_statements() inserts with
  // insert_acquired_if_free(): a waiter that finds the mutex held (the
  // usual answer when a release wakes every waiter at once) reads it and
  // writes nothing, instead of each waiter taking the row lock and flushing
  // a commit in turn, which made the hand-off slower with every waiter.
  virtual std::optional<Statement> acquire_gate(const std::string& mutex) const {
    (void)mutex;
    return std::nullopt;
  }

  // The line beside the row (backends/sql/wait_line.h): a session lock per
  // mutex that processes queue on, so that a release wakes the next process
  // only and the releaser cannot barge back in. Drivers without one return
  // nullopt (the default). With it, a release reserves the free row for
  // kQueueReserve (acquired_at holds the reserve's end; JVM Simba reads only
  // transition_at and owner_id, so it is not held back), and a reserved row
  // is taken only by a transaction for which `try_sql` is true.
  struct LineLock {
    // An SQL boolean, true when this session holds the mutex's line lock
    // or takes it until the transaction ends; it never waits. Its
    // parameters are {#4} and {#5}, which are `key`.
    std::string try_sql;
    std::vector<std::string> key;
    // Statements after which this session holds the line lock, having
    // waited at most `wait` (then failing with SqlFailure::kLockTimeout).
    std::function<std::vector<Statement>(std::chrono::milliseconds wait)> wait;
    // Run once on each new session of the line, before its first wait
    // (settings that last the session). Empty: nothing.
    std::vector<Statement> session_setup;
    // Frees it.
    Statement unlock;
    // Whether a release may free it inside its transaction, before the
    // commit: where the next holder's attempt waits for the releaser's row
    // lock and then reads the row as committed (InnoDB's upsert is a
    // locking read). The next process is woken while the release commits,
    // not after; where the server lets row locks go before the commit's
    // flush (InnoDB without a binary log), its attempt runs meanwhile. Its
    // own commit's flush covers the release's (one log, in order). Not on
    // PostgreSQL (Statement::after_commit).
    bool unlock_in_transaction = false;
    // Whether the wait's results say the lock was granted; null: the wait
    // succeeded, so it was (PostgreSQL's fails when it runs out; MySQL's
    // GET_LOCK answers 0).
    std::function<bool(const std::vector<SqlResult>& wait_results)> granted;
    // Whether a waiter's attempt may be sent after the wait, to run as the
    // lock is granted (WaitLine::waiting). Only where a wait given up ends
    // on the server at once (PostgreSQL's cancel request): a lock granted
    // to a session whose process has left would run the attempt for
    // nobody, and its mutex would stay taken until the lease ends. MariaDB
    // notices a gone client in GET_LOCK only after about 2 s (a 1 s wait
    // never), and then runs the rest of the statements anyway.
    bool attempt_with_wait = false;
    // An SQL boolean, true when another session waits in the server's
    // queue for the line lock (or is about to: its `wait` has begun); its
    // parameters are {#2} and {#3}, which are `key`. A release that frees
    // the line lock then wakes that session, which takes the row with the
    // attempt sent with its wait, and announces nothing: an announcement
    // would reach every listening process, and each process in line holds
    // it back unread (WaitLine::hold_back). Empty: every release is
    // announced.
    std::string queued_sql;
    // Session-backed tenures (WaitLine::Hooks::grace), where the driver has
    // them: the side table (`simba_mutex_session`: mutex, version) created
    // if missing, and the statements, run in one transaction on the session
    // that holds the line lock, that record tenure {#2} of mutex {0} held by
    // {1} as backed by it (only if the row is still at that version and
    // owner). Empty: none.
    std::string create_marks_sql;
    std::vector<std::string> mark_sql;
  };
  // `ended_session`: the server_id() of a line session of this process
  // that was closed while its wait may have been granted (0: none). The
  // server may count it as the line lock's holder until it notices the
  // close, and the row a release reserved for the first in line, which is
  // this process, would be refused to its own next try meanwhile; where
  // the driver can, `try_sql` also takes the lock as held by that session.
  virtual std::optional<LineLock> line_lock(const std::string& mutex,
                                            std::uint64_t ended_session = 0) const {
    (void)mutex;
    (void)ended_session;
    return std::nullopt;
  }

  // Proof of life on one host (SQLite: a kernel lock per held mutex,
  // backends/sqlite/host_locks.h), so that a dead holder's mutex is taken
  // over at once instead of when its lease ends. begin_acquire() runs
  // before each acquire transaction of `contender` (taking the mutex's
  // kernel lock) and says what the transaction adds; nullopt (the default)
  // adds nothing. `param` is the index its statements may use for
  // HostHold::param.
  struct HostHold {
    // An SQL boolean on the existing row (bare columns, as may_acquire's)
    // true when its holder is known to be gone, or empty.
    std::string takeover;
    // Run after the upsert, before the read-back (parameters as the
    // acquire's: {0} mutex, {1} contender, and `param`): they record
    // whether the owner's tenure is backed by a kernel lock.
    std::vector<Statement> record;
    // Appended to the acquire's parameters.
    std::string param;
    // Called after the call with the row's owner then ("" for none;
    // nullopt: the call failed, which may or may not have committed).
    std::function<void(const std::optional<std::string>& owner)> end;
  };
  virtual std::optional<HostHold> begin_acquire(const std::string& mutex,
                                                const std::string& contender, std::size_t param) {
    (void)mutex;
    (void)contender;
    (void)param;
    return std::nullopt;
  }
  // After `contender`'s release, whatever its outcome: it holds it no more.
  virtual void end_release(const std::string& mutex, const std::string& contender) {
    (void)mutex;
    (void)contender;
  }

  // Push. While the returned handle lives, `on_event` is called (from one
  // thread of the driver's, one call at a time) for every release
  // announced by release_notice_sql() in any process (kReleased, owner_id the
  // releaser) or seen by a row-watching listener (below), for every hold
  // taken away (kLost), and with kReleased for mutex "" after the driver
  // reconnected (announcements may have been missed). Drivers without push
  // return nullptr.
  struct Listener {
    virtual ~Listener() = default;
    // A listener that learns of releases by watching the subscribed rows
    // (SQLite's data_version watcher) rather than hearing announcements of
    // every release: subscribe() then reads the row first and calls
    // watch(); unwatch() follows when its last subscription is gone.
    virtual bool watches_rows() const { return false; }
    // `seen` is the row as subscribe() read it (nullopt if that read
    // failed): changes committed after it are delivered.
    struct Row {
      std::string owner_id;
      std::int64_t version = 0;
    };
    virtual void watch(const std::string& mutex, std::optional<Row> seen) {
      (void)mutex;
      (void)seen;
    }
    virtual void unwatch(const std::string& mutex) { (void)mutex; }
  };
  virtual std::unique_ptr<Listener> make_listener(
      std::function<void(const MutexEvent& event)> on_event) {
    (void)on_event;
    return nullptr;
  }
  // Whether a lease's renewal is only its row's (SqlBackend::do_renew
  // renews many in one statement). Not where an acquisition records more
  // beside the row (begin_acquire's host holds).
  virtual bool batches_renewals() const { return true; }
  // Whether MakeListener gives push (default: when releases are announced).
  virtual bool pushes() const { return !release_notice_sql().empty(); }
  // What follows a SELECT that locks the row for the transaction (SQLite's
  // write transaction has locked the whole file already).
  virtual std::string for_update_sql() const { return " FOR UPDATE"; }
  // A statement announcing that {0} was released by {1}, run in the
  // releasing transaction after the update (so only when the row is free
  // then, and delivered when it commits); empty when the driver has no
  // push. Like every statement, "simba_mutex" in it stands for the table.
  virtual std::string release_notice_sql() const { return {}; }
  // A statement announcing that {0}'s holder is being forced out, run in
  // the forcing transaction after the row is locked and before it is freed;
  // it must announce nothing when the row has no owner. A NOTIFY carries
  // "<mutex>\n<owner>\n<token>\nforced", which notice_event() reads (names
  // cannot contain control characters, so this is unambiguous). Empty when
  // the driver has no push.
  virtual std::string forced_notice_sql() const { return {}; }
  // What ends a release's UPDATE so that, when it frees the row, its
  // commit returns before it is durable (PostgreSQL: a RETURNING that sets
  // synchronous_commit off for the transaction; evaluated only for a row
  // it updates, and it costs no statement of its own); empty: none. Safe
  // for a release only: one lost in a server crash (or a failover to a
  // standby) leaves the row held by a process that acts on it no more,
  // until its lease ends, and a durable commit after it (the next
  // acquisition's) makes it durable too, since the log is written in
  // order. An acquisition or a renewal lost so would leave its holder
  // counting on a lease the store no longer has.
  virtual std::string lazy_release_suffix() const { return {}; }
};

struct SqlBackendOptions {
  // The table. Statements are written with "simba_mutex" and the name is
  // substituted, so it must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*).
  std::string table = "simba_mutex";
  // Connections shared by all calls (each call takes one for its duration).
  int connections = 2;
  // Create the table when it is missing (needs the privilege).
  bool create_table = true;
  std::size_t max_mutex_length = 66;
  std::size_t max_contender_id_length = 128;
  // Capabilities::failover.
  std::string failover{};
  // Capabilities::ends_with_session: the driver sees a holder's process
  // die (SQLite's kernel locks).
  bool ends_with_session = false;
  // Sessions of the wait line (SqlDriver::line_lock), each with a thread: a
  // process waits in line for that many mutexes at once. 0: no line (every
  // release wakes every waiter; the driver's acquire gate applies).
  int line_sessions = 0;
  // How long after the store ended a holder's line session another process
  // may take its tenure over (WaitLine::Hooks::grace): a dead holder's
  // mutex moves on in about this long instead of at its lease's end. 0:
  // the lease alone.
  std::chrono::milliseconds session_grace{0};
};

// How long a released row stays reserved for the first process in line.
constexpr std::chrono::milliseconds kQueueReserve{1000};

// The query keys every SQL server's URI shares: connections (1..64), table
// and create_table (on|off), read into the given fields; false for any
// other key. kInvalidArgument, naming `store`, for a bad value.
Result<bool> read_table_key(std::string_view store, const std::string& key,
                            const std::string& value, int& connections, std::string& table,
                            bool& create_table);

// The wait line's URI key, queue_connections (0..16), into `sessions`:
// false for any other key; kInvalidArgument, naming `store`, for a bad value.
Result<bool> read_queue_key(std::string_view store, const std::string& key,
                            const std::string& value, int& sessions);
constexpr int kMaxLineSessions = 16;
// The session-backed tenures' URI key, session_grace (a duration: 0 turns
// them off, else 50ms..1m), into `grace`: false for any other key;
// kInvalidArgument, naming `store`, for a bad value.
Result<bool> read_grace_key(std::string_view store, const std::string& key,
                            const std::string& value, std::chrono::milliseconds& grace);
constexpr std::chrono::milliseconds kDefaultSessionGrace{1000};
constexpr std::chrono::milliseconds kMinSessionGrace{50};
constexpr std::chrono::milliseconds kMaxSessionGrace{60000};
// OK when `grace` is a valid session_grace; else kInvalidArgument naming
// `store`.
Status check_session_grace(std::string_view store, std::chrono::milliseconds grace);
// OK when `sessions` is a valid queue_connections; else kInvalidArgument
// naming `store`.
Status check_line_sessions(std::string_view store, int sessions);

// The longest identifier every SQL store takes: PostgreSQL's NAMEDATALEN - 1
// (MySQL allows 64).
inline constexpr std::size_t kMaxIdentifier = 63;

// OK when `table` is a name the statements may carry as it is: a plain
// identifier of at most kMaxIdentifier characters (A-Z a-z 0-9 _, not
// starting with a digit). Otherwise kInvalidArgument naming the table. The
// backend and the DDL printed for a DBA (SchemaSql) both check it.
Status validate_table_name(const std::string& table);

// Whether `table` leaves room for its side table, `<table>_session` (which
// tenures a holder's session backs), in the kMaxIdentifier bytes a name may
// have. Without it a dead holder's mutex moves on only when its lease ends.
inline constexpr std::string_view kSessionTableSuffix = "_session";
inline bool session_table_fits(const std::string& table) {
  return table.size() + kSessionTableSuffix.size() <= kMaxIdentifier;
}

// The event a release notice announces: `mutex` released by `by`, or, for
// forced_notice_sql()'s "<owner>\n<token>\nforced", that hold lost (forced).
// nullopt for a malformed notice.
std::optional<MutexEvent> notice_event(const std::string& mutex, const std::string& by);

Result<std::shared_ptr<Backend>> new_sql_backend(std::unique_ptr<SqlDriver> driver,
                                                 SqlBackendOptions options);

}  // namespace simba::internal::sql

#endif  // SIMBA_BACKENDS_SQL_SQL_BACKEND_H_
