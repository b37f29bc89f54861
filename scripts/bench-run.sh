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
jobs="${JOBS:-$(nproc)}"
build="${BENCH_BUILD:-build-bench}"

echo "== Build (Release) into $build ==" >&2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSIMBA_BUILD_TESTS=OFF -DSIMBA_BUILD_EXAMPLES=OFF -DSIMBA_BUILD_CLI=OFF \
  -DSIMBA_BUILD_BENCH=ON >&2
cmake --build "$build" -j "$jobs" --target simba-bench >&2

echo "cpus: $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "kernel: $(uname -sr)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

dir="$(mktemp -d "${TMPDIR:-/tmp}/simba-bench-$kind.XXXXXX")"
chmod 755 "$dir"
started=""
cleanup() {
  if [ -n "$started" ]; then scripts/servers/"$kind".sh stop "$dir" >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
case "$kind" in
  memory) uri="memory://bench" ;;
  sqlite) uri="sqlite://$dir/bench.db" ;;
  redis|postgres|mysql|zookeeper|etcd)
    SIMBA_SERVER_OWNER_PID=$$ scripts/servers/"$kind".sh start "$dir" >/dev/null
    started=1
    uri="$(cat "$dir/uri")"
    # A non-durable server that just started: without restart_guard=off the
    # backend would refuse new leases for ttl + transition.
    if [ "$kind" = redis ]; then uri="$uri?restart_guard=off"; fi
    ;;
  *) echo "bench-run.sh: unknown store kind '$kind'" >&2; exit 64 ;;
esac
"$build/bin/simba-bench" --store "$uri" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
