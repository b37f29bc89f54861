// The keyed-lock suite on PostgreSQL (pg_advisory_lock; keys carry the test name, so tests sharing the server never meet).
#include "testing/test_servers.h"
#include "testing/keyed_conformance.h"
#include "testing/test_util.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "postgres";
  target.uri = [](const std::string&) { return SharedServerUri("postgres"); };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  // The key lives in the holder's session: a SIGKILL closes its socket, the
  // server ends the session at once and wakes the waiter (docs/keyed-locks.md:
  // "as soon as the server notices the session is gone"). A second covers the
  // kill, the server's reaction and the waiter's wake-up on a loaded machine;
  // a lease (ttl 2 s + transition 1 s) could not meet it.
  target.crash_freed_within = Scaled(std::chrono::milliseconds(1000));
  target.expect = {.fencing_tokens = true,
                   .fifo = true,
                   .push_handoff = true,
                   .freed_with_session = true};
  target.order_tested_by = "PostgresKeyed.WaitersAreServedInArrivalOrder (tests/keyed/postgres_keyed_test.cc)";
  return target;
}

INSTANTIATE_TEST_SUITE_P(Postgres, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
INSTANTIATE_TEST_SUITE_P(Postgres, KeyedCrossProcess, ::testing::Values(Target()), KeyedTargetName);

}  // namespace
}  // namespace simba::testing
