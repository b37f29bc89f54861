// The floor of a store: its cheapest round trip from the same client library
// Simba uses (Redis PING, SQL `SELECT 1`, ZooKeeper exists, an etcd range
// read; for SQLite, which has no round trip, one durable write). Everything
// simba-bench reports is compared with it.
#ifndef SIMBA_BENCH_BENCH_FLOOR_H_
#define SIMBA_BENCH_BENCH_FLOOR_H_

#include <chrono>
#include <string>
#include <vector>

#include "simba/status.h"
#include "simba/uri.h"

namespace simba::bench {

// What the floor measured: one sample (µs) per round trip, and what it was.
struct FloorSamples {
  std::string what;  // "PING", "SELECT 1", ...
  std::vector<double> micros;
};

// kUnimplemented for a store without a floor (memory://) or one not compiled
// in; the store's error when it cannot be reached. `idle`: each round trip
// after that long without one (untimed), so client and server are idle as
// a waiter and a holder are in a hand-off.
Result<FloorSamples> measure_floor(const Uri& uri, int round_trips,
                                   std::chrono::milliseconds idle = std::chrono::milliseconds(0));

}  // namespace simba::bench

#endif  // SIMBA_BENCH_BENCH_FLOOR_H_
