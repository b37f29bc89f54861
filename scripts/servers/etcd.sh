#!/usr/bin/env bash
# Starts and stops a private etcd (a cluster of one member) for Simba's
# tests: bound to 127.0.0.1, on two free ports (client and peer), with its
# data directory (DIR/data), log, pid, port, peer_port and uri files in DIR.
# Every process is addressed by the PID recorded in DIR, never by name, so
# servers of other people or other test runs are left alone. The commands
# are scripts/servers/common.sh's; this script says how etcd runs.
#
#   etcd.sh start DIR [etcd args...]  start (again) and print the uri
#   etcd.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   etcd.sh kill DIR     SIGKILL (a crash); DIR/port, DIR/peer_port and the
#                        data are kept for a restart
#   etcd.sh pause DIR    SIGSTOP (a server that hangs)
#   etcd.sh resume DIR   SIGCONT
#   etcd.sh status DIR   "running PID URI" or "stopped" (exit 3)
#   etcd.sh uri DIR      print etcd://127.0.0.1:PORT
#
# DIR/port holds the client port (the uri's), DIR/peer_port the peer port;
# a restart reuses both (the member's peer URL is stored in its data). The
# server keeps its defaults (every write is fsynced to its WAL; etcd 3.4 has
# no --unsafe-no-fsync), so a write survives a kill. Extra start args come
# after ours, and etcd lets a later flag override an earlier one (e.g.
# `--heartbeat-interval 50 --election-timeout 500`).
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
usage_args="[etcd args...]"
# Generous: after a kill the server first replays its WAL.
start_timeout=30
stop_timeout=10

# The member's name (also in --initial-cluster).
name=simba
etcd="" etcdctl="" peer=""

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
  local port="$1"
  shift
  timeout 5 "$etcdctl" --endpoints="http://127.0.0.1:$port" \
    --dial-timeout=1s --command-timeout=2s "$@"
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
  rm -rf "$dir/data"
}

server_command() {
  local client_url="http://127.0.0.1:$1" peer_url="http://127.0.0.1:$peer"
  server_cmd=("$etcd" --name "$name" --data-dir "$dir/data"
    --listen-client-urls "$client_url" --advertise-client-urls "$client_url"
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url"
    --initial-cluster "$name=$peer_url" --initial-cluster-state new
    --initial-cluster-token simba-test
    --logger zap --log-outputs stderr
    "${extra[@]}")
}

# Our own server (the member advertises both our URLs), not another one on
# the same port, and healthy (a leader, and a read commits).
server_ready() {
  ctl "$1" member list 2>/dev/null |
    grep -qF ", $name, http://127.0.0.1:$peer, http://127.0.0.1:$1," &&
    ctl "$1" endpoint health >/dev/null 2>&1
}

server_uri() {
  echo "etcd://127.0.0.1:$1"
}

server_main "$@"
