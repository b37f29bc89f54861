// File: simba/backends/postgres_keyed.h
//
// Keyed locks on PostgreSQL (the keyed SPI of simba/keyed_backend.h):
// pg_advisory_lock(bigint), session-scoped, so a crashed holder's keys are
// freed as soon as its session ends. Usually reached through
// KeyedLockProvider::open("postgresql://..."), which adds reentrancy and the
// max_hold watchdog on top.
//
// Keys. A key (any non-empty UTF-8 string without control characters, up to
// 64 KiB) becomes the bigint postgres_advisory_lock_key(key): the 64-bit
// FNV-1a hash of its bytes. Two keys with the same hash exclude each other
// (over-exclusion, never under-exclusion); among a million keys the chance of
// any such pair is about 3 in 100 million. Other users of one-argument
// pg_advisory_lock in the same database share this key space; the
// two-argument form (int, int) is a separate one.
//
// One round trip per acquisition, in the simple query protocol:
//   SET statement_timeout = 0; SET lock_timeout = <ms left>;
//   SELECT pg_advisory_lock(k); SELECT nextval('simba_keyed_token')
// The statements run in order, so the fencing token is taken while the key
// is held and is greater than every earlier holder's. A wait deadline already
// past becomes one pg_try_advisory_lock (a token only when granted). The
// sequence simba_keyed_token is created on first use (a concurrent creator is
// fine); a user who may not create it gets kPermissionDenied naming the DDL
// (CREATE SEQUENCE simba_keyed_token; GRANT USAGE ON SEQUENCE ... TO user).
// Tokens are global (one sequence for every key), so they also increase per
// key; a sequence created with CACHE > 1, or dropped and re-created, breaks
// that.
//
// Waiting: PostgreSQL queues waiters of a lock in arrival order and grants it
// to the first at once on release (FIFO, push hand-off). The wait ends at the
// request's wait_deadline (lock_timeout, SQLSTATE 55P03: "not acquired") or
// when its cancel token is stopped: the waiting thread sends a cancel request
// (PQcancel; SQLSTATE 57014) and returns kCancelled within a round trip.
//
// Connections: at most `lock_connections` (default 8), opened lazily and kept
// for reuse. A hold pins its connection until it is released; a waiter uses
// one while it waits; when all are busy an acquire waits (in arrival order)
// for one to come back, counting against its wait_deadline, cancellable. It
// never opens more. Lock traffic therefore never takes connections from the
// contention backend's pool, nor from the application's.
//
// Loss: one monitor thread per backend watches the sockets of the held, idle
// connections; when the server ends a session (pg_terminate_backend, a
// restart, a reset connection) the hold's on_lost runs at once. A silent
// network cut is noticed through TCP keepalives (defaults here: idle 10 s,
// interval 5 s, 3 probes; the keepalives_* query keys override them).
//
// URI: postgresql://user[:password]@host[:port]/db[?options], the query keys
// of the PostgreSQL contention backend (simba/backends/postgres.h) plus:
//   lock_connections   the connection budget, 1..1024 (default 8)
// Of the contention backend's own keys, `create_table=off` also stops the
// token sequence from being created (kFailedPrecondition when it is
// missing); `connections` and `table` are accepted and ignored (they size
// and name the contention backend's pool and table), so one URI serves
// both. Every other key is a libpq connection keyword. application_name
// defaults to "simba_keyed", connect_timeout to 10 (seconds). Passwords are
// never logged.
//
// Thread safety: the backend and its holds are thread-safe.

#ifndef SIMBA_BACKENDS_POSTGRES_KEYED_H_
#define SIMBA_BACKENDS_POSTGRES_KEYED_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "simba/keyed_backend.h"
#include "simba/status.h"
#include "simba/tls.h"
#include "simba/uri.h"

namespace simba {

struct PostgresKeyedOptions {
  // libpq connection keywords (host, port, user, password, dbname, sslmode,
  // ...). Must name a host. application_name, connect_timeout (whole
  // seconds) and keepalives_* get the defaults above unless given.
  std::map<std::string, std::string> params;
  // The most connections at once, 1..1024. Default 8.
  int lock_connections = 8;
  // Create the token sequence when it is missing. Default on.
  bool create_sequence = true;
  // TLS in Simba's spelling, as PostgresOptions::tls.
  std::optional<TlsOptions> tls;
};

// The keyed-lock backend of the PostgreSQL server `options` name. Nothing
// is connected yet. Errors (kInvalidArgument): no host, an unknown libpq
// keyword, a bad `lock_connections` or `connect_timeout`.
Result<std::shared_ptr<KeyedLockBackend>> new_postgres_keyed_lock_backend(
    PostgresKeyedOptions options);

// postgresql://... as above: PostgresOptionsFromUri's keys plus
// lock_connections (create_table=off sets create_sequence off). Errors
// (kInvalidArgument): those of PostgresOptionsFromUri, a bad
// `lock_connections`.
Result<PostgresKeyedOptions> postgres_keyed_options_from_uri(const Uri& uri);

// The pg_advisory_lock argument of `key`: FNV-1a 64 over the key's bytes
// (offset basis 0xcbf29ce484222325, prime 0x100000001b3), its 64 bits read
// as a two's-complement bigint. Stable across releases and machines: it is
// how every process of every version finds the same lock. To find a held key
// in pg_locks (locktype 'advisory', objsubid 1): classid is the high 32 bits,
// objid the low 32 bits.
std::int64_t postgres_advisory_lock_key(std::string_view key);

}  // namespace simba

#endif  // SIMBA_BACKENDS_POSTGRES_KEYED_H_
