// MariaDB Connector/C plumbing shared by the MySQL/MariaDB backends (the
// contention backend, mysql_backend.cc, and the keyed locks, mysql_keyed.cc):
// owning handles, connecting, driving the non-blocking API to a deadline
// (and, for waits a caller may cancel, to a wake-up descriptor), and the one
// translation of client and server errors into Simba's codes.
#ifndef SIMBA_BACKENDS_MYSQL_MYSQL_CLIENT_H_
#define SIMBA_BACKENDS_MYSQL_MYSQL_CLIENT_H_

#include <mysql.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "core/unique_handle.h"
#include "simba/backend.h"
#include "simba/backends/mysql.h"
#include "simba/status.h"

namespace simba::internal::sql::mysql {

// mysql_library_init, once and thread-safely (mysql_init would do it too,
// but not thread-safely).
void init_library_once();

using MysqlConn = UniqueHandle<MYSQL, mysql_close>;
using MysqlResult = UniqueHandle<MYSQL_RES, mysql_free_result>;

// How a driven call ended.
enum class DriveOutcome {
  kDone,      // the call finished (successfully or not: ask the library)
  kDeadline,  // the deadline passed first; the call is unfinished
  kWoken,     // `wake_fd` became readable first; the call is unfinished
};

// Drives one non-blocking call of Connector/C to its end. `status` is what
// its _start returned; `cont(ready)` calls its _cont and returns the new
// status. `wake_fd` (-1: none) is polled beside the socket, so another
// thread can interrupt the wait by making it readable (an eventfd).
template <typename Cont>
DriveOutcome drive(MYSQL* m, int& status, Deadline deadline, Cont cont, int wake_fd = -1);

// Ends an unfinished call at once: the socket is shut down, so the library
// fails every read and write and the call returns. The connection cannot be
// used again.
template <typename Cont>
void abandon(MYSQL* m, int& status, Cont cont);

// Server and client errors as Simba's codes, and what the SQL protocol
// must tell apart.
struct Failure {
  Status status;
  SqlFailure kind = SqlFailure::kOther;
  bool broken = false;  // the connection cannot be used again
};
Failure error_of(MYSQL* m);

// Why connecting failed, from the library's error `code` and `message`
// (error_of's), as a permanent or a transient Status. Permanent:
// kPermissionDenied for credentials and accounts (1045, 1044, 1130, 1251,
// 1698, 1862, locked accounts 3118 and 4151, MySQL's secure transport
// required 3159), a host blocked until FLUSH HOSTS (1129), and a TLS error
// (2026) that says the server's certificate was not verified or the server
// has no TLS; kNotFound for an unknown database (1049). Everything else is
// kUnavailable: refused, timed out, too many connections (1040), any other
// client error (2xxx) or server error.
Status connect_failure_status(unsigned int code, const std::string& message);

// The server and how to connect to it are a MysqlOptions' host, port, user,
// password, database, connect_timeout and ssl_* (its connections, table and
// create_table are the contention backend's).

// "mysql at host:port/db" (never the password), to start messages; with
// more_hosts "mysql at host:port,host2:port2/db".
std::string describe_server(const MysqlOptions& server);

// Maps `server.tls` (if set) onto its ssl_* fields and clears it: off ->
// disabled, on -> verify_ca (without a CA, the system's bundle file), verify
// -> verify_identity; ca, cert, key -> ssl_ca, ssl_cert, ssl_key.
// Errors (kInvalidArgument, naming both): an ssl_* field already set to
// something else; a server name (libmariadb cannot verify another name than
// the host); those of TlsOptions::validate.
Status apply_tls(MysqlOptions& server);

// Capabilities::transport from the ssl_* fields: "plain text", "TLS (on)"
// (verify_ca, or required with ssl_ca), "TLS (verify)" (verify_identity),
// "TLS, server not verified (ssl_mode=required)", with ", client
// certificate".
std::string transport_of(const MysqlOptions& server);

// kInvalidArgument unless `server` names a host (and every one of
// more_hosts does) and a database, a positive connect timeout and a
// consistent set of TLS options.
Status check_server(const MysqlOptions& server);

// What differs between the backends' connections.
struct ConnectExtras {
  // Run by the library after every (re)connect, e.g. "SET time_zone = ...".
  std::string init_command;
  // Connection attributes (program_name=simba is always set).
  std::vector<std::pair<std::string, std::string>> attributes;
  bool multi_statements = false;
  // Polled while connecting: readable = give up (kCancelled). -1: none.
  int wake_fd = -1;
  // The connection will hold GET_LOCK locks: check_server_role's
  // session_locks (a Galera or Group Replication member is unfit too).
  bool session_locks = false;
};

// Connects to the first of `server`'s hosts (host:port, then more_hosts, in
// order, from the first on every call: after a failover the promoted
// replica is found) that answers and is fit for locks (refuse_unsafe_server
// with extras.session_locks), without blocking past `deadline`. Each host
// gets at most the connect timeout, and at most an equal share of what is
// left of `deadline` among the hosts not yet tried, so a hung host leaves
// time for the next. A host name is resolved here within that bound and
// the library gets its addresses (tried in turn), except "localhost" (the
// library's Unix socket) and with ssl_mode "verify_identity", where the
// library needs the name to verify the certificate and resolves it again
// itself, unbounded.
// Errors, each naming the server (never a password): with one host, its
// error: kDeadlineExceeded, kUnavailable (also a host that cannot be
// resolved, and a read-only one: a failover may be under way), those of
// connect_failure_status, kFailedPrecondition (unfit for GET_LOCK: Galera,
// Group Replication). With several, one error naming every host and why it
// was passed over, with code_of_none_fit's code. kCancelled (woken) at once.
Result<MysqlConn> connect(const MysqlOptions& server, Deadline deadline,
                          const ConnectExtras& extras);

// The code of a connection that found no host fit, from why each host was
// passed over (`failures`, in the order of the hosts): kUnavailable when
// any host's failure is transient (is_retryable) other than a timeout;
// else kDeadlineExceeded when a host timed out or was not tried for lack of
// time; else (every failure permanent) the first host's code.
StatusCode code_of_none_fit(const std::vector<Status>& failures);

// What a query (one statement, or several with multi_statements) did.
struct QueryReply {
  std::vector<SqlResult> results;  // of the statements that ran, in order (NULL reads "")
  // Why the rest did not run, if a statement failed; kDeadlineExceeded or
  // kCancelled when the call was abandoned at the deadline or on wake-up
  // (then error.broken: the reply may still come).
  Failure error;
};
// Runs `sql` and collects every statement's result by `deadline`, unless
// `wake_fd` (-1: none) becomes readable first.
QueryReply query(MYSQL* m, std::string_view sql, Deadline deadline, int wake_fd = -1);

// The reply of a statement that returns at most one row of one column
// (SELECT GET_LOCK(...)): the value, nullopt for no row (SQL NULL reads
// ""), or why there is none.
struct ScalarReply {
  Status status;
  std::optional<std::string> value;
};
ScalarReply query_scalar(MYSQL* m, const std::string& sql, Deadline deadline, int wake_fd = -1);

// Capabilities::failover of both MySQL backends.
inline constexpr char kFailover[] =
    "a multi-host URI (a primary and its replicas, any order) follows a promoted replica: every "
    "new connection uses the first writable host, and a read-only one (a replica) is refused. "
    "Semi-synchronous replication (rpl_semi_sync_master_wait_point=AFTER_SYNC) with a promotion "
    "that first applies the relay log keeps exclusion and increasing fencing tokens through a "
    "failover, until a commit waits out rpl_semi_sync_master_timeout and the primary falls back "
    "to asynchronous. Asynchronous replication may lose the last commits, and with them a "
    "renewal (two owners) or a version (a token given again). GET_LOCK locks end with the "
    "primary: their holders are told";

// What a server says about its place in a replicated deployment.
struct ServerRole {
  bool read_only = false;         // @@read_only (a replica, usually)
  bool super_read_only = false;   // @@super_read_only (MySQL; a GR secondary)
  bool innodb_read_only = false;  // @@innodb_read_only
  bool wsrep = false;             // @@wsrep_on: a Galera cluster member
  std::string group_name;         // @@group_replication_group_name (MySQL GR)
};

// The statement that reads a ServerRole: SHOW GLOBAL VARIABLES, which both
// MySQL and MariaDB answer to any user, leaving out variables the server
// does not have (MariaDB has no super_read_only nor group replication).
extern const char kServerRoleSql[];

// The role from the (Variable_name, Value) rows of kServerRoleSql; names
// are matched case-insensitively, values ON/1 are true.
ServerRole server_role_of(const std::vector<SqlRow>& rows);

// An error naming `description` (the host:port) and the cause when
// sessions on a server of `role` cannot be trusted with locks. Permanent,
// kFailedPrecondition, first: when `session_locks` (GET_LOCK), a Galera
// member (wsrep_on: GET_LOCK is not replicated, MDEV-30473) or a Group
// Replication member (named locks are not certified: members do not
// exclude each other). Transient, kUnavailable: a read-only server
// (read_only, super_read_only, innodb_read_only: a replica, or a primary
// not yet promoted, a failover under way; GET_LOCK there does not exclude
// the primary's holders, and the lease table cannot be written). OK
// otherwise.
Status check_server_role(const ServerRole& role, const std::string& description,
                         bool session_locks);

// Reads the role of the server `m` is connected to and checks it
// (check_server_role). Errors of the query come back as they are.
Status refuse_unsafe_server(MYSQL* m, const std::string& description, Deadline deadline,
                            bool session_locks, int wake_fd = -1);

// `text` as a quoted SQL literal, escaped for the connection's character set.
std::string sql_literal(MYSQL* m, std::string_view text);

// ---- implementation of the templates ----

int poll_for_drive(MYSQL* m, int status, Deadline deadline, int wake_fd, bool* woken,
                   bool* timed_out);

template <typename Cont>
DriveOutcome drive(MYSQL* m, int& status, Deadline deadline, Cont cont, int wake_fd) {
  while (status != 0) {
    bool woken = false;
    bool timed_out = false;
    const int ready = poll_for_drive(m, status, deadline, wake_fd, &woken, &timed_out);
    if (woken) return DriveOutcome::kWoken;
    if (timed_out) return DriveOutcome::kDeadline;
    if (ready < 0) continue;  // nothing for the library yet (EINTR, spurious wake-up)
    status = cont(ready);
  }
  return DriveOutcome::kDone;
}

template <typename Cont>
void abandon(MYSQL* m, int& status, Cont cont) {
  mariadb_cancel(m);
  for (int i = 0; i < 100 && status != 0; ++i) {
    int ready = status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE | MYSQL_WAIT_EXCEPT);
    if (ready == 0) ready = MYSQL_WAIT_TIMEOUT;
    status = cont(ready);
  }
}

}  // namespace simba::internal::sql::mysql

#endif  // SIMBA_BACKENDS_MYSQL_MYSQL_CLIENT_H_
