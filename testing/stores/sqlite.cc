// SQLite: every test gets its own database file in a directory removed at
// exit; the cross-process cases open the same file from a second process.
#include <sys/stat.h>
#include <unistd.h>

#include "testing/stores/store.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

TempDir& dir() {
  static TempDir* dir = new TempDir();
  return *dir;
}

// Remove the directory at exit (the static above is never destroyed, so do
// it explicitly).
struct DirCleanup {
  ~DirCleanup() { delete &dir(); }
} cleanup;

StoreDescription sqlite_store() {
  StoreDescription store;
  store.name = "sqlite";
  store.at = [](const std::string&, const std::string& ns) {
    return "sqlite://" + dir().path() + "/" + ns + ".db";
  };
  const std::string read_only = dir().path() + "/read-only";
  ::mkdir(read_only.c_str(), 0555);
  store.bad_uris = {
      {"sqlite://", StatusCode::kInvalidArgument, "path"},
      {"sqlite://" + dir().path() + "/no/such/dir/x.db", StatusCode::kNotFound, "/no/such/dir"},
      // Nobody can create a file in /proc: root is told ENOENT, others EACCES.
      {"sqlite:///proc/simba-conformance.db",
       ::geteuid() == 0 ? StatusCode::kNotFound : StatusCode::kPermissionDenied,
       "/proc/simba-conformance.db"},
      {"sqlite://" + dir().path() + "/x.db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"sqlite://" + dir().path() + "/x.db?busy_timeout=fast", StatusCode::kInvalidArgument,
       "busy_timeout"},
  };
  if (::geteuid() != 0) {
    store.bad_uris.push_back(
        {"sqlite://" + read_only + "/x.db", StatusCode::kPermissionDenied, read_only});
  }
  // docs/backends/sqlite.md: the data_version watcher pushes releases and forced releases; no
  // queue
  store.expect = {.push_release = true,
                  .forced_loss_pushed = true,
                  .lists_waiters = false,
                  .fifo = false,
                  .push_channel_starts_on_subscribe = true,
                  // a dead holder's kernel lock is free (host_locks.h): the watcher's
                  // 15 ms tick and one acquisition, with a loaded machine's slack
                  .killed_owner_replaced_within = std::chrono::seconds(1)};
  // keys: leases on the store's mutexes; processes on one host, whose
  // deaths the kernel locks show
  store.keyed_crash_freed_within = std::chrono::seconds(1);
  store.keyed_expect = {
      .fencing_tokens = true, .fifo = false, .push_handoff = true, .freed_with_session = true};
  return store;
}

}  // namespace
}  // namespace simba::testing

SIMBA_STORE_SUITES(Sqlite, sqlite_store);
