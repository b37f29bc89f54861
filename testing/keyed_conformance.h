// The keyed-lock conformance suite: Ekbatan's KeyedLockProvider contract,
// written once and instantiated for every store with one line:
//
//   INSTANTIATE_TEST_SUITE_P(Redis, KeyedConformance, ::testing::Values(RedisKeyed()),
//                            simba::testing::keyed_target_name);
//
// and, for stores several processes share:
//
//   INSTANTIATE_TEST_SUITE_P(Redis, KeyedCrossProcess, ...);
//
// Cases: mutual exclusion (8 threads x 1,000 increments, exact count),
// independent keys, reentrancy (the first max_hold governs), the max_hold
// watchdog, try_acquire timing out, cancellation, fencing tokens, bad input,
// Ekbatan's wallet (concurrent deposits, none lost), and a holder process
// killed. Every wait has a timeout, so a broken backend fails, never hangs.
#ifndef SIMBA_TESTING_KEYED_CONFORMANCE_H_
#define SIMBA_TESTING_KEYED_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <ostream>
#include <string>

#include "simba/keyed_lock.h"

namespace simba::testing {

// What a store promises for keys (docs/keyed-locks.md, "What each store
// does"), stated per store so the suite asserts it instead of branching on
// capabilities().
struct KeyedExpectations {
  bool fencing_tokens = false;
  bool fifo = false;
  bool push_handoff = false;
  // A killed holder's key is free as soon as the server sees its session
  // end (its connection close), not when a lease runs out.
  bool freed_with_session = false;
};

struct KeyedTarget {
  // ctest label and test name part: "memory", "sqlite", ...
  std::string name;
  // The store for one test: `unique` differs per test; the same `unique`
  // reaches the same store (also from another process).
  std::function<std::string(const std::string& unique)> uri;
  // Lease settings for stores that hold keys by lease (short, so a killed
  // holder's key frees itself quickly).
  KeyedLockOptions options;
  // How long after a holder's process dies its key must be free again.
  std::chrono::milliseconds crash_freed_within{std::chrono::seconds(5)};
  KeyedExpectations expect;
  // The store's Backend::waiters() lists who waits for a key (a lease store
  // holds a key as the store's mutex of that name): the arrival-order case
  // sees B queue before C through it. A fifo store without it has its order
  // tested by its own suite and names that test in `order_tested_by`
  // (memory: KeyedLockTest.WaitersOfTheMemoryStoreAreServedInArrivalOrder;
  // PostgreSQL: PostgresKeyed.WaitersAreServedInArrivalOrder).
  bool store_lists_waiters = false;
  std::string order_tested_by;
};

inline std::string keyed_target_name(const ::testing::TestParamInfo<KeyedTarget>& info) {
  return info.param.name;
}
inline void PrintTo(const KeyedTarget& target, std::ostream* os) { *os << target.name; }

class KeyedConformance : public ::testing::TestWithParam<KeyedTarget> {};
class KeyedCrossProcess : public ::testing::TestWithParam<KeyedTarget> {};

}  // namespace simba::testing

#endif  // SIMBA_TESTING_KEYED_CONFORMANCE_H_
