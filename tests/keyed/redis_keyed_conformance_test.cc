// The keyed-lock suite on Redis (leases, push hand-off).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "redis";
  target.uri = [](const std::string& unique) { return SharedServerUri("redis") + "?key_prefix=k-" + unique; };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(6);
  target.expect = {.fencing_tokens = true,
                   .fifo = false,
                   .push_handoff = true,
                   .freed_with_session = false};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Redis, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Redis, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
