#!/usr/bin/env bash
# Tests scripts/servers/redis.sh's --cluster topology against real
# redis-servers: a start, a write and a read through the cluster, a kill of
# the primary of a key's slot and the failover to its replica, a restart of
# the killed member (it rejoins as a replica, its start args kept), a
# graceful failover back, and a stop that leaves no process of the cluster
# behind. Prints how long each step took.
#
#   redis_cluster_script_test.sh [path/to/redis.sh]
set -u

script=${1:-$(cd "$(dirname "$0")/../../scripts/servers" && pwd)/redis.sh}
for program in redis-server redis-cli; do
  if ! command -v "$program" >/dev/null; then
    echo "SKIP: no $program" >&2
    exit 77
  fi
done
tmp=$(mktemp -d)
dir=$tmp/cluster
trap 'bash "$script" stop "$dir" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
# The members' watchdogs stop them if this test dies.
export SIMBA_SERVER_OWNER_PID=$$
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# A failure the next steps depend on: the members' state, and out.
die() {
  echo "FAIL: $*" >&2
  bash "$script" status "$dir" >&2
  exit 1
}

now_ms() {
  echo $(($(date +%s%N) / 1000000))
}

# wait_for SECONDS COMMAND...: true once COMMAND is.
wait_for() {
  local deadline=$(($(now_ms) + $1 * 1000))
  shift
  until "$@"; do
    [ "$(now_ms)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

port_of() {
  cat "$dir/$1/port"
}

# Field $2 of member $1's INFO replication.
replication() {
  redis-cli -p "$(port_of "$1")" info replication 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

is_primary() {
  [ "$(replication "$1" role)" = master ]
}

# Member $1 replicates member $2, synced.
replicates() {
  [ "$(replication "$1" role)" = slave ] && [ "$(replication "$1" master_port)" = "$(port_of "$2")" ] &&
    [ "$(replication "$1" master_link_status)" = up ]
}

# `GET {x}a` through the cluster (-c follows MOVED) from port $1 is 1.
readable() {
  [ "$(redis-cli -c -p "$1" get '{x}a' 2>/dev/null)" = 1 ]
}

# A live process (a zombie is not: a killed server may wait for its reaper).
alive() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}

no_watchdog() {
  ! pgrep -f "redis.sh watch $dir/" >/dev/null
}

t_test=$(now_ms)
t=$(now_ms)
uri=$(bash "$script" start "$dir" --cluster --appendonly yes) || die "start --cluster failed"
echo "start: $(($(now_ms) - t)) ms: $uri"
[[ $uri =~ ^redis-cluster://127\.0\.0\.1:([0-9]+),127\.0\.0\.1:([0-9]+),127\.0\.0\.1:([0-9]+)$ ]] ||
  die "the uri is not redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3: $uri"
p1=${BASH_REMATCH[1]}
p2=${BASH_REMATCH[2]}
[ "$p1 $p2 ${BASH_REMATCH[3]}" = "$(port_of n1) $(port_of n2) $(port_of n3)" ] ||
  fail "the uri does not name n1, n2 and n3: $uri"
[ "$(cat "$dir/uri")" = "$uri" ] || fail "DIR/uri is not the uri printed"
[ "$(bash "$script" status "$dir" | wc -l)" = 6 ] || fail "status does not print six lines"

# A write and a read through the cluster, each from a primary that may not
# own the slot.
[ "$(redis-cli -c -p "$p1" set '{x}a' 1)" = OK ] || die "SET {x}a through port $p1 failed"
readable "$p2" || die "GET {x}a through port $p2 does not read 1"

slot=$(redis-cli -p "$p1" cluster keyslot x | tr -d '\r')
owner=$(bash "$script" primary-of "$dir" "$slot") || die "primary-of $slot failed"
primary=${owner%% *}
[ "$owner" = "$primary 127.0.0.1:$(port_of "$primary")" ] || die "primary-of $slot printed '$owner'"
replica=$(bash "$script" status "$dir" | awk -v p="$primary" '$NF == p && $(NF - 2) == "replica" { print $1 }')
[ -n "$replica" ] || die "status names no replica of $primary"
echo "slot $slot of {x}: $primary, replica $replica"
# Through a primary that survives the kill.
other=$p1
[ "$(port_of "$primary")" != "$p1" ] || other=$p2

# A crash of the slot's primary: its replica takes over.
t=$(now_ms)
bash "$script" kill "$dir" "primary-of-$slot" || die "kill primary-of-$slot failed"
wait_for 15 is_primary "$replica" || die "$replica was not primary within 15 s of the kill of $primary"
echo "failover after the kill of $primary: $(($(now_ms) - t)) ms"
wait_for 10 readable "$other" || die "{x}a was not readable through port $other within 10 s of the failover"
echo "readable again: $(($(now_ms) - t)) ms after the kill"
[ "$(bash "$script" primary-of "$dir" "$slot")" = "$replica 127.0.0.1:$(port_of "$replica")" ] ||
  fail "primary-of $slot does not name $replica after the failover"
bash "$script" status "$dir" >/dev/null
[ $? = 3 ] || fail "status does not exit 3 with a member stopped"

# The killed member comes back with its node table, as a replica of its
# successor, with the start args.
t=$(now_ms)
bash "$script" restart "$dir" "$primary" || die "restart $primary failed"
wait_for 15 replicates "$primary" "$replica" || die "$primary did not rejoin as a replica of $replica within 15 s"
echo "rejoined as a replica: $(($(now_ms) - t)) ms after the restart"
[ "$(redis-cli -p "$(port_of "$primary")" config get appendonly | tail -n 1 | tr -d '\r')" = yes ] ||
  fail "$primary did not restart with the start args (appendonly yes)"
bash "$script" status "$dir" | grep -qx "$primary 127\.0\.0\.1:[0-9]* running [0-9]* replica of $replica" ||
  fail "status does not show $primary as a replica of $replica"

# A graceful failover back.
t=$(now_ms)
bash "$script" failover "$dir" "$primary" || die "failover $primary failed"
is_primary "$primary" || fail "$primary is not primary after failover"
[ "$(bash "$script" primary-of "$dir" "$slot")" = "$primary 127.0.0.1:$(port_of "$primary")" ] ||
  fail "primary-of $slot does not name $primary after the failover back"
readable "$other" || fail "{x}a is not readable after the failover back"
echo "failover back to $primary: $(($(now_ms) - t)) ms"

# A stop leaves none of the servers (by their pid files) nor their watchdogs.
pids=$(cat "$dir"/n[1-6]/pid)
[ "$(wc -w <<<"$pids")" = 6 ] || fail "not six pid files: $pids"
bash "$script" stop "$dir" || fail "stop failed"
for pid in $pids; do
  if alive "$pid"; then fail "pid $pid still runs after stop: $(tr '\0' ' ' </proc/"$pid"/cmdline)"; fi
done
wait_for 5 no_watchdog || fail "a watchdog of $dir still runs 5 s after stop"
bash "$script" status "$dir" >/dev/null
[ $? = 3 ] || fail "status does not exit 3 after stop"

echo "total: $(($(now_ms) - t_test)) ms"
if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo PASS
