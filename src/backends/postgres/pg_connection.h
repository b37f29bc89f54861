// libpq plumbing shared by the PostgreSQL backends (the contention driver in
// postgres_backend.cc and the keyed locks in postgres_keyed.cc): owning
// handles, connecting without blocking past a deadline, waiting on a
// connection's socket, and turning a server error into a Status.
#ifndef SIMBA_BACKENDS_POSTGRES_PG_CONNECTION_H_
#define SIMBA_BACKENDS_POSTGRES_PG_CONNECTION_H_

#include <libpq-fe.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sql/sql_backend.h"
#include "core/net/stream.h"
#include "core/unique_handle.h"
#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"

namespace simba::internal::sql::pg {

using PgResult = UniqueHandle<PGresult, PQclear>;
using PgConn = UniqueHandle<PGconn, PQfinish>;

// Capabilities::failover of both PostgreSQL backends.
inline constexpr char kFailover[] =
    "a multi-host URI follows a promoted standby (sessions on the primary only; a standby is "
    "refused). Synchronous replication (synchronous_standby_names, synchronous_commit on) keeps "
    "exclusion and increasing fencing tokens through a failover; asynchronous replication may "
    "lose the last commits, and with them a renewal (two owners) or a token (given again). "
    "Session advisory locks end with the primary: their holders are told";

// libpq's message for `conn` without its trailing newline.
std::string conn_message(PGconn* conn);

// A key of ours among libpq's connection keywords, never passed to libpq:
// the host to connect to (resolved within the deadline, like `host`) when
// `host` is the name TLS verifies and sends (tls_server_name).
inline constexpr char kConnectHostKey[] = "simba.connect_host";

// "postgresql at host:port/db" from libpq connection keywords (never the
// password), to start messages. The host is the one connected to.
std::string describe_server(const std::map<std::string, std::string>& params);

// Maps `tls` (simba/tls.h) onto libpq's keywords in `params`: off ->
// sslmode=disable, on -> verify-ca, verify -> verify-full; ca, cert, key ->
// sslrootcert, sslcert, sslkey (no CA: the system's, as libpq 16's
// sslrootcert=system; libpq 15 is given the system's bundle file); a server
// name -> `host` (what libpq verifies and sends as SNI), the URI's host
// staying what is connected to (kConnectHostKey, or `hostaddr` when given).
// Errors (kInvalidArgument, naming both keys): a libpq keyword already in
// `params` that says otherwise (sslmode=require with tls=verify, sslrootcert
// with another file than tls_ca, ...); those of TlsOptions::validate.
Status apply_tls(std::map<std::string, std::string>& params, const TlsOptions& tls);

// Capabilities::transport from the effective sslmode (and sslcert): "plain
// text", "TLS (on)" (verify-ca), "TLS (verify)" (verify-full), with ",
// client certificate"; "TLS, server not verified (sslmode=require)"; "TLS
// if the server offers it (sslmode=prefer)" for prefer, allow and libpq's
// default. As TlsOptions::describe() for what apply_tls set.
std::string transport_of(const std::map<std::string, std::string>& params);

// Waits until `fd` has one of `events`, `wake_fd` (ignored when < 0) is
// readable, or `deadline` passes. The wake fd is not drained: it stays
// readable, so a caller that was woken stops passing it. A failed poll()
// counts as kReady, so libpq reports the error.
FdWait wait_socket(int fd, short events, Deadline deadline, int wake_fd = -1);

// Sends what libpq has queued by `deadline`, reading meanwhile (so the
// server never blocks on us). Errors: kUnavailable, kDeadlineExceeded.
Status flush(PGconn* conn, Deadline deadline);

// Waits until libpq has a whole result to give (PQisBusy false), reading
// as replies come, by `deadline`: true then, false when `wake_fd` (if >= 0)
// became readable first. Errors: kUnavailable, kDeadlineExceeded. After an
// error the connection's state is unknown.
Result<bool> await_result(PGconn* conn, Deadline deadline, int wake_fd = -1);

// Asks the server to cancel what `conn` runs now; false when the request
// could not be sent, or the server did not take it `within` (a paused
// server, a black-holed network: the request may still arrive later). A
// request opens a connection of its own and waits for the server to take
// it (a round trip): the waiting thread waits for it, never a thread that
// must not block. A request that reaches the session when it runs nothing
// is ignored; one that reaches it late may hit its next statement, so a
// caller that sent one (or gave up on sending it) closes the connection
// unless the reply shows the cancel (57014).
bool send_cancel(PGconn* conn, std::chrono::milliseconds within);

// The server's SQLSTATE of a failed result ("" when it sent none, e.g. the
// connection broke).
std::string sql_state(const PGresult* result);

// A failed result as a Status (with the SQLSTATE in the message); `failure`
// (if given) says which kind the SQL protocol must tell apart. The codes are
// sqlstate_status's.
Status result_status(PGresult* result, SqlFailure* failure);

// The Status of a server error with `sqlstate` and the server's `text` (the
// message adds the SQLSTATE), and its kind in `failure` (if given). Transient
// (kUnavailable): connection exceptions (08), shutdown and operator
// intervention (57, but 57014 query_canceled is kDeadlineExceeded),
// insufficient resources (53), serialization failures and deadlocks (40001,
// 40P01), a read-only transaction (25006: a standby, or a server made
// read-only) and lock_not_available (55P03: lock_timeout fired). kNotFound (42P01),
// kPermissionDenied (42501), kAborted (23505), kAlreadyExists (42P07,
// 42710); anything else kInternal.
Status sqlstate_status(const std::string& sqlstate, const std::string& text, SqlFailure* failure);

// Why libpq could not connect, as a Status whose message is `description`,
// libpq's `message`, a hint where one helps, and `unresolved_hosts` (the
// hosts of the list left out because their names did not resolve, each as
// "host 'name': cannot resolve host: ..."). libpq 15 and later put one
// entry per host and address tried in `message` (each starting "connection
// to server at" or "connection to server on socket"; a message without
// either is one entry). Each entry, and each unresolved host, is classified
// on its own, and the connection fails transiently (kUnavailable) if any of
// them did: another try may reach that host. Otherwise the first entry's
// code: kPermissionDenied (credentials, pg_hba.conf, a role that may not log
// in or may not connect to the database, a client certificate refused, the
// server's certificate not verified or not naming the host, a server without
// TLS where TLS is required), kNotFound (no such database or role),
// kInvalidArgument (a certificate or key file named in the options that is
// missing or unusable). Everything else is transient (refused, reset, timed
// out, starting up or shutting down, too many clients, no primary among the
// hosts).
Status connect_failure_status(const std::string& description, const std::string& message,
                              const std::vector<std::string>& unresolved_hosts = {});

// Connects without blocking past `deadline`, and returns the connection in
// nonblocking mode with libpq's notices sent to our debug log. When
// `wake_fd` (if >= 0) becomes readable first, gives up with kCancelled.
// Host names are resolved here within the deadline (and `connect_timeout`),
// not by libpq, unless `params` name a `hostaddr` already.
// A session on a standby is refused (kUnavailable: a promotion may be under
// way). Errors: those of connect_failure_status (a host of the list that
// cannot be resolved is named there too; when none resolves, kUnavailable),
// kDeadlineExceeded.
Result<PgConn> connect(const std::map<std::string, std::string>& params,
                       const std::string& description, Deadline deadline, int wake_fd = -1);

// The connection keywords this libpq knows, to reject typos in URIs.
const std::set<std::string>& libpq_keywords();

// kInvalidArgument unless `params` name a host and only keywords libpq knows.
Status check_params(const std::map<std::string, std::string>& params);

}  // namespace simba::internal::sql::pg

#endif  // SIMBA_BACKENDS_POSTGRES_PG_CONNECTION_H_
