// The MySQL/MariaDB driver of the SQL protocol (backends/sql/sql_backend.h):
// MariaDB Connector/C connections driven with its non-blocking API, so every
// call ends by its deadline, and JVM Simba's table, so JVM Simba contenders
// can share it (simba-behaviour.md §3.1, §8.1). No push: waiters poll.
#include "simba/backends/mysql.h"

#include <mysql.h>
#include <poll.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "backends/mysql/mysql_client.h"
#include "backends/mysql/mysql_lock_name.h"
#include "backends/sql/sql_backend.h"

namespace simba::internal::sql::mysql {
namespace {

// Epoch milliseconds of the database clock, fixed within one statement
// (CURRENT_TIMESTAMP is the statement's start). JVM Simba's expression; our
// sessions run in UTC, where UNIX_TIMESTAMP() has no DST fold to misread.
constexpr char kNowMs[] = "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)";

// JVM Simba's table (init-simba-mysql.sql, owner_id as since v3.0.2), column
// for column. The table options are ours: utf8mb4 holds every name we
// accept, and a binary collation makes names exact, as in every other
// store (the database's default collation may ignore case).
constexpr char kCreateTable[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex (\n"
    "  mutex varchar(66) not null primary key comment 'mutex name',\n"
    "  acquired_at bigint unsigned not null,\n"
    "  ttl_at bigint unsigned not null,\n"
    "  transition_at bigint unsigned not null,\n"
    "  owner_id varchar(128) not null,\n"
    "  version int unsigned not null\n"
    ") DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";
// Which tenures a holder's session backs (session_grace): created beside the
// table, and printed with it by `simba schema`. JVM Simba never reads it.
constexpr char kCreateSessionTable[] =
    "CREATE TABLE IF NOT EXISTS simba_mutex_session (mutex varchar(66) not null primary key, "
    "version bigint unsigned not null) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

class MysqlSession final : public SqlSession {
 public:
  explicit MysqlSession(MysqlConn conn) : conn_(std::move(conn)) {}
  // Destroyed healthy, a session says COM_QUIT; a broken one must not wait.
  void abandon() override { mariadb_cancel(conn_.get()); }
  void set_wake_fd(int fd) override { wake_fd_ = fd; }
  std::uint64_t server_id() const override { return mysql_thread_id(conn_.get()); }
  // An idle session hears from its server only when the server ends it
  // (KILL, a shutdown: an error packet, then the end of the stream): the
  // pool then opens another instead of failing the next call with it.
  bool ended_while_idle() const override {
    const int fd = static_cast<int>(mysql_get_socket(conn_.get()));
    if (fd < 0) return true;
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    if (!healthy()) return unavailable_error("the connection is broken");
    // One multi-statement query, one round trip: START TRANSACTION; s1;
    // ...; COMMIT, and then any to run after the commit
    // (Statement::after_commit). Statements after a failed one are not run.
    std::string query;
    if (transaction) query = "START TRANSACTION";
    std::size_t commit_at = statements.size();  // index of COMMIT's reply - 1
    for (std::size_t i = 0; i < statements.size(); ++i) {
      SIMBA_ASSIGN_OR_RETURN(std::string sql, render(statements[i]));
      if (transaction && statements[i].after_commit && commit_at == statements.size()) {
        query += ";COMMIT";
        commit_at = i;
      }
      if (!query.empty()) query += ";";
      query += sql;
    }
    if (transaction && commit_at == statements.size()) query += ";COMMIT";
    const std::size_t expected = statements.size() + (transaction ? 2 : 0);

    QueryReply reply = mysql::query(conn_.get(), query, deadline, wake_fd_);
    std::vector<SqlResult>& results = reply.results;
    if (!reply.error.status.ok()) {
      if (failure != nullptr) *failure = reply.error.kind;
      if (reply.error.broken) {
        // Closing it makes the server roll back what it had not committed.
        set_broken();
      } else if (transaction && !rollback(deadline)) {
        // The transaction may still be open: never reuse it.
        set_broken();
      }
      return reply.error.status;
    }
    if (results.size() != expected) {
      set_broken();
      return internal_error("expected " + std::to_string(expected) + " results, got " +
                            std::to_string(results.size()));
    }
    if (transaction) {
      results.erase(results.begin() + 1 + static_cast<long>(commit_at));
      results.erase(results.begin());
    }
    return results;
  }

 private:
  // `statement.sql` with its parameters as literals: {i} quoted and escaped
  // for the connection's character set, {#i} a bare decimal integer.
  Result<std::string> render(const Statement& statement) {
    return render_params(statement.sql, [&](std::size_t index, bool number) -> Result<std::string> {
      if (index >= statement.params.size()) {
        return internal_error("statement parameter {" + std::to_string(index) + "} is missing");
      }
      const std::string& value = statement.params[index];
      if (!number) return sql_literal(conn_.get(), value);
      long long parsed = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
      if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
        return internal_error("statement parameter {#" + std::to_string(index) +
                              "} is not an integer");
      }
      return value;
    });
  }

  // After a statement of a transaction failed: ends it. False if that
  // failed too (or missed the deadline).
  bool rollback(Deadline deadline) {
    return mysql::query(conn_.get(), "ROLLBACK", deadline).error.status.ok();
  }

  MysqlConn conn_;
  int wake_fd_ = -1;
};

class MysqlDriver final : public SqlDriver {
 public:
  explicit MysqlDriver(MysqlOptions server)
      : server_(std::move(server)), description_(describe_server(server_)) {}

  std::string_view scheme() const override { return "mysql"; }
  const std::string& description() const override { return description_; }
  std::string transport() const override { return transport_of(server_); }

  // simba doctor: the server, whether it is read-only, whether it is in a
  // Galera or Group Replication cluster (where GET_LOCK is per member), its
  // durability settings, and whether this session is encrypted.
  Status inspect(SqlSession& session, StoreReport& report, Deadline deadline) const override {
    SIMBA_ASSIGN_OR_RETURN(
        std::vector<SqlResult> r,
        session.run({{"SELECT VERSION(), @@read_only, @@innodb_flush_log_at_trx_commit", {}},
                     {"SHOW GLOBAL VARIABLES WHERE Variable_name IN ('wsrep_on', "
                      "'group_replication_group_name')",
                      {}},
                     {"SHOW SESSION STATUS LIKE 'Ssl_cipher'", {}}},
                    false, deadline));
    using Severity = StoreFinding::Severity;
    report.add(Severity::kOk, "server", first_cell(r[0]));
    // (SHOW REPLICA STATUS would need a privilege the application's user
    // seldom has; a replica is read-only in any sane deployment.)
    if (first_cell(r[0], 1) == "1") {
      report.add(Severity::kUnsafe, "topology",
                 "read-only (@@read_only=1), a replica: locks must be taken on the primary");
    } else {
      report.add(Severity::kOk, "topology", "writable (@@read_only=0)");
    }
    for (const SqlRow& row : r[1].rows) {
      if (row.size() < 2) continue;
      const bool galera = row[0] == "wsrep_on" && row[1] == "ON";
      const bool group = row[0] == "group_replication_group_name" && !row[1].empty();
      if (galera || group) {
        report.add(
            Severity::kUnsafe, "topology",
            std::string(galera ? "a Galera member (wsrep_on)" : "a Group Replication member") +
                ": GET_LOCK (the keyed locks) excludes only on this member");
      }
    }
    const std::string flush = first_cell(r[0], 2);
    report.add(flush == "1" ? Severity::kOk : Severity::kUnsafe, "durability",
               "innodb_flush_log_at_trx_commit=" + flush +
                   (flush == "1" ? ""
                                 : ": a crash may forget acknowledged acquisitions and hand "
                                   "their tokens out again"));
    const std::string cipher = first_cell(r[2], 1);
    report.add(cipher.empty() ? Severity::kNote : Severity::kOk, "session",
               cipher.empty() ? "this connection is not encrypted (Ssl_cipher is empty)"
                              : "this connection is encrypted (" + cipher + ")");
    return ok_status();
  }

  Result<std::unique_ptr<SqlSession>> connect(Deadline deadline) override {
    // UTC: UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) then has no DST fold. A row
    // lock wait is bounded on the server too (InnoDB's default is 50 s): a
    // call that gave up client-side must not leave a statement queued there
    // for long.
    ConnectExtras extras;
    extras.init_command = "SET time_zone = '+00:00', innodb_lock_wait_timeout = 10";
    extras.multi_statements = true;
    // The first writable host: a read-only server (a replica) is passed
    // over, and refused, naming it, when no host is left.
    SIMBA_ASSIGN_OR_RETURN(MysqlConn conn, mysql::connect(server_, deadline, extras));
    return std::unique_ptr<SqlSession>(std::make_unique<MysqlSession>(std::move(conn)));
  }

  std::string now_ms() const override { return kNowMs; }
  std::string create_table_sql() const override { return kCreateTable; }
  std::string insert_free_row_sql() const override {
    // INSERT IGNORE: the same statement, skipping a row that exists.
    std::string sql = kInsertFreeRow;
    return sql.insert(std::string_view("INSERT").size(), " IGNORE");
  }

  std::vector<Statement> acquire_statements(const AcquireParts& parts,
                                            const std::vector<std::string>& params) const override {
    // Insert the row acquired, or update it where the caller may acquire.
    // MySQL assigns ON DUPLICATE KEY UPDATE columns left to right, and a
    // later expression sees the earlier columns' new values: the order of
    // parts.assignments keeps `may_acquire` meaning the same in each IF.
    // The upsert locks the row (also when it changes nothing) until COMMIT,
    // so the SELECT after it sees the row as decided.
    std::string upsert = parts.insert_acquired() + " ON DUPLICATE KEY UPDATE ";
    for (std::size_t i = 0; i < parts.assignments.size(); ++i) {
      const auto& [column, value] = parts.assignments[i];
      if (i > 0) upsert += ", ";
      upsert += column + " = IF(" + parts.may_acquire + ", " + value + ", " + column + ")";
    }
    return {{upsert, params}, parts.read_back(params[0])};
  }

  // The wait line: a GET_LOCK name per mutex, which the server grants to the
  // sessions waiting for it one at a time (MariaDB queues them in the order
  // they asked). No NOTIFY: a holder keeps it while it holds, and its
  // release is the next one's wake-up. The name: a prefix keyed locks'
  // names are unlikely to take and 48 hex digits of the SHA-256 of the table
  // and mutex (60 characters, within MySQL's 64).
  std::optional<LineLock> line_lock(const std::string& mutex,
                                    std::uint64_t ended_session) const override {
    const std::string name =
        "#simba-line:" + sha256_hex(server_.table + "\n" + mutex).substr(0, 48);
    LineLock line;
    // Free, or this session's: read without taking it (a race between two
    // sessions that both find it free is decided by the row, as always).
    // Or held by a line session of ours that the wait line closed to end
    // its wait (MySQL has no cancel on the same connection): the server
    // grants a closed connection's wait until it notices the close, and a
    // try of ours right after its give-up found the released row reserved
    // for it (clustered conformance, 1-2 in 200). The line lock only
    // orders processes; the row decides who holds.
    line.try_sql = ended_session == 0
                       ? "(IS_FREE_LOCK({4}) = 1 OR IS_USED_LOCK({4}) = CONNECTION_ID())"
                       : "(IS_FREE_LOCK({4}) = 1 OR IS_USED_LOCK({4}) IN (CONNECTION_ID(), " +
                             std::to_string(ended_session) + "))";
    line.key = {name};
    line.wait = [name](std::chrono::milliseconds wait) {
      const auto seconds = std::max<long long>(1, (wait.count() + 999) / 1000);
      return std::vector<Statement>{
          {"SELECT GET_LOCK({0}, {#1})", {name, std::to_string(seconds)}}};
    };
    line.unlock = Statement{"SELECT RELEASE_LOCK({0})", {name}};
    // InnoDB's upsert waits for the release's row lock, which the commit
    // lets go before its flush (without a binary log): the next process in
    // line asks while the release is flushed, not after (MariaDB flushes
    // every commit: no per-transaction setting spares a release's).
    line.unlock_in_transaction = true;
    line.granted = [](const std::vector<SqlResult>& results) {
      return !results.empty() && first_cell(results.back()) == "1";
    };
    // Session-backed tenures (WaitLine::Hooks::grace).
    line.create_marks_sql = kCreateSessionTable;
    line.mark_sql = {
        "INSERT INTO simba_mutex_session (mutex, version) SELECT mutex, version FROM simba_mutex "
        "WHERE mutex = {0} AND owner_id = {1} AND version = {#2} ON DUPLICATE KEY UPDATE "
        "version = VALUES(version)"};
    return line;
  }

 private:
  const MysqlOptions server_;
  const std::string description_;
};

}  // namespace

}  // namespace simba::internal::sql::mysql

namespace simba {

Result<std::shared_ptr<Backend>> new_mysql_backend(MysqlOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::apply_tls(options));
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::check_server(options));
  if (options.connections < 1) {
    return invalid_argument_error("mysql: connections must be at least 1");
  }
  SIMBA_RETURN_IF_ERROR(internal::sql::check_line_sessions("mysql", options.queue_connections));
  SIMBA_RETURN_IF_ERROR(internal::sql::check_session_grace("mysql", options.session_grace));
  internal::sql::SqlBackendOptions sql;
  sql.failover = internal::sql::mysql::kFailover;
  sql.connections = options.connections;
  sql.line_sessions = options.queue_connections;
  sql.session_grace = options.session_grace;
  sql.create_table = options.create_table;
  sql.table = options.table;
  return internal::sql::new_sql_backend(
      std::make_unique<internal::sql::mysql::MysqlDriver>(std::move(options)), sql);
}

Result<MysqlOptions> mysql_options_from_uri(const Uri& uri) {
  constexpr char kForm[] = "mysql://user[:password]@host[:port][,host[:port]...]/db";
  if (uri.scheme != "mysql" && uri.scheme != "mariadb") {
    return invalid_argument_error("mysql: URI scheme is " + internal::in_quotes(uri.scheme) +
                                  ", expected 'mysql'");
  }
  if (uri.hosts.empty()) {
    return invalid_argument_error(std::string("mysql: URI names no host; expected ") + kForm);
  }
  for (std::size_t i = 0; i < uri.hosts.size(); ++i) {
    if (uri.hosts[i].host.empty()) {
      return invalid_argument_error("mysql: host " + std::to_string(i + 1) + " of " +
                                    std::to_string(uri.hosts.size()) +
                                    " in the URI is empty; expected " + kForm);
    }
  }
  if (uri.path.size() <= 1 || uri.path.find('/', 1) != std::string::npos) {
    return invalid_argument_error(std::string("mysql: URI must name one database; expected ") +
                                  kForm);
  }
  // lock_connections and op_timeout belong to the keyed-lock backend
  // (mysql_keyed.h), ignored here so one URI serves both.
  std::vector<std::string_view> keys = {
      "connections",   "create_table",      "table",        "connect_timeout",  "ssl_mode",
      "ssl_ca",        "ssl_cert",          "ssl_key",      "lock_connections", "op_timeout",
      "password_file", "queue_connections", "session_grace"};
  keys.insert(keys.end(), std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys));
  SIMBA_RETURN_IF_ERROR(uri.check_query_keys(keys));
  MysqlOptions options;
  options.host = uri.hosts.front().host;
  if (uri.hosts.front().port) options.port = *uri.hosts.front().port;
  for (std::size_t i = 1; i < uri.hosts.size(); ++i) {
    MysqlHost& more = options.more_hosts.emplace_back();
    more.host = uri.hosts[i].host;
    if (uri.hosts[i].port) more.port = *uri.hosts[i].port;
  }
  options.database = uri.path.substr(1);
  if (uri.user) options.user = *uri.user;
  if (uri.password) options.password = *uri.password;
  if (const std::optional<std::string> file = uri.query_value("password_file")) {
    if (uri.password) {
      return invalid_argument_error(
          "mysql: the URI has a password and password_file: give one of them");
    }
    SIMBA_ASSIGN_OR_RETURN(options.password, read_secret_file("mysql", "password_file", *file));
  }
  const bool any_tls_key = std::any_of(
      std::begin(kTlsQueryKeys), std::end(kTlsQueryKeys),
      [&](std::string_view key) { return uri.query_value(std::string(key)).has_value(); });
  if (any_tls_key) {
    SIMBA_ASSIGN_OR_RETURN(TlsOptions tls, tls_options_from_uri(uri, "mysql"));
    // tls_* files with ssl_mode=verify_ca and no tls=: the ssl spelling of on.
    if (!uri.query_value("tls") && uri.query_value("ssl_mode") == "verify_ca") {
      tls.mode = TlsMode::kOn;
    }
    // ssl_mode=disabled is also the field's default, so apply_tls cannot
    // tell it was asked for.
    if (uri.query_value("ssl_mode") == "disabled" && tls.enabled()) {
      return invalid_argument_error(std::string("mysql: tls=") + tls_mode_name(tls.mode) +
                                    " contradicts ssl_mode=disabled: give one of them");
    }
    options.tls = std::move(tls);
  }
  for (const auto& [key, value] : uri.query) {
    SIMBA_ASSIGN_OR_RETURN(const bool read,
                           internal::sql::read_table_key("mysql", key, value, options.connections,
                                                         options.table, options.create_table));
    SIMBA_ASSIGN_OR_RETURN(const bool queue, internal::sql::read_queue_key(
                                                 "mysql", key, value, options.queue_connections));
    SIMBA_ASSIGN_OR_RETURN(const bool grace, internal::sql::read_grace_key("mysql", key, value,
                                                                           options.session_grace));
    if (read || queue || grace) {
    } else if (key == "connect_timeout") {
      SIMBA_ASSIGN_OR_RETURN(options.connect_timeout, parse_duration("connect_timeout", value));
    } else if (key == "ssl_mode") {
      options.ssl_mode = value;
    } else if (key == "ssl_ca") {
      options.ssl_ca = value;
    } else if (key == "ssl_cert") {
      options.ssl_cert = value;
    } else if (key == "ssl_key") {
      options.ssl_key = value;
    }
  }
  // Contradictions between the tls keys and the ssl_* ones are errors here.
  MysqlOptions mapped = options;
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::apply_tls(mapped));
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::check_server(mapped));
  return options;
}

std::string mysql_schema_sql() {
  return std::string(internal::sql::mysql::kCreateTable) + ";\n" +
         internal::sql::mysql::kCreateSessionTable + ";\n";
}

}  // namespace simba
