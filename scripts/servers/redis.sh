#!/usr/bin/env bash
# Starts and stops a private redis-server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data, log, pid, port and uri files in
# DIR. The commands (start, stop, kill, pause, resume, status, uri) are
# scripts/servers/common.sh's:
#
#   redis.sh start DIR [--tls CERTS [--tls-cert-name NAME]] [redis-server args...]
#                         start (again) and print the uri
#   redis.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   redis.sh kill DIR     SIGKILL (a crash); DIR/port is kept for a restart
#   redis.sh pause DIR    SIGSTOP (a server that hangs)
#   redis.sh resume DIR   SIGCONT
#   redis.sh status DIR   "running PID URI" or "stopped" (exit 3)
#   redis.sh uri DIR      print redis://127.0.0.1:PORT (with --tls:
#                         rediss://simba:simba-acl-secret@127.0.0.1:PORT?tls_ca=DIR/tls/ca.pem)
#
# Extra start args come after ours, and redis-server lets a later option
# override an earlier one: `--appendonly yes --appendfsync always` makes a
# server that loses nothing when killed.
#
# TLS and ACL: with `--tls CERTS` (first after DIR), the server serves TLS
# only (`port 0`, `tls-port PORT`) with the certificate CERTS/server-cert.pem
# (CN localhost, SAN localhost and 127.0.0.1), signed by CERTS/ca.pem;
# scripts/servers/test-ca.sh makes them in CERTS first if they are missing,
# and this script copies them to DIR/tls. `--tls-cert-name NAME` (right after
# CERTS) serves CERTS/NAME-cert.pem and NAME-key.pem instead: `expired` is a
# server whose certificate has expired. Client certificates are asked for
# but not required (`tls-auth-clients optional`); the extra args
# `--tls-auth-clients yes` make a server that requires one signed by
# CERTS/ca.pem (CERTS/client-cert.pem). Such a server also has an ACL user
# simba (password simba-acl-secret, every command, key and channel), and its
# default user needs the same password (`AUTH simba-acl-secret`), so clients
# authenticate either way. This script's own readiness check speaks TLS,
# with the client certificate, as simba.
#
# Sentinel: `redis.sh start DIR --sentinel [redis-server args...]` starts a
# primary (DIR/n1), a replica (DIR/n2, replicaof n1) and three sentinels
# (DIR/s1..s3: `sentinel monitor simba 127.0.0.1 P 2`, down-after 1000 ms,
# failover-timeout 3000 ms, or SIMBA_SENTINEL_DOWN_AFTER_MS /
# SIMBA_SENTINEL_FAILOVER_TIMEOUT_MS), each on a free port, and prints
# redis-sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/simba (the args
# go to both data nodes). On such a DIR:
#   redis.sh stop DIR                    every member, the sentinels first
#   redis.sh status DIR                  one line per member; the primary marked
#   redis.sh primary DIR                 "n1 127.0.0.1:PORT": the primary a
#                                        sentinel names now
#   redis.sh kill|pause|resume|stop DIR MEMBER
#   redis.sh restart DIR MEMBER          start a member again (a data node
#                                        as a replica of the current primary,
#                                        with the args the topology started
#                                        with: DIR/args)
#   redis.sh member DIR MEMBER           the member's name (n1, ...): which
#                                        one `primary` or `replica` is now
#   redis.sh drop-replicas DIR MEMBER    CLIENT KILL TYPE replica on MEMBER;
#                                        with its replicas paused, what it
#                                        writes next reaches none of them
#   redis.sh settle DIR                  wait (40 s at most) until the
#                                        sentinels agree on the primary and
#                                        the replica replicates it, link up
#   redis.sh failover DIR                SENTINEL FAILOVER (a planned one:
#                                        the sentinels promote the replica
#                                        without waiting for it to catch up),
#                                        once the replica is in sync; returns
#                                        the new primary's name once it is
#                                        primary and the old one replicates
#                                        it (40 s at most)
# where MEMBER is n1, n2, s1, s2, s3, or primary / replica (as the
# sentinels see them now). `--tls` is not offered with --sentinel.
#
# Cluster: `redis.sh start DIR --cluster [redis-server args...]` starts a
# Redis Cluster of six nodes, each on a free port and a free cluster bus
# port (DIR/nK/port, DIR/nK/bus_port), its node table in DIR/nK/nodes.conf
# (cluster-node-timeout 1000 ms, or SIMBA_CLUSTER_NODE_TIMEOUT_MS): n1, n2
# and n3 primaries of slots 0-5460, 5461-10922 and 10923-16383, n4, n5 and
# n6 replicas of n1, n2 and n3. It returns once every node says
# cluster_state:ok and every replica has synced, and prints
# redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 (the primaries;
# the args go to every node, DIR/args keeps them for a restart). On such a
# DIR:
#   redis.sh stop DIR                    every member
#   redis.sh status DIR                  one line per member: its role, and
#                                        a primary's slots
#   redis.sh primary-of DIR SLOT         "nK 127.0.0.1:PORT": the primary of
#                                        SLOT now (0-16383)
#   redis.sh kill|pause|resume|stop DIR MEMBER
#   redis.sh restart DIR MEMBER          start a member again, with its
#                                        ports and nodes.conf: it rejoins
#                                        (an old primary as a replica of
#                                        its successor); returns once it
#                                        serves, not once it has rejoined
#   redis.sh settle DIR                  wait (40 s at most) until every
#                                        member sees the whole cluster
#                                        (state ok, three primaries and
#                                        three replicas, no node failing)
#                                        and each replica's link is up
#   redis.sh failover DIR MEMBER [FORCE|TAKEOVER]
#                                        CLUSTER FAILOVER on the replica
#                                        MEMBER; returns once it is primary
#   redis.sh member DIR MEMBER           the member's name (n1..n6): which
#                                        one primary-of-SLOT is now, say
#   redis.sh drop-replicas DIR MEMBER    CLIENT KILL TYPE replica on MEMBER
#                                        (as with --sentinel)
# where MEMBER is n1..n6, or primary-of-SLOT / replica-of-SLOT (the primary
# of SLOT now, its first replica). `--tls` is not offered with --cluster.
#
# Environment:
#   SIMBA_NETNS             a lab of network namespaces (scripts/servers/netns.sh)
#                           for --sentinel (3 hosts: n1 and s1 on host 1, n2
#                           and s2 on host 2, s3 on host 3) or --cluster (6
#                           hosts: nK on host K): each member runs in its
#                           host's namespace and listens on its address
#                           (DIR/MEMBER/host), so that a host can be cut off
#                           from the others (netns.sh isolate) while the
#                           clients still reach it
#   SIMBA_SERVER_OWNER_PID  a PID (or "parent" for the caller of this script):
#                           a watchdog stops the server once that process is
#                           gone, so a test binary that crashes or a ctest
#                           that is interrupted leaks no server.
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=redis
server_name=redis-server
server_comm=redis-server
usage_args="[--tls CERTS [--tls-cert-name NAME]] [redis-server args...]"
# redis-server writes its own log (--logfile); its stdio goes nowhere.
server_output=/dev/null

user=simba
password=simba-acl-secret

tls_src=""
tls_cert_name=server
tls_args=()
cli_args=()

# `--tls CERTS [--tls-cert-name NAME]` first after DIR, then the server's args.
parse_args() {
  if [ "${1:-}" = --tls ]; then
    [ $# -ge 2 ] || usage
    tls_src="$(mkdir -p "$2" && cd "$2" && pwd -P)"
    shift 2
    if [ "${1:-}" = --tls-cert-name ]; then
      [ $# -ge 2 ] || usage
      tls_cert_name="$2"
      shift 2
    fi
  fi
  extra=("$@")
}

# With --tls CERTS: the certificates in DIR/tls (made first by test-ca.sh if
# missing), the server's TLS and ACL settings, and our client's.
prepare_start() {
  tls_args=()
  cli_args=()
  [ -n "$tls_src" ] || return 0
  bash "$(dirname "$script")/test-ca.sh" "$tls_src"
  if [ ! -s "$tls_src/$tls_cert_name-cert.pem" ] || [ ! -s "$tls_src/$tls_cert_name-key.pem" ]; then
    echo "redis.sh: no $tls_cert_name-cert.pem and $tls_cert_name-key.pem in $tls_src" >&2
    exit 1
  fi
  mkdir -p "$dir/tls"
  cp "$tls_src/ca.pem" "$tls_src/client-cert.pem" "$tls_src/client-key.pem" "$dir/tls/"
  cp "$tls_src/$tls_cert_name-cert.pem" "$dir/tls/server-cert.pem"
  cp "$tls_src/$tls_cert_name-key.pem" "$dir/tls/server-key.pem"
  tls_args=(--tls-cert-file "$dir/tls/server-cert.pem" --tls-key-file "$dir/tls/server-key.pem"
    --tls-ca-cert-file "$dir/tls/ca.pem" --tls-auth-clients optional
    --user default on resetpass ">$password" '~*' '&*' +@all
    --user "$user" on ">$password" '~*' '&*' +@all)
  cli_args=(--tls --cacert "$dir/tls/ca.pem" --cert "$dir/tls/client-cert.pem"
    --key "$dir/tls/client-key.pem" --user "$user" --pass "$password" --no-auth-warning)
  # A certificate other than the good one would not verify: the readiness
  # check still encrypts, but trusts the PID check below alone.
  if [ "$tls_cert_name" != server ]; then cli_args+=(--insecure); fi
}

# A node of a --cluster topology (DIR/cluster.conf, written by the
# topology's start) has a second port, its cluster bus (DIR/bus_port),
# picked with the first and kept on a restart: the other nodes know both.
bus_port=""
saved_ports() {
  [ -f "$dir/cluster.conf" ] || return 0
  [ -s "$dir/bus_port" ] || return 1
  bus_port="$(cat "$dir/bus_port")"
}
more_ports() {
  if [ -f "$dir/cluster.conf" ]; then bus_port="$(pick_port "$1")"; fi
}
save_ports() {
  if [ -n "$bus_port" ]; then echo "$bus_port" >"$dir/bus_port"; fi
}
ports_text() {
  echo "port $1${bus_port:+ or $bus_port}"
}
# A first start that failed may have left a node table with other ports.
forget_first_start() {
  rm -f "$dir/nodes.conf"
}

server_command() {
  local ports=(--port "$1") conf=() host
  host="$(member_host)"
  # A member of a lab runs in its host's namespace (`ip netns exec` execs:
  # the PID stays the server's).
  server_cmd=()
  if [ -s "$dir/netns" ]; then server_cmd=(ip netns exec "$(cat "$dir/netns")"); fi
  if [ -f "$dir/sentinel.conf" ]; then
    # A sentinel of a --sentinel topology: its configuration (which it
    # rewrites as it learns) is in DIR/sentinel.conf.
    server_cmd+=(redis-server "$dir/sentinel.conf" --sentinel
      --bind "$host" --port "$1" --dir "$dir" --protected-mode no --logfile "$log_file")
    return
  fi
  if [ -n "$tls_src" ]; then ports=(--port 0 --tls-port "$1"); fi
  # A node of a --cluster topology: its cluster settings (a configuration
  # file comes first) and its bus port.
  if [ -f "$dir/cluster.conf" ]; then conf=("$dir/cluster.conf" --cluster-port "$bus_port"); fi
  server_cmd+=(redis-server "${conf[@]}"
    --bind "$host" "${ports[@]}" --dir "$dir"
    --save "" --appendonly no --protected-mode no
    --logfile "$log_file"
    "${tls_args[@]}" "${extra[@]}")
}

# Our own server, not another one on the same port, and done loading its
# data (a loading server answers PING with -LOADING).
server_ready() {
  local port="$1" pid="$2" info host
  host="$(member_host)"
  info="$(timeout 2 redis-cli -h "$host" -p "$port" "${cli_args[@]}" info server 2>/dev/null |
    tr -d '\r' || true)"
  grep -qx "process_id:$pid" <<<"$info" &&
    [ "$(timeout 2 redis-cli -h "$host" -p "$port" "${cli_args[@]}" ping 2>/dev/null |
      tr -d '\r')" = PONG ]
}

server_uri() {
  if [ -n "$tls_src" ]; then
    echo "rediss://$user:$password@127.0.0.1:$1?tls_ca=$dir/tls/ca.pem"
  else
    echo "redis://$(member_host):$1"
  fi
}

# ---------------------------------------------------------------------------
# --sentinel: a primary, a replica and three sentinels, each member a server
# directory of this script's own (DIR/n1, DIR/n2, DIR/s1..s3).

sentinel_members="s1 s2 s3"
data_members="n1 n2"
master_name=simba

topology_dir() {
  [ -s "$1/topology" ]
}

member_port() {
  cat "$dir/$1/port" 2>/dev/null || true
}

# "HOST:PORT" of member $1.
member_addr() {
  echo "$(member_host "$dir/$1"):$(member_port "$1")"
}

# With SIMBA_NETNS=LAB (scripts/servers/netns.sh), members on hosts of that
# lab: "MEMBER HOST_NUMBER..." pairs, written to DIR/MEMBER/host and
# DIR/MEMBER/netns before the first start (a restart finds them).
place_members() {
  [ -n "${SIMBA_NETNS:-}" ] || return 0
  while [ $# -ge 2 ]; do
    place_on_lab_host "$dir/$1" "$2"
    shift 2
  done
}

# "HOST PORT" of the primary by the first sentinel that answers, or nothing.
sentinel_primary_addr() {
  local s port out
  for s in $sentinel_members; do
    port="$(member_port "$s")"
    [ -n "$port" ] || continue
    out="$(timeout 2 redis-cli -h "$(member_host "$dir/$s")" -p "$port" sentinel get-master-addr-by-name \
      "$master_name" 2>/dev/null | tr -d '\r' | paste -sd' ' || true)"
    if [[ "$out" =~ ^[0-9.]+\ [0-9]+$ ]]; then
      echo "$out"
      return 0
    fi
  done
  return 1
}

# The data member at "HOST:PORT" $1 (ports alone are not unique in a lab:
# each host picks its own).
member_at() {
  local n
  for n in $data_members; do
    if [ "$(member_addr "$n")" = "$1" ]; then
      echo "$n"
      return 0
    fi
  done
  return 1
}

# MEMBER: n1, n2, s1, s2, s3, or primary / replica (the data members as the
# sentinels see them now).
resolve_member() {
  local addr p n
  case "$1" in
    n1 | n2 | s1 | s2 | s3) echo "$1" ;;
    primary | replica)
      addr="$(sentinel_primary_addr)" || {
        echo "redis.sh: no sentinel in $dir names a primary" >&2
        exit 1
      }
      p="$(member_at "${addr% *}:${addr##* }")" || {
        echo "redis.sh: the sentinels name $addr, not a member of $dir" >&2
        exit 1
      }
      if [ "$1" = primary ]; then echo "$p"; else
        for n in $data_members; do [ "$n" = "$p" ] || echo "$n"; done
      fi
      ;;
    *)
      echo "redis.sh: no member '$1' (n1, n2, s1, s2, s3, primary, replica)" >&2
      exit 2
      ;;
  esac
}

member_script() {
  bash "$script" "$@"
}

# What an earlier start left in DIR (an interrupted run): the members of a
# topology of either kind, the sentinels first, or a single server.
leftover_stop() {
  local m
  if topology_dir "$dir"; then
    for m in $sentinel_members n1 n2 n3 n4 n5 n6; do
      [ ! -d "$dir/$m" ] || member_script stop "$dir/$m"
    done
  elif [ -s "$dir/pid" ]; then
    member_script stop "$dir"
  fi
}

# Starts data member $1 (again): the first start of n1 is the primary; any
# other start replicates the primary the sentinels name (n2's first start:
# n1).
start_data_member() {
  local n="$1" args=() addr
  if [ -s "$dir/$n/port" ] || [ "$n" = n2 ]; then
    if addr="$(sentinel_primary_addr)" && [ "${addr% *}:${addr##* }" != "$(member_addr "$n")" ]; then
      args=(--replicaof "${addr% *}" "${addr##* }")
    elif [ "$n" = n2 ] && [ ! -s "$dir/$n/port" ]; then
      args=(--replicaof "$(member_host "$dir/n1")" "$(member_port n1)")
    fi
  fi
  # No 5 s wait for more replicas before a full sync.
  member_script start "$dir/$n" --repl-diskless-sync-delay 0 "${extra[@]}" "${args[@]}" >/dev/null
}

sentinel_id() {
  echo "$1" | sha1sum | cut -c1-40
}

# Sentinel $1's configuration: the primary, and (so that it need not wait for
# the hello messages, every 2 s) the replica and the other sentinels, whose
# ports were picked before any started.
write_sentinel_conf() {
  local s="$1" o
  {
    echo "sentinel myid $(sentinel_id "$dir/$s")"
    echo "sentinel monitor $master_name $(member_host "$dir/n1") $(member_port n1) 2"
    echo "sentinel down-after-milliseconds $master_name $down_after_ms"
    echo "sentinel failover-timeout $master_name $failover_timeout_ms"
    echo "sentinel parallel-syncs $master_name 1"
    echo "sentinel known-replica $master_name $(member_host "$dir/n2") $(member_port n2)"
    for o in $sentinel_members; do
      [ "$o" = "$s" ] ||
        echo "sentinel known-sentinel $master_name $(member_host "$dir/$o") $(member_port "$o") $(sentinel_id "$dir/$o")"
    done
  } >"$dir/$s/sentinel.conf"
}

# Starts the sentinels on ports picked together (each one's configuration
# names the others). A port another process took after it was picked (tests
# start topologies side by side) fails that start with "is taken": the
# sentinels are then stopped and started again on ports picked anew.
start_sentinels() {
  local s try err="$dir/sentinel-start.err"
  for try in 1 2 3 4 5; do
    for s in $sentinel_members; do
      # What a failed try left; its place in a lab (host, netns) stays.
      mkdir -p "$dir/$s"
      find "$dir/$s" -mindepth 1 -maxdepth 1 ! -name host ! -name netns -exec rm -rf {} +
      pick_port >"$dir/$s/port"
    done
    for s in $sentinel_members; do write_sentinel_conf "$s"; done
    : >"$err"
    for s in $sentinel_members; do
      member_script start "$dir/$s" >/dev/null 2>"$err" || break
      : >"$err"
    done
    if [ ! -s "$err" ]; then
      rm -f "$err"
      return 0
    fi
    for s in $sentinel_members; do member_script stop "$dir/$s" 2>/dev/null || true; done
    grep -q "is taken" "$err" || break
    echo "redis.sh: a sentinel's port was taken as it started (try $try); picking new ports" >&2
  done
  cat "$err" >&2
  rm -f "$err"
  return 1
}

# `SENTINEL master` field $2 as sentinel $1 sees it.
sentinel_field() {
  timeout 2 redis-cli -h "$(member_host "$dir/$1")" -p "$(member_port "$1")" sentinel master "$master_name" \
    2>/dev/null | tr -d '\r' | sed -n "/^$2\$/{n;p;q}"
}

topology_start() {
  local s deadline ok
  [ -z "$tls_src" ] || {
    echo "redis.sh: --sentinel does not take --tls" >&2
    exit 2
  }
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
  leftover_stop
  echo sentinel >"$dir/topology"
  # A fresh topology each start: the sentinels' state names ports of the
  # last one.
  rm -rf "$dir/n1" "$dir/n2" "$dir/s1" "$dir/s2" "$dir/s3"
  # The data nodes' args, for their restarts (`restart DIR n1`).
  : >"$dir/args"
  if [ ${#extra[@]} -gt 0 ]; then printf '%s\0' "${extra[@]}" >"$dir/args"; fi
  # In a lab, three hosts: the primary and a sentinel, the replica and a
  # sentinel, the third sentinel. Cut off, either data node's host is a
  # minority of the sentinels.
  place_members n1 1 s1 1 n2 2 s2 2 s3 3
  start_data_member n1
  start_data_member n2
  start_sentinels || {
    topology_stop
    exit 1
  }
  # Ready when every sentinel knows the replica and the other two (a
  # failover needs a majority of the sentinels they know) and the replica
  # has synced.
  deadline=$((SECONDS + 30))
  while :; do
    ok=1
    for s in $sentinel_members; do
      [ "$(sentinel_field "$s" num-slaves)" = 1 ] &&
        [ "$(sentinel_field "$s" num-other-sentinels)" = 2 ] || ok=0
    done
    if [ "$ok" = 1 ] && timeout 2 redis-cli -h "$(member_host "$dir/n2")" -p "$(member_port n2)" info replication \
      2>/dev/null | tr -d '\r' | grep -qx 'master_link_status:up'; then
      break
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redis.sh: the sentinels in $dir did not see the replica and each other within 30 s" >&2
      topology_stop
      exit 1
    fi
    sleep 0.1
  done
  member_port s1 >"$dir/port"
  echo "redis-sentinel://$(member_addr s1),$(member_addr s2),$(member_addr s3)/$master_name" >"$dir/uri"
  cat "$dir/uri"
}

topology_stop() {
  local m
  # The sentinels first, so that stopping the primary starts no failover.
  for m in $sentinel_members $data_members; do
    [ ! -d "$dir/$m" ] || member_script stop "$dir/$m"
  done
}

topology_status() {
  local m st rc=0 addr
  addr="$(sentinel_primary_addr || true)"
  for m in $data_members $sentinel_members; do
    st="$(member_script status "$dir/$m" 2>/dev/null || true)"
    if [ "$st" = stopped ] || [ -z "$st" ]; then rc=3; fi
    echo "$m $(member_addr "$m") ${st%% redis*}$([ "${addr% *}:${addr##* }" = "$(member_addr "$m")" ] &&
      echo ' primary')"
  done
  return "$rc"
}

topology_usage() {
  cat >&2 <<USAGE
usage: redis.sh start DIR --sentinel [redis-server args for the data nodes...]
       redis.sh stop|status|uri|primary DIR
       redis.sh kill|pause|resume|stop|restart|member|drop-replicas DIR MEMBER   (n1 n2 s1 s2 s3 primary replica)
       redis.sh failover|settle DIR
USAGE
  exit 2
}

topology_main() {
  local cmd="$1" m
  dir="$(cd "$2" && pwd -P)"
  shift 2
  down_after_ms="${SIMBA_SENTINEL_DOWN_AFTER_MS:-1000}"
  failover_timeout_ms="${SIMBA_SENTINEL_FAILOVER_TIMEOUT_MS:-3000}"
  # A data node started again gets the args the topology started with.
  if [ "$cmd" != start ] && [ -s "$dir/args" ]; then mapfile -d '' extra <"$dir/args"; fi
  case "$cmd" in
    start)
      [ $# -eq 0 ] || topology_usage
      topology_start
      ;;
    stop)
      if [ $# -eq 0 ]; then topology_stop; return; fi
      [ $# -eq 1 ] || topology_usage
      # Assigned first: a member that does not resolve ends the script here.
      m="$(resolve_member "$1")"
      member_script stop "$dir/$m"
      ;;
    status) topology_status ;;
    uri) cat "$dir/uri" ;;
    primary)
      m="$(resolve_member primary)"
      echo "$m $(member_addr "$m")"
      ;;
    member)
      [ $# -eq 1 ] || topology_usage
      m="$(resolve_member "$1")"
      echo "$m"
      ;;
    drop-replicas)
      [ $# -eq 1 ] || topology_usage
      m="$(resolve_member "$1")"
      drop_replicas "$m"
      ;;
    failover)
      [ $# -eq 0 ] || topology_usage
      sentinel_failover
      ;;
    settle)
      [ $# -eq 0 ] || topology_usage
      sentinel_settle
      ;;
    kill | pause | resume)
      [ $# -eq 1 ] || topology_usage
      m="$(resolve_member "$1")"
      member_script "$cmd" "$dir/$m"
      ;;
    restart)
      [ $# -eq 1 ] || topology_usage
      m="$(resolve_member "$1")"
      case "$m" in
        n*) start_data_member "$m" ;;
        *) member_script start "$dir/$m" >/dev/null ;;
      esac
      ;;
    *) topology_usage ;;
  esac
}

# ---------------------------------------------------------------------------
# --cluster: three primaries and a replica of each, each member a server
# directory of this script's own (DIR/n1..n6) with a cluster.conf.
#
# The cluster is built by hand (CLUSTER SET-CONFIG-EPOCH, ADDSLOTSRANGE,
# MEET, REPLICATE), not by `redis-cli --cluster create`: on one host that
# pairs replicas with primaries at random, and tests want to know that n4
# replicates n1.

cluster_members="n1 n2 n3 n4 n5 n6"

# The slots of primary $1 at the start (as redis-cli splits them).
first_slots() {
  case "$1" in
    n1) echo "0 5460" ;;
    n2) echo "5461 10922" ;;
    n3) echo "10923 16383" ;;
  esac
}

# The primary of replica $1 at the start.
first_primary() {
  case "$1" in
    n4) echo n1 ;;
    n5) echo n2 ;;
    n6) echo n3 ;;
  esac
}

# redis-cli on member $1 (its \r dropped): fails if it does not answer in
# 2 s. An error reply is output too: callers compare with what they expect.
member_cli() {
  local port host
  port="$(member_port "$1")"
  host="$(member_host "$dir/$1")"
  shift
  [ -n "$port" ] || return 1
  timeout 2 redis-cli -h "$host" -p "$port" "$@" 2>/dev/null | tr -d '\r'
}

# CLIENT KILL TYPE replica on member $1: its replicas' links drop. A replica
# that is paused (SIGSTOP) cannot reconnect, so what $1 writes from here on
# reaches none of them: replication lag on demand (what was sent before
# still sits in the paused replica's socket and is read when it resumes).
drop_replicas() {
  local out
  out="$(member_cli "$1" client kill type replica)" || true
  case "$out" in
    '' | *[!0-9]*)
      echo "redis.sh: CLIENT KILL TYPE replica on $1: ${out:-no answer}" >&2
      return 1
      ;;
  esac
  echo "$out"
}

# Waits (until SECONDS is $1, or 40 s) for every sentinel to name the same
# primary and the other data member to replicate it with its link up: after
# a failover, an old primary that comes back stays a primary of its own for
# seconds before the sentinels make it a replica.
sentinel_settle() {
  local deadline="${1:-$((SECONDS + 40))}" s addr first agree named replica
  while :; do
    named="" first="" agree=1
    for s in $sentinel_members; do
      addr="$(timeout 2 redis-cli -h "$(member_host "$dir/$s")" -p "$(member_port "$s")" \
        sentinel get-master-addr-by-name "$master_name" 2>/dev/null | tr -d '\r' | paste -sd' ' ||
        true)"
      named+="${named:+, }${addr:-nothing}"
      first="${first:-$addr}"
      if ! [[ "$addr" =~ ^[0-9.]+\ [0-9]+$ ]] || [ "$addr" != "$first" ]; then agree=0; fi
    done
    if [ "$agree" = 1 ] && replica="$( (resolve_member replica) 2>/dev/null)" &&
      member_cli "$replica" info replication | grep -qx master_link_status:up; then
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redis.sh: $dir did not settle (one primary the sentinels agree on, a replica in sync) within 40 s: the sentinels name $named" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# SENTINEL FAILOVER on the first sentinel that takes it: prints its reply
# (OK, or why not, e.g. -INPROG while a failover is under way).
ask_sentinel_failover() {
  local s port reply=""
  for s in $sentinel_members; do
    port="$(member_port "$s")"
    [ -n "$port" ] || continue
    reply="$(timeout 2 redis-cli -h "$(member_host "$dir/$s")" -p "$port" sentinel failover "$master_name" \
      2>/dev/null | tr -d '\r')" || reply=""
    [ "$reply" != OK ] || break
  done
  echo "${reply:-no sentinel answered}"
}

# A planned failover: once the topology has settled (sentinel_settle:
# SENTINEL FAILOVER wants a replica in sync, and a failover of the
# sentinels' own may still be under way after an earlier fault), SENTINEL
# FAILOVER, asked again every 6 s
# while the sentinels still name the old primary; then waits until the
# other data member says role:master and the old primary replicates it
# with its link up, so the next fault finds a replica to promote. 40 s in
# all. Prints the new primary's name.
sentinel_failover() {
  local old="" new reply="" deadline=$((SECONDS + 40)) ask_at=0
  sentinel_settle "$deadline"
  old="$(resolve_member primary)"
  until new="$( (resolve_member primary) 2>/dev/null)" && [ "$new" != "$old" ] &&
    member_cli "$new" info replication | grep -qx role:master &&
    member_cli "$old" info replication | grep -qx master_link_status:up; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redis.sh: $dir did not fail over from $old within 40 s (SENTINEL FAILOVER: $reply)" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$ask_at" ] && [ "${new:-$old}" = "$old" ]; then
      reply="$(ask_sentinel_failover)"
      ask_at=$((SECONDS + 6))
    fi
    sleep 0.1
  done
  echo "$new"
}

# True if member $1 runs and is not paused (a paused one answers nobody).
member_serving() {
  local pid state
  pid="$(cat "$dir/$1/pid" 2>/dev/null || true)"
  server_alive "$pid" || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)"
  [ "$state" != T ]
}

# CLUSTER NODES of the first member that serves, or nothing.
any_view() {
  local m
  for m in $cluster_members; do
    if member_serving "$m" && member_cli "$m" cluster nodes; then return 0; fi
  done
  return 1
}

# From CLUSTER NODES on stdin, the node at "HOST:PORT" $1: "primary
# SLOTS..." or "replica HOST:PORT" (its primary's), then "(FLAGS)" if it is
# failing, in a handshake or without an address.
nodes_role() {
  awk -v addr="$1" '
    { split($2, a, "[:@,]"); addr_of[$1] = a[1] ":" a[2]; line[NR] = $0 }
    END {
      for (i = 1; i <= NR; i++) {
        n = split(line[i], f, " ")
        split(f[2], a, "[:@,]")
        if (a[1] ":" a[2] != addr) continue
        if (f[3] ~ /master/) {
          out = "primary"
          for (j = 9; j <= n; j++) if (f[j] !~ /^\[/) out = out " " f[j]
        } else if (f[3] ~ /slave/) {
          out = "replica " addr_of[f[4]]
        } else {
          out = "unknown"
        }
        if (f[3] ~ /fail|handshake|noaddr/) out = out " (" f[3] ")"
        print out
        exit
      }
    }'
}

# From CLUSTER NODES on stdin, "EPOCH HOST:PORT ID" of the primary that
# owns slot $1, or nothing.
nodes_slot_owner() {
  awk -v slot="$1" '
    $3 ~ /master/ && $3 !~ /handshake|noaddr/ {
      for (j = 9; j <= NF; j++) {
        if ($j ~ /^\[/) continue  # a slot being migrated
        n = split($j, r, "-")
        if (slot >= r[1] + 0 && slot <= r[n] + 0) {
          split($2, a, "[:@,]")
          print $7, a[1] ":" a[2], $1
          exit
        }
      }
    }'
}

# "EPOCH HOST:PORT ID" of the primary of slot $1 now: of the claims of the
# members that serve, the one of the highest config epoch (Redis Cluster's
# own rule: right after a failover, some nodes still name the old primary).
slot_owner() {
  local m claim best=""
  for m in $cluster_members; do
    member_serving "$m" || continue
    claim="$(member_cli "$m" cluster nodes | nodes_slot_owner "$1")" || continue
    [ -n "$claim" ] || continue
    if [ -z "$best" ] || [ "${claim%% *}" -gt "${best%% *}" ]; then best="$claim"; fi
  done
  if [ -z "$best" ]; then
    echo "redis.sh: no member of $dir names a primary of slot $1" >&2
    return 1
  fi
  echo "$best"
}

check_slot() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -gt 16383 ]; then
    echo "redis.sh: no slot '$1' (0 to 16383)" >&2
    exit 2
  fi
}

# MEMBER: n1..n6, or primary-of-SLOT / replica-of-SLOT (the primary of
# SLOT now, and the first member that replicates it).
cluster_member() {
  local slot owner addr id
  case "$1" in
    n[1-6]) echo "$1" ;;
    primary-of-* | replica-of-*)
      slot="${1#*-of-}"
      check_slot "$slot"
      owner="$(slot_owner "$slot")" || exit 1
      addr="${owner#* }"
      addr="${addr%% *}"
      id="${owner##* }"
      if [ "${1%%-*}" = replica ]; then
        addr="$(any_view | awk -v id="$id" '$3 ~ /slave/ && $4 == id {
          split($2, a, "[:@,]"); print a[1] ":" a[2]; exit }')"
        if [ -z "$addr" ]; then
          echo "redis.sh: the primary of slot $slot in $dir has no replica" >&2
          exit 1
        fi
      fi
      member_at "$addr" || {
        echo "redis.sh: $addr is not a member of $dir" >&2
        exit 1
      }
      ;;
    *)
      echo "redis.sh: no member '$1' (n1..n6, primary-of-SLOT, replica-of-SLOT)" >&2
      exit 2
      ;;
  esac
}

# The start args (DIR/args, NUL-separated) of every member.
cluster_args() {
  margs=()
  if [ -s "$dir/args" ]; then mapfile -d '' margs <"$dir/args"; fi
}

# Starts member $1 (again): its ports and nodes.conf are kept.
start_cluster_member() {
  local margs
  cluster_args
  member_script start "$dir/$1" "${margs[@]}" >/dev/null
}

# Empty if member $1 is a whole part of the cluster; otherwise what it
# lacks (for the message): cluster_state:ok, all six nodes in its table
# with three primaries of slots and three replicas (so that a failover
# finds its voters), and, for a replica, a synced link to its primary.
cluster_member_lacks() {
  local info nodes
  info="$(member_cli "$1" cluster info)" || { echo "it does not answer"; return; }
  grep -qx cluster_state:ok <<<"$info" || { echo "its cluster_state is not ok"; return; }
  nodes="$(member_cli "$1" cluster nodes)" || { echo "it does not answer"; return; }
  if ! awk '$3 ~ /fail|handshake|noaddr/ { bad++ } $3 ~ /master/ && NF > 8 { p++ }
    $3 ~ /slave/ { r++ } END { exit !(p == 3 && r == 3 && !bad) }' <<<"$nodes"; then
    echo "it does not see three primaries and three replicas yet"
    return
  fi
  info="$(member_cli "$1" info replication)" || { echo "it does not answer"; return; }
  if grep -qx role:slave <<<"$info" && ! grep -qx master_link_status:up <<<"$info"; then
    echo "its link to its primary is not up"
  fi
}

# A failed start: the message $1, the log tail of member $2 (if any); the
# EXIT trap of cluster_start stops every member.
cluster_fail() {
  echo "redis.sh: $1" >&2
  if [ -n "${2:-}" ] && [ -s "$dir/$2/redis.log" ]; then
    tail -n 10 "$dir/$2/redis.log" | sed "s/^/$2: /" >&2
  fi
  exit 1
}

cluster_start() {
  local m i=0 lo hi id reply deadline lack
  [ -z "$tls_src" ] || {
    echo "redis.sh: --cluster does not take --tls" >&2
    exit 2
  }
  leftover_stop
  # From here on, a failure (or an interrupt) leaves nothing running.
  trap 'cluster_stop' EXIT
  echo cluster >"$dir/topology"
  # A fresh cluster each start: old node tables name old ports and IDs.
  rm -rf "$dir"/n[1-6] "$dir"/s[1-3] "$dir/uri" "$dir/port"
: >"$dir/args"
  if [ ${#extra[@]} -gt 0 ]; then printf '%s\0' "${extra[@]}" >"$dir/args"; fi
  deadline=$((SECONDS + cluster_start_timeout))
  # In a lab, a host per node.
  place_members n1 1 n2 2 n3 3 n4 4 n5 5 n6 6
  for m in $cluster_members; do
    mkdir -p "$dir/$m"
    # No 5 s wait for more replicas before a full sync.
    cat >"$dir/$m/cluster.conf" <<CONF
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout $node_timeout_ms
repl-diskless-sync-delay 0
CONF
    start_cluster_member "$m" || cluster_fail "member $m of $dir did not start" "$m"
  done
  # Distinct config epochs (as redis-cli gives them), the slots, then one
  # node table: n1 meets every other node, gossip does the rest.
  for m in $cluster_members; do
    i=$((i + 1))
    reply="$(member_cli "$m" cluster set-config-epoch "$i")" || reply=""
    [ "$reply" = OK ] || cluster_fail "CLUSTER SET-CONFIG-EPOCH on member $m of $dir: $reply" "$m"
  done
  for m in n1 n2 n3; do
    read -r lo hi <<<"$(first_slots "$m")"
    reply="$(member_cli "$m" cluster addslotsrange "$lo" "$hi")" || reply=""
    [ "$reply" = OK ] || cluster_fail "CLUSTER ADDSLOTSRANGE on member $m of $dir: $reply" "$m"
  done
  for m in n2 n3 n4 n5 n6; do
    reply="$(member_cli n1 cluster meet "$(member_host "$dir/$m")" "$(member_port "$m")" "$(cat "$dir/$m/bus_port")")" ||
      reply=""
    [ "$reply" = OK ] || cluster_fail "CLUSTER MEET of member $m of $dir: $reply" n1
  done
  # A replica can follow a primary once it knows it ("Unknown node" before).
  # Each replica meets its primary itself: learning it by gossip through n1
  # took more than 8 s on a loaded CI machine.
  for m in n4 n5 n6; do
    reply="$(member_cli "$m" cluster meet "$(member_host "$dir/$(first_primary "$m")")" \
      "$(member_port "$(first_primary "$m")")" "$(cat "$dir/$(first_primary "$m")/bus_port")")" || reply=""
    [ "$reply" = OK ] || cluster_fail "CLUSTER MEET of member $(first_primary "$m") by $m of $dir: $reply" "$m"
  done
  for m in n4 n5 n6; do
    id="$(member_cli "$(first_primary "$m")" cluster myid)" || id=""
    while :; do
      reply="$(member_cli "$m" cluster replicate "$id")" || reply=""
      [ "$reply" != OK ] || break
      if [ "$SECONDS" -ge "$deadline" ]; then
        cluster_fail "member $m of $dir could not replicate $(first_primary "$m") within $cluster_start_timeout s: $reply" "$m"
      fi
      sleep 0.1
    done
  done
  cluster_settle "$deadline" "was not ready within $cluster_start_timeout s"
  trap - EXIT
  member_port n1 >"$dir/port"
  echo "redis-cluster://$(member_addr n1),$(member_addr n2),$(member_addr n3)" >"$dir/uri"
  cat "$dir/uri"
}

# Waits until SECONDS is $1 for every member to lack nothing
# (cluster_member_lacks); past it, cluster_fail with "$2".
cluster_settle() {
  local m lack
  while :; do
    lack=""
    for m in $cluster_members; do
      lack="$(cluster_member_lacks "$m")"
      if [ -n "$lack" ]; then break; fi
    done
    [ -n "$lack" ] || return 0
    if [ "$SECONDS" -ge "$1" ]; then
      cluster_fail "the cluster in $dir $2: member $m: $lack" "$m"
    fi
    sleep 0.1
  done
}

# Every member at once (one after the other, a primary stopped first
# could see its replica take over).
cluster_stop() {
  local m pids=() rc=0 pid
  for m in $cluster_members; do
    if [ -d "$dir/$m" ]; then
      member_script stop "$dir/$m" &
      pids+=("$!")
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return "$rc"
}

cluster_status() {
  local m st rc=0 addr view role
  for m in $cluster_members; do
    addr="$(member_addr "$m")"
    st="$(member_script status "$dir/$m" 2>/dev/null || true)"
    if [ "$st" = stopped ] || [ -z "$st" ]; then
      rc=3
      st=stopped
    else
      st="${st%% redis*}"
    fi
    # A member's role as it sees itself; a stopped or paused one's as
    # another member sees it.
    if member_serving "$m"; then view="$(member_cli "$m" cluster nodes || true)"; else
      [ "$st" = stopped ] || st="$st paused"
      view="$(any_view || true)"
    fi
    role="$(nodes_role "$addr" <<<"$view")"
    if [[ "$role" =~ ^replica\ ([^ ]*)(.*)$ ]]; then
      role="replica of $(member_at "${BASH_REMATCH[1]}" ||
        echo "${BASH_REMATCH[1]:-?}")${BASH_REMATCH[2]}"
    fi
    echo "$m $addr $st${role:+ $role}"
  done
  return "$rc"
}

# Runs CLUSTER FAILOVER [FORCE|TAKEOVER] on the replica $1 and waits until
# it is a primary of slots.
cluster_failover() {
  local m="$1" reply deadline ask_again role
  shift
  role="$(member_cli "$m" cluster nodes | nodes_role "$(member_addr "$m")")" || role=""
  if [[ "$role" != replica* ]]; then
    echo "redis.sh: member $m of $dir is not a replica (${role:-it does not answer})" >&2
    exit 1
  fi
  reply="$(member_cli "$m" cluster failover "$@")" || reply=""
  if [ "$reply" != OK ]; then
    echo "redis.sh: CLUSTER FAILOVER $* on member $m of $dir: ${reply:-no answer}" >&2
    exit 1
  fi
  # A graceful failover gives up after 5 s (the primary does not answer,
  # or the other primaries do not vote yet for a replica that has just
  # rejoined, as a loaded CI machine showed): ask again after 6 s.
  deadline=$((SECONDS + 20))
  ask_again=$((SECONDS + 6))
  until [[ "$(member_cli "$m" cluster nodes | nodes_role "$(member_addr "$m")")" == primary\ [0-9]* ]]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redis.sh: member $m of $dir was not a primary within 20 s of CLUSTER FAILOVER $*" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$ask_again" ]; then
      member_cli "$m" cluster failover "$@" >/dev/null || true
      ask_again=$((SECONDS + 6))
    fi
    sleep 0.1
  done
}

cluster_usage() {
  cat >&2 <<USAGE
usage: redis.sh start DIR --cluster [redis-server args for every node...]
       redis.sh stop|status|uri|settle DIR
       redis.sh primary-of DIR SLOT
       redis.sh kill|pause|resume|stop|restart|member|drop-replicas DIR MEMBER
       redis.sh failover DIR MEMBER [FORCE|TAKEOVER]
  MEMBER: n1..n6, primary-of-SLOT, replica-of-SLOT
USAGE
  exit 2
}

cluster_main() {
  local cmd="$1" m owner addr
  dir="$(cd "$2" && pwd -P)"
  shift 2
  # The members member_at looks at.
  data_members="$cluster_members"
  node_timeout_ms="${SIMBA_CLUSTER_NODE_TIMEOUT_MS:-1000}"
  # Six starts and the handshakes on a loaded 2-core machine (CI's fault
  # stage runs four topologies at once) took more than 15 s.
  cluster_start_timeout=30
  # The watchdogs of the members started (or restarted) here watch our
  # caller, not this script.
  if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
  case "$cmd" in
    start) cluster_start ;;
    stop)
      if [ $# -eq 0 ]; then cluster_stop; return; fi
      [ $# -eq 1 ] || cluster_usage
      m="$(cluster_member "$1")"
      member_script stop "$dir/$m"
      ;;
    status) cluster_status ;;
    uri) cat "$dir/uri" ;;
    primary-of)
      [ $# -eq 1 ] || cluster_usage
      check_slot "$1"
      owner="$(slot_owner "$1")"
      addr="${owner#* }"
      addr="${addr%% *}"
      echo "$(member_at "$addr" || echo "?") $addr"
      ;;
    member)
      [ $# -eq 1 ] || cluster_usage
      m="$(cluster_member "$1")"
      echo "$m"
      ;;
    drop-replicas)
      [ $# -eq 1 ] || cluster_usage
      m="$(cluster_member "$1")"
      drop_replicas "$m"
      ;;
    kill | pause | resume)
      [ $# -eq 1 ] || cluster_usage
      m="$(cluster_member "$1")"
      member_script "$cmd" "$dir/$m"
      ;;
    restart)
      [ $# -eq 1 ] || cluster_usage
      m="$(cluster_member "$1")"
      start_cluster_member "$m"
      ;;
    settle)
      [ $# -eq 0 ] || cluster_usage
      cluster_settle $((SECONDS + 40)) "did not settle within 40 s"
      ;;
    failover)
      if [ $# -lt 1 ] || [ $# -gt 2 ]; then cluster_usage; fi
      m="$(cluster_member "$1")"
      cluster_failover "$m" "${@:2}"
      ;;
    *) cluster_usage ;;
  esac
}

# `start DIR --sentinel|--cluster ...` (the flag anywhere after DIR), or any
# command on a DIR that holds a topology.
if [ $# -ge 2 ]; then
  if [ "$1" = start ] && [[ " ${*:3} " == *" --cluster "* ]]; then
    if [[ " ${*:3} " == *" --sentinel "* ]]; then
      echo "redis.sh: --cluster and --sentinel are two topologies: pick one" >&2
      exit 2
    fi
    cmd_args=()
    for a in "${@:3}"; do [ "$a" = --cluster ] || cmd_args+=("$a"); done
    mkdir -p "$2"
    parse_args "${cmd_args[@]}"
    cluster_main start "$2"
    exit
  fi
  if [ "$1" = start ] && [[ " ${*:3} " == *" --sentinel "* ]]; then
    cmd_args=()
    for a in "${@:3}"; do [ "$a" = --sentinel ] || cmd_args+=("$a"); done
    mkdir -p "$2"
    parse_args "${cmd_args[@]}"
    topology_main start "$2"
    exit
  fi
  if [ "$1" != watch ] && topology_dir "$2"; then
    parse_args
    if [ "$(cat "$2/topology")" = cluster ]; then cluster_main "$@"; else topology_main "$@"; fi
    exit
  fi
fi

server_main "$@"
