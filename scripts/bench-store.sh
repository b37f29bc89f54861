#!/usr/bin/env bash
# Runs simba-bench-store (acquire + release, Locker, hand-off through the
# public API) against a private server of one kind, started and stopped by
# scripts/servers/<kind>.sh, and prints the raw store's own baseline next to
# it where we have one. Results and how to read them: docs/benchmarks.md.
#
#   scripts/bench-store.sh postgres|redis|mysql|zookeeper|etcd [iterations] [handoffs]
#
# Environment:
#   JOBS            parallel build jobs (default: nproc)
#   BENCH_BUILD     build directory (default: build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: bench-store.sh postgres|redis|mysql|zookeeper|etcd [iterations] [handoffs]}"
shift
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh
targets=(simba-bench-store)
[[ "$kind" == zookeeper ]] && targets+=(simba-bench-raw-zookeeper)
build_bench "${targets[@]}"

print_machine

server_dir="$(mktemp -d "${TMPDIR:-/tmp}/simba-bench-$kind.XXXXXX")"
chmod 755 "$server_dir"
cleanup() {
  scripts/servers/"$kind".sh stop "$server_dir" >/dev/null 2>&1 || true
  rm -rf "$server_dir"
}
trap cleanup EXIT
SIMBA_SERVER_OWNER_PID=$$ scripts/servers/"$kind".sh start "$server_dir" >/dev/null
uri="$(cat "$server_dir/uri")"
port="$(cat "$server_dir/port")"

case "$kind" in
  postgres)
    echo "server: $(postgres --version 2>/dev/null || /usr/lib/postgresql/15/bin/postgres --version)"
    # The store's own floor: two autocommitted single-row UPDATEs (what an
    # acquire and a release each have to write), one client, pgbench.
    psql "$uri" -qc "CREATE TABLE IF NOT EXISTS raw_bench (k int PRIMARY KEY, v bigint);
                     INSERT INTO raw_bench VALUES (1, 0) ON CONFLICT DO NOTHING"
    printf 'UPDATE raw_bench SET v = v + 1 WHERE k = 1;\nUPDATE raw_bench SET v = v + 1 WHERE k = 1;\n' \
      > "$server_dir/two_writes.sql"
    echo "raw baseline (pgbench, two single-row UPDATEs):" \
      "$(/usr/lib/postgresql/15/bin/pgbench -n -h 127.0.0.1 -p "$port" -U postgres \
          -f "$server_dir/two_writes.sql" -t 2000 -c 1 simba 2>&1 | grep 'latency average')"
    ;;
  redis)
    # A non-durable server that just started: without restart_guard=off
    # the backend would refuse new leases for ttl + transition.
    uri="$uri?restart_guard=off"
    ;;
  zookeeper)
    # shellcheck disable=SC2016  # expanded by the inner bash
    echo "server: ZooKeeper $(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf srvr >&3 && cat <&3' \
      "$port" 2>/dev/null | sed -n 's/^Zookeeper version: //p' | cut -d- -f1)"
    "$build/bin/simba-bench-raw-zookeeper" "127.0.0.1:$port" 2000
    ;;
  etcd)
    echo "server: $(etcd --version | head -n 1)"
    # The store's own floor: the requests one acquire + release must send
    # (lease grant + put in a transaction, pipelined; then range + lease
    # revoke, pipelined) on one keep-alive connection to the JSON gateway,
    # without the library.
    python3 bench/raw_etcd_baseline.py "$port" 2000
    ;;
esac
"$build/bin/simba-bench-store" "$uri" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
