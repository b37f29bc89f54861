// The conformance suite on etcd: a real etcd started by
// scripts/servers/etcd.sh (the ctest fixture `etcd`, or on first use when the
// binary runs by hand). Every test gets its own key prefix, so tests on one
// server never see each other's mutexes; the cross-process cases reach the
// same prefix from a second process through the same URI.
#include "testing/backend_conformance.h"
#include "testing/test_servers.h"

namespace simba::testing {
namespace {

BackendTarget EtcdTarget() {
  BackendTarget target;
  target.name = "etcd";
  target.uri = [](const std::string& unique) {
    return SharedServerUri("etcd") + "?key_prefix=t-" + unique;
  };
  target.bad_uris = {
      {"etcd://", StatusCode::kInvalidArgument, "host"},
      {"etcd://127.0.0.1:2379/some/path", StatusCode::kInvalidArgument, "path"},
      {"etcd://127.0.0.1:2379?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
      {"etcd://127.0.0.1:2379?connect_timeout=fast", StatusCode::kInvalidArgument, "connect_timeout"},
      {"etcd://127.0.0.1:2379?connect_timeout=0ms", StatusCode::kInvalidArgument, "connect_timeout"},
      {"etcd://127.0.0.1:2379?key_prefix=a/b", StatusCode::kInvalidArgument, "key_prefix"},
      {"etcd://127.0.0.1:2379?key_prefix=", StatusCode::kInvalidArgument, "key_prefix"},
      {"etcd://user:secret@127.0.0.1:2379", StatusCode::kInvalidArgument, "user and password"},
  };
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // docs/backends/etcd.md: a queue of keys by create revision, watched
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = true,
                   .fifo = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Etcd, Conformance, ::testing::Values(EtcdTarget()), TargetName);
INSTANTIATE_TEST_SUITE_P(Etcd, CrossProcessConformance, ::testing::Values(EtcdTarget()),
                         TargetName);

}  // namespace
}  // namespace simba::testing
