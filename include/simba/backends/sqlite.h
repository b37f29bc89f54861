// File: simba/backends/sqlite.h
//
// The embedded default store: `sqlite:///path/to/file.db`. Several processes
// on one host share mutexes through the file. Leases are judged by the
// database's clock (SQLite's 'now', which is the host clock shared by those
// processes); each mutex is a row of Simba's `simba_mutex` table, whose
// version at the acquisition is the fencing token (renewals keep it), as on
// PostgreSQL and MySQL. A file written by an older build (a fencing_token
// column, version bumped on renewal) is migrated when opened.
//
// The database runs in WAL mode; writers take the write lock up front
// (BEGIN IMMEDIATE) and wait for it up to the call's deadline, so contention
// between processes shows up as waiting, never as "database is locked".
// A call that waited until its deadline fails with kDeadlineExceeded; one
// whose busy_timeout ran out first fails with kUnavailable. Readers (read,
// list) never wait for writers.
//
// read(), list() and force_release() report a row as free
// (MutexOwner::none()) when it was released or its hard lease
// (transition_at) has ended by the database clock: exactly the rows
// acquire_or_renew would hand to the next caller. force_release() frees the
// row whoever holds it and sets its version to version + 1, the returned
// fencing_floor; the next acquisition's token is
// greater still.
//
// Push (capabilities().push_release): subscribe() delivers releases,
// including forced ones, made by any process using the file. A watcher
// thread, started by the first subscribe() and stopped when the backend is
// destroyed, polls `PRAGMA data_version` every ~15 ms on a connection of its
// own and reads the subscribed rows when another connection has committed;
// a row that is free and whose version moved since the last look is a
// release. Releases made through this backend wake it at once. Delivered:
// every release committed after subscribe() returns (subscribe reads the row
// it starts from; should that read find this backend's connection busy for
// a second, the watcher's first look is the starting point instead); the
// event's owner_id is the holder the watcher last saw, empty if the whole
// hold fell between two looks. A lease that merely
// expires is not announced (waiters find it at their next poll).
// Listeners run on the watcher thread, one at a time, and must not block;
// a listener may destroy its own or another Subscription. Destroying a
// Subscription elsewhere waits for a running call of its listener, so do
// not destroy one while holding a lock that listener takes.
//
// Names: mutex at most 66 bytes (Simba's varchar(66), so names port to the
// MySQL backend and to JVM Simba), contender id at most 128 bytes.
//
// URI: sqlite:///abs/path.db or sqlite://relative/path.db, with query keys
//   busy_timeout   longest wait for the file lock per call (default 5s;
//                  a call's own deadline may cut it shorter)
//
// Example:
//   auto backend = simba::new_sqlite_backend({.path = "/var/lib/app/simba.db"});
//
// Thread safety: thread-safe. Calls share one connection, one at a time;
// the watcher adds one thread and one connection per backend, however many
// mutexes and subscriptions there are.

#ifndef SIMBA_BACKENDS_SQLITE_H_
#define SIMBA_BACKENDS_SQLITE_H_

#include <chrono>
#include <memory>
#include <string>

#include "simba/backend.h"
#include "simba/status.h"
#include "simba/uri.h"

namespace simba {

struct SqliteOptions {
  // Path of the database file; created if missing (its directory must exist
  // and be writable). Must not be empty.
  std::string path;
  // Longest wait for the file's write lock in one call (also the longest
  // wait while opening). 0 means do not wait. Must not be negative.
  // Default: 5 s.
  std::chrono::milliseconds busy_timeout{5000};
};

// Opens (creating if needed) the database and the simba_mutex table.
// Errors: kInvalidArgument for an empty path, ":memory:", a path that is a
// directory, a file that is not an SQLite database, or a negative
// busy_timeout; kNotFound when the directory does not exist;
// kPermissionDenied when the file or directory is read-only; kUnavailable
// for other failures to open. Every message names the path (or, for a
// missing directory, the directory).
Result<std::shared_ptr<Backend>> new_sqlite_backend(SqliteOptions options);

// sqlite:///abs/path.db or sqlite://rel/path.db?busy_timeout=2s (the host
// part of the second form is the first segment of a relative path).
// Errors (kInvalidArgument): another scheme, a user, password or port,
// several hosts, no file path, an unknown query key, a bad busy_timeout.
Result<SqliteOptions> sqlite_options_from_uri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_SQLITE_H_
