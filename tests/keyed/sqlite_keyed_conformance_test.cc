// The keyed-lock suite on SQLite (leases on the store's mutexes; processes on one host).
#include "testing/test_util.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

TempDir& Dir() {
  static TempDir* dir = new TempDir();
  return *dir;
}

struct DirCleanup {
  ~DirCleanup() { delete &Dir(); }
} cleanup;

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "sqlite";
  target.uri = [](const std::string& unique) {
    return "sqlite://" + Dir().path() + "/" + unique + ".db";
  };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(6);
  target.expect = {.fencing_tokens = true,
                   .fifo = false,
                   .push_handoff = true,
                   .freed_with_session = false};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Sqlite, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Sqlite, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
