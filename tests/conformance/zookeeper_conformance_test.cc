// The conformance suite on ZooKeeper: a real server started by
// scripts/servers/zookeeper.sh (the ctest fixture `zookeeper`, or on first
// use when the binary runs by hand). Every test gets a root node of its own,
// so tests on one server never see each other's elections; the
// cross-process cases reach the same root from a second process through the
// same URI.
#include "testing/backend_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

BackendTarget ZookeeperTarget() {
  BackendTarget target;
  target.name = "zookeeper";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("zookeeper") + "?root=/t-" + unique;
  };
  target.bad_uris = {
      {"zookeeper://", StatusCode::kInvalidArgument, "host"},
      {"zookeeper://u:p@127.0.0.1:2181", StatusCode::kInvalidArgument, "user info"},
      {"zookeeper://127.0.0.1:2181?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"zookeeper://127.0.0.1:2181?session_timeout=fast", StatusCode::kInvalidArgument, "session_timeout"},
      {"zookeeper://127.0.0.1:2181?root=relative", StatusCode::kInvalidArgument, "root"},
      {"zookeeper://127.0.0.1:2181?root=/trailing/", StatusCode::kInvalidArgument, "root"},
      {"zookeeper://127.0.0.1:2181/chroot/", StatusCode::kInvalidArgument, "chroot"},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/zookeeper.md: a queue of sequential nodes, each watching its predecessor
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = true,
                   .fifo = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Zookeeper, Conformance, ::testing::Values(ZookeeperTarget()),
                         TargetName);
INSTANTIATE_TEST_SUITE_P(Zookeeper, CrossProcessConformance,
                         ::testing::Values(ZookeeperTarget()), TargetName);

}  // namespace
}  // namespace simba::testing
