// Keyed locks on MySQL and MariaDB: one key is one GET_LOCK name, held by
// the session of a connection pinned to the hold (docs/backends/mysql.md, "Keyed
// locks").
//
// The session-lock engine (backends/sql/session_lock.h) owns the budget,
// the holds, the loss monitor and the cancel's wake-up; here are the store's
// calls: connecting (and probing the server's traits), GET_LOCK in slices,
// RELEASE_LOCK.
//
// Cancellation: the waiter polls the acquire's wake-up eventfd beside its
// socket and, when it fires, closes the connection. We chose this over KILL
// QUERY from a second connection because (1) it needs no connection beyond
// the budget (lock_connections is the most this backend opens, a canceller
// included), (2) it takes no extra round trip, so a cancel is seen within a
// poll wake-up, and (3) the server drops a GET_LOCK waiter as soon as its
// client goes (checked on MariaDB 10.11), and a GET_LOCK granted just then is
// freed with the session, so no key stays held without a hold. Waits are
// also cut into slices of at most kMaxSlice, which bounds a server-side
// waiter the server did not drop. The cost is a reconnect after a cancel.
#include "simba/backends/mysql_keyed.h"

#include <mysql.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include "backends/mysql/mysql_client.h"
#include "backends/mysql/mysql_lock_name.h"
#include "backends/sql/session_lock.h"
#include "core/log.h"
#include "simba/backends/mysql.h"

namespace simba::internal::sql::mysql {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// The longest single GET_LOCK wait: a longer wait is several in a row.
constexpr milliseconds kMaxSlice{10000};
// How far past its wait_deadline a wait may end: the server's own timeout
// ends a MariaDB wait on time (to the millisecond); a MySQL wait (whole
// seconds) is abandoned by the client this long after the deadline.
constexpr milliseconds kDeadlineGrace{200};
// Longest key: longer ones are hashed anyway, this only keeps a caller's
// mistake (a megabyte "key") from reaching the store.
constexpr std::size_t kMaxKeyBytes = 65536;

// What the server is, as far as locks care; probed on the first connection.
struct ServerTraits {
  std::string version;
  // MariaDB takes fractional seconds (to the microsecond); MySQL rounds a
  // GET_LOCK timeout to whole seconds.
  bool fractional_timeouts = false;
  LockNameCompare names = LockNameCompare::kFolded;
};

// One connection of the budget, and the name its session holds.
class MysqlSession final : public LockSession {
 public:
  explicit MysqlSession(MysqlConn conn) : conn_(std::move(conn)) {}

  MYSQL* get() const { return conn_.get(); }
  int socket() const override { return static_cast<int>(mysql_get_socket(conn_.get())); }
  // Shuts the socket down, so closing does not wait for the server (the
  // session then ends, freeing whatever it held).
  void abandon() override { mariadb_cancel(conn_.get()); }

  std::string held_name;  // the GET_LOCK name held, once granted

 private:
  MysqlConn conn_;
};

MysqlSession& my(LockSession& session) { return static_cast<MysqlSession&>(session); }

// Dead peers on a silently cut network are noticed by TCP keepalive (about
// 8 s); a server that closes the session is noticed at once.
void enable_keepalive(int fd) {
  const int on = 1, idle_s = 5, interval_s = 1, probes = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

// The GET_LOCK timeout argument for a wait of `wait` (>= 0): milliseconds
// as a decimal where the server takes fractions, else whole seconds rounded
// up (the client then ends the wait on time itself).
std::string timeout_argument(milliseconds wait, bool fractional) {
  if (!fractional) {
    return std::to_string(std::chrono::ceil<std::chrono::seconds>(wait).count());
  }
  const long long ms = wait.count();
  std::string fraction = std::to_string(ms % 1000);
  fraction.insert(0, 3 - fraction.size(), '0');
  return std::to_string(ms / 1000) + "." + fraction;
}

class MysqlLockDriver final : public SessionLockDriver {
 public:
  MysqlLockDriver(MysqlKeyedOptions config, std::string description)
      : config_(std::move(config)), description_(std::move(description)) {}

  // Connects (by the connect timeout; `wake_fd` readable gives up) and
  // learns the server's traits on the first connection.
  Result<std::unique_ptr<LockSession>> open_session(Deadline deadline, int wake_fd) override {
    ConnectExtras extras;
    // A held lock lives as long as its session: the server's idle timeout
    // (wait_timeout, 8 h by default) must not end it, so it is a year.
    extras.init_command = "SET SESSION wait_timeout = 31536000";
    extras.attributes = {{"simba_role", "keyed_lock"}};
    extras.wake_fd = wake_fd;
    // GET_LOCK on a replica, a Galera or a Group Replication member would
    // not exclude the holders of other members: such a server is passed
    // over, and refused, naming it, when no host is left. Bounded by the
    // connect timeout (per host).
    extras.session_locks = true;
    SIMBA_ASSIGN_OR_RETURN(MysqlConn conn, connect(config_.server, deadline, extras));
    auto session = std::make_unique<MysqlSession>(std::move(conn));
    enable_keepalive(session->socket());
    if (traits().has_value()) return std::unique_ptr<LockSession>(std::move(session));
    Result<ServerTraits> probed = probe_traits(*session, wake_fd);
    if (!probed.ok()) {
      session->abandon();
      return probed.status();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!traits_) {
      SIMBA_LOG(kInfo, description_
                           << ": keyed locks on " << probed->version << ", "
                           << (probed->names == LockNameCompare::kExact ? "exact" : "case-folded")
                           << " lock names");
      traits_ = std::move(*probed);
    }
    return std::unique_ptr<LockSession>(std::move(session));
  }

  // GET_LOCK in slices until it is granted, the wait deadline passes, or the
  // caller cancels.
  Result<std::optional<std::uint64_t>> lock(LockSession& session, std::string_view key,
                                            Deadline wait_deadline, int wake_fd) override {
    const ServerTraits traits = *this->traits();
    MYSQL* m = my(session).get();
    const std::string name = lock_name_of(key, traits.names);
    const std::string literal = sql_literal(m, name);
    for (;;) {
      const auto now = steady_clock::now();
      const bool last = wait_deadline - now <= kMaxSlice;
      const milliseconds wait =
          last
              ? std::max(milliseconds::zero(), std::chrono::ceil<milliseconds>(wait_deadline - now))
              : kMaxSlice;
      const std::string timeout = timeout_argument(wait, traits.fractional_timeouts);
      // An attempt without a wait gets op_timeout for its reply; the last
      // slice ends kDeadlineGrace after the wait deadline at the latest (a
      // whole-second server would wait longer); an earlier slice gets its
      // reply op_timeout after the server's own timeout.
      Deadline reply_deadline;
      if (wait == milliseconds::zero()) {
        reply_deadline = now + config_.op_timeout;
      } else if (last) {
        reply_deadline = wait_deadline + kDeadlineGrace;
      } else {
        reply_deadline = now + kMaxSlice + config_.op_timeout;  // kMaxSlice is whole seconds
      }
      ScalarReply reply = query_scalar(m, "SELECT GET_LOCK(" + literal + ", " + timeout + ")",
                                       reply_deadline, wake_fd);
      if (!reply.status.ok()) {
        session.set_broken();  // abandoned or broken: its end frees a late grant
        if (reply.status.code() == StatusCode::kDeadlineExceeded && last &&
            wait > milliseconds::zero()) {
          return std::optional<std::uint64_t>();  // the wait deadline passed
        }
        return reply.status.with_context(description_ + ": GET_LOCK: ");
      }
      if (!reply.value || reply.value->empty()) {  // SQL NULL
        session.set_broken();
        return unavailable_error(description_ +
                                 ": GET_LOCK returned NULL (the wait was killed or failed)");
      }
      if (*reply.value == "1") {
        my(session).held_name = name;
        return std::optional<std::uint64_t>(0);  // GET_LOCK mints no token
      }
      if (*reply.value != "0") {
        session.set_broken();
        return internal_error(description_ + ": GET_LOCK returned " + in_quotes(*reply.value));
      }
      if (last) return std::optional<std::uint64_t>();  // timed out
    }
  }

  Status unlock(LockSession& session, Deadline deadline) override {
    MYSQL* m = my(session).get();
    ScalarReply reply = query_scalar(
        m, "SELECT RELEASE_LOCK(" + sql_literal(m, my(session).held_name) + ")", deadline);
    if (!reply.status.ok()) return reply.status.with_context("RELEASE_LOCK: ");
    if (reply.value != "1") {
      return aborted_error("RELEASE_LOCK found the key not held by this session");
    }
    return ok_status();
  }

 private:
  std::optional<ServerTraits> traits() {
    std::lock_guard<std::mutex> lock(mu_);
    return traits_;
  }

  // The server's version, and whether it tells names apart that differ only
  // in case: it takes a probe lock and asks whether its case-folded twin is
  // free (MariaDB 10.11: yes; MySQL lower-cases names: no).
  Result<ServerTraits> probe_traits(MysqlSession& session, int wake) {
    MYSQL* m = session.get();
    const Deadline deadline = steady_clock::now() + config_.op_timeout;
    ServerTraits traits;
    SIMBA_ASSIGN_OR_RETURN(traits.version, scalar(m, "SELECT VERSION()", deadline, wake));
    traits.fractional_timeouts = traits.version.find("MariaDB") != std::string::npos;
    const std::string suffix = "-" + std::to_string(mysql_thread_id(m));
    const std::string probe = sql_literal(m, "simba-case-probe-A\xc3\xa9" + suffix);
    const std::string twin = sql_literal(m, "simba-case-probe-a\xc3\x89" + suffix);
    SIMBA_ASSIGN_OR_RETURN(std::string taken,
                           scalar(m, "SELECT GET_LOCK(" + probe + ", 0)", deadline, wake));
    SIMBA_ASSIGN_OR_RETURN(std::string twin_free,
                           scalar(m, "SELECT IS_FREE_LOCK(" + twin + ")", deadline, wake));
    SIMBA_ASSIGN_OR_RETURN(std::string released,
                           scalar(m, "SELECT RELEASE_LOCK(" + probe + ")", deadline, wake));
    if (taken != "1" || released != "1") {
      return unavailable_error(description_ + ": the probe lock could not be taken and freed");
    }
    traits.names = twin_free == "1" ? LockNameCompare::kExact : LockNameCompare::kFolded;
    return traits;
  }

  // A statement's single value ("" for NULL); errors with context.
  Result<std::string> scalar(MYSQL* m, const std::string& sql, Deadline deadline, int wake) {
    ScalarReply reply = query_scalar(m, sql, deadline, wake);
    if (!reply.status.ok()) return reply.status.with_context(description_ + ": " + sql + ": ");
    return reply.value.value_or("");
  }

  const MysqlKeyedOptions config_;
  const std::string description_;
  std::mutex mu_;
  std::optional<ServerTraits> traits_;  // guarded by mu_
};

KeyedLockCapabilities mysql_capabilities() {
  KeyedLockCapabilities capabilities;
  capabilities.mechanism =
      "GET_LOCK (session; keys over 64 characters or 192 bytes are hashed to '#sha256:' + 56 "
      "hex digits, and two keys with one hashed name exclude each other; no fencing tokens: "
      "GET_LOCK mints none)";
  capabilities.fencing_tokens = false;
  // MariaDB's metadata-lock queue is not a documented FIFO, and a wait of
  // more than one slice asks again.
  capabilities.fifo = false;
  capabilities.push_handoff = true;  // the server wakes a waiter on release
  capabilities.max_key_length = kMaxKeyBytes;
  capabilities.failover = std::string(kFailover) +
                          ". GET_LOCK is refused on Galera and Group Replication members, whose "
                          "named locks do not exclude each other";
  return capabilities;
}

}  // namespace

}  // namespace simba::internal::sql::mysql

namespace simba {

Result<std::shared_ptr<KeyedLockBackend>> new_mysql_keyed_lock_backend(MysqlKeyedOptions options) {
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::apply_tls(options.server));
  SIMBA_RETURN_IF_ERROR(internal::sql::mysql::check_server(options.server));
  if (options.op_timeout <= std::chrono::milliseconds::zero()) {
    return invalid_argument_error("mysql: op_timeout must be positive");
  }
  internal::sql::SessionLockConfig engine;
  engine.scheme = "mysql";
  engine.description = internal::sql::mysql::describe_server(options.server);
  engine.capabilities = internal::sql::mysql::mysql_capabilities();
  engine.budget = options.lock_connections;
  engine.store_call_timeout = options.op_timeout;
  auto driver = std::make_shared<internal::sql::mysql::MysqlLockDriver>(std::move(options),
                                                                        engine.description);
  return internal::sql::new_session_lock_backend(std::move(engine), std::move(driver));
}

// The contention backend's keys (MysqlOptionsFromUri checks them) plus
// lock_connections and op_timeout.
Result<MysqlKeyedOptions> mysql_keyed_options_from_uri(const Uri& uri) {
  MysqlKeyedOptions options;
  Uri shared = uri;
  SIMBA_ASSIGN_OR_RETURN(options.lock_connections,
                         internal::sql::take_lock_connections("mysql", shared));
  shared.query.erase("op_timeout");
  SIMBA_ASSIGN_OR_RETURN(options.server, mysql_options_from_uri(shared));
  if (auto value = uri.query_value("op_timeout")) {
    SIMBA_ASSIGN_OR_RETURN(options.op_timeout, parse_duration("op_timeout", *value));
  }
  return options;  // NewMysqlKeyedLockBackend checks the values
}

}  // namespace simba
