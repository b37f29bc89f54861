#!/usr/bin/env bash
# Starts and stops a private MariaDB server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR, never by name, so servers of other people or other test
# runs are left alone. The commands are scripts/servers/common.sh's; this
# script says how mariadbd runs.
#
#   mysql.sh start DIR [--tls CERTS | --tls-expired CERTS] [mariadbd args...]
#                         start (again) and print the uri
#   mysql.sh stop DIR     SIGTERM, then SIGKILL after 30 s; no server is fine
#   mysql.sh kill DIR     SIGKILL (a crash); DIR/port and the data are kept
#                         for a restart, which runs crash recovery
#   mysql.sh pause DIR    SIGSTOP (a server that hangs)
#   mysql.sh resume DIR   SIGCONT
#   mysql.sh status DIR   "running PID URI" or "stopped" (exit 3)
#   mysql.sh uri DIR      print mysql://simba:simba-test@127.0.0.1:PORT/simba
#
# The first start initializes DIR/data (mariadb-install-db) with a database
# simba and a user simba (password simba-test, every privilege on simba.*)
# for clients over TCP; root may log in over DIR/mysqld.sock only. A restart
# reuses the data. The server ignores every my.cnf (--no-defaults) and keeps
# its defaults (innodb_flush_log_at_trx_commit=1), so a commit survives a
# kill. Extra start args come after ours, and mariadbd lets a later option
# override an earlier one (e.g. `--max-connections=300`).
#
# TLS: with `--tls CERTS` (first after DIR), the server also accepts TLS
# with the certificate CERTS/server-cert.pem (CN localhost, SAN localhost and
# 127.0.0.1), signed by CERTS/ca.pem; scripts/servers/test-ca.sh makes them
# in CERTS first if they are missing, and this script copies them to DIR/tls.
# Clients that do not ask for TLS are still served; `--require-secure-transport=ON`
# as an extra arg makes a TLS-only server (this script's own readiness check
# uses TLS then too). Every data directory also has a user simba_x509
# (password simba-test, the same privileges as simba) that REQUIREs X509: it
# gets in only with a client certificate signed by the CA the server trusts
# (CERTS/client-cert.pem with CERTS/client-key.pem). `--tls-expired CERTS`
# is the same with CERTS/expired-cert.pem (valid only in January 2020) as
# the server's certificate, for tests that clients refuse it.
#
# As root, DIR is given to the Debian user mysql and the server runs as that
# user (DIR's parents must let it in); otherwise it runs as the current user.
#
# Environment:
#   SIMBA_NETNS             a lab of network namespaces (scripts/servers/netns.sh)
#                           for --replica: member N runs in host N's namespace
#                           and listens on its address (DIR/nN/host), and the
#                           replication user may come from the lab's subnet, so
#                           that the primary can be cut off from its replica
#                           (netns.sh isolate) while the clients still reach it
#   SIMBA_SERVER_OWNER_PID  a PID (or "parent" for the caller of this script):
#                           a watchdog stops the server once that process is
#                           gone, so a test binary that crashes or a ctest
#                           that is interrupted leaks no server.
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=mysql
server_name=mariadbd
server_comm=mariadbd
log_name=mysqld.log
usage_args="[--tls CERTS | --tls-expired CERTS] [mariadbd args...]"
# Generous: after a kill the server first runs crash recovery.
start_timeout=30
stop_timeout=30

user=simba
x509_user=simba_x509
# For a replica of this server (start --replica): loopback only.
repl_user=simba_repl
password=simba-test
database=simba

mysqld="" install_db="" client=""
user_args=()
tls_src=""
tls_server="server"
tls_args=()
client_tls_args=()

# Sets mysqld, install_db and client to the MariaDB programs (the server is
# in /usr/sbin, which a user's PATH may lack).
find_programs() {
  local p
  mysqld="" install_db="" client=""
  for p in mariadbd /usr/sbin/mariadbd /usr/libexec/mariadbd; do
    if command -v "$p" >/dev/null; then mysqld="$(command -v "$p")"; break; fi
  done
  for p in mariadb-install-db /usr/bin/mariadb-install-db; do
    if command -v "$p" >/dev/null; then install_db="$(command -v "$p")"; break; fi
  done
  for p in mariadb /usr/bin/mariadb; do
    if command -v "$p" >/dev/null; then client="$(command -v "$p")"; break; fi
  done
  if [ -z "$mysqld" ] || [ -z "$install_db" ] || [ -z "$client" ]; then
    echo "mysql.sh: found no MariaDB server and client (install mariadb-server mariadb-client)" >&2
    return 1
  fi
}

# As root, hands DIR to the user mysql (the server writes its socket and pid
# file there) and checks that this user can reach it (every parent directory
# must let it through).
prepare_dir() {
  user_args=()
  if [ "$(id -u)" -ne 0 ]; then return 0; fi
  if ! id mysql >/dev/null 2>&1; then
    echo "mysql.sh: mariadbd does not run as root, and there is no user mysql" >&2
    return 1
  fi
  user_args=(--user=mysql)
  chown mysql:mysql "$dir"
  if ! setpriv --reuid=mysql --regid=mysql --init-groups -- test -w "$dir" -a -x "$dir"; then
    echo "mysql.sh: user mysql cannot enter $dir (a parent directory is closed to it)" >&2
    return 1
  fi
}

# Initializes DIR/data once, with the database and user for TCP clients. An
# initialization that was interrupted leaves no DIR/initialized and is redone
# from scratch.
init_data() {
  if [ -e "$dir/initialized" ] && [ -d "$dir/data" ]; then return 0; fi
  rm -rf "$dir/data"
  # Run at the end of the bootstrap, which starts with the grant tables off:
  # FLUSH PRIVILEGES turns them on for CREATE USER and GRANT.
  cat >"$dir/setup.sql" <<EOF
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS \`$database\`;
CREATE USER IF NOT EXISTS '$user'@'%' IDENTIFIED BY '$password';
GRANT ALL PRIVILEGES ON \`$database\`.* TO '$user'@'%';
CREATE USER IF NOT EXISTS '$x509_user'@'%' IDENTIFIED BY '$password' REQUIRE X509;
GRANT ALL PRIVILEGES ON \`$database\`.* TO '$x509_user'@'%';
CREATE USER IF NOT EXISTS '$repl_user'@'127.0.0.1' IDENTIFIED BY '$password';
GRANT REPLICATION SLAVE ON *.* TO '$repl_user'@'127.0.0.1';
EOF
  if [ -s "$dir/host" ]; then
    # A member of a lab: its replica comes from the lab's subnet.
    local from
    from="$(cut -d. -f1-3 "$dir/host").%"
    cat >>"$dir/setup.sql" <<EOF
CREATE USER IF NOT EXISTS '$repl_user'@'$from' IDENTIFIED BY '$password';
GRANT REPLICATION SLAVE ON *.* TO '$repl_user'@'$from';
EOF
  fi
  # A second try after a failed bootstrap: a CI run on a loaded 2-core
  # machine once saw it fail with only the tool's help text in the last 20
  # lines, so the error lines of a failed try are printed either way.
  local try
  for try in 1 2; do
    if "$install_db" --no-defaults "${user_args[@]}" --auth-root-authentication-method=socket \
        --datadir="$dir/data" --skip-test-db --skip-name-resolve \
        --extra-file="$dir/setup.sql" >"$dir/install-db.log" 2>&1; then
      break
    fi
    echo "mysql.sh: mariadb-install-db failed (try $try of 2):" >&2
    grep -iE 'error|abort|fail|cannot|denied' "$dir/install-db.log" | head -n 20 >&2 || true
    if [ "$try" = 2 ]; then
      tail -n 20 "$dir/install-db.log" >&2 || true
      return 1
    fi
    rm -rf "$dir/data"
    sleep 1
  done
  touch "$dir/initialized"
}

# Kills a mariadbd whose working directory is our data directory (the server
# chdirs there) but whose PID DIR does not hold any more: it would keep the
# data files locked. Runs only when our server is down.
clean_leftovers() {
  local f pid comm
  for f in /proc/[0-9]*/comm; do
    comm=""
    read -r comm 2>/dev/null <"$f" || continue
    [ "$comm" = mariadbd ] || continue
    pid="${f#/proc/}"
    pid="${pid%/comm}"
    if [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$dir/data" ] && server_alive "$pid"; then
      echo "mysql.sh: killing pid $pid left over from an earlier server in $dir" >&2
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 10 || true
    fi
  done
}

# With --tls CERTS: copies the server's certificate, key and CA to DIR/tls
# (made first by test-ca.sh if missing; as root, readable by the user mysql)
# and sets tls_args for the server and client_tls_args for our client.
prepare_tls() {
  tls_args=()
  client_tls_args=()
  [ -n "$tls_src" ] || return 0
  bash "$(dirname "$script")/test-ca.sh" "$tls_src"
  mkdir -p "$dir/tls"
  cp "$tls_src/ca.pem" "$dir/tls/ca.pem"
  cp "$tls_src/$tls_server-cert.pem" "$dir/tls/server-cert.pem"
  cp "$tls_src/$tls_server-key.pem" "$dir/tls/server-key.pem"
  if [ "$(id -u)" -eq 0 ]; then chown -R mysql:mysql "$dir/tls"; fi
  tls_args=(--ssl-ca="$dir/tls/ca.pem" --ssl-cert="$dir/tls/server-cert.pem"
    --ssl-key="$dir/tls/server-key.pem")
  client_tls_args=(--ssl --ssl-ca="$dir/tls/ca.pem" --ssl-verify-server-cert)
  # An expired certificate fails every verification, ours too.
  if [ "$tls_server" = expired ]; then client_tls_args=(--ssl); fi
}

# Runs SQL $2 as the TCP user on port $1; prints tab-separated rows.
query() {
  timeout 10 "$client" --no-defaults --protocol=tcp -h "$(member_host)" -P "$1" \
    "${client_tls_args[@]}" -u "$user" "-p$password" --connect-timeout=2 -N -B -e "$2" \
    "$database"
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

prepare_start() {
  # A Unix socket path longer than 107 bytes is refused.
  if [ $((${#dir} + 12)) -gt 107 ]; then
    echo "mysql.sh: $dir/mysqld.sock is too long for a Unix socket (107 bytes at most)" >&2
    exit 1
  fi
  prepare_dir
  prepare_tls
  init_data
}

before_launch() {
  clean_leftovers
}

server_command() {
  server_cmd=()
  # A member of a lab runs in its host's namespace (`ip netns exec` execs:
  # the PID stays the server's).
  if [ -s "$dir/netns" ]; then server_cmd=(ip netns exec "$(cat "$dir/netns")"); fi
  server_cmd+=("$mysqld" --no-defaults "${user_args[@]}" --datadir="$dir/data"
    --bind-address="$(member_host)" --port="$1" --socket="$dir/mysqld.sock"
    --pid-file="$dir/mysqld.pid" --skip-name-resolve
    "${tls_args[@]}" "${extra[@]}")
}

# Our own server (its data directory), not another one on the same port,
# and it lets our user in.
server_ready() {
  [ "$(query "$1" 'select @@datadir' 2>/dev/null || true)" = "$dir/data/" ]
}

server_uri() {
  echo "mysql://$user:$password@$(member_host):$1/$database"
}

# ---- a primary and a replica ---------------------------------------------------
#
#   mysql.sh start DIR --replica [--semi-sync] [mariadbd args...]
#   mysql.sh start DIR --topology primary-replica [--semi-sync] [mariadbd args...]
#       a primary (member 1, DIR/n1, binary log on, server_id 1) and a replica
#       of it (member 2, DIR/n2, server_id 2, read_only=ON, its own binary log
#       so that it can be promoted) replicating over GTID (MASTER_USE_GTID=
#       slave_pos) as the user simba_repl; each a server of this script on
#       its own free port. Prints the primary's URI (DIR/uri; DIR/port is its
#       port; `member-uri` names each). Replication is asynchronous; with
#       --semi-sync it is semi-synchronous (rpl_semi_sync_master_wait_point=
#       AFTER_SYNC): the primary answers a commit once the replica has it in
#       its relay log, or after rpl_semi_sync_master_timeout (60 s) without
#       an answer, when it falls back to asynchronous.
#   mysql.sh stop|kill|pause|resume DIR   every member
#   mysql.sh status DIR      one line per member: "N running PID PORT
#                            primary|replica" or "N stopped"
#   mysql.sh primary DIR     each running member that is not read-only, one a
#                            line; exit 1 if none
#   mysql.sh kill-member|stop-member|start-member|pause-member|resume-member DIR N
#   mysql.sh member-uri DIR N    the URI of member N
#   mysql.sh promote DIR N   on replica N: stop receiving, apply what the
#                            relay log holds (MASTER_GTID_WAIT up to 10 s),
#                            STOP SLAVE, RESET SLAVE ALL, read_only=OFF
#   mysql.sh pause-replication|resume-replication DIR N
#                            STOP / START SLAVE IO_THREAD on the replica of
#                            primary N: it receives nothing meanwhile (what N
#                            commits then is lost if N dies; with --semi-sync
#                            N's commits wait)
# Every member also has a user root over its socket (DIR/nN/mysqld.sock),
# which the script uses to set replication up.
cluster_dir=""

cluster_usage() {
  echo "usage: mysql.sh start DIR --replica|--topology primary-replica [--semi-sync] [mariadbd args...]" >&2
  echo "       mysql.sh stop|kill|pause|resume|status|uri|primary DIR" >&2
  echo "       mysql.sh kill-member|stop-member|start-member|pause-member|resume-member|member-uri|promote|pause-replication|resume-replication DIR N" >&2
  exit 2
}

member_cmd() {
  local n="$1" cmd="$2"
  shift 2
  bash "$script" "$cmd" "$cluster_dir/n$n" "$@"
}

member_port() { cat "$cluster_dir/n$1/port" 2>/dev/null; }

member_running() {
  bash "$script" status "$cluster_dir/n$1" >/dev/null 2>&1
}

# SQL $2 as root over member $1's socket; tab-separated rows.
member_sql() {
  timeout 10 "$client" --no-defaults --socket="$cluster_dir/n$1/mysqld.sock" -u root \
    --connect-timeout=2 -N -B -e "$2"
}

# "primary", "replica" or "" (down or not answering).
member_role() {
  local r
  member_running "$1" || return 0
  r="$(member_sql "$1" 'select @@global.read_only' 2>/dev/null || true)"
  case "$r" in 1) echo replica ;; 0) echo primary ;; esac
}

check_member() {
  case "${1:-}" in 1 | 2) ;; *) echo "mysql.sh: member must be 1 or 2, not '${1:-}'" >&2; exit 2 ;; esac
}

member_args() {
  local n="$1"
  printf '%s\n' "--server-id=$n" --log-bin=mysql-bin --log-slave-updates=ON --binlog-format=ROW
  if [ "$n" = 2 ] && [ ! -e "$cluster_dir/promoted" ]; then echo --read-only=ON; fi
  if [ -e "$cluster_dir/semi-sync" ]; then
    # The first primary waits for its replica; a promoted replica has none
    # to wait for.
    if [ "$n" = 1 ]; then
      printf '%s\n' --rpl-semi-sync-master-enabled=ON \
        --rpl-semi-sync-master-wait-point=AFTER_SYNC --rpl-semi-sync-master-timeout=60000
    else
      echo --rpl-semi-sync-slave-enabled=ON
    fi
  fi
}

start_member() {
  local n="$1"
  local -a margs=() args=()
  mapfile -t margs < <(member_args "$n")
  mapfile -t args <"$cluster_dir/args"
  member_cmd "$n" start "${margs[@]}" "${args[@]}" >/dev/null
}

# Waits up to 30 s until the replica (member 2) runs both threads.
wait_replicating() {
  local deadline=$((SECONDS + 30)) got
  while :; do
    got="$(member_sql 2 "show global status like 'Slave_running'" 2>/dev/null | cut -f2)"
    [ "$got" != ON ] || return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "mysql.sh: member 2 is not replicating after 30 s (Slave_running: '$got')" >&2
      return 1
    fi
    sleep 0.1
  done
}

# With --semi-sync, waits up to 30 s until the primary (member 1) counts its
# replica as a semi-synchronous client.
wait_semi_sync() {
  local deadline=$((SECONDS + 30)) got
  [ -e "$cluster_dir/semi-sync" ] || return 0
  while :; do
    got="$(member_sql 1 "show global status like 'Rpl_semi_sync_master_clients'" 2>/dev/null | cut -f2)"
    [ "${got:-0}" -lt 1 ] || return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "mysql.sh: member 1 has no semi-synchronous replica after 30 s" >&2
      return 1
    fi
    sleep 0.1
  done
}

# The replica of primary $1 (the other member), if it runs as a replica.
replica_of() {
  local other=$((3 - $1))
  if [ "$(member_role "$other")" = replica ]; then echo "$other"; fi
}

# Promotes replica $1: what it has received is applied first (a failover
# tool's job; without it a commit the primary was told the replica has
# would be lost), then it stops replicating and becomes writable.
promote_member() {
  local n="$1" pos
  member_sql "$n" "STOP SLAVE IO_THREAD"
  pos="$(member_sql "$n" "SHOW SLAVE STATUS\G" | sed -n 's/^ *Gtid_IO_Pos: *//p')"
  if [ -n "$pos" ]; then
    if [ "$(member_sql "$n" "SELECT MASTER_GTID_WAIT('$pos', 10)")" != 0 ]; then
      echo "mysql.sh: member $n did not apply its relay log ($pos) within 10 s; promoting anyway" >&2
    fi
  fi
  member_sql "$n" "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF"
}

cluster_start() {
  local n semi_sync=""
  local -a args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --replica) shift ;;
      --semi-sync) semi_sync=1; shift ;;
      --topology)
        [ "${2:-}" = primary-replica ] || { echo "mysql.sh: the only topology is primary-replica" >&2; exit 2; }
        shift 2 ;;
      --tls | --tls-expired) echo "mysql.sh: --tls is not supported with --replica" >&2; exit 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  mkdir -p "$cluster_dir"
  cluster_dir="$(cd "$cluster_dir" && pwd -P)"
  if [ "$(id -u)" -eq 0 ]; then chown mysql:mysql "$cluster_dir"; fi
  find_programs
  if [ -f "$cluster_dir/topology" ] && [ -e "$cluster_dir/n2/initialized" ]; then
    local promoted
    promoted="$(cat "$cluster_dir/promoted" 2>/dev/null || true)"
    for n in 1 2; do
      if [ -n "$promoted" ] && [ "$n" != "$promoted" ]; then
        echo "mysql.sh: member $n was the primary before member $promoted was promoted: left down" >&2
        continue
      fi
      start_member "$n"
    done
    cat "$cluster_dir/uri"
    return 0
  fi
  rm -rf "${cluster_dir:?}/n1" "${cluster_dir:?}/n2" "$cluster_dir/promoted" "$cluster_dir/semi-sync"
  if [ -n "${SIMBA_NETNS:-}" ]; then
    # Member N on host N of the lab (scripts/servers/netns.sh).
    for n in 1 2; do place_on_lab_host "$cluster_dir/n$n" "$n"; done
  fi
  echo primary-replica >"$cluster_dir/topology"
  if [ -n "$semi_sync" ]; then touch "$cluster_dir/semi-sync"; fi
  : >"$cluster_dir/args"
  if [ ${#args[@]} -gt 0 ]; then printf '%s\n' "${args[@]}" >"$cluster_dir/args"; fi
  start_member 1
  start_member 2 || { member_cmd 1 stop || true; exit 1; }
  member_sql 2 "CHANGE MASTER TO MASTER_HOST='$(member_host "$cluster_dir/n1")', MASTER_PORT=$(member_port 1),
      MASTER_USER='$repl_user', MASTER_PASSWORD='$password', MASTER_USE_GTID=slave_pos,
      MASTER_CONNECT_RETRY=1; START SLAVE" || { cluster_stop; exit 1; }
  wait_replicating || { cluster_stop; exit 1; }
  wait_semi_sync || { cluster_stop; exit 1; }
  member_port 1 >"$cluster_dir/port"
  cp "$cluster_dir/n1/uri" "$cluster_dir/uri"
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
  find_programs
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
    start-member) start_member "$n" ;;
    member-uri) cat "$cluster_dir/n$n/uri" ;;
    promote)
      role="$(member_role "$n")"
      if [ "$role" != replica ]; then
        echo "mysql.sh: member $n is not a running replica (${role:-down})" >&2
        exit 1
      fi
      promote_member "$n"
      echo "$n" >"$cluster_dir/promoted" ;;
    pause-replication | resume-replication)
      local replica
      replica="$(replica_of "$n")"
      if [ -z "$replica" ]; then
        echo "mysql.sh: member $n has no running replica" >&2
        exit 1
      fi
      if [ "$cmd" = pause-replication ]; then
        member_sql "$replica" "STOP SLAVE IO_THREAD"
      else
        member_sql "$replica" "START SLAVE IO_THREAD"
      fi ;;
    *) cluster_usage ;;
  esac
}

if [ $# -ge 2 ]; then
  case "$1" in
    *-member | member-uri | promote | primary | pause-replication | resume-replication)
      if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
      cluster_main "$@"
      exit $? ;;
  esac
  if [ -f "$2/topology" ] || { [ "$1" = start ] && [[ " ${*:3} " == *" --replica "* || " ${*:3} " == *" --topology "* ]]; }; then
    # The members' watchdogs watch our caller, not this script.
    if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
    rc=0
    cluster_main "$@" || rc=$?
    exit "$rc"
  fi
fi

server_main "$@"
