#!/usr/bin/env bash
# Builds the benchmarks (Release, in build-bench/), starts a private
# redis-server, runs simba-bench-redis against it and stops the server.
# Results and how to read them: docs/benchmarks.md.
#
#   scripts/bench.sh [simba-bench-redis options...]
#     e.g. scripts/bench.sh --iterations 5000 --renew-mutexes 0
#
# Environment:
#   JOBS            parallel build jobs (default: nproc)
#   BENCH_BUILD     build directory (default: build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh
build_bench simba-bench-redis

echo "== Machine ==" >&2
echo "cpus: $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "kernel: $(uname -sr)"
echo "redis: $(redis-server --version)"
# Other work on the machine shows in the figures: note how busy it was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# A private server in a temporary directory, stopped (by the PID that
# redis.sh recorded) however this script ends. The script's defaults are the
# configuration of docs/servers.md: --save "" --appendonly no.
server_dir="$(mktemp -d "${TMPDIR:-/tmp}/simba-bench-redis.XXXXXX")"
cleanup() {
  scripts/servers/redis.sh stop "$server_dir" || true
  rm -rf "$server_dir"
}
trap cleanup EXIT
# The watchdog stops the server should this script be killed outright.
SIMBA_SERVER_OWNER_PID=$$ scripts/servers/redis.sh start "$server_dir" >/dev/null
uri="$(cat "$server_dir/uri")"

# restart_guard=off: this server was started a moment ago and keeps no
# durable copy of its data, so with the guard on the backend refuses every
# new lease for ttl + transition after the server's start (a lease granted
# before a restart might still be in use, and the server would have
# forgotten it). Nothing held a lease on this fresh server, so the guard
# would only stall the benchmark for ~16 s; turning it off changes no call
# the benchmark times (the guard's bound is one more script argument).
"$build/bin/simba-bench-redis" "$@" "$uri?restart_guard=off"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
