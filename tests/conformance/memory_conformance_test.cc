// The conformance suite on the in-process store (the reference backend).
#include "testing/backend_conformance.h"

namespace simba::testing {
namespace {

BackendTarget MemoryTarget() {
  BackendTarget target;
  target.name = "memory";
  target.uri = [](const std::string& unique) { return "memory://" + unique; };
  target.bad_uris = {
      {"memory://", StatusCode::kInvalidArgument, "NAME"},
      {"memory://name:1234", StatusCode::kInvalidArgument, "port"},
      {"memory://name/path", StatusCode::kInvalidArgument, "path"},
      {"memory://name?unknown=1", StatusCode::kInvalidArgument, "'unknown'"},
  };
  // JVM Simba's Redis TCK settings: ttl 2 s, transition 1 s.
  target.options.ttl = std::chrono::seconds(2);
  target.options.transition = std::chrono::seconds(1);
  // in-process: every release and force is a call the store sees
  target.expect = {.push_release = true,
                   .forced_loss_pushed = true,
                   .lists_waiters = true,
                   .fifo = false};
  return target;
}

INSTANTIATE_TEST_SUITE_P(Memory, Conformance, ::testing::Values(MemoryTarget()), TargetName);

}  // namespace
}  // namespace simba::testing
