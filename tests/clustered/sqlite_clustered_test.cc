// The clustered-lock suite on SQLite: every test gets its own database file
// in a directory removed at exit; the killed-node case opens the same file
// from a second process.
#include "testing/clustered_conformance.h"
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

ClusteredTarget SqliteTarget() {
  ClusteredTarget target;
  target.name = "sqlite";
  target.uri = [](const std::string& unique) {
    return "sqlite://" + Dir().path() + "/" + unique + ".db";
  };
  target.lease.ttl = std::chrono::seconds(2);
  target.lease.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Sqlite, ClusteredConformance, ::testing::Values(SqliteTarget()),
                         ClusteredTargetName);
INSTANTIATE_TEST_SUITE_P(Sqlite, ClusteredCrossProcess, ::testing::Values(SqliteTarget()),
                         ClusteredTargetName);

}  // namespace
}  // namespace simba::testing
