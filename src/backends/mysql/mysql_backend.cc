// The MySQL/MariaDB driver of the SQL protocol (backends/sql/sql_backend.h):
// MariaDB Connector/C connections driven with its non-blocking API, so every
// call ends by its deadline, and JVM Simba's table, so JVM Simba contenders
// can share it (simba-behaviour.md §3.1, §8.1). No push: waiters poll.
#include "core/poll_timeout.h"
#include "simba/backends/mysql.h"

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "core/log.h"

namespace simba {
namespace {

using internal::PollTimeout;

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

void InitLibraryOnce() {
  // mysql_init() would do it too, but not thread-safely.
  static std::once_flag once;
  std::call_once(once, [] { mysql_library_init(0, nullptr, nullptr); });
}

// Drives one non-blocking call of Connector/C to its end. `status` is what
// its _start returned; `cont(ready)` calls its _cont and returns the new
// status. False at the deadline: the call is then unfinished.
template <typename Cont>
bool Drive(MYSQL* m, int& status, Deadline deadline, Cont cont) {
  while (status != 0) {
    int timeout = PollTimeout(deadline);
    if (timeout < 0) return false;
    // The library's own timeouts (connect_timeout) count too.
    bool library_timeout = false;
    if ((status & MYSQL_WAIT_TIMEOUT) != 0) {
      const unsigned int ms = mysql_get_timeout_value_ms(m);
      if (static_cast<long long>(ms) < timeout) {
        timeout = static_cast<int>(ms);
        library_timeout = true;
      }
    }
    short events = 0;
    if ((status & MYSQL_WAIT_READ) != 0) events |= POLLIN;
    if ((status & MYSQL_WAIT_WRITE) != 0) events |= POLLOUT;
    if ((status & MYSQL_WAIT_EXCEPT) != 0) events |= POLLPRI;
    pollfd p{static_cast<int>(mysql_get_socket(m)), events, 0};
    const int n = ::poll(&p, 1, timeout);
    int ready = 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      ready = status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);  // let the library see the error
    } else if (n == 0) {
      if (!library_timeout) continue;  // the deadline, checked above
      ready = MYSQL_WAIT_TIMEOUT;
    } else {
      if ((p.revents & POLLIN) != 0) ready |= MYSQL_WAIT_READ;
      if ((p.revents & POLLOUT) != 0) ready |= MYSQL_WAIT_WRITE;
      if ((p.revents & POLLPRI) != 0) ready |= MYSQL_WAIT_EXCEPT;
      if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
        ready |= status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);
      }
    }
    status = cont(ready);
  }
  return true;
}

// Ends an unfinished call at once: the socket is shut down, so the library
// fails every read and write and the call returns.
template <typename Cont>
void Abandon(MYSQL* m, int& status, Cont cont) {
  mariadb_cancel(m);
  for (int i = 0; i < 100 && status != 0; ++i) {
    int ready = status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE | MYSQL_WAIT_EXCEPT);
    if (ready == 0) ready = MYSQL_WAIT_TIMEOUT;
    status = cont(ready);
  }
}

// Server and client errors as Simba's codes, and what the protocol must
// tell apart.
struct Failure {
  Status status;
  SqlFailure kind = SqlFailure::kOther;
  bool broken = false;  // the connection cannot be used again
};

Failure ErrorOf(MYSQL* m) {
  const unsigned int code = mysql_errno(m);
  const std::string message = std::string(mysql_error(m)) + " (error " + std::to_string(code) +
                              ", SQLSTATE " + mysql_sqlstate(m) + ")";
  Failure f;
  switch (code) {
    case ER_NO_SUCH_TABLE:  // 1146
      f.kind = SqlFailure::kNoTable;
      f.status = NotFoundError(message);
      break;
    case ER_TABLEACCESS_DENIED_ERROR:  // 1142
    case ER_DBACCESS_DENIED_ERROR:     // 1044
    case ER_SPECIFIC_ACCESS_DENIED_ERROR:  // 1227
      f.kind = SqlFailure::kNoPrivilege;
      f.status = PermissionDeniedError(message);
      break;
    case ER_TABLE_EXISTS_ERROR:  // 1050
      f.kind = SqlFailure::kAlreadyExists;
      f.status = AlreadyExistsError(message);
      break;
    case ER_DUP_ENTRY:  // 1062
      f.kind = SqlFailure::kDuplicateKey;
      f.status = AbortedError(message);
      break;
    case ER_ACCESS_DENIED_ERROR:  // 1045
      f.status = PermissionDeniedError(message);
      break;
    case ER_BAD_DB_ERROR:  // 1049
      f.status = NotFoundError(message);
      break;
    case ER_LOCK_WAIT_TIMEOUT:  // 1205
    case ER_LOCK_DEADLOCK:      // 1213
      f.status = UnavailableError(message);
      break;
    case CR_CONNECTION_ERROR:    // 2002
    case CR_CONN_HOST_ERROR:     // 2003
    case CR_SERVER_GONE_ERROR:   // 2006
    case CR_SERVER_LOST:         // 2013
    case CR_SERVER_LOST_EXTENDED:  // 2055
    case ER_CONNECTION_KILLED:   // 1927 (MariaDB: KILL of this connection)
    case ER_SERVER_SHUTDOWN:     // 1053
    case ER_QUERY_INTERRUPTED:   // 1317
      f.broken = true;
      f.status = UnavailableError(message);
      break;
    default:
      // Other client errors (2xxx) leave the connection in doubt.
      f.broken = code >= 2000 && code < 3000;
      f.status = f.broken ? UnavailableError(message) : InternalError(message);
      break;
  }
  return f;
}

struct MysqlDeleter {
  void operator()(MYSQL* m) const { mysql_close(m); }
};
using MysqlConn = std::unique_ptr<MYSQL, MysqlDeleter>;

struct ResultDeleter {
  void operator()(MYSQL_RES* r) const { mysql_free_result(r); }
};
using MysqlResult = std::unique_ptr<MYSQL_RES, ResultDeleter>;

struct Endpoint {
  std::string host;
  unsigned int port = 3306;
  std::string user;
  std::string password;
  std::string database;
  milliseconds connect_timeout{10000};
  std::string ssl_mode;
  std::string ssl_ca;
};

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
    if (!Drive(m, status, deadline, query_cont)) return Late(status, query_cont);
    if (rc != 0) {
      error = ErrorOf(m);
      failed = true;
    }
    while (!failed) {
      MYSQL_RES* raw = nullptr;
      status = mysql_store_result_start(&raw, m);
      auto store_cont = [&](int ready) { return mysql_store_result_cont(&raw, m, ready); };
      if (!Drive(m, status, deadline, store_cont)) return Late(status, store_cont);
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
      if (!Drive(m, status, deadline, next_cont)) return Late(status, next_cont);
      if (next == -1) break;  // no more results
      if (next > 0) {
        error = ErrorOf(m);  // the next statement failed
        failed = true;
      }
    }
    if (failed) {
      if (failure != nullptr) *failure = error.kind;
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
    if (!Drive(m, status, deadline, cont)) {
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

// Connects without blocking past `deadline` (the host name is resolved by
// the library, which may block; use an address or a local resolver).
Result<MysqlConn> Connect(const Endpoint& endpoint, const std::string& description,
                          Deadline deadline) {
  InitLibraryOnce();
  MysqlConn conn(mysql_init(nullptr));
  if (!conn) return UnavailableError(description + ": out of memory");
  MYSQL* m = conn.get();
  mysql_options(m, MYSQL_OPT_NONBLOCK, nullptr);
  mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  // UTC: UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) then has no DST fold. A row
  // lock wait is bounded on the server too (InnoDB's default is 50 s): a
  // call that gave up client-side must not leave a statement queued there
  // for long.
  mysql_options(m, MYSQL_INIT_COMMAND,
                "SET time_zone = '+00:00', innodb_lock_wait_timeout = 10");
  const unsigned int timeout_s = static_cast<unsigned int>(
      std::max<long long>(1, std::chrono::ceil<std::chrono::seconds>(endpoint.connect_timeout)
                                 .count()));
  mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout_s);
  mysql_options4(m, MYSQL_OPT_CONNECT_ATTR_ADD, "program_name", "simba");
  if (endpoint.ssl_mode != "disabled" || !endpoint.ssl_ca.empty()) {
    const my_bool on = 1;
    mysql_options(m, MYSQL_OPT_SSL_ENFORCE, &on);
    if (!endpoint.ssl_ca.empty()) mysql_options(m, MYSQL_OPT_SSL_CA, endpoint.ssl_ca.c_str());
    const my_bool verify = endpoint.ssl_mode == "verify_identity" ? 1 : 0;
    mysql_options(m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
  }
  // The connect timeout, in case the call's deadline is far away.
  deadline = std::min(deadline, steady_clock::now() + endpoint.connect_timeout);
  MYSQL* connected = nullptr;
  int status = mysql_real_connect_start(
      &connected, m, endpoint.host.c_str(), endpoint.user.c_str(),
      endpoint.password.empty() ? nullptr : endpoint.password.c_str(), endpoint.database.c_str(),
      endpoint.port, nullptr, CLIENT_MULTI_STATEMENTS);
  auto cont = [&](int ready) { return mysql_real_connect_cont(&connected, m, ready); };
  if (!Drive(m, status, deadline, cont)) {
    Abandon(m, status, cont);
    return DeadlineExceededError(description + ": connecting timed out");
  }
  if (connected == nullptr) {
    Failure f = ErrorOf(m);
    if (f.status.code() == StatusCode::kInternal) f.status = UnavailableError(f.status.message());
    return Status(f.status.code(), description + ": connecting: " + f.status.message());
  }
  return conn;
}

class MysqlDriver final : public SqlDriver {
 public:
  explicit MysqlDriver(Endpoint endpoint) : endpoint_(std::move(endpoint)) {
    description_ = "mysql at " + endpoint_.host + ":" + std::to_string(endpoint_.port) + "/" +
                   endpoint_.database;
  }

  std::string_view scheme() const override { return "mysql"; }
  const std::string& description() const override { return description_; }

  Result<std::unique_ptr<SqlSession>> Connect(Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(MysqlConn conn, simba::Connect(endpoint_, description_, deadline));
    return std::unique_ptr<SqlSession>(std::make_unique<MysqlSession>(std::move(conn)));
  }

  std::string NowMs() const override { return kNowMs; }
  std::string CreateTableSql() const override { return kCreateTable; }
  std::string InsertFreeRowSql() const override {
    return "INSERT IGNORE INTO simba_mutex (mutex, acquired_at, ttl_at, transition_at, owner_id, "
           "version) VALUES ({0}, 0, 0, 0, '', 0)";
  }

  std::vector<Statement> AcquireStatements(const AcquireParts& parts,
                                           const std::vector<std::string>& params) const override {
    // Insert the row acquired, or update it where the caller may acquire.
    // MySQL assigns ON DUPLICATE KEY UPDATE columns left to right, and a
    // later expression sees the earlier columns' new values: the order of
    // parts.assignments keeps `may_acquire` meaning the same in each IF.
    // The upsert locks the row (also when it changes nothing) until COMMIT,
    // so the SELECT after it sees the row as decided.
    std::string upsert =
        "INSERT INTO simba_mutex (mutex, acquired_at, ttl_at, transition_at, owner_id, "
        "version) VALUES ({0}, " + parts.now + ", " + parts.now + " + {#2}, " + parts.now +
        " + {#2} + {#3}, {1}, 1) ON DUPLICATE KEY UPDATE ";
    for (std::size_t i = 0; i < parts.assignments.size(); ++i) {
      const auto& [column, value] = parts.assignments[i];
      if (i > 0) upsert += ", ";
      upsert += column + " = IF(" + parts.may_acquire + ", " + value + ", " + column + ")";
    }
    return {{upsert, params},
            {"SELECT " + parts.returning + " FROM simba_mutex WHERE mutex = {0}", {params[0]}}};
  }

 private:
  const Endpoint endpoint_;
  std::string description_;
};

}  // namespace

std::string MysqlSchemaSql() { return std::string(kCreateTable) + ";\n"; }

Result<std::shared_ptr<Backend>> NewMysqlBackend(MysqlOptions options) {
  if (options.host.empty()) return InvalidArgumentError("mysql: no host");
  if (options.database.empty()) return InvalidArgumentError("mysql: no database");
  if (options.connections < 1) {
    return InvalidArgumentError("mysql: connections must be at least 1");
  }
  if (options.ssl_mode != "disabled" && options.ssl_mode != "required" &&
      options.ssl_mode != "verify_identity") {
    return InvalidArgumentError("mysql: ssl_mode must be disabled, required or verify_identity, "
                                "not " + Quoted(options.ssl_mode));
  }
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
  SIMBA_RETURN_IF_ERROR(uri.CheckQueryKeys(
      {"connections", "create_table", "table", "connect_timeout", "ssl_mode", "ssl_ca"}));
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
      if (value != "disabled" && value != "required" && value != "verify_identity") {
        return InvalidArgumentError(
            "mysql: ssl_mode must be disabled, required or verify_identity, not " +
            Quoted(value));
      }
      options.ssl_mode = value;
    } else if (key == "ssl_ca") {
      options.ssl_ca = value;
    }
  }
  return options;
}

}  // namespace simba
