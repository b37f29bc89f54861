// File: simba/backends/mysql.h
//
// `mysql://user[:password]@host[:port][,host[:port]...]/db[?options]` (also
// `mariadb://`): Simba's `simba_mutex` table in MySQL (8.0.28+) or MariaDB
// (tested with Debian's 10.11), through MariaDB Connector/C (libmariadb).
//
// Locks live on the primary. Several hosts are a primary and its replicas,
// in any order: every new connection tries them in order and uses the first
// that answers and is writable, so after a failover the promoted replica is
// found. A read-only server (read_only, super_read_only, innodb_read_only: a
// replica) is skipped, and with no host left it is refused with
// kFailedPrecondition naming it (kUnavailable, naming every host and why,
// when some host could not be reached: a failover may be under way). Keyed
// locks also refuse a Galera (wsrep_on) or Group Replication member, where
// GET_LOCK does not exclude across members (Capabilities::failover;
// docs/backends/mysql.md, "Replicated deployment").
//
// The table is JVM Simba's, column for column (simba-behaviour.md §3.1.1:
// bigint unsigned epoch-millisecond times, varchar(66) mutex, varchar(128)
// owner_id, int unsigned version), so JVM Simba contenders and ours can
// share it. Lease times come from the database clock
// (UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) in the session time zone UTC, which
// has no DST ambiguity). The table is created on first use when the user
// may (`simba schema --store URI` prints the DDL for a DBA); otherwise calls
// fail with kPermissionDenied saying what to run. A table created by Simba
// uses utf8mb4_bin, so names are exact (case and accents count); in a table
// created otherwise they compare by its collation.
//
// One round trip acquires, renews or creates the row and reads it back:
// `START TRANSACTION; INSERT ... ON DUPLICATE KEY UPDATE ...; SELECT ...;
// COMMIT` as one multi-statement query. The fencing token is the row's
// version after the acquisition (a renewal keeps it). JVM Simba bumps the
// version on renewals too; tokens stay increasing across owners either way.
//
// Push without notifications: the wait line (docs/backends/mysql.md, "The
// wait line"). Waiting processes queue on a GET_LOCK name per mutex, one
// session each (`queue_connections`, default 1: that many mutexes at once
// per process); a holder keeps that name while it holds the mutex, so its
// release wakes the next process in line, which then asks at once. Waiters of other mutexes (over
// the budget, or with queue_connections=0) poll at the lease's end.
//
// Connections: `connections` (default 2) shared by every call, driven
// without blocking so every call ends by its deadline; a call that misses
// it closes its connection (the server then rolls back whatever it had
// not committed). Row lock waits are bounded on the server too
// (innodb_lock_wait_timeout 10 s per session).
//
// URI query keys: `connections` (1..64), `queue_connections` (0..16),
// `session_grace` (a duration; 0ms turns it off), `create_table` (on|off), `table`
// (default simba_mutex, a plain identifier), `connect_timeout` (a duration,
// default 10s), `ssl_mode` (disabled|required|verify_ca|verify_identity,
// default disabled), `ssl_ca` (a CA file), `ssl_cert` and `ssl_key` (a client
// certificate and its key); any of the three files implies at least
// required. `password_file` (the password is the file's first line; not with
// a password in the URI). TLS in Simba's one spelling (simba/tls.h): `tls`
// (off|on|verify), `tls_ca`, `tls_cert`, `tls_key`, mapped onto ssl_mode
// (off: disabled, on: verify_ca, verify: verify_identity), ssl_ca, ssl_cert,
// ssl_key; without `tls=`, ssl_mode=verify_ca with tls_* keys means tls=on.
// An ssl_* key that says otherwise than a tls key is an error naming both.
// `tls_server_name` is refused: libmariadb verifies the certificate against
// the host it connects to and has no option to name another (put that name
// in the URI's host). Any other key is an error. Passwords are never logged
// nor in errors; Capabilities::transport says which mode is in effect.
// docs/backends/mysql.md, "TLS and authentication", has examples.

#ifndef SIMBA_BACKENDS_MYSQL_H_
#define SIMBA_BACKENDS_MYSQL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "simba/backend.h"
#include "simba/status.h"
#include "simba/tls.h"
#include "simba/uri.h"

namespace simba {

// One server of a replicated deployment.
struct MysqlHost {
  std::string host;  // required
  std::uint16_t port = 3306;
};

struct MysqlOptions {
  std::string host;  // required
  std::uint16_t port = 3306;
  // More servers (replicas that may be promoted), tried in order after
  // host:port on every new connection; the first writable one is used.
  // Default: none.
  std::vector<MysqlHost> more_hosts;
  std::string user;
  std::string password;
  std::string database;  // required
  // Connections for calls, >= 1. Default 2.
  int connections = 2;
  // Sessions of the wait line, 0..16 (above). Default 1; 0: none (waiters
  // poll, the backend does not push).
  int queue_connections = 1;
  // How long after the server ended a holder's line session another
  // process may take its mutex over (URI key session_grace; default 1s,
  // 50ms..1m, 0 off). A holder that keeps its place in line records its
  // tenure as backed by that session (in `<table>_session`), pings it every
  // grace / 4, and believes its hold only until grace after the last
  // answered ping: a holder's death moves the mutex on in about the grace
  // instead of at its lease's end; a paused or cut-off holder stops
  // believing by then. docs/backends/mysql.md, "Failover when a holder dies".
  std::chrono::milliseconds session_grace{1000};
  // Create simba_mutex when it is missing. Default on.
  bool create_table = true;
  // The table. JVM Simba's is simba_mutex; another keeps separate
  // applications in one database apart.
  std::string table = "simba_mutex";
  // A bound on connecting to each host even when a call's deadline is far
  // away. With several hosts, each gets at most an equal share of what is
  // left of the call's deadline, so a hung host cannot starve the next.
  std::chrono::milliseconds connect_timeout{10000};
  // TLS: "disabled", "required" (encrypted; the server's certificate is
  // verified only if ssl_ca is given), "verify_ca" (encrypted, certificate
  // verified against ssl_ca, which it needs) or "verify_identity"
  // (encrypted, certificate verified against ssl_ca or the system's CAs, and
  // the host name checked against it). A server without TLS is refused in
  // every mode but "disabled".
  std::string ssl_mode = "disabled";
  // A CA certificate file for verifying the server (implies "required").
  std::string ssl_ca;
  // A client certificate file (PEM) to send, for users that REQUIRE X509,
  // and its private key file (unencrypted PEM; empty: in ssl_cert's file).
  // ssl_cert implies "required"; ssl_key needs ssl_cert.
  std::string ssl_cert;
  std::string ssl_key;
  // TLS in Simba's spelling, mapped onto the ssl_* fields as above when set
  // (fields that say otherwise are an error); unset: the ssl_* fields alone.
  std::optional<TlsOptions> tls;
};

// Errors (kInvalidArgument): no host (also in more_hosts), no database,
// connections < 1, a bad ssl_mode, verify_ca without ssl_ca, ssl_key
// without ssl_cert, `tls` contradicting an ssl_* field.
Result<std::shared_ptr<Backend>> new_mysql_backend(MysqlOptions options);

// The URI's first host is host:port, the others more_hosts. Errors
// (kInvalidArgument): another scheme, no host, an empty host in the list,
// no database, an unknown query key, a bad value.
Result<MysqlOptions> mysql_options_from_uri(const Uri& uri);

// The DDL of simba_mutex and of simba_mutex_session (which tenures a
// holder's session backs: session_grace), one statement a line-ending
// ";\n" each, for a DBA; `simba schema` prints it for the URI's table.
std::string mysql_schema_sql();

}  // namespace simba

#endif  // SIMBA_BACKENDS_MYSQL_H_
