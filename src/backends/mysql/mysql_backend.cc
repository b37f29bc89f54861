// The MySQL/MariaDB driver of the SQL protocol (backends/sql/sql_backend.h):
// MariaDB Connector/C connections driven with its non-blocking API, so every
// call ends by its deadline, and JVM Simba's table, so JVM Simba contenders
// can share it (simba-behaviour.md §3.1, §8.1). No push: waiters poll.
#include "simba/backends/mysql.h"

#include <mysql.h>

#include <algorithm>
#include <charconv>
#include <utility>
#include <vector>

#include "backends/mysql/mysql_client.h"
#include "backends/sql/sql_backend.h"
#include "core/log.h"

namespace simba {
namespace {

using internal::mysql::Abandon;
using internal::mysql::ConnectExtras;
using internal::mysql::Drive;
using internal::mysql::DriveOutcome;
using internal::mysql::Endpoint;
using internal::mysql::ErrorOf;
using internal::mysql::Failure;
using internal::mysql::MysqlConn;
using internal::mysql::MysqlFailureKind;
using internal::mysql::MysqlResult;

using internal::sql::AcquireParts;
using internal::sql::SqlDriver;
using internal::sql::SqlFailure;
using internal::sql::SqlResult;
using internal::sql::SqlRow;
using internal::sql::SqlSession;
using internal::sql::Statement;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

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

std::string Quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

// The SQL protocol's view of a failure.
SqlFailure SqlFailureOf(MysqlFailureKind kind) {
  switch (kind) {
    case MysqlFailureKind::kNoTable:
      return SqlFailure::kNoTable;
    case MysqlFailureKind::kNoPrivilege:
      return SqlFailure::kNoPrivilege;
    case MysqlFailureKind::kAlreadyExists:
      return SqlFailure::kAlreadyExists;
    case MysqlFailureKind::kDuplicateKey:
      return SqlFailure::kDuplicateKey;
    case MysqlFailureKind::kOther:
      break;
  }
  return SqlFailure::kOther;
}

class MysqlSession final : public SqlSession {
 public:
  explicit MysqlSession(MysqlConn conn) : conn_(std::move(conn)) {}
  ~MysqlSession() override {
    // COM_QUIT on a healthy connection; a broken one must not wait.
    if (!healthy_) mariadb_cancel(conn_.get());
  }

  bool healthy() const override { return healthy_; }

  Result<std::vector<SqlResult>> Run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    if (!healthy_) return UnavailableError("the connection is broken");
    // One multi-statement query, one round trip: START TRANSACTION; s1;
    // ...; COMMIT. Statements after a failed one are not run.
    std::string query;
    if (transaction) query = "START TRANSACTION;";
    for (std::size_t i = 0; i < statements.size(); ++i) {
      SIMBA_ASSIGN_OR_RETURN(std::string sql, Render(statements[i]));
      if (i > 0) query += ";";
      query += sql;
    }
    if (transaction) query += ";COMMIT";
    const std::size_t expected = statements.size() + (transaction ? 2 : 0);

    MYSQL* m = conn_.get();
    std::vector<SqlResult> results;
    Failure error;
    bool failed = false;
    int rc = 0;
    int status = mysql_real_query_start(&rc, m, query.data(), query.size());
    auto query_cont = [&](int ready) { return mysql_real_query_cont(&rc, m, ready); };
    if (Drive(m, status, deadline, query_cont) != DriveOutcome::kDone) {
      return Late(status, query_cont);
    }
    if (rc != 0) {
      error = ErrorOf(m);
      failed = true;
    }
    while (!failed) {
      MYSQL_RES* raw = nullptr;
      status = mysql_store_result_start(&raw, m);
      auto store_cont = [&](int ready) { return mysql_store_result_cont(&raw, m, ready); };
      if (Drive(m, status, deadline, store_cont) != DriveOutcome::kDone) {
        return Late(status, store_cont);
      }
      MysqlResult result(raw);
      SqlResult out;
      if (result) {
        const unsigned int columns = mysql_num_fields(result.get());
        while (MYSQL_ROW row = mysql_fetch_row(result.get())) {
          const unsigned long* lengths = mysql_fetch_lengths(result.get());
          SqlRow values;
          values.reserve(columns);
          for (unsigned int c = 0; c < columns; ++c) {
            values.emplace_back(row[c] != nullptr ? std::string(row[c], lengths[c]) : "");
          }
          out.rows.push_back(std::move(values));
        }
      } else if (mysql_field_count(m) != 0) {
        error = ErrorOf(m);  // rows were due but could not be read
        error.broken = true;
        failed = true;
        break;
      } else {
        out.affected_rows = mysql_affected_rows(m);
      }
      results.push_back(std::move(out));
      int next = 0;
      status = mysql_next_result_start(&next, m);
      auto next_cont = [&](int ready) { return mysql_next_result_cont(&next, m, ready); };
      if (Drive(m, status, deadline, next_cont) != DriveOutcome::kDone) {
        return Late(status, next_cont);
      }
      if (next == -1) break;  // no more results
      if (next > 0) {
        error = ErrorOf(m);  // the next statement failed
        failed = true;
      }
    }
    if (failed) {
      if (failure != nullptr) *failure = SqlFailureOf(error.kind);
      if (error.broken) {
        healthy_ = false;
      } else if (transaction && !Rollback(deadline)) {
        // The transaction may still be open: never reuse it.
        healthy_ = false;
      }
      return error.status;
    }
    if (results.size() != expected) {
      healthy_ = false;
      return InternalError("expected " + std::to_string(expected) + " results, got " +
                           std::to_string(results.size()));
    }
    if (transaction) results = {results.begin() + 1, results.end() - 1};
    return results;
  }

 private:
  // `statement.sql` with its parameters as literals: {i} quoted and escaped
  // for the connection's character set, {#i} a bare decimal integer.
  Result<std::string> Render(const Statement& statement) {
    const std::string& sql = statement.sql;
    std::string out;
    out.reserve(sql.size() + 64);
    for (std::size_t i = 0; i < sql.size(); ++i) {
      if (sql[i] == '{') {
        const std::size_t close = sql.find('}', i);
        const bool number = i + 1 < sql.size() && sql[i + 1] == '#';
        const std::size_t first = number ? i + 2 : i + 1;
        std::size_t index = 0;
        if (close != std::string::npos && close > first &&
            std::from_chars(sql.data() + first, sql.data() + close, index).ptr ==
                sql.data() + close) {
          if (index >= statement.params.size()) {
            return InternalError("statement parameter {" + std::to_string(index) + "} is missing");
          }
          const std::string& value = statement.params[index];
          if (number) {
            long long parsed = 0;
            const auto [end, ec] =
                std::from_chars(value.data(), value.data() + value.size(), parsed);
            if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
              return InternalError("statement parameter {#" + std::to_string(index) +
                                   "} is not an integer");
            }
            out += value;
          } else {
            std::string escaped(value.size() * 2 + 1, '\0');
            const unsigned long n = mysql_real_escape_string(conn_.get(), escaped.data(),
                                                             value.data(), value.size());
            escaped.resize(n);
            out += "'" + escaped + "'";
          }
          i = close;
          continue;
        }
      }
      out += sql[i];
    }
    return out;
  }

  // After a statement of a transaction failed: ends it. False if that
  // failed too (or missed the deadline).
  bool Rollback(Deadline deadline) {
    MYSQL* m = conn_.get();
    int rc = 0;
    static constexpr char kRollback[] = "ROLLBACK";
    int status = mysql_real_query_start(&rc, m, kRollback, sizeof(kRollback) - 1);
    auto cont = [&](int ready) { return mysql_real_query_cont(&rc, m, ready); };
    if (Drive(m, status, deadline, cont) != DriveOutcome::kDone) {
      Abandon(m, status, cont);
      return false;
    }
    return rc == 0;
  }

  // The reply may still come; the connection cannot be reused (closing it
  // makes the server roll back what it had not committed).
  template <typename Cont>
  Status Late(int& status, Cont cont) {
    healthy_ = false;
    Abandon(conn_.get(), status, cont);
    return DeadlineExceededError("no reply by the deadline");
  }

  MysqlConn conn_;
  bool healthy_ = true;
};

class MysqlDriver final : public SqlDriver {
 public:
  explicit MysqlDriver(Endpoint endpoint) : endpoint_(std::move(endpoint)) {
    description_ = "mysql at " + endpoint_.host + ":" + std::to_string(endpoint_.port) + "/" +
                   endpoint_.database;
  }

  std::string_view scheme() const override { return "mysql"; }
  const std::string& description() const override { return description_; }

  Result<std::unique_ptr<SqlSession>> Connect(Deadline deadline) override {
    // UTC: UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) then has no DST fold. A row
    // lock wait is bounded on the server too (InnoDB's default is 50 s): a
    // call that gave up client-side must not leave a statement queued there
    // for long.
    ConnectExtras extras;
    extras.init_command = "SET time_zone = '+00:00', innodb_lock_wait_timeout = 10";
    extras.multi_statements = true;
    SIMBA_ASSIGN_OR_RETURN(MysqlConn conn,
                           internal::mysql::Connect(endpoint_, description_, deadline, extras));
    return std::unique_ptr<SqlSession>(std::make_unique<MysqlSession>(std::move(conn)));
  }

  std::string NowMs() const override { return kNowMs; }
  std::string CreateTableSql() const override { return kCreateTable; }
  std::string InsertFreeRowSql() const override {
    // INSERT IGNORE: the same statement, skipping a row that exists.
    std::string sql = internal::sql::kInsertFreeRow;
    return sql.insert(std::string_view("INSERT").size(), " IGNORE");
  }

  std::vector<Statement> AcquireStatements(const AcquireParts& parts,
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
  const Endpoint endpoint_;
  std::string description_;
};

// ssl_mode and the TLS files, for NewMysqlBackend and MysqlOptionsFromUri.
Status CheckTlsOptions(const MysqlOptions& options) {
  if (options.ssl_mode != "disabled" && options.ssl_mode != "required" &&
      options.ssl_mode != "verify_ca" && options.ssl_mode != "verify_identity") {
    return InvalidArgumentError(
        "mysql: ssl_mode must be disabled, required, verify_ca or verify_identity, not " +
        Quoted(options.ssl_mode));
  }
  // libmariadb verifies a chain without the host name only against a CA
  // file; without one, verify_ca would verify nothing.
  if (options.ssl_mode == "verify_ca" && options.ssl_ca.empty()) {
    return InvalidArgumentError(
        "mysql: ssl_mode=verify_ca needs ssl_ca (the CA file that signed the server's "
        "certificate)");
  }
  if (!options.ssl_key.empty() && options.ssl_cert.empty()) {
    return InvalidArgumentError("mysql: ssl_key needs ssl_cert (the client certificate)");
  }
  return OkStatus();
}

}  // namespace

std::string MysqlSchemaSql() { return std::string(kCreateTable) + ";\n"; }

Result<std::shared_ptr<Backend>> NewMysqlBackend(MysqlOptions options) {
  if (options.host.empty()) return InvalidArgumentError("mysql: no host");
  if (options.database.empty()) return InvalidArgumentError("mysql: no database");
  if (options.connections < 1) {
    return InvalidArgumentError("mysql: connections must be at least 1");
  }
  SIMBA_RETURN_IF_ERROR(CheckTlsOptions(options));
  if (options.connect_timeout <= milliseconds::zero()) {
    return InvalidArgumentError("mysql: connect_timeout must be positive");
  }
  Endpoint endpoint;
  endpoint.host = options.host;
  endpoint.port = options.port;
  endpoint.user = options.user;
  endpoint.password = options.password;
  endpoint.database = options.database;
  endpoint.connect_timeout = options.connect_timeout;
  endpoint.ssl_mode = options.ssl_mode;
  endpoint.ssl_ca = options.ssl_ca;
  endpoint.ssl_cert = options.ssl_cert;
  endpoint.ssl_key = options.ssl_key;
  internal::sql::SqlBackendOptions sql;
  sql.connections = options.connections;
  sql.create_table = options.create_table;
  sql.table = options.table;
  return internal::sql::NewSqlBackend(std::make_unique<MysqlDriver>(std::move(endpoint)), sql);
}

Result<MysqlOptions> MysqlOptionsFromUri(const Uri& uri) {
  constexpr char kForm[] = "mysql://user[:password]@host[:port]/db";
  if (uri.scheme != "mysql" && uri.scheme != "mariadb") {
    return InvalidArgumentError("mysql: URI scheme is " + Quoted(uri.scheme) +
                                ", expected 'mysql'");
  }
  if (uri.hosts.size() != 1 || uri.hosts.front().host.empty()) {
    return InvalidArgumentError(std::string("mysql: URI must name one host; expected ") + kForm);
  }
  if (uri.path.size() <= 1 || uri.path.find('/', 1) != std::string::npos) {
    return InvalidArgumentError(std::string("mysql: URI must name one database; expected ") +
                                kForm);
  }
  // lock_connections and op_timeout belong to the keyed-lock backend
  // (mysql_keyed.h), ignored here so one URI serves both.
  SIMBA_RETURN_IF_ERROR(uri.CheckQueryKeys({"connections", "create_table", "table",
                                            "connect_timeout", "ssl_mode", "ssl_ca",
                                            "ssl_cert", "ssl_key", "lock_connections",
                                            "op_timeout"}));
  MysqlOptions options;
  options.host = uri.hosts.front().host;
  if (uri.hosts.front().port) options.port = *uri.hosts.front().port;
  options.database = uri.path.substr(1);
  if (uri.user) options.user = *uri.user;
  if (uri.password) options.password = *uri.password;
  for (const auto& [key, value] : uri.query) {
    if (key == "connections") {
      int n = 0;
      auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (error != std::errc() || end != value.data() + value.size() || n < 1 || n > 64) {
        return InvalidArgumentError("mysql: connections must be 1..64, not " + Quoted(value));
      }
      options.connections = n;
    } else if (key == "table") {
      options.table = value;
    } else if (key == "create_table") {
      if (value != "on" && value != "off") {
        return InvalidArgumentError("mysql: create_table must be on or off, not " +
                                    Quoted(value));
      }
      options.create_table = value == "on";
    } else if (key == "connect_timeout") {
      SIMBA_ASSIGN_OR_RETURN(options.connect_timeout, ParseDuration("connect_timeout", value));
      if (options.connect_timeout <= milliseconds::zero()) {
        return InvalidArgumentError("mysql: connect_timeout must be positive");
      }
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
  SIMBA_RETURN_IF_ERROR(CheckTlsOptions(options));
  return options;
}

}  // namespace simba
