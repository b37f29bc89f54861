// Keyed locks on PostgreSQL: pg_advisory_lock on connections of their own
// (simba/backends/postgres_keyed.h says what a user sees). The session-lock
// engine (backends/sql/session_lock.h) owns the budget, the holds, lost
// sessions and the cancel's wake-up; here are the store's calls: the lock
// round trip, its cancellation (PQcancel), the token sequence, the unlock.
#include "simba/backends/postgres_keyed.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <climits>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "backends/sql/session_lock.h"
#include "core/log.h"
#include "simba/backends/postgres.h"

namespace simba::internal::sql::pg {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr char kCreateSequence[] = "CREATE SEQUENCE IF NOT EXISTS simba_keyed_token";
constexpr std::size_t kMaxKeyLength = 64 * 1024;
// Bounds every store call other than the wait itself: checking and creating
// the sequence, unlocking, and the reply after lock_timeout has fired.
constexpr milliseconds kStoreCallTimeout{10000};
constexpr int kDefaultConnectTimeoutSeconds = 10;
// How long a cancelled wait waits for the server's answer to the cancel
// request (a round trip, normally). A request that reaches the session just
// before it has read the query is ignored by the server; the session is then
// closed instead (see PgLockDriver::lock()).
constexpr milliseconds kAfterWake{250};

// `d` + `by`, saturating at Deadline::max() (which means "no deadline").
Deadline later(Deadline d, milliseconds by) {
  return d >= Deadline::max() - by ? Deadline::max() : d + by;
}

// ---- one query, its replies -------------------------------------------------------

// What one statement of a query did.
struct StatementReply {
  Status error;                      // OK for a command or rows
  std::string sqlstate;              // the error's, if the server sent one
  std::optional<std::string> value;  // first column of the first row, unless NULL
};

// What a query (one or more statements, the simple query protocol) did.
struct QueryReply {
  std::vector<StatementReply> statements;  // those that ran, in order
  // Not OK when sending or reading failed, or the deadline passed: the
  // connection's state is then unknown and it must be closed.
  Status transport;
};

// Sends `sql` and collects every statement's outcome by `deadline`. When
// `wake_fd` (if >= 0) becomes readable, `on_wake` runs once and says whether
// to keep waiting for the reply, for at most kAfterWake more.
QueryReply run_query(PGconn* conn, const std::string& sql, Deadline deadline, int wake_fd = -1,
                     const std::function<bool()>& on_wake = {}) {
  QueryReply reply;
  if (PQsendQuery(conn, sql.c_str()) != 1) {
    reply.transport = unavailable_error("sending: " + conn_message(conn));
    return reply;
  }
  if (Status sent = flush(conn, deadline); !sent.ok()) {
    reply.transport = sent;
    return reply;
  }
  for (;;) {
    const Result<bool> ready = await_result(conn, deadline, wake_fd);
    if (!ready.ok()) {
      reply.transport = ready.status();
      return reply;
    }
    if (!*ready) {   // woken
      wake_fd = -1;  // once
      if (on_wake && !on_wake()) {
        reply.transport = cancelled_error("gave up waiting for the reply");
        return reply;
      }
      deadline = std::min(deadline, steady_clock::now() + kAfterWake);
      continue;
    }
    PgResult result(PQgetResult(conn));
    if (!result) break;  // every statement has answered
    StatementReply statement;
    switch (PQresultStatus(result.get())) {
      case PGRES_COMMAND_OK:
        break;
      case PGRES_TUPLES_OK:
        if (PQntuples(result.get()) > 0 && PQnfields(result.get()) > 0 &&
            PQgetisnull(result.get(), 0, 0) == 0) {
          statement.value = PQgetvalue(result.get(), 0, 0);
        }
        break;
      default:
        statement.error = result_status(result.get(), nullptr);
        statement.sqlstate = sql_state(result.get());
        break;
    }
    reply.statements.push_back(std::move(statement));
  }
  if (PQstatus(conn) == CONNECTION_BAD) {
    reply.transport = unavailable_error("connection lost: " + conn_message(conn));
  }
  return reply;
}

const StatementReply* first_error(const QueryReply& reply) {
  for (const StatementReply& statement : reply.statements) {
    if (!statement.error.ok()) return &statement;
  }
  return nullptr;
}

// ---- the driver of the session-lock engine -----------------------------------------

// One connection of the budget, and the key its session holds.
class PgSession final : public LockSession {
 public:
  explicit PgSession(PgConn conn) : conn_(std::move(conn)) {}

  PGconn* get() const { return conn_.get(); }
  int socket() const override {
    return PQstatus(conn_.get()) == CONNECTION_OK ? PQsocket(conn_.get()) : -1;
  }
  // Readable: the server's goodbye ("terminating connection due to
  // administrator command") or a harmless notice; libpq keeps either.
  bool ended(short revents) override {
    if ((revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) != 0) return true;
    return PQconsumeInput(conn_.get()) != 1 || PQstatus(conn_.get()) == CONNECTION_BAD;
  }

  std::int64_t lock_key = 0;  // the key held, once granted

 private:
  PgConn conn_;
};

PgSession& pg(LockSession& session) { return static_cast<PgSession&>(session); }

// How one acquisition waits at the server.
struct WaitPlan {
  bool try_only = false;          // the deadline has passed: one look
  long long lock_timeout_ms = 0;  // 0: no limit (Deadline::max())
};

WaitPlan plan_wait(Deadline wait_deadline) {
  if (wait_deadline == Deadline::max()) return {};
  const auto left = wait_deadline - steady_clock::now();
  if (left <= steady_clock::duration::zero()) return {true, 0};
  // Rounded up, so the server never gives up before the deadline; capped at
  // lock_timeout's largest value (about 24 days).
  const long long ms = std::chrono::ceil<milliseconds>(left).count();
  return {false, std::min<long long>(ms, INT_MAX)};
}

std::string lock_sql(std::int64_t lock_key, const WaitPlan& plan) {
  const std::string key = std::to_string(lock_key);
  // statement_timeout would cut a long wait short (the URI's `options` or the
  // role may set one): the wait is bounded by lock_timeout instead.
  if (plan.try_only) {
    // CASE evaluates its branch only when the key was granted: no token is
    // spent on a miss.
    return "SET statement_timeout = 0; SELECT CASE WHEN pg_try_advisory_lock(" + key +
           ") THEN nextval('simba_keyed_token') END";
  }
  return "SET statement_timeout = 0; SET lock_timeout = " + std::to_string(plan.lock_timeout_ms) +
         "; SELECT pg_advisory_lock(" + key + "); SELECT nextval('simba_keyed_token')";
}

// Whether the session holds the key after a lock query (some of whose
// statements may have failed).
enum class Held { kNo, kYes, kUnknown };

Held held_after(const QueryReply& reply, const WaitPlan& plan) {
  const auto& s = reply.statements;
  if (plan.try_only) {
    // [SET, SELECT CASE]: a failure of the CASE may come after the grant.
    if (s.size() < 2) return Held::kNo;
    if (!s[1].error.ok()) return Held::kUnknown;
    return s[1].value ? Held::kYes : Held::kNo;
  }
  // [SET, SET, SELECT pg_advisory_lock, SELECT nextval]
  return s.size() >= 3 && s[2].error.ok() ? Held::kYes : Held::kNo;
}

class PgLockDriver final : public SessionLockDriver {
 public:
  PgLockDriver(PostgresKeyedOptions options, std::string description, milliseconds connect_timeout)
      : params_(std::move(options.params)),
        description_(std::move(description)),
        user_(params_.count("user") != 0 ? params_.at("user") : "<user>"),
        create_sequence_(options.create_sequence),
        connect_timeout_(connect_timeout) {}

  Result<std::unique_ptr<LockSession>> open_session(Deadline deadline, int wake_fd) override {
    SIMBA_ASSIGN_OR_RETURN(
        PgConn conn, connect(params_, description_,
                             std::min(deadline, steady_clock::now() + connect_timeout_), wake_fd));
    return std::unique_ptr<LockSession>(std::make_unique<PgSession>(std::move(conn)));
  }

  // Creates the token sequence unless it exists (once per backend: after
  // that, its absence shows up as an error of nextval).
  Status prepare(LockSession& session) override {
    if (sequence_ready_.load()) return ok_status();
    const Deadline deadline = steady_clock::now() + kStoreCallTimeout;
    // Looked up first: CREATE ... IF NOT EXISTS needs the CREATE privilege
    // even when the sequence exists, which a DBA may have made for us.
    PGconn* conn = pg(session).get();
    const QueryReply found =
        run_query(conn, "SELECT to_regclass('simba_keyed_token') IS NOT NULL", deadline);
    SIMBA_RETURN_IF_ERROR(setup_outcome(session, found, "looking up the token sequence"));
    if (found.statements.empty() || found.statements[0].value != "t") {
      if (!create_sequence_) {
        return failed_precondition_error(description_ +
                                         ": the token sequence simba_keyed_token is missing and "
                                         "create_table=off; " +
                                         sequence_advice());
      }
      const QueryReply created = run_query(conn, kCreateSequence, deadline);
      const StatementReply* failed = first_error(created);
      // A concurrent creator that won the race (duplicate name or catalog
      // row) leaves what we wanted.
      const bool lost_race =
          failed != nullptr && (failed->sqlstate == "42P07" || failed->sqlstate == "42710" ||
                                failed->sqlstate == "23505");
      if (failed != nullptr && failed->sqlstate == "42501") {
        return permission_denied_error(description_ + ": may not create the token sequence (" +
                                       failed->error.message() + "); " + sequence_advice());
      }
      if (!lost_race) {
        SIMBA_RETURN_IF_ERROR(setup_outcome(session, created, "creating the token sequence"));
      }
    }
    sequence_ready_.store(true);
    return ok_status();
  }

  // The lock round trip, and what its outcome means.
  Result<std::optional<std::uint64_t>> lock(LockSession& session, std::string_view key,
                                            Deadline wait_deadline, int wake_fd) override {
    const std::int64_t lock_key = postgres_advisory_lock_key(key);
    const WaitPlan plan = plan_wait(wait_deadline);
    PGconn* conn = pg(session).get();
    bool cancel_sent = false;
    // A try is one quick round trip: it is not worth cancelling.
    const QueryReply reply = run_query(conn, lock_sql(lock_key, plan),
                                       plan.try_only ? steady_clock::now() + kStoreCallTimeout
                                                     : later(wait_deadline, kStoreCallTimeout),
                                       plan.try_only ? -1 : wake_fd, [&] {
                                         cancel_sent = send_cancel(conn, kAfterWake);
                                         // Unsent, the wait would go on: give up on the session
                                         // instead.
                                         return cancel_sent;
                                       });
    if (!reply.transport.ok()) {
      // Whatever the session holds or waits for ends with it (a wait the
      // server still has for it ends when it is granted: the session then
      // finds nobody to answer to).
      session.set_broken();
      return reply.transport.with_context(description_ + ": acquiring a key");
    }
    const Held held = held_after(reply, plan);
    const StatementReply* failed = first_error(reply);
    if (failed == nullptr) {
      if (held == Held::kNo) return std::optional<std::uint64_t>();  // a try found it taken
      // A cancel request already sent may still reach the session and hit
      // the next statement.
      if (cancel_sent) session.set_broken();
      return granted(pg(session), lock_key,
                     plan.try_only ? reply.statements[1].value : reply.statements.back().value);
    }
    // A statement failed. A session that may hold the key, or that a cancel
    // request may still reach (it would hit the next statement), is closed.
    if (held != Held::kNo || (cancel_sent && failed->sqlstate != "57014")) session.set_broken();
    if (held == Held::kNo) {
      if (failed->sqlstate == "55P03") return std::optional<std::uint64_t>();  // lock_timeout
      if (failed->sqlstate == "57014") {
        return unavailable_error(
            description_ +
            ": the server cancelled the wait (pg_cancel_backend?): " + failed->error.message());
      }
    }
    if (failed->sqlstate == "42501") {
      return permission_denied_error(description_ + ": may not use the token sequence (" +
                                     failed->error.message() + "); " + sequence_advice());
    }
    if (failed->sqlstate == "42P01") {
      sequence_ready_.store(false);  // dropped meanwhile: the next acquire re-creates it
      return unavailable_error(description_ + ": the token sequence is missing (" +
                               failed->error.message() + "); try again");
    }
    return failed->error.with_context(description_ + ": acquiring a key");
  }

  Status unlock(LockSession& session, Deadline deadline) override {
    const QueryReply reply = run_query(
        pg(session).get(),
        "SELECT pg_advisory_unlock(" + std::to_string(pg(session).lock_key) + ")", deadline);
    if (!reply.transport.ok()) return reply.transport;
    if (const StatementReply* failed = first_error(reply)) return failed->error;
    if (reply.statements.size() != 1 || reply.statements[0].value != "t") {
      return internal_error("pg_advisory_unlock: the session did not hold the key");
    }
    return ok_status();
  }

 private:
  std::string sequence_advice() const {
    return "run: CREATE SEQUENCE simba_keyed_token; GRANT USAGE ON SEQUENCE simba_keyed_token TO " +
           user_ + ";";
  }

  // The status of a setup query; a session in an unknown state is closed.
  Status setup_outcome(LockSession& session, const QueryReply& reply,
                       const std::string& what) const {
    if (!reply.transport.ok()) {
      session.set_broken();
      return reply.transport.with_context(description_ + ": " + what);
    }
    if (const StatementReply* failed = first_error(reply)) {
      return failed->error.with_context(description_ + ": " + what);
    }
    return ok_status();
  }

  // The key was granted: its fencing token, from nextval.
  Result<std::optional<std::uint64_t>> granted(PgSession& session, std::int64_t lock_key,
                                               const std::optional<std::string>& token_text) {
    session.lock_key = lock_key;
    std::uint64_t token = 0;
    if (!token_text ||
        std::from_chars(token_text->data(), token_text->data() + token_text->size(), token).ec !=
            std::errc() ||
        token == 0) {
      session.set_broken();
      return internal_error(description_ + ": nextval gave no fencing token");
    }
    return std::optional<std::uint64_t>(token);
  }

  const std::map<std::string, std::string> params_;
  const std::string description_;
  const std::string user_;
  const bool create_sequence_;
  const milliseconds connect_timeout_;
  std::atomic<bool> sequence_ready_{false};
};

KeyedLockCapabilities pg_capabilities() {
  KeyedLockCapabilities capabilities;
  capabilities.mechanism = "pg_advisory_lock (session; key hashed to 64 bits)";
  capabilities.fencing_tokens = true;
  // The server queues a lock's waiters in arrival order and grants the
  // first at once on release; each of our sessions waits for one key only,
  // so the deadlock detector never reorders a queue. Waiters for a
  // connection of the budget line up in arrival order too.
  capabilities.fifo = true;
  capabilities.push_handoff = true;
  capabilities.max_key_length = kMaxKeyLength;
  capabilities.failover = kFailover;
  return capabilities;
}

}  // namespace

}  // namespace simba::internal::sql::pg

namespace simba {

Result<std::shared_ptr<KeyedLockBackend>> new_postgres_keyed_lock_backend(
    PostgresKeyedOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::sql::pg::check_params(options.params));
  if (options.tls)
    SIMBA_RETURN_IF_ERROR(internal::sql::pg::apply_tls(options.params, *options.tls));
  // (emplace keeps a value the caller set.)
  options.params.emplace("application_name", "simba_keyed");
  options.params.emplace("connect_timeout",
                         std::to_string(internal::sql::pg::kDefaultConnectTimeoutSeconds));
  // A silently dead server (a cut cable) is found by keepalives: within
  // about 25 s rather than the system's two hours.
  options.params.emplace("keepalives_idle", "10");
  options.params.emplace("keepalives_interval", "5");
  options.params.emplace("keepalives_count", "3");
  // libpq ignores connect_timeout when connecting without blocking, as we
  // do: we apply it ourselves. Zero or less means "forever" to libpq; a
  // store call of ours always ends, so that becomes the default.
  int seconds = 0;
  const std::string& text = options.params.at("connect_timeout");
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (error != std::errc() || end != text.data() + text.size()) {
    return invalid_argument_error("postgresql: connect_timeout must be whole seconds, not " +
                                  internal::in_quotes(text));
  }
  internal::sql::SessionLockConfig config;
  config.scheme = "postgresql";
  config.description = internal::sql::pg::describe_server(options.params);
  config.capabilities = internal::sql::pg::pg_capabilities();
  config.budget = options.lock_connections;
  config.store_call_timeout = internal::sql::pg::kStoreCallTimeout;
  auto driver = std::make_shared<internal::sql::pg::PgLockDriver>(
      std::move(options), config.description,
      std::chrono::seconds(seconds > 0 ? seconds
                                       : internal::sql::pg::kDefaultConnectTimeoutSeconds));
  return internal::sql::new_session_lock_backend(std::move(config), std::move(driver));
}

Result<PostgresKeyedOptions> postgres_keyed_options_from_uri(const Uri& uri) {
  PostgresKeyedOptions options;
  // The contention backend's parser checks everything else; it does not
  // know our one key.
  Uri shared = uri;
  SIMBA_ASSIGN_OR_RETURN(options.lock_connections,
                         internal::sql::take_lock_connections("postgresql", shared));
  SIMBA_ASSIGN_OR_RETURN(PostgresOptions postgres, postgres_options_from_uri(shared));
  options.params = std::move(postgres.params);
  options.create_sequence = postgres.create_table;
  options.tls = std::move(postgres.tls);
  return options;
}

std::int64_t postgres_advisory_lock_key(std::string_view key) {
  constexpr std::uint64_t kOffsetBasis = 0xcbf29ce484222325ULL;
  constexpr std::uint64_t kPrime = 0x100000001b3ULL;
  std::uint64_t hash = kOffsetBasis;
  for (const char c : key) {
    hash ^= static_cast<unsigned char>(c);
    hash *= kPrime;
  }
  // Two's complement (defined since C++20): the bigint PostgreSQL stores.
  return static_cast<std::int64_t>(hash);
}

}  // namespace simba
