#!/usr/bin/env bash
# Starts and stops a private etcd (a cluster of one member) for Simba's
# tests: bound to 127.0.0.1, on two free ports (client and peer), with its
# data directory (DIR/data), log, pid, port, peer_port and uri files in DIR.
# Every process is addressed by the PID recorded in DIR, never by name, so
# servers of other people or other test runs are left alone. The commands
# are scripts/servers/common.sh's; this script says how etcd runs.
#
#   etcd.sh start DIR [--tls CERTS [--client-cert-auth] [--expired-cert]]
#                [--auth] [etcd args...]
#                        start (again) and print the uri
#   etcd.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   etcd.sh kill DIR     SIGKILL (a crash); DIR/port, DIR/peer_port and the
#                        data are kept for a restart
#   etcd.sh pause DIR    SIGSTOP (a server that hangs)
#   etcd.sh resume DIR   SIGCONT
#   etcd.sh status DIR   "running PID URI" or "stopped" (exit 3)
#   etcd.sh uri DIR      print etcd://127.0.0.1:PORT (with TLS and auth: see
#                        below)
#
# DIR/port holds the client port (the uri's), DIR/peer_port the peer port;
# a restart reuses both (the member's peer URL is stored in its data). The
# server keeps its defaults (every write is fsynced to its WAL; etcd 3.4 has
# no --unsafe-no-fsync), so a write survives a kill. Extra start args come
# after ours, and etcd lets a later flag override an earlier one (e.g.
# `--heartbeat-interval 50 --election-timeout 500`).
#
# TLS: with `--tls CERTS` (first after DIR), the client URL is https only,
# with the certificate CERTS/server-cert.pem (CN localhost, SAN localhost
# and 127.0.0.1) signed by CERTS/ca.pem; scripts/servers/test-ca.sh makes
# them in CERTS first if they are missing, and this script copies them to
# DIR/tls. Then, in this order:
#   --client-cert-auth  etcd asks every client for a certificate signed by
#                       ca.pem (CERTS/client-cert.pem + client-key.pem)
#   --expired-cert      serve CERTS/expired-cert.pem (valid only in January
#                       2020) instead: every client that verifies refuses it
#                       (this script's own checks skip verification then)
# The peer URL stays plain http on 127.0.0.1.
#
# Auth: with `--auth` (after the TLS options), the first start adds the users
# root and simba (password simba-test for both), a role simba with readwrite
# on every key, grants it to simba and runs `etcdctl auth enable`; the data
# keeps it for restarts. The server's simple tokens live 300 s unless an
# extra `--auth-token-ttl N` says otherwise.
#
# The uri then carries what a client needs:
#   etcd://[simba:simba-test@]127.0.0.1:PORT[?tls=verify&tls_ca=DIR/tls/ca.pem
#          &tls_cert=DIR/tls/client-cert.pem&tls_key=DIR/tls/client-key.pem]
#
# Cluster: `etcd.sh start DIR --members N [--tls ...] [--auth] [etcd args...]`
# starts N members (1 to 9) on 127.0.0.1 (or, with SIMBA_NETNS=LAB, member I
# on host I of that lab of network namespaces, scripts/servers/netns.sh:
# in its namespace, on its address; not with --tls), each with its own client and peer
# port, data and log in DIR/mI (I = 1..N: a member's directory is that of a
# single server above, its name mI), all listed in one --initial-cluster; it
# returns once every member is healthy (a leader, a read commits). The uri
# names every member:
#   etcd://[simba:simba-test@]127.0.0.1:P1,127.0.0.1:P2,...[?tls=...]
# (with TLS, the certificates are in DIR/tls). Auth is set up once for the
# cluster. DIR/members holds N, DIR/args the start args (a member restarts
# with them). Then:
#   stop|kill|pause|resume DIR   every member
#   status DIR                   "running ..." if any member runs, with one
#                                "mI running PID" / "mI stopped" line each
#   stop-member DIR I            SIGTERM member I (then SIGKILL after 10 s)
#   kill-member DIR I            SIGKILL member I (a crash; data kept)
#   pause-member DIR I           SIGSTOP member I (a member that hangs)
#   resume-member DIR I          SIGCONT member I
#   restart-member DIR I         start member I again (same ports and data);
#                                returns once it runs (not waiting for a
#                                quorum, which may be lost)
#   leader DIR                   print I of the member that leads (asked of
#                                every running, unpaused member: the one
#                                that names itself the leader); exit 1 if
#                                none does
#   make-leader DIR I            move the leadership to member I (etcdctl
#                                move-leader, asked of the leader) and wait
#                                until member I leads
#   member-uri DIR I             print the uri of member I alone
# A member alone is also a directory of this script: `etcd.sh status DIR/m2`.
#
# Environment:
#   SIMBA_SERVER_OWNER_PID  a PID (or "parent" for the caller of this script):
#                           a watchdog stops the server once that process is
#                           gone, so a test binary that crashes or a ctest
#                           that is interrupted leaks no server.
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=etcd
server_comm=etcd
usage_args="[--members N] [--tls CERTS [--client-cert-auth] [--expired-cert]] [--auth] [etcd args...]"
# Generous: after a kill the server first replays its WAL.
start_timeout=30
stop_timeout=10

# The member's name (also in --initial-cluster).
name=simba
etcd="" etcdctl="" peer=""
user=simba
password=simba-test
tls_src="" client_cert_auth=0 expired_cert=0 auth=0
tls_args=() ctl_tls_args=() ctl_auth_args=()
scheme=http

# Our etcdctl calls name their endpoint and API themselves; ETCDCTL_*
# variables of the caller would conflict with them.
unset ETCDCTL_API ETCDCTL_ENDPOINTS ETCDCTL_DIAL_TIMEOUT ETCDCTL_COMMAND_TIMEOUT
export ETCDCTL_API=3

# Sets etcd and etcdctl to the programs (Debian's etcd-server and etcd-client).
find_programs() {
  local p
  etcd="" etcdctl=""
  for p in etcd /usr/bin/etcd; do
    if command -v "$p" >/dev/null; then etcd="$(command -v "$p")"; break; fi
  done
  for p in etcdctl /usr/bin/etcdctl; do
    if command -v "$p" >/dev/null; then etcdctl="$(command -v "$p")"; break; fi
  done
  if [ -z "$etcd" ] || [ -z "$etcdctl" ]; then
    echo "etcd.sh: found no etcd and etcdctl (install etcd-server etcd-client)" >&2
    return 1
  fi
}

# Runs etcdctl against client port $1 with the rest as its args; a paused
# server accepts (the kernel does) but never answers: hence timeout.
ctl() {
  local address="$1"
  shift
  [[ "$address" == *:* ]] || address="$(member_host):$address"
  timeout 5 "$etcdctl" --endpoints="$scheme://$address" \
    --dial-timeout=1s --command-timeout=2s "${ctl_tls_args[@]}" "${ctl_auth_args[@]}" "$@"
}

# Client address ("HOST:PORT") of cluster member $1.
member_address() {
  echo "$(cat "$dir/m$1/host" 2>/dev/null || echo 127.0.0.1):$(cat "$dir/m$1/port")"
}

# A cluster member: the cluster's directory (internal: `--member-of DIR`,
# first after the member's DIR) and its --initial-cluster.
cluster_dir="" initial_cluster=""

# Our options first after DIR (in the order of the usage line), then etcd's.
parse_args() {
  if [ "${1:-}" = --member-of ]; then
    [ $# -ge 2 ] || usage
    cluster_dir="$2"
    shift 2
    name="$(basename "$dir")"
    initial_cluster="$(cat "$cluster_dir/cluster")"
  fi
  if [ "${1:-}" = --tls ]; then
    [ $# -ge 2 ] || usage
    tls_src="$(mkdir -p "$2" && cd "$2" && pwd -P)"
    shift 2
    if [ "${1:-}" = --client-cert-auth ]; then client_cert_auth=1; shift; fi
    if [ "${1:-}" = --expired-cert ]; then expired_cert=1; shift; fi
  fi
  if [ "${1:-}" = --auth ]; then auth=1; shift; fi
  extra=("$@")
}

# With --tls CERTS: copies the certificates to DIR/tls (made first by
# test-ca.sh if missing) and sets tls_args for etcd and ctl_tls_args for
# etcdctl; with --auth, ctl_auth_args.
prepare_start() {
  if [ -n "$tls_src" ]; then
    bash "$(dirname "$script")/test-ca.sh" "$tls_src"
    mkdir -p "$dir/tls"
    cp "$tls_src/ca.pem" "$tls_src/server-cert.pem" "$tls_src/server-key.pem" \
      "$tls_src/expired-cert.pem" "$tls_src/expired-key.pem" \
      "$tls_src/client-cert.pem" "$tls_src/client-key.pem" "$dir/tls/"
  fi
  ctl_settings
}

# tls_args, ctl_tls_args and ctl_auth_args from the options (the
# certificates in DIR/tls).
ctl_settings() {
  tls_args=()
  ctl_tls_args=()
  ctl_auth_args=()
  scheme=http
  if [ "$auth" -eq 1 ]; then ctl_auth_args=(--user "root:$password"); fi
  [ -n "$tls_src" ] || return 0
  scheme=https
  local served=server
  if [ "$expired_cert" -eq 1 ]; then served=expired; fi
  tls_args=(--cert-file "$dir/tls/$served-cert.pem" --key-file "$dir/tls/$served-key.pem"
    --trusted-ca-file "$dir/tls/ca.pem")
  if [ "$client_cert_auth" -eq 1 ]; then tls_args+=(--client-cert-auth); fi
  ctl_tls_args=(--cacert "$dir/tls/ca.pem" --cert "$dir/tls/client-cert.pem"
    --key "$dir/tls/client-key.pem")
  if [ "$expired_cert" -eq 1 ]; then ctl_tls_args+=(--insecure-skip-tls-verify); fi
}

# DIR/peer_port beside DIR/port: a restart reuses both (the member's peer
# URL is stored in its data).
saved_ports() {
  [ -s "$dir/peer_port" ] || return 1
  peer="$(cat "$dir/peer_port")"
}
more_ports() {
  peer="$(pick_port "$1")"
}
save_ports() {
  echo "$peer" >"$dir/peer_port"
}
ports_text() {
  echo "port $1 or $peer"
}
# A first start that failed may have left a member with other ports.
forget_first_start() {
  rm -rf "$dir/data" "$dir/auth-enabled"
}

server_command() {
  local host
  host="$(member_host)"
  local client_url="$scheme://$host:$1" peer_url="http://$host:$peer"
  server_cmd=()
  # A member of a lab runs in its host's namespace (`ip netns exec` execs:
  # the PID stays the server's).
  if [ -s "$dir/netns" ]; then server_cmd=(ip netns exec "$(cat "$dir/netns")"); fi
  server_cmd+=("$etcd" --name "$name" --data-dir "$dir/data"
    --listen-client-urls "$client_url" --advertise-client-urls "$client_url"
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url"
    --initial-cluster "${initial_cluster:-$name=$peer_url}" --initial-cluster-state new
    --initial-cluster-token simba-test
    --logger zap --log-outputs stderr
    "${tls_args[@]}" "${extra[@]}")
}

# Our own server (the member advertises both our URLs), not another one on
# the same port, and healthy (a leader, and a read commits).
# A cluster member is ready once it runs as that member (the cluster
# start then waits for a healthy cluster; a restarted member may have no
# quorum to be healthy with).
server_ready() {
  local host
  host="$(member_host)"
  ctl "$1" member list 2>/dev/null |
    grep -qF ", $name, http://$host:$peer, $scheme://$host:$1," &&
    { [ -n "$cluster_dir" ] || ctl "$1" endpoint health >/dev/null 2>&1; }
}

# With --auth, once per data directory: the users, the role and `auth
# enable` (a restart finds them in the data).
after_start() {
  [ "$auth" -eq 1 ] || return 0
  [ -z "$cluster_dir" ] || return 0  # once for the cluster (cluster_start)
  [ ! -e "$dir/auth-enabled" ] || return 0
  {
    ctl "$1" user add "root:$password" &&
      ctl "$1" user add "$user:$password" &&
      ctl "$1" role add "$user" &&
      ctl "$1" role grant-permission "$user" readwrite --from-key "" &&
      ctl "$1" user grant-role "$user" "$user" &&
      ctl "$1" auth enable
  } >"$dir/auth-setup.log" 2>&1 || {
    echo "etcd.sh: enabling auth failed" >&2
    tail -n 20 "$dir/auth-setup.log" >&2 || true
    return 1
  }
  touch "$dir/auth-enabled"
}

server_uri() {
  local userinfo="" query=""
  if [ "$auth" -eq 1 ]; then userinfo="$user:$password@"; fi
  local hosts="$1"
  # A port alone, or a cluster's list of host:port.
  [[ "$hosts" == *:* ]] || hosts="$(member_host):$hosts"
  if [ -n "$tls_src" ]; then
    query="?tls=verify&tls_ca=$dir/tls/ca.pem&tls_cert=$dir/tls/client-cert.pem"
    query+="&tls_key=$dir/tls/client-key.pem"
  fi
  echo "etcd://${userinfo}$hosts$query"
}

# ---- clusters (see the top) ----------------------------------------------

members_count() {
  cat "$dir/members" 2>/dev/null || true
}

# Exits 2 unless $1 names a member of the cluster in $dir.
check_member() {
  local n
  n="$(members_count)"
  if [ -z "$n" ]; then
    echo "etcd.sh: no cluster was started in $dir" >&2
    exit 2
  fi
  if ! [[ "${1:-}" =~ ^[1-9]$ ]] || [ "$1" -gt "$n" ]; then
    echo "etcd.sh: no member '${1:-}' in $dir (members 1 to $n)" >&2
    exit 2
  fi
}

# This script's command $1 on member $2 (more args after).
on_member() {
  local cmd="$1" i="$2"
  shift 2
  bash "$script" "$cmd" "$dir/m$i" "$@"
}

# The start args of the members (DIR/args, NUL-separated).
member_args() {
  mapfile -d '' margs <"$dir/args"
}

# Starts member $1 with the saved args.
start_member() {
  local margs=()
  member_args
  on_member start "$1" "${margs[@]}"
}

# `command DIR` on every member; fails if one did.
each_member() {
  local i rc=0 n
  n="$(members_count)"
  for i in $(seq 1 "$n"); do
    on_member "$1" "$i" || rc=1
  done
  return "$rc"
}

# The PID of member $1 if it runs and is not paused.
member_serving_pid() {
  local pid state
  pid="$(cat "$dir/m$1/pid" 2>/dev/null || true)"
  server_alive "$pid" || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)"
  [ "$state" != T ] || return 1
  echo "$pid"
}

# The member that names itself the leader (asked of each serving member).
cluster_leader() {
  local i n fields id lead
  n="$(members_count)"
  for i in $(seq 1 "$n"); do
    member_serving_pid "$i" >/dev/null || continue
    fields="$(ctl "$(member_address "$i")" endpoint status -w fields 2>/dev/null)" || continue
    id="$(sed -n 's/^"MemberID" : //p' <<<"$fields")"
    lead="$(sed -n 's/^"Leader" : //p' <<<"$fields")"
    if [ -n "$id" ] && [ "$id" = "$lead" ]; then
      echo "$i"
      return 0
    fi
  done
  echo "etcd.sh: no member of $dir leads" >&2
  return 1
}

# The member ID of member $1, in hex (as move-leader takes it).
member_id_hex() {
  local id
  id="$(ctl "$(member_address "$1")" endpoint status -w fields 2>/dev/null |
    sed -n 's/^"MemberID" : //p')"
  [ -n "$id" ] || return 1
  printf '%x\n' "$id"
}

cluster_make_leader() {
  local target="$1" lead id deadline=$((SECONDS + 10))
  while :; do
    lead="$(cluster_leader 2>/dev/null)" || lead=""
    [ "$lead" != "$target" ] || return 0
    if [ -n "$lead" ] && id="$(member_id_hex "$target")"; then
      ctl "$(member_address "$lead")" move-leader "$id" >/dev/null 2>&1 || true
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "etcd.sh: member $target of $dir did not become the leader within 10 s" >&2
      return 1
    fi
    sleep 0.1
  done
}

# True once every member answers `endpoint health` (a leader, a read commits).
cluster_healthy() {
  local i n
  n="$(members_count)"
  for i in $(seq 1 "$n"); do
    ctl "$(member_address "$i")" endpoint health >/dev/null 2>&1 || return 1
  done
}

# etcd.sh start DIR --members N [args...]
cluster_start() {
  local n="$1" i p ports=() peers=() cluster="" hosts="" rc deadline host
  shift
  if ! [[ "$n" =~ ^[1-9]$ ]]; then
    echo "etcd.sh: --members takes 1 to 9" >&2
    exit 2
  fi
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  find_programs
  # The members' watchdogs watch our caller, not this script.
  if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
  # Leftover members (an interrupted run) go first.
  if [ -s "$dir/members" ]; then each_member stop || true; fi
  parse_args "$@"
  if [ -n "${SIMBA_NETNS:-}" ] && [ -n "$tls_src" ]; then
    # The test certificates name 127.0.0.1 and localhost only.
    echo "etcd.sh: SIMBA_NETNS and --tls do not go together" >&2
    exit 2
  fi
  # The certificates once (the members copy them in parallel), in DIR/tls
  # for the uri; our etcdctl settings.
  prepare_start
  local fresh=1
  if [ "$(members_count)" = "$n" ] && [ -s "$dir/cluster" ]; then
    fresh=0
    # A restart: same ports and data.
    for i in $(seq 1 "$n"); do ports+=("$(cat "$dir/m$i/port")"); done
  else
    rm -rf "$dir"/m[1-9] "$dir/cluster" "$dir/members" "$dir/auth-enabled"
    for i in $(seq 1 "$n"); do
      mkdir -p "$dir/m$i"
      host=127.0.0.1
      if [ -n "${SIMBA_NETNS:-}" ]; then
        # Member i on host i of the lab (scripts/servers/netns.sh).
        place_on_lab_host "$dir/m$i" "$i"
        host="$(cat "$dir/m$i/host")"
      fi
      for _ in $(seq 1 20); do
        p="$(pick_port)"
        [[ " ${ports[*]} ${peers[*]} " != *" $p "* ]] && break
      done
      ports+=("$p")
      for _ in $(seq 1 20); do
        p="$(pick_port)"
        [[ " ${ports[*]} ${peers[*]} " != *" $p "* ]] && break
      done
      peers+=("$p")
      echo "${ports[$((i - 1))]}" >"$dir/m$i/port"
      echo "$p" >"$dir/m$i/peer_port"
      cluster+="${cluster:+,}m$i=http://$host:$p"
    done
    echo "$cluster" >"$dir/cluster"
    echo "$n" >"$dir/members"
  fi
  printf '%s\0' --member-of "$dir" "$@" >"$dir/args"
  # Every member at once: none is healthy before a quorum runs.
  for i in $(seq 1 "$n"); do
    start_member "$i" >"$dir/m$i/start.out" 2>&1 &
  done
  rc=0
  for i in $(seq 1 "$n"); do
    wait -n || rc=1
  done
  deadline=$((SECONDS + start_timeout))
  while [ "$rc" -eq 0 ] && ! cluster_healthy; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "etcd.sh: the cluster in $dir was not healthy within $start_timeout s" >&2
      rc=1
    fi
    sleep 0.1
  done
  if [ "$rc" -eq 0 ] && ! after_start "$(member_address 1)"; then rc=1; fi
  if [ "$rc" -ne 0 ]; then
    for i in $(seq 1 "$n"); do
      if [ -s "$dir/m$i/start.out" ]; then sed "s/^/m$i: /" "$dir/m$i/start.out" >&2; fi
    done
    each_member stop || true
    if [ "$fresh" = 1 ] && retry_on_taken_port "$dir"/m*/start.out; then
      rm -f "$dir/cluster" "$dir/members"
      exec bash "$script" start "$dir" --members "$n" "$@"
    fi
    exit 1
  fi
  for i in $(seq 1 "$n"); do hosts+="${hosts:+,}$(member_address "$i")"; done
  echo "${ports[0]}" >"$dir/port"
  server_uri "$hosts" >"$dir/uri"
  cat "$dir/uri"
}

cluster_status() {
  local i n any=0
  n="$(members_count)"
  for i in $(seq 1 "$n"); do
    if on_member status "$i" >/dev/null; then any=1; fi
  done
  if [ "$any" -eq 1 ]; then echo "running $(cat "$dir/uri" 2>/dev/null || true)"; else echo stopped; fi
  for i in $(seq 1 "$n"); do
    echo "m$i $(on_member status "$i" | cut -d' ' -f1-2)"
  done
  [ "$any" -eq 1 ] || return 3
}

# Cluster commands, and the usual ones on a cluster's directory; anything
# else is a single server's (server_main).
cluster_main() {
  local cmd="${1:-}" i
  [ $# -ge 2 ] || return 0
  dir="$2"
  case "$cmd" in
    start)
      if [ "${3:-}" = --members ]; then
        [ $# -ge 4 ] || usage
        cluster_start "${@:4}"
        exit 0
      fi
      ;;
    stop | kill | pause | resume | status | uri | leader | member-uri | make-leader | \
      stop-member | kill-member | pause-member | resume-member | restart-member)
      if [ ! -s "$dir/members" ]; then
        # A single server's directory (or none): its own commands.
        case "$cmd" in
          leader | member-uri | make-leader | *-member) check_member "" ;;
        esac
        return 0
      fi
      dir="$(cd "$dir" && pwd -P)"
      find_programs
      local margs=()
      member_args
      parse_args "${margs[@]:2}"
      ctl_settings
      case "$cmd" in
        stop | kill | pause | resume) each_member "$cmd" ;;
        status) cluster_status ;;
        uri) cmd_uri ;;
        leader) cluster_leader ;;
        make-leader)
          check_member "${3:-}"
          cluster_make_leader "$3"
          ;;
        member-uri)
          check_member "${3:-}"
          cat "$dir/m$3/uri"
          ;;
        restart-member)
          check_member "${3:-}"
          start_member "$3" >/dev/null
          ;;
        *-member)
          check_member "${3:-}"
          on_member "${cmd%-member}" "$3"
          ;;
      esac
      exit $?
      ;;
  esac
}

cluster_main "$@"
server_main "$@"
