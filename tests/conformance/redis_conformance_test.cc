// The conformance suite on Redis: a real redis-server started by
// scripts/servers/redis.sh (the ctest fixture `redis`, or on first use when
// the binary runs by hand). Every test gets its own key prefix, so tests on
// one server never see each other's mutexes; the cross-process cases reach
// the same prefix from a second process through the same URI.
#include "testing/backend_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

BackendTarget RedisTarget() {
  BackendTarget target;
  target.name = "redis";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("redis") + "?key_prefix=t-" + unique;
  };
  target.bad_uris = {
      {"redis://", StatusCode::kInvalidArgument},
      {"redis://127.0.0.1:6379/not-a-db", StatusCode::kInvalidArgument},
      {"redis://127.0.0.1:6379?unknown=1", StatusCode::kInvalidArgument},
      {"redis://127.0.0.1:6379?connect_timeout=fast", StatusCode::kInvalidArgument},
      {"redis://127.0.0.1:6379?key_prefix=a*b", StatusCode::kInvalidArgument},
      {"redis://127.0.0.1:6379?restart_guard=maybe", StatusCode::kInvalidArgument},
      {"redis://a:1,b:2", StatusCode::kInvalidArgument},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Redis, Conformance, ::testing::Values(RedisTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Redis, CrossProcessConformance, ::testing::Values(RedisTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
