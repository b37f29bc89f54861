// The clustered-lock suite on the in-process store (the reference backend):
// the two nodes of a test are two managers opening the same named store.
#include "testing/clustered_conformance.h"

namespace simba::testing {
namespace {

ClusteredTarget MemoryTarget() {
  ClusteredTarget target;
  target.name = "memory";
  target.uri = [](const std::string& unique) { return "memory://" + unique; };
  target.lease.ttl = std::chrono::seconds(2);
  target.lease.transition = std::chrono::seconds(1);
  return target;
}

INSTANTIATE_TEST_SUITE_P(Memory, ClusteredConformance, ::testing::Values(MemoryTarget()),
                         ClusteredTargetName);

}  // namespace
}  // namespace simba::testing
