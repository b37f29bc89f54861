#!/usr/bin/env bash
# Starts and stops a private etcd (a cluster of one member) for Simba's
# tests: bound to 127.0.0.1, on two free ports (client and peer), with its
# data directory (DIR/data), log, pid, port, peer_port and uri files in DIR.
# Every process is addressed by the PID recorded in DIR, never by name, so
# servers of other people or other test runs are left alone.
#
#   etcd.sh start DIR [etcd args...]  start (again) and print the uri
#   etcd.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   etcd.sh kill DIR     SIGKILL (a crash); DIR/port, DIR/peer_port and the
#                        data are kept for a restart
#   etcd.sh pause DIR    SIGSTOP (a server that hangs)
#   etcd.sh resume DIR   SIGCONT
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
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# Port picking, PID bookkeeping and the owner watchdog, shared by every
# server script.
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

# Generous: after a kill the server first replays its WAL.
start_timeout=30
stop_timeout=10

# The member's name (also in --initial-cluster).
name=simba

# Our etcdctl calls name their endpoint and API themselves; ETCDCTL_*
# variables of the caller would conflict with them.
unset ETCDCTL_API ETCDCTL_ENDPOINTS ETCDCTL_DIAL_TIMEOUT ETCDCTL_COMMAND_TIMEOUT
export ETCDCTL_API=3

usage() {
  echo "usage: etcd.sh start|stop|kill|pause|resume|uri DIR [etcd args...]" >&2
  exit 2
}

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

# True if PID runs and is an etcd. A zombie counts as gone: PID 1 of some
# containers reaps late, and a server that has exited serves nobody. The
# name check keeps a recycled PID from being signalled.
server_alive() {
  local pid="$1" state comm
  [ -n "$pid" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = etcd ]
}

# Runs etcdctl against client port $1 with the rest as its args; a paused
# server accepts (the kernel does) but never answers: hence timeout.
ctl() {
  local port="$1"
  shift
  timeout 5 "$etcdctl" --endpoints="http://127.0.0.1:$port" \
    --dial-timeout=1s --command-timeout=2s "$@"
}

# Starts etcd on client port $1 and peer port $2 (extra args in
# ${extra[@]}), detached, and waits until it is healthy (it has a leader and
# commits). Returns 3 if a port was taken under our feet.
launch() {
  local port="$1" peer="$2" pid="" deadline log_start
  local client_url="http://127.0.0.1:$1" peer_url="http://127.0.0.1:$2"
  rm -f "$dir/pid"
  touch "$dir/etcd.log"
  log_start=$(($(stat -c %s "$dir/etcd.log") + 1))
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. Its stdin goes to /dev/null and
  # its log to DIR/etcd.log (ctest waits for its pipes to close), and the
  # wrapper closes every other inherited descriptor (a test's client socket
  # held open by the server would hide the client's disconnects). The
  # wrapper writes its own PID, which stays the server's after exec, whether
  # or not setsid had to fork.
  # shellcheck disable=SC2016  # expanded by the wrapper, not here
  (cd "$dir" && exec setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv "$0.tmp" "$0"
    exec "$@"
  ' "$dir/pid" \
    "$etcd" --name "$name" --data-dir "$dir/data" \
    --listen-client-urls "$client_url" --advertise-client-urls "$client_url" \
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
    --initial-cluster "$name=$peer_url" --initial-cluster-state new \
    --initial-cluster-token simba-test \
    --logger zap --log-outputs stderr \
    "${extra[@]}" </dev/null >>"$dir/etcd.log" 2>&1) &

  deadline=$((SECONDS + start_timeout))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      # Our own server (the member advertises both our URLs), not another
      # one on the same port, and healthy (a leader, and a read commits).
      if ctl "$port" member list 2>/dev/null | grep -qF ", $name, $peer_url, $client_url," &&
         ctl "$port" endpoint health >/dev/null 2>&1; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "etcd.sh: etcd on port $port was not healthy within $start_timeout s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || true
      fi
      rm -f "$dir/pid"
      tail -c "+$log_start" "$dir/etcd.log" | tail -n 20 >&2 || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -c "+$log_start" "$dir/etcd.log" | grep -q "address already in use"; then
    return 3
  fi
  echo "etcd.sh: etcd exited at start" >&2
  tail -c "+$log_start" "$dir/etcd.log" | tail -n 20 >&2 || true
  return 1
}

cmd_start() {
  local port="" peer="" rc
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  find_programs
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  local old
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "etcd.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  if [ -s "$dir/port" ] && [ -s "$dir/peer_port" ]; then
    # A restart keeps the address clients already know, and the peer URL
    # that the member's data names.
    port="$(cat "$dir/port")"
    peer="$(cat "$dir/peer_port")"
    launch "$port" "$peer" || {
      rc=$?
      [ "$rc" -ne 3 ] || echo "etcd.sh: port $port or $peer is taken" >&2
      exit 1
    }
  else
    # A first start that failed may have left a member with other ports.
    rm -rf "$dir/data"
    for _ in 1 2 3 4 5; do
      port="$(pick_port)"
      peer="$(pick_port "$port")"
      rc=0
      launch "$port" "$peer" || rc=$?
      [ "$rc" -eq 3 ] || break  # 3: another process took a port since we looked
      rm -rf "$dir/data"
    done
    [ "$rc" -eq 0 ] || exit 1
  fi
  echo "$port" >"$dir/port"
  echo "$peer" >"$dir/peer_port"
  echo "etcd://127.0.0.1:$port" >"$dir/uri"
  start_watchdog
  cat "$dir/uri"
}

cmd_stop() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true  # a paused server acts on SIGTERM only once resumed
    if ! wait_gone "$pid" "$stop_timeout"; then
      echo "etcd.sh: pid $pid ignored SIGTERM for $stop_timeout s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 10
    fi
  fi
  rm -f "$dir/pid"
}

cmd_kill() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10
  fi
  rm -f "$dir/pid"
}

cmd_signal() {  # cmd_signal SIG
  local pid
  pid="$(read_pid)"
  if ! server_alive "$pid"; then
    echo "etcd.sh: no server running in $dir" >&2
    exit 1
  fi
  kill "-$1" "$pid"
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "etcd.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
shift 2
extra=("$@")
etcd="" etcdctl=""
case "$cmd" in
  start) cmd_start ;;
  stop) [ ! -d "$dir" ] || cmd_stop ;;
  kill) [ ! -d "$dir" ] || cmd_kill ;;
  pause) cmd_signal STOP ;;
  resume) cmd_signal CONT ;;
  uri) cmd_uri ;;
  watch) [ $# -eq 2 ] || usage; cmd_watch "$1" "$2" ;;
  *) usage ;;
esac
