// The clustered-lock suite on ZooKeeper: a real server started by
// scripts/servers/zookeeper.sh (the ctest fixture `zookeeper`, or on first use when the
// binary runs by hand). Every test gets a root node of its own, so tests on one
// server never see each other's locks; the killed-node case reaches the same
// one from a second process through the same URI.
#include "testing/clustered_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

ClusteredTarget ZookeeperTarget() {
  ClusteredTarget target;
  target.name = "zookeeper";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("zookeeper") + "?root=/t-" + unique;
  };
  target.lease.ttl = std::chrono::seconds(2);
  target.lease.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Zookeeper, ClusteredConformance, ::testing::Values(ZookeeperTarget()),
                         ClusteredTargetName);
INSTANTIATE_TEST_SUITE_P(Zookeeper, ClusteredCrossProcess, ::testing::Values(ZookeeperTarget()),
                         ClusteredTargetName);

}  // namespace
}  // namespace simba::testing
