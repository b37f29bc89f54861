// The keyed-lock suite on MySQL/MariaDB (GET_LOCK; keys carry the test name, so tests sharing the server never meet).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "mysql";
  target.uri = [](const std::string&) { return SharedServerUri("mysql"); };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(5);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Mysql, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Mysql, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
