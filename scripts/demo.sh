#!/usr/bin/env bash
# A short demo of the `simba` command line on SQLite (about 20-30 s):
#   1. several `simba run` processes take turns on one mutex; each critical
#      section prints its fencing token (one at a time, tokens increasing);
#   2. two `simba elect` processes elect a leader; the leader is killed with
#      SIGKILL and the other takes over with a greater token;
#   3. `simba status` shows the store.
# Exits 0 only if all of it behaved as it should. Every process it starts is
# stopped by PID on the way out.
#
# Environment: SIMBA_BIN  the simba binary (default build/bin/simba)
set -euo pipefail

simba="${SIMBA_BIN:-build/bin/simba}"
if [ -z "${SIMBA_BIN:-}" ] && [ ! -x "$simba" ]; then
  simba="$(dirname "$0")/../build/bin/simba"   # run from elsewhere than the repository root
fi
if [ ! -x "$simba" ]; then
  echo "demo.sh: no simba binary at ${SIMBA_BIN:-build/bin/simba}; build it first" \
       "(cmake -S . -B build -G Ninja && cmake --build build) or set SIMBA_BIN" >&2
  exit 1
fi
simba="$(cd "$(dirname "$simba")" && pwd)/$(basename "$simba")"

tmp="${TMPDIR:-/tmp}"
db="$tmp/simba-demo-$$.db"
store="sqlite://$db"
work="$(mktemp -d "$tmp/simba-demo-$$.XXXXXX")"
lease=(--ttl 2s --transition 1s)

# ---- cleanup: every process we started, by PID ----------------------------------------
bg_pids=()   # the simba processes started in the background
cleanup() {
  local pid
  for pid in "${bg_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 0.3
  for pid in "${bg_pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # Children of a simba killed with SIGKILL die with it (its reaper kills
  # their groups); should a reaper itself have been killed, they wrote their
  # pids.
  for f in "$work"/*.pid; do
    [ -e "$f" ] || continue
    read -r pid _ < "$f" || true
    if [ -n "${pid:-}" ]; then
      kill -KILL -- "-$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
  rm -f "$db" "$db-wal" "$db-shm" "$db-journal"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo
  echo "DEMO FAILED: $*" >&2
  exit 1
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 0.1
  done
}

now_ms() { local t="${EPOCHREALTIME/[.,]/}"; echo $((t / 1000)); }
start_ms="$(now_ms)"

echo "simba: $simba"
echo "store: $store"

# ---- 1. simba run: one at a time ---------------------------------------------------------
echo
echo "== 1. Four 'simba run' processes take turns on the mutex 'report' =="
echo "   \$ simba run --store $store --mutex report ${lease[*]} --timeout 30s -- <critical section>"
# The critical section: detects overlap (mkdir is atomic), appends the token,
# holds the lock for a moment.
# shellcheck disable=SC2016  # expanded by the child's shell
section='mkdir "$DEMO/inside" 2>/dev/null || echo overlap >> "$DEMO/violations"
printf "   worker %s  has the lock  fencing token %s\n" "$WORKER" "$SIMBA_FENCING_TOKEN"
echo "$SIMBA_FENCING_TOKEN" >> "$DEMO/tokens"
sleep 0.3
rmdir "$DEMO/inside"'
run_pids=()
for w in 1 2 3 4; do
  DEMO="$work" WORKER="$w" "$simba" run --store "$store" --mutex report "${lease[@]}" \
    --timeout 30s -- sh -c "$section" &
  run_pids+=($!)
  bg_pids+=($!)
done
for pid in "${run_pids[@]}"; do
  wait "$pid" || fail "a 'simba run' exited with status $?"
done
[ ! -e "$work/violations" ] || fail "two critical sections overlapped"
count="$(wc -l < "$work/tokens")"
[ "$count" -eq 4 ] || fail "expected 4 critical sections, saw $count"
if ! sort -n -c "$work/tokens" 2>/dev/null || [ "$(sort -n -u "$work/tokens" | wc -l)" -ne 4 ]; then
  fail "fencing tokens did not increase: $(tr '\n' ' ' < "$work/tokens")"
fi
echo "   ok: 4 critical sections, never two at once, tokens increasing: $(tr '\n' ' ' < "$work/tokens")"

# ---- 2. simba elect: failover ----------------------------------------------------------------
echo
echo "== 2. Two 'simba elect' processes contend for the leadership of 'scheduler' =="
echo "   \$ simba elect --store $store --mutex scheduler ${lease[*]} -- <leader's job>"
# The leader's job: announces itself, writes "<pid> <token>" to
# leader.<simba pid>.pid, then works until stopped.
# shellcheck disable=SC2016  # expanded by the child's shell
job='echo "$$ $SIMBA_FENCING_TOKEN" > "$DEMO/leader.$PPID.pid"
printf "   elect %s leads: job pid %s, fencing token %s\n" "$PPID" "$$" "$SIMBA_FENCING_TOKEN"
trap "printf \"   elect %s: job %s stopped\\n\" $PPID $$; exit 0" TERM
while :; do sleep 0.2; done 2>/dev/null'
elect_pids=()
for _ in 1 2; do
  DEMO="$work" "$simba" elect --store "$store" --mutex scheduler "${lease[@]}" -- sh -c "$job" &
  elect_pids+=($!)
  bg_pids+=($!)
done
leaders() {   # how many jobs have started
  local files=("$work"/leader.*.pid)
  if [ -e "${files[0]}" ]; then echo "${#files[@]}"; else echo 0; fi
}
have_a_leader() { [ "$(leaders)" -ge 1 ]; }
wait_for 15 have_a_leader || fail "no leader was elected within 15 s"
sleep 1
[ "$(leaders)" -eq 1 ] || fail "two leaders at once"
leader=""
for pid in "${elect_pids[@]}"; do
  [ -e "$work/leader.$pid.pid" ] && leader="$pid"
done
[ -n "$leader" ] || fail "the leader's job is not a child of either simba elect"
follower="${elect_pids[0]}"
[ "$follower" = "$leader" ] && follower="${elect_pids[1]}"
read -r job_pid old_token < "$work/leader.$leader.pid"

echo "   kill -KILL $leader   (the leader, as if its machine died; its job too)"
{  # (quiet: bash would report the killed job)
  kill -KILL "$leader"
  kill -KILL -- "-$job_pid" || kill -KILL "$job_pid" || true
  wait "$leader" || true
} 2>/dev/null
killed_ms="$(now_ms)"
wait_for 10 test -e "$work/leader.$follower.pid" ||
  fail "elect $follower did not take over within 10 s"
took=$(($(now_ms) - killed_ms))
read -r _ new_token < "$work/leader.$follower.pid"
[ "$new_token" -gt "$old_token" ] || fail "the new leader's token $new_token is not above $old_token"
echo "   ok: elect $follower took over ${took} ms after the kill (lease: ttl 2 s + transition 1 s)," \
     "token $old_token -> $new_token"

# ---- 3. simba status -----------------------------------------------------------------------
echo
echo "== 3. simba status --store $store =="
"$simba" status --store "$store" | sed 's/^/   /' || fail "simba status failed"
echo
echo "   \$ simba status --store $store scheduler --json"
json="$("$simba" status --store "$store" scheduler --json)" || fail "simba status --json failed"
echo "   ${json//$'\n'/$'\n'   }"
echo "$json" | grep -Eq '"held": ?true' || fail "status does not show 'scheduler' held"

# ---- the end: stop the leader politely ---------------------------------------------------------
echo
echo "   kill -TERM $follower   (stops its job, releases the leadership, exits 0)"
kill -TERM "$follower"
code=0
wait "$follower" || code=$?
[ "$code" -eq 0 ] || fail "simba elect exited with $code after SIGTERM"

echo
echo "Demo finished in $(( ($(now_ms) - start_ms) / 1000 )) s: all good."
