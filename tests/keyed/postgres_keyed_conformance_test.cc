// The keyed-lock suite on PostgreSQL (pg_advisory_lock; keys carry the test name, so tests sharing the server never meet).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "postgres";
  target.uri = [](const std::string&) { return SharedServerUri("postgres"); };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(5);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Postgres, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Postgres, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
