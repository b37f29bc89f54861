#!/usr/bin/env bash
# Starts and stops a private redis-server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data, log, pid, port and uri files in
# DIR. The commands (start, stop, kill, pause, resume, status, uri) are
# scripts/servers/common.sh's:
#
#   redis.sh start DIR [redis-server args...]  start (again) and print the uri
#   redis.sh stop DIR     SIGTERM, then SIGKILL after 10 s; no server is fine
#   redis.sh kill DIR     SIGKILL (a crash); DIR/port is kept for a restart
#   redis.sh pause DIR    SIGSTOP (a server that hangs)
#   redis.sh resume DIR   SIGCONT
#   redis.sh status DIR   "running PID URI" or "stopped" (exit 3)
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
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=redis
server_name=redis-server
server_comm=redis-server
usage_args="[redis-server args...]"
# redis-server writes its own log (--logfile); its stdio goes nowhere.
server_output=/dev/null

server_command() {
  server_cmd=(redis-server
    --bind 127.0.0.1 --port "$1" --dir "$dir"
    --save "" --appendonly no --protected-mode no
    --logfile "$log_file"
    "${extra[@]}")
}

# Our own server, not another one on the same port, and done loading its
# data (a loading server answers PING with -LOADING).
server_ready() {
  local port="$1" pid="$2" info
  info="$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' || true)"
  grep -qx "process_id:$pid" <<<"$info" &&
    [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | tr -d '\r')" = PONG ]
}

server_uri() {
  echo "redis://127.0.0.1:$1"
}

server_main "$@"
