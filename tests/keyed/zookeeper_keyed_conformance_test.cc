// The keyed-lock suite on ZooKeeper (the sequential-ephemeral queue).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "zookeeper";
  target.uri = [](const std::string& unique) { return SharedServerUri("zookeeper") + "?root=/k-" + unique; };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(8);
  target.expect = {.fencing_tokens = true,
                   .fifo = true,
                   .push_handoff = true,
                   .freed_with_session = true};
  target.store_lists_waiters = true;
  return target;
}

INSTANTIATE_TEST_SUITE_P(Zookeeper, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Zookeeper, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
