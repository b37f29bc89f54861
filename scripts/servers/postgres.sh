#!/usr/bin/env bash
# Starts and stops a private PostgreSQL server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR (the postmaster) or as one of its children, never by name,
# so servers of other people or other test runs are left alone. The commands
# are scripts/servers/common.sh's; this script says how postgres runs.
#
#   postgres.sh start DIR [postgres args...]  start (again) and print the uri
#   postgres.sh stop DIR    SIGINT (fast shutdown), then SIGKILL after 30 s
#   postgres.sh kill DIR    SIGKILL to the postmaster and its children (a
#                           crash); DIR/port and the data are kept for a
#                           restart, which runs crash recovery
#   postgres.sh pause DIR   SIGSTOP to the postmaster and its children
#   postgres.sh resume DIR  SIGCONT
#   postgres.sh status DIR  "running PID URI" or "stopped" (exit 3)
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
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=postgres
server_comm=postgres
usage_args="[postgres args...]"
# Generous: after a kill the server first replays its WAL.
start_timeout=30
stop_timeout=30
# Fast shutdown.
stop_signal=INT
bindir=""

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

find_programs() {
  bindir="$(find_bindir)"
}

prepare_start() {
  prepare_dir
  init_data
}

before_launch() {
  clean_leftovers
}

server_command() {
  local socket_dir="$dir"
  # A Unix socket path longer than 107 bytes is refused, and a postmaster
  # that can create none of its sockets does not start: clients use TCP, so
  # without room the socket is left out.
  if [ "${#dir}" -gt $((107 - 16)) ]; then socket_dir=""; fi
  server_cmd=()
  if [ "$(id -u)" -eq 0 ]; then
    server_cmd=(setpriv --reuid=postgres --regid=postgres --init-groups --)
  fi
  server_cmd+=("$bindir/postgres" -D "$dir/data" -h 127.0.0.1 -p "$1" -k "$socket_dir"
    "${extra[@]}")
}

# Our own postmaster (its lock file names it), done with recovery and
# listening on our port (so whatever answers there is ours).
server_ready() {
  local port="$1" pid="$2"
  [ "$(pidfile_line 1)" = "$pid" ] && [ "$(pidfile_line 8)" = ready ] &&
    timeout 5 "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 2 >/dev/null 2>&1
}

after_start() {
  create_database "$1"
}

server_uri() {
  echo "postgresql://postgres@127.0.0.1:$1/simba"
}

# The postmaster first, so that it starts no child that would run on.
pause_server() {
  local pid="$1" child
  kill -STOP "$pid"
  wait_stopped "$pid" || true
  for child in $(children_of "$pid"); do kill -STOP "$child" 2>/dev/null || true; done
}

# Its children too: a paused server acts on SIGINT only once resumed, and
# its paused children would not heed the postmaster's SIGTERM.
continue_server() {
  local pid="$1" child
  for child in $(children_of "$pid"); do kill -CONT "$child" 2>/dev/null || true; done
  kill -CONT "$pid"
}

server_main "$@"
