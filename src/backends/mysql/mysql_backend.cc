// The MySQL/MariaDB driver of the SQL protocol (backends/sql/sql_backend.h):
// MariaDB Connector/C connections driven with its non-blocking API, so every
// call ends by its deadline, and JVM Simba's table, so JVM Simba contenders
// can share it (simba-behaviour.md §3.1, §8.1). No push: waiters poll.
#include "simba/backends/mysql.h"

#include <mysql.h>

#include <charconv>
#include <utility>
#include <vector>

#include "backends/mysql/mysql_client.h"
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

class MysqlSession final : public SqlSession {
 public:
  explicit MysqlSession(MysqlConn conn) : conn_(std::move(conn)) {}
  // Destroyed healthy, a session says COM_QUIT; a broken one must not wait.
  void abandon() override { mariadb_cancel(conn_.get()); }

  Result<std::vector<SqlResult>> run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    if (!healthy()) return unavailable_error("the connection is broken");
    // One multi-statement query, one round trip: START TRANSACTION; s1;
    // ...; COMMIT. Statements after a failed one are not run.
    std::string query;
    if (transaction) query = "START TRANSACTION;";
    for (std::size_t i = 0; i < statements.size(); ++i) {
      SIMBA_ASSIGN_OR_RETURN(std::string sql, render(statements[i]));
      if (i > 0) query += ";";
      query += sql;
    }
    if (transaction) query += ";COMMIT";
    const std::size_t expected = statements.size() + (transaction ? 2 : 0);

    QueryReply reply = mysql::query(conn_.get(), query, deadline);
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
    if (transaction) results = {results.begin() + 1, results.end() - 1};
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
};

class MysqlDriver final : public SqlDriver {
 public:
  explicit MysqlDriver(MysqlOptions server)
      : server_(std::move(server)), description_(describe_server(server_)) {}

  std::string_view scheme() const override { return "mysql"; }
  const std::string& description() const override { return description_; }

  Result<std::unique_ptr<SqlSession>> connect(Deadline deadline) override {
    // UTC: UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) then has no DST fold. A row
    // lock wait is bounded on the server too (InnoDB's default is 50 s): a
    // call that gave up client-side must not leave a statement queued there
    // for long.
    ConnectExtras extras;
    extras.init_command = "SET time_zone = '+00:00', innodb_lock_wait_timeout = 10";
    extras.multi_statements = true;
    SIMBA_ASSIGN_OR_RETURN(MysqlConn conn, mysql::connect(server_, description_, deadline, extras));
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

 private:
  const MysqlOptions server_;
  const std::string description_;
};

}  // namespace

}  // namespace simba::internal::sql::mysql

namespace simba {

Result<std::shared_ptr<Backend>> new_mysql_backend(MysqlOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::check_server(options));
  if (options.connections < 1) {
    return invalid_argument_error("mysql: connections must be at least 1");
  }
  internal::sql::SqlBackendOptions sql;
  sql.connections = options.connections;
  sql.create_table = options.create_table;
  sql.table = options.table;
  return internal::sql::new_sql_backend(
      std::make_unique<internal::sql::mysql::MysqlDriver>(std::move(options)), sql);
}

Result<MysqlOptions> mysql_options_from_uri(const Uri& uri) {
  constexpr char kForm[] = "mysql://user[:password]@host[:port]/db";
  if (uri.scheme != "mysql" && uri.scheme != "mariadb") {
    return invalid_argument_error("mysql: URI scheme is " + internal::in_quotes(uri.scheme) +
                                  ", expected 'mysql'");
  }
  if (uri.hosts.size() != 1 || uri.hosts.front().host.empty()) {
    return invalid_argument_error(std::string("mysql: URI must name one host; expected ") + kForm);
  }
  if (uri.path.size() <= 1 || uri.path.find('/', 1) != std::string::npos) {
    return invalid_argument_error(std::string("mysql: URI must name one database; expected ") +
                                  kForm);
  }
  // lock_connections and op_timeout belong to the keyed-lock backend
  // (mysql_keyed.h), ignored here so one URI serves both.
  SIMBA_RETURN_IF_ERROR(
      uri.check_query_keys({"connections", "create_table", "table", "connect_timeout", "ssl_mode",
                            "ssl_ca", "ssl_cert", "ssl_key", "lock_connections", "op_timeout"}));
  MysqlOptions options;
  options.host = uri.hosts.front().host;
  if (uri.hosts.front().port) options.port = *uri.hosts.front().port;
  options.database = uri.path.substr(1);
  if (uri.user) options.user = *uri.user;
  if (uri.password) options.password = *uri.password;
  for (const auto& [key, value] : uri.query) {
    SIMBA_ASSIGN_OR_RETURN(const bool read,
                           internal::sql::read_table_key("mysql", key, value, options.connections,
                                                         options.table, options.create_table));
    if (read) {
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
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::check_server(options));
  return options;
}

std::string mysql_schema_sql() { return std::string(internal::sql::mysql::kCreateTable) + ";\n"; }

}  // namespace simba
