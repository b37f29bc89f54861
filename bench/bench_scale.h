// simba-bench's scale scenario: one process holds many mutexes (one factory)
// and many keys (one keyed provider) through a few renewal periods, and
// reports its threads, sockets, memory, store calls per second and how late
// renewals ran.
#ifndef SIMBA_BENCH_BENCH_SCALE_H_
#define SIMBA_BENCH_BENCH_SCALE_H_

#include "bench_report.h"

namespace simba::bench {

void scale_mutexes(const Options& options, Report& report);
void scale_keys(const Options& options, Report& report);

}  // namespace simba::bench

#endif  // SIMBA_BENCH_BENCH_SCALE_H_
