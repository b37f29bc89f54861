// The keyed-lock suite on memory:// (a FIFO per key inside the process).
#include "testing/keyed_conformance.h"

namespace simba::testing {
namespace {

KeyedTarget Target() {
  KeyedTarget target;
  target.name = "memory";
  target.uri = [](const std::string& unique) { return "memory://" + unique; };
  target.options.lease.ttl = std::chrono::seconds(2);
  target.options.lease.transition = std::chrono::seconds(1);
  target.crash_freed_within = std::chrono::seconds(5);
  target.expect = {.fencing_tokens = true,
                   .fifo = true,
                   .push_handoff = true,
                   .freed_with_session = true};
  target.order_tested_by = "KeyedLockTest.WaitersOfTheMemoryStoreAreServedInArrivalOrder (tests/unit/keyed_lock_test.cc)";
  return target;
}

INSTANTIATE_TEST_SUITE_P(Memory, KeyedConformance, ::testing::Values(Target()), KeyedTargetName);
// No other process can reach an in-process store.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KeyedCrossProcess);

}  // namespace
}  // namespace simba::testing
