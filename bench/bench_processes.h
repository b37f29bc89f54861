// simba-bench's scenarios that need other processes: failover (the holder
// process is SIGKILLed) and contention between processes. The other
// processes are simba-bench itself, started with `--child ROLE ...`.
#ifndef SIMBA_BENCH_BENCH_PROCESSES_H_
#define SIMBA_BENCH_BENCH_PROCESSES_H_

#include "bench_report.h"

namespace simba::bench {

void failover_mutex(const Options& options, Report& report);
void failover_key(const Options& options, Report& report);
void contended_processes(const Options& options, int contenders, Report& report);

// The body of a child process: argv[1] is "--child". Returns the exit code.
int run_child(int argc, char** argv);

}  // namespace simba::bench

#endif  // SIMBA_BENCH_BENCH_PROCESSES_H_
