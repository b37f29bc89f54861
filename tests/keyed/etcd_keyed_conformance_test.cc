// The keyed-lock suite on etcd (lease + transaction).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "etcd";
  target.uri = [](const std::string& unique) { return SharedServerUri("etcd") + "?key_prefix=k-" + unique; };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(6);
  target.expect = {.fencing_tokens = true,
                   .fifo = true,
                   .push_handoff = true,
                   .freed_with_session = false};
  target.store_lists_waiters = true;
  return target;
}

INSTANTIATE_TEST_SUITE_P(Etcd, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Etcd, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
