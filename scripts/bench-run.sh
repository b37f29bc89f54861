#!/usr/bin/env bash
# Runs simba-bench (floor, uncontended, hand-off, contended; see the top of
# bench/simba_bench.cc) against a private store of one kind, started and
# stopped by scripts/servers/<kind>.sh (memory and sqlite need no server).
# Results and how to read them: docs/benchmarks.md.
#
#   scripts/bench-run.sh memory|sqlite|redis|postgres|mysql|zookeeper|etcd [simba-bench options]
#     e.g. scripts/bench-run.sh redis --scenario contended --contenders 1,4,16
#
# Environment:
#   JOBS            parallel build jobs (default: nproc)
#   BENCH_BUILD     build directory (default: build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: bench-run.sh memory|sqlite|redis|postgres|mysql|zookeeper|etcd [options]}"
shift
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh
build_bench simba-bench
print_machine
make_bench_dir "$kind" simba-bench
case "$kind" in
  memory) uri="memory://bench" ;;
  sqlite) uri="sqlite://$bench_dir/bench.db" ;;
  redis|postgres|mysql|zookeeper|etcd)
    start_bench_server
    uri="$bench_uri"
    # A non-durable server that just started: without restart_guard=off the
    # backend would refuse new leases for ttl + transition.
    if [ "$kind" = redis ]; then uri="$uri?restart_guard=off"; fi
    ;;
  *) echo "bench-run.sh: unknown store kind '$kind'" >&2; exit 64 ;;
esac
"$build/bin/simba-bench" --store "$uri" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
