// simba-bench's scenarios that need other processes: failover (the holder
// process is SIGKILLed) and contention between processes. The other
// processes are simba-bench itself, started with `--child ROLE ...`.
#ifndef SIMBA_BENCH_BENCH_PROCESSES_H_
#define SIMBA_BENCH_BENCH_PROCESSES_H_

#include "bench_report.h"

namespace simba::bench {

void failover_mutex(const Options& options, Report& report);
void failover_key(const Options& options, Report& report);
// N processes loop on one hot key: a keyed provider's key, or (`locker`) a
// Locker's mutex.
void contended_processes(const Options& options, int contenders, bool locker, Report& report);

// The body of a child process: argv[1] is "--child". Returns the exit code.
int run_child(int argc, char** argv);

}  // namespace simba::bench

#endif  // SIMBA_BENCH_BENCH_PROCESSES_H_
