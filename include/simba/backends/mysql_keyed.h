// File: simba/backends/mysql_keyed.h
//
// Keyed locks on MySQL and MariaDB: each key is a GET_LOCK name held by the
// session of a connection pinned to the hold. The session's end frees the key,
// so a crashed holder's keys are freed when the server sees its connection
// close. docs/backends/mysql.md ("Keyed locks") has the details.
//
//   mysql://user[:password]@host[:port][,host[:port]...]/db?lock_connections=8&op_timeout=5s
//
// Lock names. A key of at most 64 characters and 192 bytes is its own
// lock name. A longer key, or one that starts with "#sha256:", gets the name
// "#sha256:" + the first 56 hex digits of its SHA-256 (64 characters, stable
// across processes and versions), so no key is ever truncated. Two keys with
// the same hashed name exclude each other: the store may exclude too much,
// never too little. The first connection probes how the server compares
// names. MariaDB 10.11 compares bytes, so case, accents and trailing spaces
// count. On a server that folds case (MySQL lower-cases names), only keys
// of printable ASCII without capitals or spaces are used as they are, and
// every other key is hashed, so "A" and "a" still differ.
//
// Waits. GET_LOCK(name, timeout) runs in slices of at most 10 s. MariaDB
// takes fractional seconds, so a wait ends on time. MySQL rounds up to whole
// seconds, so the client ends the wait itself, closing that connection. A
// wait ends at most about 200 ms after its wait_deadline. A deadline already
// past is a single GET_LOCK(name, 0). A cancel closes the waiting connection
// within a poll wake-up, and the server then drops the waiter.
//
// Connections: `lock_connections` (default 8, 1..1024) is the most
// connections the backend opens. Each hold pins one connection until it is
// released, and each waiter uses one while it waits. An acquire that finds
// them all busy waits for a free one, within its wait_deadline and
// cancellable. Connections open lazily. One monitor thread per backend
// watches held connections and calls on_lost as soon as the server ends a
// session (KILL, restart, reset). A silently cut network is noticed by TCP
// keepalive in about 8 s.
//
// URI query keys: `lock_connections`; `op_timeout` (default 5s: the bound
// on RELEASE_LOCK, the probes and the reply of a GET_LOCK after its server
// timeout); and the MySQL backend's `connect_timeout`, `ssl_mode` and
// `ssl_ca`. `connections`, `table` and `create_table` are accepted and
// ignored, so one URI serves both backends. Any other key is
// kInvalidArgument. Passwords are never logged.
//
// Capabilities: cross_process, freed_with_session and push_handoff (the
// server wakes a waiter on release). No fencing tokens: GET_LOCK mints none,
// and fencing_token() is 0. Not FIFO: the server does not promise an order,
// and a long wait asks again in each slice.
//
// Thread safety: the backend and its holds may be used from any thread.

#ifndef SIMBA_BACKENDS_MYSQL_KEYED_H_
#define SIMBA_BACKENDS_MYSQL_KEYED_H_

#include <chrono>
#include <memory>

#include "simba/backends/mysql.h"
#include "simba/keyed_backend.h"
#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

struct MysqlKeyedOptions {
  // The server and how to connect: host, port, user, password, database,
  // connect_timeout and the ssl_* options, as for the contention backend
  // (whose connections, table and create_table are ignored here).
  MysqlOptions server;
  // The most connections at once, 1..1024. Default 8.
  int lock_connections = 8;
  // Bounds RELEASE_LOCK, the probes and the reply of a GET_LOCK after its
  // server timeout. Positive. Default 5 s.
  std::chrono::milliseconds op_timeout{5000};
};

// The keyed-lock backend of the MySQL or MariaDB server `options` name.
// Nothing is connected yet. Errors (kInvalidArgument): no host or database,
// a bad value.
Result<std::shared_ptr<KeyedLockBackend>> new_mysql_keyed_lock_backend(MysqlKeyedOptions options);

// mysql://user[:password]@host[:port][,...]/db?... (scheme mysql or mariadb): the
// contention backend's keys (MysqlOptionsFromUri) plus lock_connections and
// op_timeout. Errors (kInvalidArgument): another scheme, no host or
// database, an unknown query key, a value that does not parse.
Result<MysqlKeyedOptions> mysql_keyed_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_MYSQL_KEYED_H_
