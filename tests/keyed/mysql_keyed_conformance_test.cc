// The keyed-lock suite on MySQL/MariaDB (GET_LOCK; keys carry the test name, so tests sharing the server never meet).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "mysql";
  target.uri = [](const std::string&) { return SharedServerUri("mysql"); };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  // The key lives in the holder's session: a SIGKILL closes its socket, the
  // server ends the session at once and wakes the waiter (docs/keyed-locks.md:
  // "as soon as the server notices the session is gone"). A second covers the
  // kill, the server's reaction and the waiter's wake-up on a loaded machine;
  // a lease (ttl 2 s + transition 1 s) could not meet it.
  target.crash_freed_within = Scaled(std::chrono::milliseconds(1000));
  target.expect = {.fencing_tokens = false,
                   .fifo = false,
                   .push_handoff = true,
                   .freed_with_session = true};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Mysql, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Mysql, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
