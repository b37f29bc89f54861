// File: simba/backends/sqlite.h
//
// The embedded default store: `sqlite:///path/to/file.db`. Several processes
// on one host share mutexes through the file. Leases are judged by the
// database's clock (SQLite's 'now', which is the host clock shared by those
// processes); each mutex is a row of Simba's `simba_mutex` table plus a
// `fencing_token` column holding the row version at acquisition.
//
// The database runs in WAL mode; writers take the write lock up front
// (BEGIN IMMEDIATE) and wait for it up to the call's deadline, so contention
// between processes shows up as waiting, never as "database is locked".
//
// URI: sqlite:///abs/path.db or sqlite://relative/path.db, with query keys
//   busy_timeout   longest wait for the file lock per call (default 5s;
//                  a call's own deadline may cut it shorter)
//
// Example:
//   auto backend = simba::NewSqliteBackend({.path = "/var/lib/app/simba.db"});
//
// Thread safety: thread-safe (one connection, serialized).

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
  // Longest wait for the file's write lock in one call. Default: 5 s.
  std::chrono::milliseconds busy_timeout{5000};
};

// Opens (creating if needed) the database and the simba_mutex table.
// Errors: kInvalidArgument for an empty path; kNotFound when the directory
// does not exist; kPermissionDenied when the file or directory is read-only;
// kUnavailable for other failures to open. Every message names the path.
Result<std::shared_ptr<Backend>> NewSqliteBackend(SqliteOptions options);

// sqlite:///abs/path.db or sqlite://rel/path.db?busy_timeout=2s.
Result<SqliteOptions> SqliteOptionsFromUri(const Uri& uri);

}  // namespace simba

#endif  // SIMBA_BACKENDS_SQLITE_H_
