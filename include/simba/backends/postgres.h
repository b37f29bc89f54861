// File: simba/backends/postgres.h
//
// `postgresql://user[:password]@host[:port][,host[:port]...]/db[?options]`
// (also `postgres://`): Simba's `simba_mutex` table in PostgreSQL (tested
// with Debian's 15), through libpq.
//
// Several hosts are a primary and its standbys: libpq's host and port
// lists, with target_session_attrs=read-write unless the URI sets it. A
// session that lands on a standby (in_hot_standby, or pg_is_in_recovery()
// before PostgreSQL 14) is refused with kFailedPrecondition naming the
// host. Through a failover the guarantees hold with synchronous
// replication only (Capabilities::failover; docs/backends/postgres.md,
// "Replicated deployment").
//
// The table has JVM Simba's columns in PostgreSQL types (bigint times and
// version, varchar(66) mutex, varchar(128) owner_id); lease times come from
// the database clock (statement_timestamp()). It is created on first use
// when the user may (`simba schema --store URI` prints the DDL for a DBA);
// otherwise calls fail with kPermissionDenied saying what to run.
//
// One upsert acquires, renews or creates the row and a read in the same
// pipeline returns it: one round trip. The fencing token is the row's
// version after the acquisition (a renewal keeps it).
//
// Push: a release (or forced release) is announced with pg_notify on the
// channel `simba_mutex`; a listener connection per backend wakes the
// waiters of that mutex in every process at once. Polling stays the
// fallback.
//
// Connections: `connections` (default 2) shared by every call, plus one
// listener connection once something subscribes, plus up to
// `queue_connections` (default 1) for the wait line once a mutex is waited
// for (docs/backends/postgres.md, "Hand-off"). A call that misses its
// deadline closes its connection; statements are also bounded on the server
// (statement_timeout and lock_timeout 10 s, unless the URI sets `options`).
//
// URI query keys: ours are `connections`, `queue_connections` (0..16),
// `session_grace` (a duration; 0ms turns it off), `create_table` (on|off) and
// `table` (default simba_mutex, a plain identifier), `password_file` (the
// password is that file's first line; not with a password in the URI), and
// TLS in Simba's one spelling (simba/tls.h): `tls` (off|on|verify),
// `tls_ca`, `tls_cert`, `tls_key`, `tls_server_name`, mapped onto libpq's
// sslmode (off: disable, on: verify-ca, verify: verify-full), sslrootcert,
// sslcert, sslkey, and for tls_server_name the host libpq verifies (the URI's
// host is still what is connected to). Without `tls=`, sslmode=verify-ca
// with tls_* keys means tls=on. Every other key must be a libpq connection
// keyword (sslmode, sslrootcert, application_name, connect_timeout, options,
// target_session_attrs, ...) and is passed to libpq unchanged; one that says
// otherwise than a tls key (sslmode=require with tls=verify) is an error
// naming both. Passwords are never logged nor in errors; Capabilities::
// transport says which sslmode is in effect ("TLS (verify)", ...).
// docs/backends/postgres.md, "TLS and authentication", has examples.

#ifndef SIMBA_BACKENDS_POSTGRES_H_
#define SIMBA_BACKENDS_POSTGRES_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <optional>
#include "simba/backend.h"

#include "simba/status.h"
#include "simba/tls.h"
#include "simba/uri.h"

namespace simba {

struct PostgresOptions {
  // libpq connection keywords (host, port, user, password, dbname, sslmode,
  // ...). Must name a host.
  std::map<std::string, std::string> params;
  // Connections for calls, >= 1. Default 2.
  int connections = 2;
  // Create simba_mutex when it is missing. Default on.
  bool create_table = true;
  // Sessions of the wait line, 0..16 (URI key queue_connections; default
  // 1): for that many mutexes at once this process queues on a session
  // lock beside the row, so a release wakes the next process in line only,
  // first come first served, and the releaser cannot take the mutex straight
  // back. Waiters of other mutexes are woken by every release. 0: none.
  int queue_connections = 1;
  // How long after the server ended a holder's line session another
  // process may take its mutex over (URI key session_grace; default 1s,
  // 50ms..1m, 0 off): a holder that keeps its place in line (the wait line
  // above) records its tenure as backed by that session and pings it every
  // grace / 4, and believes its hold only until grace after the last
  // answered ping. So a holder's death moves the mutex on in about the
  // grace instead of at its lease's end (ttl + transition); a holder that
  // is paused or cut off stops believing by then. docs/backends/
  // postgres.md, "Failover when a holder dies".
  std::chrono::milliseconds session_grace{1000};
  // The table (also the NOTIFY channel). JVM Simba's is simba_mutex;
  // another keeps separate applications in one database apart.
  std::string table = "simba_mutex";
  // TLS in Simba's spelling, mapped onto params' sslmode, sslrootcert,
  // sslcert, sslkey and host as above when set; unset: params alone decide
  // (libpq's default sslmode is prefer).
  std::optional<TlsOptions> tls;
};

// Errors (kInvalidArgument): no host, connections < 1, a key libpq does
// not know, `tls` contradicting a libpq keyword in params.
Result<std::shared_ptr<Backend>> new_postgres_backend(PostgresOptions options);

// Errors (kInvalidArgument): another scheme, no host, no database, an
// unknown query key, a bad value.
Result<PostgresOptions> postgres_options_from_uri(const Uri& uri);

// The DDL of simba_mutex and of simba_mutex_session (which tenures a
// holder's session backs: session_grace), one statement a line-ending
// ";\n" each, for a DBA; `simba schema` prints it for the URI's table.
std::string postgres_schema_sql();

}  // namespace simba

#endif  // SIMBA_BACKENDS_POSTGRES_H_
