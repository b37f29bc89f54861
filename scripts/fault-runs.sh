#!/usr/bin/env bash
# The long fault runs (issue #9), by hand: simba-fault-run on every store for
# --duration seconds each, two stores at a time, keeping every run's logs and
# the checker's report. The short profile of the same runs is in ctest
# (`ctest -L faults`); docs/reliability.md records a long run.
#
#   scripts/fault-runs.sh [--duration S] [--stores "memory sqlite ..."]
#                         [--lanes N] [--per-fault]
#                         [-- extra simba-fault-run options]
#     --duration S  seconds of faults per store (default 600)
#     --stores      stores to run (default: memory sqlite redis postgres mysql
#                   zookeeper etcd); a replicated topology (redis-sentinel,
#                   redis-cluster, etcd-3, zookeeper-3, postgres-standby,
#                   mysql-replica) runs with --topology, and "topologies"
#                   stands for all six
#     --lanes N     stores run at the same time (default 2)
#     --per-fault   one run of --duration per store (or topology) and fault,
#                   "STORE:FAULT", instead of one run spread over its faults
#                   (the faults are simba-fault-run's: --faults list); a
#                   single cell can also be named in --stores as STORE:FAULT
#
# Environment:
#   OUT           where the runs go (default: /tmp/simba-fault-runs); each
#                 store's logs in OUT/STORE, its console output in
#                 OUT/STORE.out, a summary of all in OUT/summary.txt and
#                 the table for docs/reliability.md in OUT/summary.md
#                 (scripts/fault-summary.py)
#   FAULT_BUILD   build directory (default: build-faults, RelWithDebInfo)
#   FAULT_BIN     a directory that already holds simba-fault-run and
#                 simba-fault-worker: nothing is built (so a long run is not
#                 disturbed by rebuilds of the tree it came from)
#   JOBS          parallel build jobs (default: nproc)
#
# Exits non-zero if any run's checker found a violation.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '7,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "$1"
}

duration=600
stores="memory sqlite redis postgres mysql zookeeper etcd"
lanes=2
per_fault=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) [ $# -ge 2 ] || usage 2; duration="$2"; shift 2 ;;
    --stores) [ $# -ge 2 ] || usage 2; stores="$2"; shift 2 ;;
    --lanes) [ $# -ge 2 ] || usage 2; lanes="$2"; shift 2 ;;
    --per-fault) per_fault=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage 0 ;;
    *) usage 2 ;;
  esac
done
all_topologies="redis-sentinel redis-cluster etcd-3 zookeeper-3 postgres-standby mysql-replica"
stores="${stores//topologies/$all_topologies}"
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || { echo "fault-runs: --duration needs seconds" >&2; exit 2; }
[[ "$lanes" =~ ^[1-9][0-9]*$ ]] || { echo "fault-runs: --lanes needs a number" >&2; exit 2; }

out="${OUT:-/tmp/simba-fault-runs}"
build="${FAULT_BUILD:-build-faults}"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$out"

if [ -n "${FAULT_BIN:-}" ]; then
  bin="$FAULT_BIN"
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMBA_WERROR=ON \
    -DSIMBA_BUILD_EXAMPLES=OFF > "$out/build.log" 2>&1
  ninja -C "$build" -j "$jobs" simba-fault-run simba-fault-worker >> "$out/build.log" 2>&1 || {
    tail -30 "$out/build.log" >&2
    exit 3
  }
  bin="$build/bin"
fi

is_topology() { [[ " $all_topologies " == *" ${1%%:*} "* ]]; }

# run_one STORE|TOPOLOGY[:FAULT]: one long run (of that fault alone); its
# exit status is the checker's.
run_one() {
  local cell="$1" what=--store faults=()
  if is_topology "$cell"; then what=--topology; fi
  if [[ "$cell" == *:* ]]; then faults=(--faults "${cell#*:}"); fi
  "$bin/simba-fault-run" "$what" "${cell%%:*}" "${faults[@]}" --duration "$duration" \
    --out "$out/$cell" --worker "$bin/simba-fault-worker" "${extra[@]}" > "$out/$cell.out" 2>&1
}

if [ "$per_fault" -eq 1 ]; then
  cells=""
  for store in $stores; do
    if [[ "$store" == *:* ]]; then cells+=" $store"; continue; fi
    what=--store
    if is_topology "$store"; then what=--topology; fi
    list="$("$bin/simba-fault-run" "$what" "$store" --faults list)" || {
      echo "fault-runs: simba-fault-run $what $store --faults list failed" >&2
      exit 2
    }
    for fault in $list; do cells+=" $store:$fault"; done
  done
  stores="${cells# }"
fi

# Lanes: at most $lanes runs at once, the next store starting when one ends.
declare -A pids=()
failed=()
for store in $stores; do
  while [ "${#pids[@]}" -ge "$lanes" ]; do
    wait -n || true
    for s in "${!pids[@]}"; do
      if ! kill -0 "${pids[$s]}" 2>/dev/null; then
        wait "${pids[$s]}" || failed+=("$s")
        unset "pids[$s]"
      fi
    done
  done
  echo "fault-runs: $store for ${duration} s ($(date +%T))"
  run_one "$store" &
  pids[$store]=$!
done
for s in "${!pids[@]}"; do
  wait "${pids[$s]}" || failed+=("$s")
done

{
  echo "simba-fault-run, ${duration} s per store, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
  for store in $stores; do
    echo
    echo "== $store"
    grep -m1 '^fault-run: store' "$out/$store.out" || true
    cat "$out/$store/report.txt" 2>/dev/null || echo "(no report: see $out/$store.out)"
  done
} > "$out/summary.txt"
cat "$out/summary.txt"
# The table for docs/reliability.md.
# shellcheck disable=SC2086  # one word per store
python3 scripts/fault-summary.py "$out" $stores > "$out/summary.md"
topologies_run=()
for store in $stores; do
  if is_topology "$store"; then topologies_run+=("$store"); fi
done
if [ "${#topologies_run[@]}" -gt 0 ]; then
  # One row per topology and fault: docs/reliability.md's matrix.
  python3 scripts/fault-summary.py --matrix "$out" "${topologies_run[@]}" >> "$out/summary.md"
fi
echo "fault-runs: the table for docs/reliability.md is in $out/summary.md"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fault-runs: the checker failed on: ${failed[*]}" >&2
  exit 1
fi
