// The PostgreSQL driver of the SQL protocol (backends/sql/sql_backend.h):
// libpq connections driven without blocking, so every call ends by its
// deadline, and a LISTEN connection for push.
#include "simba/backends/postgres.h"

#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <charconv>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "backends/sql/sql_backend.h"
#include "core/log.h"

namespace simba {
namespace {

using internal::pg::Connect;
using internal::pg::ConnMessage;
using internal::pg::DescribeServer;
using internal::pg::LibpqKeywords;
using internal::pg::PgConn;
using internal::pg::PgResult;
using internal::pg::Quoted;
using internal::pg::ResultStatus;
using internal::pg::WaitSocket;

using internal::sql::AcquireParts;
using internal::sql::SqlDriver;
using internal::sql::SqlFailure;
using internal::sql::SqlResult;
using internal::sql::SqlRow;
using internal::sql::SqlSession;
using internal::sql::Statement;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

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

// "{0}" -> "$1", ... ("{#0}", a number, too: libpq types it by its use).
std::string Render(const std::string& sql) {
  std::string out;
  out.reserve(sql.size());
  for (std::size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] == '{') {
      const std::size_t close = sql.find('}', i);
      const std::size_t first = i + 1 < sql.size() && sql[i + 1] == '#' ? i + 2 : i + 1;
      int index = 0;
      if (close != std::string::npos && close > first &&
          std::from_chars(sql.data() + first, sql.data() + close, index).ptr ==
              sql.data() + close) {
        out += "$" + std::to_string(index + 1);
        i = close;
        continue;
      }
    }
    out += sql[i];
  }
  return out;
}

class PgSession final : public SqlSession {
 public:
  PgSession(PgConn conn, std::string description)
      : conn_(std::move(conn)), description_(std::move(description)) {}

  bool healthy() const override { return healthy_ && PQstatus(conn_.get()) == CONNECTION_OK; }

  Result<std::vector<SqlResult>> Run(const std::vector<Statement>& statements, bool transaction,
                                     Deadline deadline, SqlFailure* failure) override {
    if (failure != nullptr) *failure = SqlFailure::kOther;
    PGconn* conn = conn_.get();
    // One pipeline, one sync: the statements run as one implicit
    // transaction (so `transaction` needs nothing more) in one round trip.
    (void)transaction;
    if (PQenterPipelineMode(conn) != 1) return Broken("entering pipeline mode");
    for (const Statement& statement : statements) {
      const std::string sql = Render(statement.sql);
      std::vector<const char*> values;
      values.reserve(statement.params.size());
      for (const std::string& p : statement.params) values.push_back(p.c_str());
      if (PQsendQueryParams(conn, sql.c_str(), static_cast<int>(values.size()), nullptr,
                            values.data(), nullptr, nullptr, 0) != 1) {
        return Broken("sending a statement");
      }
    }
    if (PQpipelineSync(conn) != 1) return Broken("sending");
    // Flush everything we queued.
    for (;;) {
      const int flushed = PQflush(conn);
      if (flushed == 0) break;
      if (flushed < 0) return Broken("sending");
      if (!WaitSocket(conn, POLLOUT | POLLIN, deadline)) return Late();
      if (PQconsumeInput(conn) != 1) return Broken("reading");
    }
    std::vector<SqlResult> results;
    Status first_error;
    bool synced = false;
    while (!synced) {
      while (PQisBusy(conn) == 1) {
        if (!WaitSocket(conn, POLLIN, deadline)) return Late();
        if (PQconsumeInput(conn) != 1) return Broken("reading");
      }
      PgResult result(PQgetResult(conn));
      if (!result) continue;  // the end of one statement's results
      switch (PQresultStatus(result.get())) {
        case PGRES_PIPELINE_SYNC:
          synced = true;
          break;
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
          if (first_error.ok()) first_error = ResultStatus(result.get(), failure);
          break;
      }
    }
    if (PQexitPipelineMode(conn) != 1) healthy_ = false;
    if (!first_error.ok()) return first_error;
    return results;
  }

 private:
  Status Broken(std::string_view what) {
    healthy_ = false;
    return UnavailableError(std::string(what) + ": " + ConnMessage(conn_.get()));
  }
  Status Late() {
    // The reply may still come; the connection cannot be reused.
    healthy_ = false;
    return DeadlineExceededError("no reply by the deadline");
  }

  PgConn conn_;
  std::string description_;
  bool healthy_ = true;
};

// The LISTEN connection: one thread, reconnecting with backoff.
class PgListener final : public SqlDriver::Listener {
 public:
  PgListener(std::map<std::string, std::string> params, std::string description,
             std::string channel,
             std::function<void(const MutexEvent&)> on_event)
      : params_(std::move(params)),
        description_(std::move(description)),
        channel_(std::move(channel)),
        on_event_(std::move(on_event)) {
    if (::pipe(wake_) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Loop(); });
  }

  ~PgListener() override {
    stopping_ = true;
    if (wake_[1] >= 0) {
      const char byte = 1;
      (void)!::write(wake_[1], &byte, 1);
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // destroyed from a callback: the loop ends by itself
    } else if (thread_.joinable()) {
      thread_.join();
    }
    if (wake_[0] >= 0) ::close(wake_[0]);
    if (wake_[1] >= 0) ::close(wake_[1]);
  }

 private:
  void Loop() {
    milliseconds delay{0};
    while (!stopping_) {
      Status status = Session();
      if (stopping_) break;
      delay = std::clamp(delay * 2, milliseconds(100), milliseconds(2000));
      SIMBA_LOG(kDebug, description_ << ": listener: " << status << "; reconnecting in "
                                     << FormatDuration(delay));
      pollfd p{wake_[0], POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(delay.count()));
    }
  }

  Status Session() {
    auto conn = Connect(params_, description_, steady_clock::now() + milliseconds(5000));
    if (!conn.ok()) return conn.status();
    PGconn* c = conn->get();
    if (PQsetnonblocking(c, 0) != 0) return UnavailableError(ConnMessage(c));
    PgResult listen(PQexec(c, ("LISTEN " + channel_).c_str()));
    if (PQresultStatus(listen.get()) != PGRES_COMMAND_OK) {
      return UnavailableError("LISTEN: " + ConnMessage(c));
    }
    // Releases before we listened (a subscription made while the first
    // LISTEN was on its way, or anything while we were disconnected) were
    // missed: everyone looks once.
    on_event_(MutexEvent{MutexEvent::Kind::kReleased, "", ""});
    for (;;) {
      pollfd p[2] = {{PQsocket(c), POLLIN, 0}, {wake_[0], POLLIN, 0}};
      const int n = ::poll(p, 2, 15000);
      if (stopping_) return OkStatus();
      if (n < 0 && errno != EINTR) return UnavailableError("poll failed");
      if (n == 0) {
        // Idle: make sure the connection is still there.
        PgResult ping(PQexec(c, "SELECT 1"));
        if (PQresultStatus(ping.get()) != PGRES_TUPLES_OK) {
          return UnavailableError("lost: " + ConnMessage(c));
        }
      }
      if (PQconsumeInput(c) != 1) return UnavailableError("lost: " + ConnMessage(c));
      while (PGnotify* notify = PQnotifies(c)) {
        const std::string payload = notify->extra != nullptr ? notify->extra : "";
        PQfreemem(notify);
        const std::size_t split = payload.find('\n');
        const auto event = internal::sql::NoticeEvent(
            payload.substr(0, split),
            split == std::string::npos ? std::string() : payload.substr(split + 1));
        if (event) on_event_(*event);
      }
    }
  }

  const std::map<std::string, std::string> params_;
  const std::string description_;
  const std::string channel_;
  const std::function<void(const MutexEvent&)> on_event_;
  std::atomic<bool> stopping_{false};
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

class PgDriver final : public SqlDriver {
 public:
  PgDriver(std::map<std::string, std::string> params, std::string table)
      : params_(std::move(params)), table_(std::move(table)) {
    description_ = DescribeServer(params_);
  }

  std::string_view scheme() const override { return "postgresql"; }
  const std::string& description() const override { return description_; }

  Result<std::unique_ptr<SqlSession>> Connect(Deadline deadline) override {
    SIMBA_ASSIGN_OR_RETURN(PgConn conn, internal::pg::Connect(params_, description_, deadline));
    return std::unique_ptr<SqlSession>(std::make_unique<PgSession>(std::move(conn), description_));
  }

  std::string NowMs() const override { return kNowMs; }
  std::string CreateTableSql() const override { return kCreateTable; }
  std::string InsertFreeRowSql() const override {
    return std::string(internal::sql::kInsertFreeRow) + " ON CONFLICT (mutex) DO NOTHING";
  }

  std::vector<Statement> AcquireStatements(const AcquireParts& parts,
                                           const std::vector<std::string>& params) const override {
    // Insert the row acquired, or update it where the caller may acquire.
    // ON CONFLICT ... WHERE false still locks the row until the end of the
    // (implicit) transaction, so the read that follows sees it as decided.
    std::string upsert = parts.insert_acquired("t") + " ON CONFLICT (mutex) DO UPDATE SET ";
    for (std::size_t i = 0; i < parts.assignments.size(); ++i) {
      if (i > 0) upsert += ", ";
      upsert += parts.assignments[i].first + " = " + Qualify(parts.assignments[i].second);
    }
    upsert += " WHERE " + Qualify(parts.may_acquire);
    // (Each statement gets only the parameters it uses: libpq cannot type
    // an unused one.)
    return {{upsert, params}, parts.read_back(params[0])};
  }

  std::unique_ptr<Listener> MakeListener(
      std::function<void(const MutexEvent&)> on_event) override {
    return std::make_unique<PgListener>(params_, description_, table_, std::move(on_event));
  }
  std::string ReleaseNoticeSql() const override {
    // Only if the row is free now: the release may have found another owner.
    return "SELECT pg_notify('simba_mutex', {0}::text || chr(10) || {1}::text) FROM simba_mutex "
           "WHERE mutex = {0} AND owner_id = ''";
  }
  std::string ForcedNoticeSql() const override {
    // The holder and its token (the version) as they are before the update.
    return "SELECT pg_notify('simba_mutex', mutex || chr(10) || owner_id || chr(10) || "
           "version::text || chr(10) || 'forced') FROM simba_mutex "
           "WHERE mutex = {0} AND owner_id <> ''";
  }

 private:
  // In ON CONFLICT DO UPDATE, columns must say which row they mean: the
  // existing one (t.), not EXCLUDED.
  static std::string Qualify(const std::string& expression) {
    std::string out = expression;
    for (const char* column : {"version", "acquired_at", "ttl_at", "transition_at", "owner_id"}) {
      std::string result;
      const std::string name(column);
      std::size_t at = 0;
      while (at < out.size()) {
        const std::size_t found = out.find(name, at);
        if (found == std::string::npos) {
          result += out.substr(at);
          break;
        }
        const bool word_start =
            found == 0 || !(std::isalnum(static_cast<unsigned char>(out[found - 1])) ||
                            out[found - 1] == '_' || out[found - 1] == '.');
        const std::size_t end = found + name.size();
        const bool word_end = end >= out.size() ||
                              !(std::isalnum(static_cast<unsigned char>(out[end])) || out[end] == '_');
        result += out.substr(at, found - at);
        result += (word_start && word_end ? "t." : "") + name;
        at = end;
      }
      out = result;
    }
    return out;
  }

  const std::map<std::string, std::string> params_;
  // Also the NOTIFY channel: the notice names "simba_mutex", which the
  // protocol replaces with the table's name.
  const std::string table_;
  std::string description_;
};

}  // namespace

std::string PostgresSchemaSql() { return std::string(kCreateTable) + ";\n"; }

Result<std::shared_ptr<Backend>> NewPostgresBackend(PostgresOptions options) {
  if (options.params.count("host") == 0 && options.params.count("hostaddr") == 0) {
    return InvalidArgumentError("postgresql: no host");
  }
  for (const auto& [key, value] : options.params) {
    if (LibpqKeywords().count(key) == 0) {
      return InvalidArgumentError("postgresql: unknown connection option " + Quoted(key));
    }
  }
  if (options.connections < 1) {
    return InvalidArgumentError("postgresql: connections must be at least 1");
  }
  // A bound on connecting even when a call's deadline is far away.
  if (options.params.count("connect_timeout") == 0) options.params["connect_timeout"] = "10";
  // Statements are bounded on the server too: a call that gave up
  // client-side (and closed its connection) must not leave a statement
  // waiting there for a row lock. Unless the URI sets `options` itself.
  if (options.params.count("options") == 0) {
    options.params["options"] = "-c statement_timeout=10s -c lock_timeout=10s";
  }
  internal::sql::SqlBackendOptions sql;
  sql.connections = options.connections;
  sql.create_table = options.create_table;
  sql.table = options.table;
  return internal::sql::NewSqlBackend(
      std::make_unique<PgDriver>(std::move(options.params), options.table), sql);
}

Result<PostgresOptions> PostgresOptionsFromUri(const Uri& uri) {
  constexpr char kForm[] = "postgresql://user[:password]@host[:port]/db";
  if (uri.scheme != "postgresql" && uri.scheme != "postgres") {
    return InvalidArgumentError("postgresql: URI scheme is " + Quoted(uri.scheme) +
                                ", expected 'postgresql'");
  }
  if (uri.hosts.size() != 1 || uri.hosts.front().host.empty()) {
    return InvalidArgumentError(std::string("postgresql: URI must name one host; expected ") +
                                kForm);
  }
  if (uri.path.size() <= 1) {
    return InvalidArgumentError(std::string("postgresql: URI names no database; expected ") +
                                kForm);
  }
  PostgresOptions options;
  options.params["host"] = uri.hosts.front().host;
  if (uri.hosts.front().port) options.params["port"] = std::to_string(*uri.hosts.front().port);
  options.params["dbname"] = uri.path.substr(1);
  if (uri.user) options.params["user"] = *uri.user;
  if (uri.password) options.params["password"] = *uri.password;
  for (const auto& [key, value] : uri.query) {
    if (key == "connections") {
      int n = 0;
      auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (error != std::errc() || end != value.data() + value.size() || n < 1 || n > 64) {
        return InvalidArgumentError("postgresql: connections must be 1..64, not " + Quoted(value));
      }
      options.connections = n;
    } else if (key == "table") {
      options.table = value;
    } else if (key == "create_table") {
      if (value != "on" && value != "off") {
        return InvalidArgumentError("postgresql: create_table must be on or off, not " +
                                    Quoted(value));
      }
      options.create_table = value == "on";
    } else if (key == "lock_connections") {
      // The keyed-lock backend's (postgres_keyed.h): one URI serves both.
    } else if (key == "host" || key == "port" || key == "dbname" || key == "user" ||
               key == "password") {
      return InvalidArgumentError("postgresql: " + Quoted(key) +
                                  " belongs in the URI itself, not its query");
    } else if (LibpqKeywords().count(key) == 0) {
      return InvalidArgumentError("postgresql: unknown URI query key " + Quoted(key) +
                                  " (ours: connections, create_table, table, lock_connections; "
                                  "others must be libpq connection keywords)");
    } else {
      options.params[key] = value;
    }
  }
  return options;
}

}  // namespace simba
