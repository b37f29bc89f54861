// The conformance suite on SQLite: every test gets its own database file in a
// directory removed at exit; the cross-process cases open the same file from
// a second process.
#include <sys/stat.h>
#include <unistd.h>

#include "testing/backend_conformance.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

TempDir& Dir() {
  static TempDir* dir = new TempDir();
  return *dir;
}

// Remove the directory at exit (the static above is never destroyed, so do
// it explicitly).
struct DirCleanup {
  ~DirCleanup() { delete &Dir(); }
} cleanup;

BackendTarget SqliteTarget() {
  BackendTarget target;
  target.name = "sqlite";
  target.uri = [](const std::string& unique) {
    return "sqlite://" + Dir().path() + "/" + unique + ".db";
  };
  const std::string read_only = Dir().path() + "/read-only";
  ::mkdir(read_only.c_str(), 0555);
  target.bad_uris = {
      {"sqlite://", StatusCode::kInvalidArgument, "path"},
      {"sqlite://" + Dir().path() + "/no/such/dir/x.db", StatusCode::kNotFound, "/no/such/dir"},
      // Nobody can create a file in /proc: root is told ENOENT, others EACCES.
      {"sqlite:///proc/simba-conformance.db",
       ::geteuid() == 0 ? StatusCode::kNotFound : StatusCode::kPermissionDenied,
       "/proc/simba-conformance.db"},
      {"sqlite://" + Dir().path() + "/x.db?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"sqlite://" + Dir().path() + "/x.db?busy_timeout=fast", StatusCode::kInvalidArgument,
       "busy_timeout"},
  };
  if (::geteuid() != 0) {
    target.bad_uris.push_back(
        {"sqlite://" + read_only + "/x.db", StatusCode::kPermissionDenied, read_only});
  }
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/sqlite.md: the data_version watcher pushes releases and forced releases; no
  // queue
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = false,
                   .fifo = false,
                   .push_channel_starts_on_subscribe = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Sqlite, Conformance, ::testing::Values(SqliteTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Sqlite, CrossProcessConformance, ::testing::Values(SqliteTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
