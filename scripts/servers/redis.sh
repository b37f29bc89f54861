#!/usr/bin/env bash
# Starts and stops a private redis-server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data, log, pid, port and uri files in
# DIR. Every process is addressed by the PID recorded in DIR, never by name,
# so servers of other people or other test runs are left alone.
#
#   redis.sh start DIR [redis-server args...]  start (again) and print the uri
#   redis.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   redis.sh kill DIR     SIGKILL (a crash); DIR/port is kept for a restart
#   redis.sh pause DIR    SIGSTOP (a server that hangs)
#   redis.sh resume DIR   SIGCONT
#   redis.sh uri DIR      print redis://127.0.0.1:PORT
#
# Extra start args come after ours, and redis-server lets a later option
# override an earlier one: `--appendonly yes --appendfsync always` makes a
# server that loses nothing when killed.
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

usage() {
  echo "usage: redis.sh start|stop|kill|pause|resume|uri DIR [redis-server args...]" >&2
  exit 2
}

# True if PID runs and is a redis-server. A zombie counts as gone: PID 1 of
# some containers reaps late, and a server that has exited serves nobody.
# The name check keeps a recycled PID from being signalled.
server_alive() {
  local pid="$1" state comm
  [ -n "$pid" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = redis-server ]
}

# Starts redis-server on port $1 (extra args in ${extra[@]}), detached, and
# waits until it answers. Returns 3 if the port was taken under our feet.
launch() {
  local port="$1" pid="" deadline info
  rm -f "$dir/pid"
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. All of its stdio goes to
  # /dev/null (ctest waits for its pipes to close), and the wrapper closes
  # every other inherited descriptor (a test's client socket held open by
  # the server would hide the client's disconnects). The wrapper writes its
  # own PID, which stays the server's after exec, whether or not setsid had
  # to fork.
  # shellcheck disable=SC2016  # expanded by the wrapper, not here
  setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv "$0.tmp" "$0"
    exec redis-server "$@"
  ' "$dir/pid" \
    --bind 127.0.0.1 --port "$port" --dir "$dir" \
    --save "" --appendonly no --protected-mode no \
    --logfile "$dir/redis.log" \
    "${extra[@]}" </dev/null >/dev/null 2>&1 &

  deadline=$((SECONDS + 10))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      # Our own server, not another one on the same port, and done loading
      # its data (a loading server answers PING with -LOADING).
      info="$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' || true)"
      if grep -qx "process_id:$pid" <<<"$info" &&
         [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | tr -d '\r')" = PONG ]; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redis.sh: redis-server on port $port did not answer within 10 s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || true
      fi
      rm -f "$dir/pid"
      tail -n 20 "$dir/redis.log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -n 5 "$dir/redis.log" 2>/dev/null | grep -q "Address already in use"; then
    return 3
  fi
  echo "redis.sh: redis-server exited at start" >&2
  tail -n 20 "$dir/redis.log" >&2 2>/dev/null || true
  return 1
}

cmd_start() {
  local port="" rc
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  local old
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "redis.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  if [ -s "$dir/port" ]; then
    # A restart keeps the address clients already know.
    port="$(cat "$dir/port")"
    launch "$port" || { rc=$?; [ "$rc" -ne 3 ] || echo "redis.sh: port $port is taken" >&2; exit 1; }
  else
    for _ in 1 2 3 4 5; do
      port="$(pick_port)"
      rc=0
      launch "$port" || rc=$?
      [ "$rc" -eq 3 ] || break  # 3: another process took the port since we looked
    done
    [ "$rc" -eq 0 ] || exit 1
  fi
  echo "$port" >"$dir/port"
  echo "redis://127.0.0.1:$port" >"$dir/uri"
  start_watchdog
  cat "$dir/uri"
}

cmd_stop() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true  # a paused server acts on SIGTERM only once resumed
    if ! wait_gone "$pid" 10; then
      echo "redis.sh: pid $pid ignored SIGTERM for 10 s; sending SIGKILL" >&2
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
    echo "redis.sh: no server running in $dir" >&2
    exit 1
  fi
  kill "-$1" "$pid"
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "redis.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
shift 2
extra=("$@")
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
