// File: simba/backends/postgres.h
//
// `postgresql://user[:password]@host[:port]/db[?options]` (also
// `postgres://`): Simba's `simba_mutex` table in PostgreSQL (tested with
// Debian's 15), through libpq.
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
// listener connection once something subscribes. A call that misses its
// deadline closes its connection; statements are also bounded on the server
// (statement_timeout and lock_timeout 10 s, unless the URI sets `options`).
//
// URI query keys: ours are `connections`, `create_table` (on|off) and
// `table` (default simba_mutex, a plain identifier);
// every other key must be a libpq connection keyword (sslmode, sslrootcert,
// application_name, connect_timeout, options, target_session_attrs, ...) and
// is passed to libpq unchanged. Passwords are never logged.

#ifndef SIMBA_BACKENDS_POSTGRES_H_
#define SIMBA_BACKENDS_POSTGRES_H_

#include <map>
#include <memory>
#include <string>

#include "simba/backend.h"
#include "simba/status.h"
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
  // The table (also the NOTIFY channel). JVM Simba's is simba_mutex;
  // another keeps separate applications in one database apart.
  std::string table = "simba_mutex";
};

// Errors (kInvalidArgument): no host, connections < 1, a key libpq does
// not know.
Result<std::shared_ptr<Backend>> new_postgres_backend(PostgresOptions options);

// Errors (kInvalidArgument): another scheme, several hosts, no database, an
// unknown query key, a bad value.
Result<PostgresOptions> postgres_options_from_uri(const Uri& uri);

// The DDL of simba_mutex, for a DBA.
std::string postgres_schema_sql();

}  // namespace simba

#endif  // SIMBA_BACKENDS_POSTGRES_H_
