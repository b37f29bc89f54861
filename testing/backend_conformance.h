// The conformance suite (TCK): one set of behaviours every backend must show,
// written once and instantiated per backend with one line:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, Conformance, ::testing::Values(sqlite_target()),
//                            simba::testing::target_name);
//
// and, for stores that several processes can share:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, CrossProcessConformance, ...);
//
// (testing/stores/store.h does that from the store's description), and for
// stores with a server ServerRestartConformance.
//
// It holds JVM Simba's five TCK cases with Simba's mutex names and timings
// (start, restart, guard, multiContend, schedule) plus fencing, hand-off,
// lease-loss, bad-input and scale cases. Every wait has a timeout, so a broken
// backend fails instead of hanging.
#ifndef SIMBA_TESTING_BACKEND_CONFORMANCE_H_
#define SIMBA_TESTING_BACKEND_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "simba/contend_service.h"
#include "simba/status.h"

namespace simba::testing {

struct BadUri {
  std::string uri;
  StatusCode expected;
  // What the error must name: the URI part or parameter at fault (DESIGN §2:
  // "an error naming the parameter").
  std::string names;
};

// What a store promises (docs/backends/<store>.md), stated per store so the
// suite asserts it instead of branching on whatever capabilities() says: a
// backend that stops doing one of these fails, it does not quietly take the
// weaker branch.
struct StoreExpectations {
  // A release is pushed to waiters (Capabilities::push_release): hand-off
  // within a round trip or two, not at the waiter's next poll.
  bool push_release = false;
  // force_release() pushes a forced kLost to the holder at once (not only
  // at its next renewal).
  bool forced_loss_pushed = false;
  // waiters() lists who waits (else it is kUnimplemented).
  bool lists_waiters = false;
  // Waiters get the mutex in the order they first asked (Capabilities::fifo).
  bool fifo = false;
  // renew() renews many leases in one store call (Capabilities::
  // batch_renewals); else it is kUnimplemented.
  bool batch_renewals = false;
  // A lease's length is fixed when it is acquired (etcd: a key sits on a
  // session lease of one length, and moves to another only by queueing
  // again): a renewal asking another ttl renews nothing and answers with the
  // store's owner, times as the store has them.
  bool lease_length_fixed = false;
  // The push channel (a LISTEN connection, a watcher's first look, a
  // subscriber connection) comes up asynchronously after the backend's
  // first subscribe, and any subscription hears releases once it is up: a
  // test that needs a push waits for a probe's release first.
  bool push_channel_starts_on_subscribe = false;
  // A holder's process that dies is replaced within this, rather than when
  // its lease ends (Capabilities::ends_with_session; scaled). Zero: the
  // lease decides.
  std::chrono::milliseconds killed_owner_replaced_within{0};
  // A holder's death is seen only once its hold is backed by something the
  // store sees end (PostgreSQL's and MySQL's line session: a place in line,
  // then a record, a few round trips after the acquisition). The suite
  // lets the holder hold this long (scaled) before killing it. Zero: at
  // once (SQLite's kernel lock is taken before the acquisition).
  std::chrono::milliseconds killed_owner_backed_within{0};
};

// What a backend supplies to the suite.
struct BackendTarget {
  // ctest label and test name part: "memory", "sqlite", ...
  std::string name;
  // A URI for the store used by one test. `unique` differs per test, so a
  // backend may give each test its own namespace; all calls with the same
  // `unique` must reach the same store (also from another process).
  std::function<std::string(const std::string& unique)> uri;
  // URIs that must fail to open, with the code they must fail with.
  std::vector<BadUri> bad_uris;
  // Lease settings for the suite (JVM Simba's TCK uses ttl 2 s with a short
  // transition).
  ContendOptions options;
  StoreExpectations expect;

  // For ServerRestartConformance, a store with a server: its kind and the
  // arguments a private one gets (TestServer::start), and the store one
  // test uses on the server at `server_uri` (what `uri` gives on the shared
  // server). After the server's restart someone owns the mutex again
  // within `restart_owner_within` (scaled).
  std::string server;
  std::vector<std::string> server_args;
  std::function<std::string(const std::string& server_uri, const std::string& unique)> uri_on;
  std::chrono::milliseconds restart_owner_within{std::chrono::seconds(6)};
};

inline std::string target_name(const ::testing::TestParamInfo<BackendTarget>& info) {
  return info.param.name;
}
inline void PrintTo(const BackendTarget& target, std::ostream* os) { *os << target.name; }

class Conformance : public ::testing::TestWithParam<BackendTarget> {};
class CrossProcessConformance : public ::testing::TestWithParam<BackendTarget> {};
// The store's server is killed and restarted under a held lease: stores
// with a server (testing/stores/<store>.cc says which).
class ServerRestartConformance : public ::testing::TestWithParam<BackendTarget> {};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_BACKEND_CONFORMANCE_H_
