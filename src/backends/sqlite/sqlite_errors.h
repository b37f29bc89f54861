// Internal to the SQLite backend: the one place where SQLite result codes
// become Status values. Declared here (rather than hidden in the backend's
// anonymous namespace) only so the translation table can be unit-tested.
//
// The header deliberately does not include <sqlite3.h>: callers pass plain
// ints, so nothing outside src/backends/sqlite needs the C client's headers.

#ifndef SIMBA_BACKENDS_SQLITE_SQLITE_ERRORS_H_
#define SIMBA_BACKENDS_SQLITE_SQLITE_ERRORS_H_

#include <string_view>

#include "simba/status.h"

namespace simba::internal {

// What went wrong, as SQLite reported it.
struct SqliteFailure {
  // The (extended or primary) result code, e.g. SQLITE_BUSY or
  // SQLITE_CANTOPEN_ISDIR.
  int code = 0;
  // errno of the failing system call (sqlite3_system_errno), 0 if none.
  int system_errno = 0;
  // sqlite3_errmsg() text; may be empty.
  std::string_view sqlite_message;
};

// Translates `failure` into a Status whose message starts with `context`
// (which should name the database path and the operation).
//
//   SQLITE_OK / ROW / DONE          OK
//   BUSY*, LOCKED*                  kDeadlineExceeded if `deadline_passed`,
//                                   else kUnavailable (busy_timeout ran out)
//   READONLY* (but DBMOVED), PERM,
//   AUTH                            kPermissionDenied
//   READONLY_DBMOVED                kUnavailable (file moved/deleted under us)
//   CANTOPEN_ISDIR                  kInvalidArgument (path is a directory)
//   CANTOPEN with EACCES/EPERM/EROFS kPermissionDenied
//   CANTOPEN with ENOENT/ENOTDIR    kNotFound
//   CANTOPEN otherwise              kUnavailable
//   NOTADB                          kInvalidArgument (not a database file)
//   IOERR* with EACCES/EPERM/EROFS  kPermissionDenied
//   IOERR*, FULL, NOMEM, PROTOCOL,
//   SCHEMA, NOLFS                   kUnavailable (environmental; may pass)
//   INTERRUPT                       kDeadlineExceeded if `deadline_passed`,
//                                   else kCancelled
//   CORRUPT*                        kInternal (the store broke an invariant)
//   anything else (ERROR, MISUSE,
//   CONSTRAINT, RANGE, ...)         kInternal (a bug on our side)
Status sqlite_failure_to_status(const SqliteFailure& failure, bool deadline_passed,
                                std::string_view context);

}  // namespace simba::internal

#endif  // SIMBA_BACKENDS_SQLITE_SQLITE_ERRORS_H_
