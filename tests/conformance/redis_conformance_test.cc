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
      {"redis://", StatusCode::kInvalidArgument, "host"},
      {"redis://127.0.0.1:6379/not-a-db", StatusCode::kInvalidArgument, "database number"},
      {"redis://127.0.0.1:6379?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"redis://127.0.0.1:6379?connect_timeout=fast", StatusCode::kInvalidArgument, "connect_timeout"},
      {"redis://127.0.0.1:6379?key_prefix=a*b", StatusCode::kInvalidArgument, "key_prefix"},
      {"redis://127.0.0.1:6379?restart_guard=maybe", StatusCode::kInvalidArgument, "restart_guard"},
      {"redis://a:1,b:2", StatusCode::kInvalidArgument, "one host"},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/redis.md: pub/sub pushes releases and forced releases; the contender set lists
  // waiters; the oldest live waiter is woken first, but nothing queues them
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = true,
                   .fifo = false,
                   .push_channel_starts_on_subscribe = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Redis, Conformance, ::testing::Values(RedisTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Redis, CrossProcessConformance, ::testing::Values(RedisTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
