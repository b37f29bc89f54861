#!/usr/bin/env bash
# Starts and stops a private PostgreSQL server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR (the postmaster) or as one of its children, never by name,
# so servers of other people or other test runs are left alone. The commands
# are scripts/servers/common.sh's; this script says how postgres runs.
#
#   postgres.sh start DIR [--tls CERTS | --tls-expired CERTS] [postgres args...]
#                           start (again) and print the uri
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
# TLS: with `--tls CERTS` (first after DIR), the server is TLS-only on TCP:
# ssl=on with the certificate CERTS/server-cert.pem (CN localhost, SAN
# localhost and 127.0.0.1) signed by CERTS/ca.pem, which it also trusts for
# client certificates; scripts/servers/test-ca.sh makes them in CERTS first
# if they are missing, and this script copies them to DIR/tls (the key mode
# 0600, owned by the server's user, as postgres demands). Its own
# DIR/tls/pg_hba.conf (hba_file and ident_file point there: a start without
# --tls uses initdb's files again) rejects every TCP client that does not
# encrypt (hostnossl ... reject) and lets in, over TLS on 127.0.0.1 only:
#   simba       password tls-secret-pw (scram-sha-256; distinct, so tests can
#               grep errors for it)
#   simba_cert  with a client certificate signed by CERTS/ca.pem whose CN is
#               simba-test-client (CERTS/client-cert.pem): `cert`
#               authentication, mapped by DIR/tls/pg_ident.conf; no password
#   postgres    trust (the script's own admin; loopback only)
# Both simba users may create in the database simba's schema public and use
# each other's tables and sequences. The uri printed is then
# postgresql://simba:tls-secret-pw@127.0.0.1:PORT/simba?tls=verify&tls_ca=DIR/tls/ca.pem
# `--tls-expired CERTS` is the same with CERTS/expired-cert.pem (valid only
# in January 2020) as the server's certificate, for tests that clients
# refuse it.
#
# postgres refuses to run as root: as root, DIR is given to the Debian user
# postgres and the server runs as that user (DIR's parents must let it in);
# otherwise it runs as the current user.
#
# Environment:
#   SIMBA_NETNS             a lab of network namespaces (scripts/servers/netns.sh)
#                           for --standby: member N runs in host N's namespace
#                           and listens on its address (DIR/nN/host), and
#                           pg_hba.conf trusts the lab's subnet, so that the
#                           primary can be cut off from its standby (netns.sh
#                           isolate) while the clients still reach both
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
usage_args="[--tls CERTS | --tls-expired CERTS] [postgres args...]"
# Generous: after a kill the server first replays its WAL.
start_timeout=30
stop_timeout=30
# Fast shutdown.
stop_signal=INT
bindir=""
tls_src=""
tls_server="server"
tls_args=()

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
  if [ -s "$dir/host" ]; then
    # A member of a lab: the clients (on the lab's bridge) and the standby
    # come from the lab's subnet, not from 127.0.0.1. A standby's base
    # backup copies this file.
    local subnet
    subnet="$(cut -d. -f1-3 "$dir/host").0/24"
    printf 'host all all %s trust\nhost replication all %s trust\n' "$subnet" "$subnet" \
      >>"$dir/data/pg_hba.conf"
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
  have="$(timeout 30 "$bindir/psql" -X -q -A -t -h "$(member_host)" -p "$port" -U postgres -d postgres \
            -c "select 1 from pg_database where datname = 'simba'" 2>&1)" || {
    echo "postgres.sh: psql failed: $have" >&2
    return 1
  }
  if [ "$have" != 1 ]; then
    timeout 30 "$bindir/psql" -X -q -h "$(member_host)" -p "$port" -U postgres -d postgres \
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

# `--tls CERTS` or `--tls-expired CERTS` first after DIR, then the server's
# args.
parse_args() {
  case "${1:-}" in
    --tls | --tls-expired)
      [ $# -ge 2 ] || usage
      if [ "$1" = --tls-expired ]; then tls_server=expired; fi
      tls_src="$(mkdir -p "$2" && cd "$2" && pwd -P)"
      shift 2
      ;;
  esac
  extra=("$@")
}

# With --tls CERTS: copies the CA and the server's certificate and key to
# DIR/tls (made first by test-ca.sh if missing), writes the TLS-only
# pg_hba.conf and its pg_ident.conf there, and sets tls_args for the server.
prepare_tls() {
  tls_args=()
  [ -n "$tls_src" ] || return 0
  bash "$(dirname "$script")/test-ca.sh" "$tls_src"
  mkdir -p "$dir/tls"
  cp "$tls_src/ca.pem" "$dir/tls/ca.pem"
  cp "$tls_src/$tls_server-cert.pem" "$dir/tls/server-cert.pem"
  cp "$tls_src/$tls_server-key.pem" "$dir/tls/server-key.pem"
  cat >"$dir/tls/pg_hba.conf" <<'HBA'
# Written by scripts/servers/postgres.sh --tls: TLS-only on TCP.
local     all  all                      trust
hostnossl all  all         0.0.0.0/0    reject
hostnossl all  all         ::/0         reject
hostssl   all  simba_cert  127.0.0.1/32 cert map=simba_certs
hostssl   all  postgres    127.0.0.1/32 trust
hostssl   all  all         127.0.0.1/32 scram-sha-256
HBA
  cat >"$dir/tls/pg_ident.conf" <<'IDENT'
# The test client certificate (CN simba-test-client) is simba_cert.
simba_certs  simba-test-client  simba_cert
IDENT
  chmod 644 "$dir/tls/"*
  chmod 600 "$dir/tls/server-key.pem"
  if [ "$(id -u)" -eq 0 ]; then chown -R postgres:postgres "$dir/tls"; fi
  tls_args=(-c ssl=on -c "ssl_cert_file=$dir/tls/server-cert.pem"
    -c "ssl_key_file=$dir/tls/server-key.pem" -c "ssl_ca_file=$dir/tls/ca.pem"
    -c "hba_file=$dir/tls/pg_hba.conf" -c "ident_file=$dir/tls/pg_ident.conf"
    -c password_encryption=scram-sha-256)
}

prepare_start() {
  prepare_dir
  init_data
  prepare_tls
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
  # A member of a lab runs in its host's namespace (`ip netns exec` and
  # setpriv exec: the PID stays the postmaster's).
  if [ -s "$dir/netns" ]; then server_cmd=(ip netns exec "$(cat "$dir/netns")"); fi
  if [ "$(id -u)" -eq 0 ]; then
    server_cmd+=(setpriv --reuid=postgres --regid=postgres --init-groups --)
  fi
  server_cmd+=("$bindir/postgres" -D "$dir/data" -h "$(member_host)" -p "$1" -k "$socket_dir"
    "${tls_args[@]}" "${extra[@]}")
}

# Our own postmaster (its lock file names it), done with recovery and
# listening on our port (so whatever answers there is ours).
server_ready() {
  local port="$1" pid="$2"
  [ "$(pidfile_line 1)" = "$pid" ] && [ "$(pidfile_line 8)" = ready ] &&
    timeout 5 "$bindir/pg_isready" -q -h "$(member_host)" -p "$port" -U postgres -d postgres -t 2 >/dev/null 2>&1
}

# With --tls: the users simba (password) and simba_cert (client
# certificate), each allowed to create in simba's schema public and to use
# what the other creates there. Run again on every start (idempotent).
create_tls_users() {
  local port="$1" out
  [ -n "$tls_src" ] || return 0
  out="$(timeout 30 "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d simba \
           -v ON_ERROR_STOP=1 2>&1 <<'SQL'
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'simba') THEN
    CREATE ROLE simba LOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'simba_cert') THEN
    CREATE ROLE simba_cert LOGIN;
  END IF;
END
$$;
SET password_encryption = 'scram-sha-256';
ALTER ROLE simba PASSWORD 'tls-secret-pw';
GRANT USAGE, CREATE ON SCHEMA public TO simba, simba_cert;
ALTER DEFAULT PRIVILEGES FOR ROLE simba IN SCHEMA public GRANT ALL ON TABLES TO simba_cert;
ALTER DEFAULT PRIVILEGES FOR ROLE simba IN SCHEMA public GRANT ALL ON SEQUENCES TO simba_cert;
ALTER DEFAULT PRIVILEGES FOR ROLE simba_cert IN SCHEMA public GRANT ALL ON TABLES TO simba;
ALTER DEFAULT PRIVILEGES FOR ROLE simba_cert IN SCHEMA public GRANT ALL ON SEQUENCES TO simba;
SQL
)" || {
    echo "postgres.sh: creating the TLS users failed: $out" >&2
    return 1
  }
}

after_start() {
  create_database "$1"
  create_tls_users "$1"
}

server_uri() {
  if [ -n "$tls_src" ]; then
    echo "postgresql://simba:tls-secret-pw@127.0.0.1:$1/simba?tls=verify&tls_ca=$dir/tls/ca.pem"
  else
    echo "postgresql://postgres@$(member_host):$1/simba"
  fi
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

# ---- a primary and a streaming standby ------------------------------------------
#
#   postgres.sh start DIR --standby [--sync] [postgres args...]
#   postgres.sh start DIR --topology primary-standby [--sync] [postgres args...]
#       a primary (member 1, DIR/n1) and a hot standby streaming from it
#       (member 2, DIR/n2, made by pg_basebackup -R), each a server of this
#       script on its own free port; prints
#       postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/simba (DIR/uri; DIR/port
#       is P1). Replication is asynchronous unless --sync: then the primary
#       names the standby in synchronous_standby_names, and a commit returns
#       once the standby has flushed it. A start on an existing cluster
#       directory starts its members again (a member that was the primary
#       before the other was promoted stays down: two primaries would split).
#   postgres.sh stop|kill|pause|resume DIR   every member
#   postgres.sh status DIR      one line per member: "N running PID PORT
#                               primary|standby" or "N stopped"
#   postgres.sh primary DIR     the number of each running member that is not
#                               in recovery (a primary), one a line; exit 1 if none
#   postgres.sh kill-member|stop-member|start-member|pause-member|resume-member DIR N
#   postgres.sh member-uri DIR N    the URI of member N alone
#   postgres.sh promote DIR N   pg_promote() on standby N, waiting until it
#                               serves writes
#   postgres.sh rejoin DIR N    make member N (a former primary, now down)
#                               a standby of the other member, the primary
#                               now: its data is replaced by a base backup
#                               of the primary (-R), then it starts and the
#                               primary streams to it (synchronously with
#                               --sync) before this returns
#   postgres.sh pause-replication|resume-replication DIR N
#                               SIGSTOP / SIGCONT to primary N's walsenders:
#                               its standby falls behind (what N commits
#                               meanwhile is lost if N dies)
cluster_dir=""

cluster_usage() {
  echo "usage: postgres.sh start DIR --standby|--topology primary-standby [--sync] [postgres args...]" >&2
  echo "       postgres.sh stop|kill|pause|resume|status|uri|primary DIR" >&2
  echo "       postgres.sh kill-member|stop-member|start-member|pause-member|resume-member|member-uri|promote|rejoin|pause-replication|resume-replication DIR N" >&2
  exit 2
}

# Runs this script's single-server command $2 on member $1.
member_cmd() {
  local n="$1" cmd="$2"
  shift 2
  bash "$script" "$cmd" "$cluster_dir/n$n" "$@"
}

member_port() { cat "$cluster_dir/n$1/port" 2>/dev/null; }

# "HOST:PORT" of member $1.
member_addr() { echo "$(member_host "$cluster_dir/n$1"):$(member_port "$1")"; }

# psql as postgres on member $1; prints the unaligned rows.
member_sql() {
  timeout 10 "$bindir/psql" -X -q -A -t -h "$(member_host "$cluster_dir/n$1")" -p "$(member_port "$1")" -U postgres \
    -d postgres -v ON_ERROR_STOP=1 -c "$2"
}

member_running() {
  bash "$script" status "$cluster_dir/n$1" >/dev/null 2>&1
}

# "primary", "standby" or "" (down or not answering).
member_role() {
  local r
  member_running "$1" || return 0
  r="$(member_sql "$1" 'select pg_is_in_recovery()' 2>/dev/null || true)"
  case "$r" in t) echo standby ;; f) echo primary ;; esac
}

check_member() {
  case "${1:-}" in 1 | 2) ;; *) echo "postgres.sh: member must be 1 or 2, not '${1:-}'" >&2; exit 2 ;; esac
}

# Waits up to 30 s until the primary $1 streams to a standby (and, with
# --sync, a synchronous one).
wait_streaming() {
  local want="streaming" deadline=$((SECONDS + 30)) got
  while :; do
    got="$(member_sql "$1" "select state || ' ' || sync_state from pg_stat_replication" 2>/dev/null || true)"
    case "$got" in
      "streaming sync"*) return 0 ;;
      "streaming async"*) [ "$(cat "$cluster_dir/sync" 2>/dev/null)" = on ] || return 0 ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "postgres.sh: the standby is not $want from member $1 after 30 s (pg_stat_replication: '$got')" >&2
      return 1
    fi
    sleep 0.1
  done
}

cluster_start() {
  local sync=off arg out
  local -a args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --standby) shift ;;
      --topology)
        [ "${2:-}" = primary-standby ] || { echo "postgres.sh: the only topology is primary-standby" >&2; exit 2; }
        shift 2 ;;
      --sync) sync=on; shift ;;
      --tls | --tls-expired) echo "postgres.sh: --tls is not supported with --standby" >&2; exit 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  mkdir -p "$cluster_dir"
  cluster_dir="$(cd "$cluster_dir" && pwd -P)"
  if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$cluster_dir"; fi
  bindir="$(find_bindir)"
  if [ -f "$cluster_dir/topology" ] && [ -e "$cluster_dir/n2/initialized" ]; then
    # Again: each member as it was; a former primary whose standby was
    # promoted is left down.
    local n promoted
    promoted="$(cat "$cluster_dir/promoted" 2>/dev/null || true)"
    for n in 1 2; do
      if [ -n "$promoted" ] && [ "$n" != "$promoted" ] && [ ! -e "$cluster_dir/n$n/data/standby.signal" ]; then
        echo "postgres.sh: member $n was the primary before member $promoted was promoted: left down" >&2
        continue
      fi
      member_cmd "$n" start "${args[@]}" >/dev/null
    done
    cat "$cluster_dir/uri"
    return 0
  fi
  rm -rf "${cluster_dir:?}/n1" "${cluster_dir:?}/n2" "$cluster_dir/promoted"
  if [ -n "${SIMBA_NETNS:-}" ]; then
    # Member N on host N of the lab (scripts/servers/netns.sh).
    for arg in 1 2; do place_on_lab_host "$cluster_dir/n$arg" "$arg"; done
  fi
  echo primary-standby >"$cluster_dir/topology"
  echo "$sync" >"$cluster_dir/sync"
  : >"$cluster_dir/args"
  if [ ${#args[@]} -gt 0 ]; then printf '%s\n' "${args[@]}" >"$cluster_dir/args"; fi
  member_cmd 1 start "${args[@]}" >/dev/null
  # The standby: a base backup of the primary that follows it (-R writes
  # primary_conninfo and standby.signal). Trust on 127.0.0.1 lets it in.
  mkdir -p "$cluster_dir/n2"
  if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$cluster_dir/n2"; fi
  if ! out="$(as_server_user timeout 120 "$bindir/pg_basebackup" -h "$(member_host "$cluster_dir/n1")" -p "$(member_port 1)" \
      -U postgres -D "$cluster_dir/n2/data" -R -X stream -c fast --no-sync 2>&1)"; then
    echo "postgres.sh: pg_basebackup from member 1 failed: $out" >&2
    member_cmd 1 stop || true
    exit 1
  fi
  touch "$cluster_dir/n2/initialized"
  member_cmd 2 start "${args[@]}" >/dev/null || { member_cmd 1 stop || true; exit 1; }
  if [ "$sync" = on ]; then
    member_sql 1 "alter system set synchronous_standby_names = '*'" >/dev/null
    member_sql 1 "select pg_reload_conf()" >/dev/null
  fi
  wait_streaming 1 || { cluster_stop; exit 1; }
  member_port 1 >"$cluster_dir/port"
  echo "postgresql://postgres@$(member_addr 1),$(member_addr 2)/simba" >"$cluster_dir/uri"
  cat "$cluster_dir/uri"
}

cluster_stop() {
  local n
  for n in 2 1; do member_cmd "$n" stop || true; done
}

cluster_main() {
  local cmd="$1" n="" role
  cluster_dir="$2"
  shift 2
  case "$cmd" in
    start) cluster_start "$@"; return ;;
    stop) cluster_stop; return ;;
    kill | pause | resume)
      for n in 1 2; do
        if member_running "$n"; then member_cmd "$n" "$cmd"; fi
      done
      return ;;
    uri) cat "$cluster_dir/uri"; return ;;
  esac
  bindir="$(find_bindir)"
  case "$cmd" in
    status)
      local any=3
      for n in 1 2; do
        if member_running "$n"; then
          any=0
          echo "$n running $(bash "$script" status "$cluster_dir/n$n" | cut -d' ' -f2) $(member_port "$n") $(member_role "$n")"
        else
          echo "$n stopped"
        fi
      done
      return "$any" ;;
    primary)
      local found=1
      for n in 1 2; do
        if [ "$(member_role "$n")" = primary ]; then echo "$n"; found=0; fi
      done
      return "$found" ;;
  esac
  n="${1:-}"
  check_member "$n"
  case "$cmd" in
    kill-member | stop-member | pause-member | resume-member) member_cmd "$n" "${cmd%-member}" ;;
    start-member)
      local -a args=()
      mapfile -t args <"$cluster_dir/args"
      member_cmd "$n" start "${args[@]}" >/dev/null ;;
    member-uri) cat "$cluster_dir/n$n/uri" ;;
    pause-replication) signal_walsenders "$n" STOP ;;
    resume-replication) signal_walsenders "$n" CONT ;;
    promote)
      role="$(member_role "$n")"
      if [ "$role" != standby ]; then
        echo "postgres.sh: member $n is not a running standby (${role:-down})" >&2
        exit 1
      fi
      # Waits (up to 60 s) until the promotion is done.
      [ "$(member_sql "$n" 'select pg_promote(true, 60)')" = t ] || {
        echo "postgres.sh: pg_promote on member $n did not finish" >&2
        exit 1
      }
      echo "$n" >"$cluster_dir/promoted" ;;
    rejoin) rejoin_member "$n" ;;
    *) cluster_usage ;;
  esac
}

# Makes member $1 a standby of the other member, which must be the primary:
# a former primary cannot follow its successor (their histories forked at
# the promotion), so its data is replaced by a base backup of the primary.
rejoin_member() {
  local n="$1" primary=$((3 - $1)) out
  local -a args=()
  if [ "$(member_role "$primary")" != primary ]; then
    echo "postgres.sh: member $primary is not a running primary for member $n to follow" >&2
    exit 1
  fi
  if member_running "$n"; then member_cmd "$n" stop; fi
  rm -rf "${cluster_dir:?}/n$n/data"
  if ! out="$(as_server_user timeout 120 "$bindir/pg_basebackup" -h "$(member_host "$cluster_dir/n$primary")" \
      -p "$(member_port "$primary")" -U postgres -D "$cluster_dir/n$n/data" -R -X stream -c fast \
      --no-sync 2>&1)"; then
    echo "postgres.sh: pg_basebackup from member $primary failed: $out" >&2
    exit 1
  fi
  mapfile -t args <"$cluster_dir/args"
  member_cmd "$n" start "${args[@]}" >/dev/null
  if [ "$(cat "$cluster_dir/sync" 2>/dev/null)" = on ]; then
    member_sql "$primary" "alter system set synchronous_standby_names = '*'" >/dev/null
    member_sql "$primary" "select pg_reload_conf()" >/dev/null
  fi
  wait_streaming "$primary"
}

# SIGSTOP (`pause`) or SIGCONT to the walsenders of primary member $1: what
# it commits meanwhile stays on it (a standby that falls behind).
signal_walsenders() {
  local n="$1" sig="$2" pid child found=1
  pid="$(cat "$cluster_dir/n$n/pid" 2>/dev/null || true)"
  [ -n "$pid" ] || { echo "postgres.sh: member $n is not running" >&2; exit 1; }
  for child in $(children_of "$pid"); do
    if tr '\0' ' ' <"/proc/$child/cmdline" 2>/dev/null | grep -q '^postgres: walsender'; then
      kill "-$sig" "$child"
      found=0
    fi
  done
  [ "$found" -eq 0 ] || { echo "postgres.sh: member $n has no walsender" >&2; exit 1; }
}

# A cluster command: `start DIR --standby|--topology ...`, any command on a
# directory that holds a cluster, or a member command.
if [ $# -ge 2 ]; then
  case "$1" in
    *-member | member-uri | promote | rejoin | primary | *-replication)
      if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
      cluster_main "$@"
      exit $? ;;
  esac
  if [ -f "$2/topology" ] || { [ "$1" = start ] && [[ " ${*:3} " == *" --standby "* || " ${*:3} " == *" --topology "* ]]; }; then
    # The members' watchdogs watch our caller, not this script.
    if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
    rc=0
    cluster_main "$@" || rc=$?
    exit "$rc"
  fi
fi

server_main "$@"
