// One description per store (testing/stores/<store>.cc) that feeds the
// conformance (testing/backend_conformance.h), keyed
// (testing/keyed_conformance.h) and clustered (testing/clustered_conformance.h)
// suites. Adding a store to the suites is one description and one line in
// tests/CMakeLists.txt (simba_add_store_suites):
//
//   StoreDescription redis_store() {
//     StoreDescription store;
//     store.name = "redis";
//     store.server = "redis";
//     store.at = [](const std::string& server, const std::string& ns) {
//       return server + "?key_prefix=" + ns;
//     };
//     ...
//     return store;
//   }
//   SIMBA_STORE_SUITES(Redis, RedisStore)
//
// The suites are compiled once (OBJECT libraries) and each store's file once;
// a store's three test binaries link the suite they run and its description.
// SIMBA_STORE_SUITES instantiates every suite in each of them: a binary
// without a suite's TEST_Ps has nothing to run from that instantiation (and
// is allowed not to: GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST), and
// gtest never calls the description for it.
#ifndef SIMBA_TESTING_STORES_STORE_H_
#define SIMBA_TESTING_STORES_STORE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "simba/contend_service.h"
#include "testing/backend_conformance.h"
#include "testing/clustered_conformance.h"
#include "testing/keyed_conformance.h"

namespace simba::testing {

struct StoreDescription {
  // ctest label and test name part: "memory", "sqlite", ...
  std::string name;
  // The kind of server (scripts/servers/<kind>.sh, the ctest fixture of that
  // name), or empty for a store without one (memory, sqlite).
  std::string server;
  // The arguments a private server of this kind gets, the same as the
  // fixture's (tests/CMakeLists.txt), for the cases that restart one.
  std::vector<std::string> server_args;
  // Opening the store: the URI of the store one test uses, on the server at
  // `server_uri` (empty for a store without a server), in namespace `ns`
  // (a letter, a dash and the test's unique name): a key prefix, a table,
  // a root node, a file. Every suite opens its stores through this.
  std::function<std::string(const std::string& server_uri, const std::string& ns)> at;
  // Several processes can reach the store (the cross-process cases run).
  bool shared_across_processes = true;
  // Lease of every hold in the suites: JVM Simba's TCK settings, ttl 2 s,
  // transition 1 s.
  ContendOptions lease = [] {
    ContendOptions options;
    options.ttl = std::chrono::seconds(2);
    options.transition = std::chrono::seconds(1);
    return options;
  }();

  // ---- the conformance suite (BackendTarget) ----
  std::vector<BadUri> bad_uris;
  StoreExpectations expect;
  // The server can be killed and restarted under a held lease
  // (ServerRestartConformance): true for the stores with a server.
  bool restarts = false;
  // After a restart, someone owns the mutex again within this (scaled).
  std::chrono::milliseconds restart_owner_within{std::chrono::seconds(6)};

  // ---- the keyed suite (KeyedTarget) ----
  KeyedExpectations keyed_expect;
  // Keyed locks on this store are locks of the server's sessions
  // (pg_advisory_lock, GET_LOCK) named after the test, not rows or keys in
  // a namespace: the keyed suite uses the server's URI as it is.
  bool keyed_on_server = false;
  std::chrono::milliseconds keyed_crash_freed_within{std::chrono::seconds(5)};
  bool keyed_store_lists_waiters = false;
  std::string keyed_order_tested_by;

  // ---- the clustered suite (ClusteredTarget) ----
  int client_library_threads_under_load = 0;
};

// The shared server's URI (SharedServerUri) or "" for a store without one.
std::string shared_server_of(const StoreDescription& store);
// The store one test uses, `ns` its namespace, on the shared server.
std::string store_uri(const StoreDescription& store, const std::string& ns);

BackendTarget conformance_target_of(const StoreDescription& store);
KeyedTarget keyed_target_of(const StoreDescription& store);
ClusteredTarget clustered_target_of(const StoreDescription& store);

// A table name for namespace `ns` (SQL stores): lower case, every character
// but letters, digits and '_' made '_', at most 63 characters.
std::string table_for(const std::string& ns);

// `target` once, or not at all when `when` is false (an instantiation that
// generates nothing; the suites allow that for their optional parts).
template <typename T>
std::vector<T> only_if(bool when, T target) {
  if (!when) return {};
  return {std::move(target)};
}

}  // namespace simba::testing

// Every suite on the store `describe()` returns, with test names
// <Prefix>/<Suite>.<Case>/<store name> (scripts/test.sh selects by them).
#define SIMBA_STORE_SUITES(Prefix, describe)                                                   \
  namespace simba::testing {                                                                   \
  INSTANTIATE_TEST_SUITE_P(Prefix, Conformance,                                                \
                           ::testing::Values(conformance_target_of(describe())), target_name); \
  INSTANTIATE_TEST_SUITE_P(Prefix, CrossProcessConformance,                                    \
                           ::testing::ValuesIn(only_if(describe().shared_across_processes,     \
                                                       conformance_target_of(describe()))),    \
                           target_name);                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, ServerRestartConformance,                                   \
                           ::testing::ValuesIn(only_if(describe().restarts,                    \
                                                       conformance_target_of(describe()))),    \
                           target_name);                                                       \
  INSTANTIATE_TEST_SUITE_P(Prefix, KeyedConformance,                                           \
                           ::testing::Values(keyed_target_of(describe())), keyed_target_name); \
  INSTANTIATE_TEST_SUITE_P(Prefix, KeyedCrossProcess,                                          \
                           ::testing::ValuesIn(only_if(describe().shared_across_processes,     \
                                                       keyed_target_of(describe()))),          \
                           keyed_target_name);                                                 \
  INSTANTIATE_TEST_SUITE_P(Prefix, ClusteredConformance,                                       \
                           ::testing::Values(clustered_target_of(describe())),                 \
                           clustered_target_name);                                             \
  INSTANTIATE_TEST_SUITE_P(Prefix, ClusteredCrossProcess,                                      \
                           ::testing::ValuesIn(only_if(describe().shared_across_processes,     \
                                                       clustered_target_of(describe()))),      \
                           clustered_target_name);                                             \
  }                                                                                            \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);                                  \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CrossProcessConformance);                      \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ServerRestartConformance);                     \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KeyedConformance);                             \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KeyedCrossProcess);                            \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ClusteredConformance);                         \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ClusteredCrossProcess);                        \
  static_assert(true, "")

#endif  // SIMBA_TESTING_STORES_STORE_H_
