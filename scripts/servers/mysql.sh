#!/usr/bin/env bash
# Starts and stops a private MariaDB server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR, never by name, so servers of other people or other test
# runs are left alone. The commands are scripts/servers/common.sh's; this
# script says how mariadbd runs.
#
#   mysql.sh start DIR [--tls CERTS] [mariadbd args...]
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
# (CERTS/client-cert.pem with CERTS/client-key.pem).
#
# As root, DIR is given to the Debian user mysql and the server runs as that
# user (DIR's parents must let it in); otherwise it runs as the current user.
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

kind=mysql
server_name=mariadbd
server_comm=mariadbd
log_name=mysqld.log
usage_args="[--tls CERTS] [mariadbd args...]"
# Generous: after a kill the server first runs crash recovery.
start_timeout=30
stop_timeout=30

user=simba
x509_user=simba_x509
password=simba-test
database=simba

mysqld="" install_db="" client=""
user_args=()
tls_src=""
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
EOF
  if ! "$install_db" --no-defaults "${user_args[@]}" --auth-root-authentication-method=socket \
      --datadir="$dir/data" --skip-test-db --skip-name-resolve \
      --extra-file="$dir/setup.sql" >"$dir/install-db.log" 2>&1; then
    echo "mysql.sh: mariadb-install-db failed" >&2
    tail -n 20 "$dir/install-db.log" >&2 || true
    return 1
  fi
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
  cp "$tls_src/ca.pem" "$tls_src/server-cert.pem" "$tls_src/server-key.pem" "$dir/tls/"
  if [ "$(id -u)" -eq 0 ]; then chown -R mysql:mysql "$dir/tls"; fi
  tls_args=(--ssl-ca="$dir/tls/ca.pem" --ssl-cert="$dir/tls/server-cert.pem"
    --ssl-key="$dir/tls/server-key.pem")
  client_tls_args=(--ssl --ssl-ca="$dir/tls/ca.pem" --ssl-verify-server-cert)
}

# Runs SQL $2 as the TCP user on port $1; prints tab-separated rows.
query() {
  timeout 10 "$client" --no-defaults --protocol=tcp -h 127.0.0.1 -P "$1" \
    "${client_tls_args[@]}" -u "$user" "-p$password" --connect-timeout=2 -N -B -e "$2" \
    "$database"
}

# `--tls CERTS` first after DIR, then the server's args.
parse_args() {
  if [ "${1:-}" = --tls ]; then
    [ $# -ge 2 ] || usage
    tls_src="$(mkdir -p "$2" && cd "$2" && pwd -P)"
    shift 2
  fi
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
  server_cmd=("$mysqld" --no-defaults "${user_args[@]}" --datadir="$dir/data"
    --bind-address=127.0.0.1 --port="$1" --socket="$dir/mysqld.sock"
    --pid-file="$dir/mysqld.pid" --skip-name-resolve
    "${tls_args[@]}" "${extra[@]}")
}

# Our own server (its data directory), not another one on the same port,
# and it lets our user in.
server_ready() {
  [ "$(query "$1" 'select @@datadir' 2>/dev/null || true)" = "$dir/data/" ]
}

server_uri() {
  echo "mysql://$user:$password@127.0.0.1:$1/$database"
}

server_main "$@"
