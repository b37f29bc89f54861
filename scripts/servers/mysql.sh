#!/usr/bin/env bash
# Starts and stops a private MariaDB server for Simba's tests: bound to
# 127.0.0.1, on a free port, with its data directory (DIR/data), Unix socket,
# log, pid, port and uri files in DIR. Every process is addressed by the PID
# recorded in DIR, never by name, so servers of other people or other test
# runs are left alone.
#
#   mysql.sh start DIR [--tls CERTS] [mariadbd args...]
#                         start (again) and print the uri
#   mysql.sh stop DIR     SIGTERM, then SIGKILL after 30 s; no server is fine
#   mysql.sh kill DIR     SIGKILL (a crash); DIR/port and the data are kept
#                         for a restart, which runs crash recovery
#   mysql.sh pause DIR    SIGSTOP (a server that hangs)
#   mysql.sh resume DIR   SIGCONT
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
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# Port picking, PID bookkeeping and the owner watchdog, shared by every
# server script.
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

# Generous: after a kill the server first runs crash recovery.
start_timeout=30
stop_timeout=30

user=simba
x509_user=simba_x509
password=simba-test
database=simba

usage() {
  echo "usage: mysql.sh start|stop|kill|pause|resume|uri DIR [--tls CERTS] [mariadbd args...]" >&2
  exit 2
}

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

# True if PID runs and is a mariadbd. A zombie counts as gone: PID 1 of
# some containers reaps late, and a server that has exited serves nobody.
# The name check keeps a recycled PID from being signalled.
server_alive() {
  local pid="$1" state comm
  [ -n "$pid" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = mariadbd ]
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

# Starts mariadbd on port $1 (extra args in ${extra[@]}), detached, and waits
# until it accepts our user. Returns 3 if the port was taken under our feet.
launch() {
  local port="$1" pid="" deadline log_start
  rm -f "$dir/pid"
  clean_leftovers
  touch "$dir/mysqld.log"
  log_start=$(($(stat -c %s "$dir/mysqld.log") + 1))
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. Its stdin goes to /dev/null and
  # its log to DIR/mysqld.log (ctest waits for its pipes to close), and the
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
    "$mysqld" --no-defaults "${user_args[@]}" --datadir="$dir/data" \
    --bind-address=127.0.0.1 --port="$port" --socket="$dir/mysqld.sock" \
    --pid-file="$dir/mysqld.pid" --skip-name-resolve \
    "${tls_args[@]}" "${extra[@]}" </dev/null >>"$dir/mysqld.log" 2>&1) &

  deadline=$((SECONDS + start_timeout))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      # Our own server (its data directory), not another one on the same
      # port, and it lets our user in.
      if [ "$(query "$port" 'select @@datadir' 2>/dev/null || true)" = "$dir/data/" ]; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "mysql.sh: mariadbd on port $port was not ready within $start_timeout s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || true
      fi
      rm -f "$dir/pid"
      tail -c "+$log_start" "$dir/mysqld.log" | tail -n 20 >&2 || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -c "+$log_start" "$dir/mysqld.log" | grep -q "Address already in use"; then
    return 3
  fi
  echo "mysql.sh: mariadbd exited at start" >&2
  tail -c "+$log_start" "$dir/mysqld.log" | tail -n 20 >&2 || true
  return 1
}

cmd_start() {
  local port="" rc
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  find_programs
  # A Unix socket path longer than 107 bytes is refused.
  if [ $((${#dir} + 12)) -gt 107 ]; then
    echo "mysql.sh: $dir/mysqld.sock is too long for a Unix socket (107 bytes at most)" >&2
    exit 1
  fi
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  local old
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "mysql.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  prepare_dir
  prepare_tls
  init_data
  if [ -s "$dir/port" ]; then
    # A restart keeps the address clients already know.
    port="$(cat "$dir/port")"
    launch "$port" || { rc=$?; [ "$rc" -ne 3 ] || echo "mysql.sh: port $port is taken" >&2; exit 1; }
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
  echo "mysql://$user:$password@127.0.0.1:$port/$database" >"$dir/uri"
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
      echo "mysql.sh: pid $pid ignored SIGTERM for $stop_timeout s; sending SIGKILL" >&2
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
    echo "mysql.sh: no server running in $dir" >&2
    exit 1
  fi
  kill "-$1" "$pid"
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "mysql.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
shift 2
tls_src=""
if [ "${1:-}" = --tls ]; then
  [ $# -ge 2 ] || usage
  tls_src="$(mkdir -p "$2" && cd "$2" && pwd -P)"
  shift 2
fi
extra=("$@")
mysqld="" install_db="" client=""
user_args=()
tls_args=()
client_tls_args=()
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
