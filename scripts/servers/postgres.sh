#!/usr/bin/env bash
# Starts and stops a private PostgreSQL server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR (the postmaster) or as one of its children, never by name,
# so servers of other people or other test runs are left alone.
#
#   postgres.sh start DIR [postgres args...]  start (again) and print the uri
#   postgres.sh stop DIR    SIGINT (fast shutdown), then SIGKILL after 30 s
#   postgres.sh kill DIR    SIGKILL to the postmaster and its children (a
#                           crash); DIR/port and the data are kept for a
#                           restart, which runs crash recovery
#   postgres.sh pause DIR   SIGSTOP to the postmaster and its children
#   postgres.sh resume DIR  SIGCONT
#   postgres.sh uri DIR     print postgresql://postgres@127.0.0.1:PORT/simba
#
# The first start initializes DIR/data (initdb, user postgres, trust
# authentication) and creates the database simba; a restart reuses both. The
# server keeps its defaults (fsync and synchronous_commit on), so a commit
# survives a kill. Extra start args come after ours, and postgres lets a later
# option override an earlier one (e.g. `-c max_connections=200`).
#
# postgres refuses to run as root: as root, DIR is given to the Debian user
# postgres and the server runs as that user (DIR's parents must let it in);
# otherwise it runs as the current user.
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
stop_timeout=30

usage() {
  echo "usage: postgres.sh start|stop|kill|pause|resume|uri DIR [postgres args...]" >&2
  exit 2
}

# The directory of initdb, postgres, pg_isready and psql: Debian keeps them
# in /usr/lib/postgresql/<version>/bin (the newest is taken), other systems
# on the PATH.
find_bindir() {
  local d best
  # The glob sorts 10 before 9: the highest version is picked by number.
  best="$(for d in /usr/lib/postgresql/*/bin; do
            if [ -x "$d/postgres" ] && [ -x "$d/initdb" ]; then echo "$d"; fi
          done | sort -t/ -k5,5n | tail -n 1)"
  if [ -z "$best" ] && command -v postgres >/dev/null && command -v initdb >/dev/null; then
    best="$(dirname "$(command -v postgres)")"
  fi
  if [ -z "$best" ]; then
    echo "postgres.sh: found no PostgreSQL server (install postgresql)" >&2
    return 1
  fi
  echo "$best"
}

# True if PID runs and is a postgres. A zombie counts as gone: PID 1 of
# some containers reaps late, and a server that has exited serves nobody.
# The name check keeps a recycled PID from being signalled.
server_alive() {
  local pid="$1" state comm
  [ -n "$pid" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = postgres ]
}

# The PIDs of the live children of $1 (the postmaster's backends and
# auxiliary processes; each of them is in a session of its own, so neither a
# process group nor a session reaches them). Pure bash: no procps needed.
children_of() {
  local f pid key value state ppid
  for f in /proc/[0-9]*/status; do
    pid="${f#/proc/}"
    pid="${pid%/status}"
    state="" ppid=""
    while read -r key value; do
      case "$key" in
        State:) state="${value%% *}" ;;
        PPid:) ppid="$value"; break ;;
      esac
    done 2>/dev/null <"$f" || continue
    if [ "$ppid" = "$1" ] && [ -n "$state" ] && [ "$state" != Z ]; then echo "$pid"; fi
  done
}

# The postgres processes whose working directory is our data directory (a
# postmaster and its children chdir there): the leftovers of a postmaster
# killed by someone else, which would keep its shared memory in use.
data_dir_processes() {
  local f pid comm
  for f in /proc/[0-9]*/comm; do
    comm=""
    read -r comm 2>/dev/null <"$f" || continue
    [ "$comm" = postgres ] || continue
    pid="${f#/proc/}"
    pid="${pid%/comm}"
    if [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$dir/data" ] && server_alive "$pid"; then
      echo "$pid"
    fi
  done
}

# Waits up to 5 s for process $1 to be stopped (SIGSTOP is delivered
# asynchronously; a postmaster not yet stopped could still fork).
wait_stopped() {
  local deadline=$((SECONDS + 5)) state
  while :; do
    state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)" || return 0
    case "$state" in T | t | Z | "") return 0 ;; esac
    if [ "$SECONDS" -ge "$deadline" ]; then return 1; fi
    sleep 0.01
  done
}

# Runs "$@" as the user the server runs as.
as_server_user() {
  if [ "$(id -u)" -eq 0 ]; then
    setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
  else
    "$@"
  fi
}

# As root, hands DIR to the user postgres and checks that this user can
# reach it (every parent directory must let it through).
prepare_dir() {
  if [ "$(id -u)" -ne 0 ]; then return 0; fi
  if ! id postgres >/dev/null 2>&1; then
    echo "postgres.sh: postgres does not run as root, and there is no user postgres" >&2
    return 1
  fi
  chown postgres:postgres "$dir"
  if ! as_server_user test -w "$dir" -a -x "$dir"; then
    echo "postgres.sh: user postgres cannot enter $dir (a parent directory is closed to it)" >&2
    return 1
  fi
}

# Initializes DIR/data once. An initialization that was interrupted leaves
# no DIR/initialized and is redone from scratch.
init_data() {
  if [ -e "$dir/initialized" ] && [ -d "$dir/data" ]; then return 0; fi
  rm -rf "$dir/data"
  # --no-sync only spares initdb's own fsyncs of the fresh files; the server
  # keeps fsync on. C locale: present everywhere, and no collation surprises.
  if ! as_server_user "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust \
      -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
    echo "postgres.sh: initdb failed" >&2
    tail -n 20 "$dir/initdb.log" >&2 || true
    return 1
  fi
  touch "$dir/initialized"
}

# Removes what a killed server may have left that would stop a new one:
# its children (still attached to its shared memory) and lock files naming a
# PID that is now another process's. Runs only when our server is down.
clean_leftovers() {
  local pid f other
  for pid in $(data_dir_processes); do
    echo "postgres.sh: killing pid $pid left over from an earlier server in $dir" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || true
  done
  # postgres itself removes a lock file whose PID is gone, but not one whose
  # PID was reused (a server can't tell a recycled PID from a live server).
  for f in "$dir/data/postmaster.pid" "$dir"/.s.PGSQL.*.lock; do
    [ -e "$f" ] || continue
    other="$(head -n 1 "$f" 2>/dev/null || true)"
    if [ -z "$other" ] || ! server_alive "$other" ||
       [ "$(readlink "/proc/$other/cwd" 2>/dev/null)" != "$dir/data" ]; then
      rm -f "$f"
    fi
  done
}

# Line $1 of DIR/data/postmaster.pid, blanks trimmed.
pidfile_line() {
  sed -n "${1}p" "$dir/data/postmaster.pid" 2>/dev/null | tr -d '[:space:]'
}

# Starts postgres on port $1 (extra args in ${extra[@]}), detached, and waits
# until it accepts connections. Returns 3 if the port was taken under our
# feet.
launch() {
  local port="$1" pid="" deadline log_start socket_dir="$dir"
  rm -f "$dir/pid"
  clean_leftovers
  # A Unix socket path longer than 107 bytes is refused, and a postmaster
  # that can create none of its sockets does not start: clients use TCP, so
  # without room the socket is left out.
  if [ "${#dir}" -gt $((107 - 16)) ]; then socket_dir=""; fi
  touch "$dir/postgres.log"
  log_start=$(($(stat -c %s "$dir/postgres.log") + 1))
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. Its stdin goes to /dev/null and
  # its log to DIR/postgres.log (ctest waits for its pipes to close), and the
  # wrapper closes every other inherited descriptor (a test's client socket
  # held open by the server would hide the client's disconnects). The
  # wrapper writes its own PID, which stays the server's after exec (setpriv
  # execs too), whether or not setsid had to fork.
  # shellcheck disable=SC2016  # expanded by the wrapper, not here
  (cd "$dir" && exec setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv "$0.tmp" "$0"
    if [ "$(id -u)" -eq 0 ]; then
      exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
    fi
    exec "$@"
  ' "$dir/pid" \
    "$bindir/postgres" -D "$dir/data" -h 127.0.0.1 -p "$port" -k "$socket_dir" \
    "${extra[@]}" </dev/null >>"$dir/postgres.log" 2>&1) &

  deadline=$((SECONDS + start_timeout))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      # Our own postmaster (its lock file names it), done with recovery and
      # listening on our port (so whatever answers there is ours).
      if [ "$(pidfile_line 1)" = "$pid" ] && [ "$(pidfile_line 8)" = ready ] &&
         timeout 5 "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 2 >/dev/null 2>&1; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "postgres.sh: postgres on port $port was not ready within $start_timeout s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then kill_server "$pid"; fi
      rm -f "$dir/pid"
      tail -c "+$log_start" "$dir/postgres.log" | tail -n 20 >&2 || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -c "+$log_start" "$dir/postgres.log" | grep -q "Address already in use"; then
    return 3
  fi
  echo "postgres.sh: postgres exited at start" >&2
  tail -c "+$log_start" "$dir/postgres.log" | tail -n 20 >&2 || true
  return 1
}

# Creates the database simba unless it exists (a restart finds it).
create_database() {
  local port="$1" have
  have="$(timeout 30 "$bindir/psql" -X -q -A -t -h 127.0.0.1 -p "$port" -U postgres -d postgres \
            -c "select 1 from pg_database where datname = 'simba'" 2>&1)" || {
    echo "postgres.sh: psql failed: $have" >&2
    return 1
  }
  if [ "$have" != 1 ]; then
    timeout 30 "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
      -v ON_ERROR_STOP=1 -c "create database simba" >/dev/null
  fi
}

cmd_start() {
  local port="" rc
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  bindir="$(find_bindir)"
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  local old
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "postgres.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  prepare_dir
  init_data
  if [ -s "$dir/port" ]; then
    # A restart keeps the address clients already know.
    port="$(cat "$dir/port")"
    launch "$port" || { rc=$?; [ "$rc" -ne 3 ] || echo "postgres.sh: port $port is taken" >&2; exit 1; }
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
  # Watched from here on: a failure below must not leak the server.
  start_watchdog
  if ! create_database "$port"; then
    cmd_stop
    exit 1
  fi
  echo "postgresql://postgres@127.0.0.1:$port/simba" >"$dir/uri"
  cat "$dir/uri"
}

# SIGKILL to postmaster $1 and its children: the postmaster is stopped first
# so that it starts no new child while they are killed (its children would
# be out of reach once it is gone).
kill_server() {
  local pid="$1" child children
  kill -STOP "$pid" 2>/dev/null || true
  wait_stopped "$pid" || true
  children="$(children_of "$pid")"
  for child in $children; do kill -KILL "$child" 2>/dev/null || true; done
  kill -KILL "$pid" 2>/dev/null || true
  wait_gone "$pid" 10 || true
  for child in $children; do wait_gone "$child" 10 || true; done
}

cmd_stop() {
  local pid child
  pid="$(read_pid)"
  if server_alive "$pid"; then
    kill -INT "$pid" 2>/dev/null || true
    # A paused server acts on SIGINT only once resumed, and its paused
    # children would not heed the postmaster's SIGTERM.
    for child in $(children_of "$pid"); do kill -CONT "$child" 2>/dev/null || true; done
    kill -CONT "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$stop_timeout"; then
      echo "postgres.sh: pid $pid did not shut down within $stop_timeout s; sending SIGKILL" >&2
      kill_server "$pid"
    fi
  fi
  rm -f "$dir/pid"
}

cmd_kill() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then kill_server "$pid"; fi
  rm -f "$dir/pid"
}

cmd_pause() {
  local pid child
  pid="$(read_pid)"
  if ! server_alive "$pid"; then
    echo "postgres.sh: no server running in $dir" >&2
    exit 1
  fi
  # The postmaster first, so that it starts no child that would run on.
  kill -STOP "$pid"
  wait_stopped "$pid" || true
  for child in $(children_of "$pid"); do kill -STOP "$child" 2>/dev/null || true; done
}

cmd_resume() {
  local pid child
  pid="$(read_pid)"
  if ! server_alive "$pid"; then
    echo "postgres.sh: no server running in $dir" >&2
    exit 1
  fi
  for child in $(children_of "$pid"); do kill -CONT "$child" 2>/dev/null || true; done
  kill -CONT "$pid"
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "postgres.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
shift 2
extra=("$@")
bindir=""
case "$cmd" in
  start) cmd_start ;;
  stop) [ ! -d "$dir" ] || cmd_stop ;;
  kill) [ ! -d "$dir" ] || cmd_kill ;;
  pause) cmd_pause ;;
  resume) cmd_resume ;;
  uri) cmd_uri ;;
  watch) [ $# -eq 2 ] || usage; cmd_watch "$1" "$2" ;;
  *) usage ;;
esac
