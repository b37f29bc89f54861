// The clustered-lock conformance suite: what simba/clustered_lock.h promises,
// checked on a real store, written once and instantiated per backend:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, ClusteredConformance,
//                            ::testing::Values(SqliteClusteredTarget()),
//                            simba::testing::clustered_target_name);
//
// and, for stores several processes can share (a node killed while holding):
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, ClusteredCrossProcess, ...);
//
// Every test opens its managers on a URI of its own (target.uri(unique)), so
// tests sharing a server never see each other's locks. Every wait has a
// timeout (scaled by SIMBA_TEST_TIME_SCALE), so a broken backend fails
// instead of hanging. The cross-process case runs the helper program named
// by SIMBA_CLUSTERED_NODE_PATH (tests/clustered/clustered_node.cc).
#ifndef SIMBA_TESTING_CLUSTERED_CONFORMANCE_H_
#define SIMBA_TESTING_CLUSTERED_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>

#include "simba/contend_service.h"

namespace simba::testing {

// What a backend supplies to the suite.
struct ClusteredTarget {
  // ctest label and test name part: "memory", "sqlite", ...
  std::string name;
  // A URI for the store used by one test. `unique` differs per test; all
  // calls with the same `unique` must reach the same store (also from
  // another process).
  std::function<std::string(const std::string& unique)> uri;
  // Lease of every hold in the suite: short, so that expiry cases finish
  // quickly (ttl 2 s, transition 1 s, as in the backend suite).
  ContendOptions lease;
  // Threads the store's client library may add to its own pool under load,
  // independent of how many locks wait (gRPC starts a second timer thread:
  // docs/backends/etcd.md, "Connections and threads"). Simba's own threads
  // are bounded apart, by name, and get no allowance.
  int client_library_threads_under_load = 0;
};

inline std::string clustered_target_name(const ::testing::TestParamInfo<ClusteredTarget>& info) {
  return info.param.name;
}
inline void PrintTo(const ClusteredTarget& target, std::ostream* os) { *os << target.name; }

class ClusteredConformance : public ::testing::TestWithParam<ClusteredTarget> {};
class ClusteredCrossProcess : public ::testing::TestWithParam<ClusteredTarget> {};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_CLUSTERED_CONFORMANCE_H_
