// The clustered-lock suite on Redis: a real server started by
// scripts/servers/redis.sh (the ctest fixture `redis`, or on first use when the
// binary runs by hand). Every test gets a key prefix of its own, so tests on one
// server never see each other's locks; the killed-node case reaches the same
// one from a second process through the same URI.
#include "testing/clustered_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

ClusteredTarget RedisTarget() {
  ClusteredTarget target;
  target.name = "redis";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("redis") + "?key_prefix=t-" + unique;
  };
  target.lease.ttl = std::chrono::seconds(2);
  target.lease.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Redis, ClusteredConformance, ::testing::Values(RedisTarget()),
                         ClusteredTargetName);
INSTANTIATE_TEST_SUITE_P(Redis, ClusteredCrossProcess, ::testing::Values(RedisTarget()),
                         ClusteredTargetName);

}  // namespace
}  // namespace simba::testing
