// The PostgreSQL driver of the SQL protocol (backends/sql/sql_backend.h):
// libpq connections driven without blocking, so every call ends by its
// deadline, and a LISTEN connection for push.
#include "simba/backends/postgres.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "backends/sql/sql_backend.h"
#include "core/log.h"
#include "core/worker.h"
#include "simba/backends/postgres_keyed.h"

namespace simba::internal::sql::pg {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// How long a call given up (PgSession::run's wake fd) waits for the server
// to answer its cancel request: a round trip, normally.
constexpr milliseconds kAfterCancel{1000};
// How often the server checks that a session waiting in line still has its
// client (client_connection_check_interval).
constexpr milliseconds kClientCheck{100};
// XORed into a line key's high half: the key of its waiting mark
// (PgDriver::waiting_mark).
constexpr std::int32_t kWaitingMarkXor = 0x5a5a5a5a;

constexpr char kNowMs[] = "(floor(extract(epoch from statement_timestamp()) * 1000))::bigint";

constexpr char kCreateTable[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex (\n"
    "  mutex varchar(66) NOT NULL PRIMARY KEY,\n"
    "  acquired_at bigint NOT NULL DEFAULT 0,\n"
    "  ttl_at bigint NOT NULL DEFAULT 0,\n"
    "  transition_at bigint NOT NULL DEFAULT 0,\n"
    "  owner_id varchar(128) NOT NULL DEFAULT '',\n"
    "  version bigint NOT NULL DEFAULT 0\n"
    ")";
// Which tenures a holder's session backs (session_grace): created beside the
// table, and printed with it by `simba schema`.
constexpr char kCreateSessionTable[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex_session (mutex varchar(66) PRIMARY KEY, "
    "version bigint NOT NULL)";

// Whether sessions prepare their statements: shared by a driver's sessions,
// turned off for good when the server loses one (below).
using PrepareSwitch = std::shared_ptr<std::atomic<bool>>;

class PgSession final : public SqlSession {
 public:
  PgSession(PgConn conn, PrepareSwitch prepare)
      : conn_(std::move(conn)), prepare_(std::move(prepare)) {}

  bool healthy() const override {
    return SqlSession::healthy() && PQstatus(conn_.get()) == CONNECTION_OK;
  }
  void set_wake_fd(int fd) override { wake_fd_ = fd; }
  // An idle session hears from its server only when the server ends it
  // (terminated, shut down): the pool then opens another instead of failing
  // the next call with it.
  bool ended_while_idle() const override {
    const int fd = PQsocket(conn_.get());
    if (fd < 0) return true;
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    PGconn* conn = conn_.get();
    // One pipeline, one sync: the statements run as one implicit
    // transaction (so `transaction` needs nothing more) in one round trip.
    // A statement to run after the commit (Statement::after_commit) begins
    // a second implicit transaction: a sync before it.
    if (PQenterPipelineMode(conn) != 1) return broken("entering pipeline mode");
    int syncs = 1;
    bool sent_after_commit = false;
    // Each statement is prepared once per session (a Parse in the same
    // pipeline, the first time it is sent) and then only executed: the
    // server plans an unnamed statement again every time, and planning was
    // most of an acquisition's server time (the upsert: 0.28 ms unnamed,
    // 0.07 ms prepared). `sent` says which replies are a Prepare's.
    struct Sent {
      bool prepare;
      std::string sql;
    };
    std::vector<Sent> sent;
    const bool prepare = prepare_->load();
    for (const Statement& statement : statements) {
      if (statement.after_commit && transaction && syncs == 1) {
        if (PQpipelineSync(conn) != 1) return broken("sending");
        ++syncs;
        sent_after_commit = true;
      }
      // "{0}" -> "$1", ... ("{#0}", a number, too: libpq types it by its use).
      SIMBA_ASSIGN_OR_RETURN(std::string sql, render_params(statement.sql, [](std::size_t i, bool) {
                               return Result<std::string>("$" + std::to_string(i + 1));
                             }));
      std::vector<const char*> values;
      values.reserve(statement.params.size());
      for (const std::string& p : statement.params) values.push_back(p.c_str());
      const int count = static_cast<int>(values.size());
      int sent_ok = 0;
      if (prepare) {
        auto it = prepared_.find(sql);
        if (it == prepared_.end()) {
          it = prepared_.emplace(sql, "simba_" + std::to_string(next_name_++)).first;
          if (PQsendPrepare(conn, it->second.c_str(), sql.c_str(), count, nullptr) != 1) {
            return broken("preparing a statement");
          }
          sent.push_back({true, sql});
        }
        sent_ok = PQsendQueryPrepared(conn, it->second.c_str(), count, values.data(), nullptr,
                                      nullptr, 0);
      } else {
        sent_ok = PQsendQueryParams(conn, sql.c_str(), count, nullptr, values.data(), nullptr,
                                    nullptr, 0);
      }
      if (sent_ok != 1) return broken("sending a statement");
      sent.push_back({false, std::move(sql)});
    }
    if (PQpipelineSync(conn) != 1) return broken("sending");
    SIMBA_RETURN_IF_ERROR(broken(flush(conn, deadline)));
    std::vector<SqlResult> results;
    Status first_error;
    bool synced = false;
    std::size_t command = 0;  // the index in `sent` of the reply being read
    int wake_fd = wake_fd_;
    while (!synced) {
      SIMBA_ASSIGN_OR_RETURN(const bool ready, broken(await_result(conn, deadline, wake_fd)));
      if (!ready) {
        // No longer wanted. Closing the connection would not end a lock
        // wait: the server notices a gone client only when it next writes
        // to it, after it ran the rest of the pipeline (an attempt sent
        // with a wait in line would take the mutex for a process that has
        // left). So the server is asked to cancel, and what ran meanwhile
        // is still read: the caller learns of a hold it must give back. A
        // cancel that comes when the pipeline is done is ignored by the
        // server (it cancels nothing between commands), and PQcancel
        // returns once the server took it: the session can be used again.
        wake_fd = -1;
        if (!send_cancel(conn, kAfterCancel)) {
          return broken(cancelled_error("given up: no longer wanted"));
        }
        deadline = std::min(deadline, steady_clock::now() + kAfterCancel);
        continue;
      }
      PgResult result(PQgetResult(conn));
      if (!result) {  // the end of one command's replies
        ++command;
        continue;
      }
      const ExecStatusType status = PQresultStatus(result.get());
      if (status == PGRES_PIPELINE_SYNC) {
        synced = --syncs == 0;
        continue;
      }
      const Sent* what = command < sent.size() ? &sent[command] : nullptr;
      const bool failed = status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK;
      const bool lost = failed && lost_prepared(result.get());
      // A statement that was not prepared (an earlier one failed, so the
      // pipeline skipped it) or whose preparation the server forgot is
      // prepared again next time.
      if (what != nullptr && failed && (what->prepare || lost)) prepared_.erase(what->sql);
      if (what != nullptr && what->prepare) {
        if (status != PGRES_COMMAND_OK && status != PGRES_PIPELINE_ABORTED && first_error.ok()) {
          first_error = result_status(result.get(), failure);
        }
        continue;
      }
      switch (status) {
        case PGRES_TUPLES_OK:
        case PGRES_COMMAND_OK: {
          SqlResult out;
          const int rows = PQntuples(result.get());
          const int columns = PQnfields(result.get());
          for (int r = 0; r < rows; ++r) {
            SqlRow row;
            row.reserve(static_cast<std::size_t>(columns));
            for (int c = 0; c < columns; ++c) row.emplace_back(PQgetvalue(result.get(), r, c));
            out.rows.push_back(std::move(row));
          }
          const char* affected = PQcmdTuples(result.get());
          if (affected != nullptr && *affected != '\0') {
            std::from_chars(affected, affected + std::strlen(affected), out.affected_rows);
          }
          results.push_back(std::move(out));
          break;
        }
        case PGRES_PIPELINE_ABORTED:
          break;
        default:
          if (first_error.ok()) {
            first_error = lost ? unavailable_error("the server lost a prepared statement")
                               : result_status(result.get(), failure);
          }
          break;
      }
    }
    if (PQexitPipelineMode(conn) != 1) set_broken();
    // A failed transaction did not keep what ran after it from running (a
    // sync ends a pipeline's error): the session's locks are not what its
    // owner believes, and closing it ends them all.
    if (!first_error.ok() && sent_after_commit) set_broken();
    if (!first_error.ok()) return first_error;
    return results;
  }

 private:
  // A failed or late call (whose reply may still come): the connection
  // cannot be reused.
  Status broken(Status status) {
    if (!status.ok()) set_broken();
    return status;
  }
  template <typename T>
  Result<T> broken(Result<T> result) {
    if (!result.ok()) set_broken();
    return result;
  }
  Status broken(std::string_view what) {
    return broken(unavailable_error(std::string(what) + ": " + conn_message(conn_.get())));
  }

  // "prepared statement ... does not exist" (SQLSTATE 26000): the server
  // session behind this connection is not the one that prepared it, which
  // is what a pooler in transaction mode does (PgBouncer before 1.21, or
  // without max_prepared_statements). The driver's sessions stop preparing;
  // the call fails as unavailable and its retry runs unprepared.
  bool lost_prepared(PGresult* result) {
    const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    if (state == nullptr || std::strcmp(state, "26000") != 0) return false;
    if (prepare_->exchange(false)) {
      SIMBA_LOG(kWarn,
                "postgresql: the server lost a prepared statement (a pooler in "
                "transaction mode?): statements are no longer prepared");
    }
    return true;
  }

  PgConn conn_;
  int wake_fd_ = -1;
  const PrepareSwitch prepare_;
  // Statement text -> its prepared name in this session.
  std::unordered_map<std::string, std::string> prepared_;
  int next_name_ = 0;
};

// The LISTEN connection: one thread, reconnecting with backoff. What the
// thread reads is in a State it shares, so the listener may be destroyed
// from inside on_event, on that thread (a listener dropped the backend).
class PgListener final : public SqlDriver::Listener {
 public:
  PgListener(std::map<std::string, std::string> params, std::string description,
             std::string channel, std::function<void(const MutexEvent&)> on_event)
      : state_(std::make_shared<State>(std::move(params), std::move(description),
                                       std::move(channel), std::move(on_event))) {
    worker_.start("pg-listen", [state = state_] { state->loop(); });
  }

  ~PgListener() override {
    state_->stopping = true;
    state_->wake.post();
    worker_.join();
  }

 private:
  struct State {
    State(std::map<std::string, std::string> params_in, std::string description_in,
          std::string channel_in, std::function<void(const MutexEvent&)> on_event_in)
        : params(std::move(params_in)),
          description(std::move(description_in)),
          channel(std::move(channel_in)),
          on_event(std::move(on_event_in)) {}

    void loop() {
      Backoff backoff;
      while (!stopping) {
        Status status = session();
        if (stopping) break;
        const milliseconds delay = backoff.failed();
        SIMBA_LOG(kDebug, description << ": listener: " << status << "; reconnecting in "
                                      << format_duration(delay));
        wait_fd(wake.fd(), POLLIN, steady_clock::now() + delay);
      }
    }

    Status session() {
      auto conn = connect(params, description, steady_clock::now() + milliseconds(5000));
      if (!conn.ok()) return conn.status();
      PGconn* c = conn->get();
      if (PQsetnonblocking(c, 0) != 0) return unavailable_error(conn_message(c));
      PgResult listen(PQexec(c, ("LISTEN " + channel).c_str()));
      if (PQresultStatus(listen.get()) != PGRES_COMMAND_OK) {
        return unavailable_error("LISTEN: " + conn_message(c));
      }
      // Releases before we listened (a subscription made while the first
      // LISTEN was on its way, or anything while we were disconnected) were
      // missed: everyone looks once.
      on_event(MutexEvent{MutexEvent::Kind::kReleased, "", ""});
      for (;;) {
        const FdWait waited =
            wait_fd(PQsocket(c), POLLIN, steady_clock::now() + milliseconds(15000), wake.fd());
        if (stopping) return ok_status();
        if (waited == FdWait::kFailed) return unavailable_error("poll failed");
        if (waited == FdWait::kTimedOut) {
          // Idle: make sure the connection is still there.
          PgResult ping(PQexec(c, "SELECT 1"));
          if (PQresultStatus(ping.get()) != PGRES_TUPLES_OK) {
            return unavailable_error("lost: " + conn_message(c));
          }
        }
        if (PQconsumeInput(c) != 1) return unavailable_error("lost: " + conn_message(c));
        while (PGnotify* notify = PQnotifies(c)) {
          const std::string payload = notify->extra != nullptr ? notify->extra : "";
          PQfreemem(notify);
          const std::size_t split = payload.find('\n');
          const auto event =
              notice_event(payload.substr(0, split),
                           split == std::string::npos ? std::string() : payload.substr(split + 1));
          if (event) on_event(*event);
        }
      }
    }

    const std::map<std::string, std::string> params;
    const std::string description;
    const std::string channel;
    const std::function<void(const MutexEvent&)> on_event;
    std::atomic<bool> stopping{false};
    const WakeFd wake;
  };

  const std::shared_ptr<State> state_;
  Worker worker_;
};

class PgDriver final : public SqlDriver {
 public:
  PgDriver(std::map<std::string, std::string> params, std::string table)
      : params_(std::move(params)), table_(std::move(table)) {
    description_ = describe_server(params_);
  }

  std::string_view scheme() const override { return "postgresql"; }
  const std::string& description() const override { return description_; }
  std::string transport() const override { return transport_of(params_); }

  // simba doctor: the server, whether it is a standby, its durability
  // settings, its standbys, and whether this session is encrypted.
  Status inspect(SqlSession& session, StoreReport& report, Deadline deadline) const override {
    SIMBA_ASSIGN_OR_RETURN(std::vector<SqlResult> r,
                           session.run({{"SELECT version()", {}},
                                        {"SELECT pg_is_in_recovery()::text", {}},
                                        {"SHOW synchronous_commit", {}},
                                        {"SHOW fsync", {}},
                                        {"SELECT count(*)::text FROM pg_stat_replication", {}},
                                        {"SHOW synchronous_standby_names", {}},
                                        {"SELECT coalesce((SELECT ssl::text FROM pg_stat_ssl "
                                         "WHERE pid = pg_backend_pid()), 'false')",
                                         {}}},
                                       false, deadline));
    using Severity = StoreFinding::Severity;
    report.add(Severity::kOk, "server", first_cell(r[0]));
    const bool standby = first_cell(r[1]) == "true";
    report.add(standby ? Severity::kUnsafe : Severity::kOk, "topology",
               standby ? "a standby (pg_is_in_recovery): the mutex table cannot be written, "
                         "and advisory locks taken here do not exclude those on the primary"
                       : "a primary (not in recovery)");
    const std::string sync_commit = first_cell(r[2]);
    report.add(
        sync_commit == "off" ? Severity::kUnsafe : Severity::kOk, "durability",
        "synchronous_commit=" + sync_commit +
            (sync_commit == "off" ? ": a crash may forget acknowledged acquisitions and hand their "
                                    "tokens out again"
                                  : ""));
    if (first_cell(r[3]) != "on") {
      report.add(Severity::kUnsafe, "durability",
                 "fsync=" + first_cell(r[3]) + ": a crash may lose the mutex table's changes");
    }
    const std::string standbys = first_cell(r[4]);
    if (!standbys.empty() && standbys != "0") {
      const bool synchronous = !first_cell(r[5]).empty();
      report.add(synchronous ? Severity::kOk : Severity::kNote, "replication",
                 standbys + " standby(s) streaming, " +
                     (synchronous ? "synchronously (synchronous_standby_names set)"
                                  : "asynchronously: a failover may lose the last acquisitions, "
                                    "and their tokens may be handed out again"));
    }
    const bool encrypted = first_cell(r[6]) == "true";
    report.add(encrypted ? Severity::kOk : Severity::kNote, "session",
               encrypted ? "this connection is encrypted (pg_stat_ssl)"
                         : "this connection is not encrypted (pg_stat_ssl)");
    return ok_status();
  }

  Result<std::unique_ptr<SqlSession>> connect(Deadline deadline) override {
    return connect_wakeable(deadline, -1);
  }
  Result<std::unique_ptr<SqlSession>> connect_wakeable(Deadline deadline, int wake_fd) override {
    SIMBA_ASSIGN_OR_RETURN(PgConn conn, pg::connect(params_, description_, deadline, wake_fd));
    return std::unique_ptr<SqlSession>(std::make_unique<PgSession>(std::move(conn), prepare_));
  }

  std::string now_ms() const override { return kNowMs; }
  std::string create_table_sql() const override { return kCreateTable; }
  // In ON CONFLICT DO UPDATE, columns must say which row they mean: the
  // existing one (t.), not EXCLUDED.
  std::string existing_row_alias() const override { return "t"; }
  // The acquisitions of one mutex take turns on a transaction-level
  // advisory lock, released when the acquiring transaction ends (without a
  // wait line; with one, its lock is this same key). Its two-int form: a
  // key space apart from the keyed locks' bigint keys (pg_locks.objsubid 2,
  // not 1). The pair is the FNV-1a 64 hash of the table and the mutex; two
  // mutexes with one hash only take turns.
  std::optional<Statement> acquire_gate(const std::string& mutex) const override {
    return Statement{"SELECT pg_advisory_xact_lock({#0}, {#1})", advisory_key(mutex)};
  }
  // The wait line: a session-level advisory lock on the same key, which
  // PostgreSQL grants to the sessions waiting for it in the order they asked.
  // A session that holds it at either level gets it again at once.
  std::optional<LineLock> line_lock(const std::string& mutex,
                                    std::uint64_t ended_session) const override {
    // A wait given up is cancelled on its own session, which then unlocks;
    // one closed instead (the unlock failed) is left to the reserve's end.
    (void)ended_session;
    std::vector<std::string> key = advisory_key(mutex);
    LineLock line;
    line.try_sql = "pg_try_advisory_xact_lock({#4}, {#5})";
    // The server polls the client while the session waits (from
    // PostgreSQL 14; older servers have no such setting and skip it): a
    // process that died in line leaves the queue within kClientCheck, not
    // when the lock comes to it, which would run its attempt for nobody.
    // Once per session: it lasts the session.
    line.session_setup = {
        {"SELECT set_config('client_connection_check_interval', {0}, false) "
         "WHERE current_setting('server_version_num')::int >= 140000",
         {std::to_string(kClientCheck.count())}}};
    line.wait = [key](milliseconds wait) {
      // lock_timeout for the wait only (SQLSTATE 55P03 when it runs out),
      // then the session's own again for what follows (an attempt): a 55P03
      // then would hide that the line lock was granted.
      // These run at every wait, so none reads the pg_settings view, which
      // builds a row for every setting: the two that did cost the server a
      // sixth of its CPU with 16 processes in line. The session's own
      // lock_timeout is kept in a setting of ours for the same transaction.
      return std::vector<Statement>{
          {"SELECT set_config('simba.lock_timeout', current_setting('lock_timeout'), true), "
           "set_config('lock_timeout', {0}, true)",
           {std::to_string(wait.count())}},
          {"SELECT pg_advisory_xact_lock_shared(" + waiting_mark(0, 1) + ")", key},
          {"SELECT pg_advisory_lock({#0}, {#1})", key},
          {"SELECT set_config('lock_timeout', current_setting('simba.lock_timeout'), true)", {}}};
    };
    line.unlock = Statement{"SELECT pg_advisory_unlock({#0}, {#1})", key};
    // Session-backed tenures. The record need not be durable: lost in a
    // crash (which ends every session anyway), the tenure is taken over at
    // its lease's end, as without it.
    line.create_marks_sql = kCreateSessionTable;
    line.mark_sql = {
        "SELECT set_config('synchronous_commit', 'off', true)",
        "INSERT INTO simba_mutex_session (mutex, version) SELECT mutex, version FROM simba_mutex "
        "WHERE mutex = {0} AND owner_id = {1} AND version = {#2} ON CONFLICT (mutex) DO UPDATE "
        "SET version = EXCLUDED.version"};
    line.attempt_with_wait = true;
    // Someone waits in line when the waiting mark is held: an exclusive try
    // fails (a session does not conflict with itself, and the releaser's
    // own waits ended with their transactions). It replaced a read of
    // pg_locks, which takes every lock partition of the server: ~145 us
    // more than a SELECT 1 with 40 sessions holding advisory locks, on the
    // serial path of every hand-off. Taken, the mark is held until the
    // release commits: a process joining the line meanwhile waits that
    // long, then finds the line lock free.
    line.queued_sql = "NOT pg_try_advisory_xact_lock(" + waiting_mark(2, 3) + ")";
    line.key = std::move(key);
    return line;
  }

  std::unique_ptr<Listener> make_listener(
      std::function<void(const MutexEvent&)> on_event) override {
    return std::make_unique<PgListener>(params_, description_, table_, std::move(on_event));
  }
  std::string release_notice_sql() const override {
    // Only if the row is free now: the release may have found another owner.
    return "SELECT pg_notify('simba_mutex', {0}::text || chr(10) || {1}::text) FROM simba_mutex "
           "WHERE mutex = {0} AND owner_id = ''";
  }
  std::string lazy_release_suffix() const override {
    // A function in RETURNING, not a statement before the UPDATE: a SET
    // LOCAL first in the pipeline drew a warning per release (the server
    // does not see a transaction block yet), and a SELECT set_config() of
    // its own cost a statement's execution, most of the saving.
    return " RETURNING set_config('synchronous_commit', 'off', true)";
  }
  std::string forced_notice_sql() const override {
    // The holder and its token (the version) as they are before the update.
    return "SELECT pg_notify('simba_mutex', mutex || chr(10) || owner_id || chr(10) || "
           "version::text || chr(10) || 'forced') FROM simba_mutex "
           "WHERE mutex = {0} AND owner_id <> ''";
  }

 private:
  const std::map<std::string, std::string> params_;
  const PrepareSwitch prepare_ = std::make_shared<std::atomic<bool>>(true);
  // Also the NOTIFY channel: the notice names "simba_mutex", which the
  // protocol replaces with the table's name.
  const std::string table_;
  std::string description_;

  // The waiting mark of the line lock whose two keys are parameters {#high}
  // and {#low}: a transaction-level advisory lock, taken shared by each
  // session for the whole transaction of its lock wait (granted or not),
  // on the line key with its high half XORed with a constant. Another key
  // of the same two-int space: a mutex whose line key it equals (odds of
  // 2^-64) costs only a release that is not announced while nobody waits,
  // whose row the next try takes when its reserve ends.
  static std::string waiting_mark(int high, int low) {
    return "{#" + std::to_string(high) + "}::int4 # " + std::to_string(kWaitingMarkXor) + ", {#" +
           std::to_string(low) + "}";
  }

  std::vector<std::string> advisory_key(const std::string& mutex) const {
    const auto key = static_cast<std::uint64_t>(postgres_advisory_lock_key(table_ + "\n" + mutex));
    const auto high = static_cast<std::int32_t>(static_cast<std::uint32_t>(key >> 32));
    const auto low = static_cast<std::int32_t>(static_cast<std::uint32_t>(key));
    return {std::to_string(high), std::to_string(low)};
  }
};

}  // namespace

}  // namespace simba::internal::sql::pg

namespace simba {

Result<std::shared_ptr<Backend>> new_postgres_backend(PostgresOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::sql::pg::check_params(options.params));
  if (options.tls)
    SIMBA_RETURN_IF_ERROR(internal::sql::pg::apply_tls(options.params, *options.tls));
  if (options.connections < 1) {
    return invalid_argument_error("postgresql: connections must be at least 1");
  }
  SIMBA_RETURN_IF_ERROR(
      internal::sql::check_line_sessions("postgresql", options.queue_connections));
  SIMBA_RETURN_IF_ERROR(internal::sql::check_session_grace("postgresql", options.session_grace));
  // A bound on connecting even when a call's deadline is far away.
  if (options.params.count("connect_timeout") == 0) options.params["connect_timeout"] = "10";
  // Statements are bounded on the server too: a call that gave up
  // client-side (and closed its connection) must not leave a statement
  // waiting there for a row lock. Unless the URI sets `options` itself.
  if (options.params.count("options") == 0) {
    options.params["options"] = "-c statement_timeout=10s -c lock_timeout=10s";
  }
  internal::sql::SqlBackendOptions sql;
  sql.failover = internal::sql::pg::kFailover;
  sql.connections = options.connections;
  sql.line_sessions = options.queue_connections;
  sql.session_grace = options.session_grace;
  sql.create_table = options.create_table;
  sql.table = options.table;
  return internal::sql::new_sql_backend(
      std::make_unique<internal::sql::pg::PgDriver>(std::move(options.params), options.table), sql);
}

Result<PostgresOptions> postgres_options_from_uri(const Uri& uri) {
  constexpr char kForm[] = "postgresql://user[:password]@host[:port][,host[:port]...]/db";
  if (uri.scheme != "postgresql" && uri.scheme != "postgres") {
    return invalid_argument_error("postgresql: URI scheme is " + internal::in_quotes(uri.scheme) +
                                  ", expected 'postgresql'");
  }
  if (uri.hosts.empty() || std::any_of(uri.hosts.begin(), uri.hosts.end(),
                                       [](const UriHost& host) { return host.host.empty(); })) {
    return invalid_argument_error(std::string("postgresql: URI names no host; expected ") + kForm);
  }
  if (uri.path.size() <= 1) {
    return invalid_argument_error(std::string("postgresql: URI names no database; expected ") +
                                  kForm);
  }
  PostgresOptions options;
  // Several hosts (a primary and its standbys): libpq's lists, one port
  // per host ("" for the default), and sessions on the primary only unless
  // the URI says otherwise (target_session_attrs=read-write: libpq skips a
  // standby and tries the next host). connect() refuses a standby anyway.
  std::string hosts;
  std::string ports;
  bool any_port = false;
  for (std::size_t i = 0; i < uri.hosts.size(); ++i) {
    hosts += (i == 0 ? "" : ",") + uri.hosts[i].host;
    ports += (i == 0 ? "" : ",");
    if (uri.hosts[i].port) {
      ports += std::to_string(*uri.hosts[i].port);
      any_port = true;
    }
  }
  options.params["host"] = hosts;
  if (any_port) options.params["port"] = ports;
  if (uri.hosts.size() > 1 && !uri.query_value("target_session_attrs")) {
    options.params["target_session_attrs"] = "read-write";
  }
  options.params["dbname"] = uri.path.substr(1);
  if (uri.user) options.params["user"] = *uri.user;
  if (uri.password) options.params["password"] = *uri.password;
  if (const std::optional<std::string> file = uri.query_value("password_file")) {
    if (uri.password) {
      return invalid_argument_error(
          "postgresql: the URI has a password and password_file: give one of them");
    }
    SIMBA_ASSIGN_OR_RETURN(options.params["password"],
                           read_secret_file("postgresql", "password_file", *file));
  }
  const bool any_tls_key = std::any_of(
      std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys),
      [&](std::string_view key) { return uri.query_value(std::string(key)).has_value(); });
  if (any_tls_key) {
    SIMBA_ASSIGN_OR_RETURN(TlsOptions tls, tls_options_from_uri(uri, "postgresql"));
    // tls_* files with sslmode=verify-ca and no tls=: libpq's spelling of on.
    if (!uri.query_value("tls") && uri.query_value("sslmode") == "verify-ca") {
      tls.mode = TlsMode::kOn;
    }
    options.tls = std::move(tls);
  }
  for (const auto& [key, value] : uri.query) {
    SIMBA_ASSIGN_OR_RETURN(const bool read, internal::sql::read_table_key(
                                                "postgresql", key, value, options.connections,
                                                options.table, options.create_table));
    SIMBA_ASSIGN_OR_RETURN(
        const bool queue,
        internal::sql::read_queue_key("postgresql", key, value, options.queue_connections));
    SIMBA_ASSIGN_OR_RETURN(const bool grace, internal::sql::read_grace_key("postgresql", key, value,
                                                                           options.session_grace));
    if (read || queue || grace) {
    } else if (key == "lock_connections" || key == "password_file" ||
               std::find(std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys), key) !=
                   std::end(kTlsQueryKeys)) {
      // Read above; lock_connections is the keyed-lock backend's
      // (postgres_keyed.h): one URI serves both.
    } else if (key == "host" || key == "port" || key == "dbname" || key == "user" ||
               key == "password") {
      return invalid_argument_error("postgresql: " + internal::in_quotes(key) +
                                    " belongs in the URI itself, not its query");
    } else if (internal::sql::pg::libpq_keywords().count(key) == 0) {
      return invalid_argument_error(
          "postgresql: unknown URI query key " + internal::in_quotes(key) +
          " (ours: connections, queue_connections, session_grace, create_table, table, "
          "lock_connections, "
          "password_file, tls, tls_ca, tls_cert, tls_key, "
          "tls_server_name; others must be libpq connection keywords)");
    } else {
      options.params[key] = value;
    }
  }
  // Contradictions between the tls keys and libpq's are errors here already.
  if (options.tls) {
    std::map<std::string, std::string> mapped = options.params;
    SIMBA_RETURN_IF_ERROR(internal::sql::pg::apply_tls(mapped, *options.tls));
  }
  return options;
}

std::string postgres_schema_sql() {
  return std::string(internal::sql::pg::kCreateTable) + ";\n" +
         internal::sql::pg::kCreateSessionTable + ";\n";
}

}  // namespace simba
