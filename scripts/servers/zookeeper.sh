#!/usr/bin/env bash
# Starts and stops a private ZooKeeper server (standalone) for Simba's tests:
# bound to 127.0.0.1, on a free port, with its data directory (DIR/data),
# zoo.cfg, log, pid, port and uri files in DIR. Every process is addressed by
# the PID recorded in DIR (the JVM), never by name, so servers of other people
# or other test runs are left alone.
#
#   zookeeper.sh start DIR [key=value...]  start (again) and print the uri
#   zookeeper.sh stop DIR    SIGTERM, then SIGKILL after 10 s; no server is fine
#   zookeeper.sh kill DIR    SIGKILL to the JVM (a crash); DIR/port and the
#                            data are kept for a restart
#   zookeeper.sh pause DIR   SIGSTOP (a server that hangs)
#   zookeeper.sh resume DIR  SIGCONT
#   zookeeper.sh uri DIR     print zookeeper://127.0.0.1:PORT
#
# Debian ships no launcher usable outside systemd, so the script writes
# DIR/zoo.cfg and runs `java ... ZooKeeperServerMain DIR/zoo.cfg` with
# Debian's zookeeper.jar (its manifest's Class-Path brings its dependencies)
# and slf4j-simple (the binding it lacks; the log goes to DIR/zookeeper.log).
# tickTime is 500 ms, so session timeouts may be 1-10 s (ZooKeeper clamps
# them to [2, 20] x tickTime); maxClientCnxns=0 lifts the default limit of 60
# connections per client address (every test client is 127.0.0.1); the
# AdminServer (:8080) is off; the four-letter words ruok, srvr, mntr, stat
# and conf are allowed. The server keeps its defaults otherwise (forceSync:
# every transaction is fsynced before it is acknowledged), so a write
# survives a kill. Extra start args are zoo.cfg lines appended after ours,
# and a later line overrides an earlier one (e.g. `tickTime=2000`).
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

# Generous: a JVM on a loaded CI machine is slow to start, and after a kill
# the server first replays its transaction log.
start_timeout=30
stop_timeout=10

usage() {
  echo "usage: zookeeper.sh start|stop|kill|pause|resume|uri DIR [zoo.cfg lines key=value...]" >&2
  exit 2
}

# Sets java and classpath: Debian's zookeeper.jar (whose manifest names its
# dependencies) and the slf4j-simple binding.
find_programs() {
  local p jar="" slf4j=""
  java=""
  for p in java /usr/lib/jvm/default-java/bin/java; do
    if command -v "$p" >/dev/null; then java="$(command -v "$p")"; break; fi
  done
  for p in /usr/share/java/zookeeper.jar /usr/share/zookeeper/zookeeper.jar; do
    if [ -f "$p" ]; then jar="$p"; break; fi
  done
  if [ -f /usr/share/java/slf4j-simple.jar ]; then slf4j=/usr/share/java/slf4j-simple.jar; fi
  if [ -z "$java" ] || [ -z "$jar" ] || [ -z "$slf4j" ]; then
    echo "zookeeper.sh: found no java, zookeeper.jar or slf4j-simple.jar (install zookeeper libslf4j-java)" >&2
    return 1
  fi
  classpath="$jar:$slf4j"
}

# True if PID runs and is a ZooKeeper server JVM. A zombie counts as gone:
# PID 1 of some containers reaps late, and a server that has exited serves
# nobody. The name and command line checks keep a recycled PID from being
# signalled.
server_alive() {
  local pid="$1" state comm
  [ -n "$pid" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = java ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qx org.apache.zookeeper.server.ZooKeeperServerMain
}

# Sends four-letter word $2 to 127.0.0.1:$1 and prints the answer (the
# server closes the connection after it). Bash's /dev/tcp: no nc needed. A
# paused server accepts (the kernel does) but never answers: hence timeout.
four_letter() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf %s "$1" >&3 && cat <&3' \
    "$1" "$2" 2>/dev/null
}

# Writes DIR/zoo.cfg for port $1; the extra args are appended as lines.
write_config() {
  local port="$1" line
  {
    echo "# Written by zookeeper.sh on every start; extra start args at the end."
    echo "tickTime=500"
    echo "dataDir=$dir/data"
    echo "clientPort=$port"
    echo "clientPortAddress=127.0.0.1"
    echo "maxClientCnxns=0"
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=ruok,srvr,mntr,stat,conf"
    for line in "${extra[@]}"; do echo "$line"; done
  } >"$dir/zoo.cfg.tmp"
  mv "$dir/zoo.cfg.tmp" "$dir/zoo.cfg"
}

# Starts ZooKeeper on port $1, detached, and waits until it serves requests.
# Returns 3 if the port was taken under our feet.
launch() {
  local port="$1" pid="" deadline log_start
  rm -f "$dir/pid"
  mkdir -p "$dir/data"
  write_config "$port"
  touch "$dir/zookeeper.log"
  log_start=$(($(stat -c %s "$dir/zookeeper.log") + 1))
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. Its stdin goes to /dev/null and
  # its log to DIR/zookeeper.log (ctest waits for its pipes to close), and
  # the wrapper closes every other inherited descriptor (a test's client
  # socket held open by the server would hide the client's disconnects). The
  # wrapper writes its own PID, which stays the JVM's after exec, whether or
  # not setsid had to fork. -XX:-UsePerfData: no /tmp/hsperfdata file, which
  # a killed JVM would leave behind.
  # shellcheck disable=SC2016  # expanded by the wrapper, not here
  (cd "$dir" && exec setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv "$0.tmp" "$0"
    exec "$@"
  ' "$dir/pid" \
    "$java" -Xmx512m -XX:-UsePerfData \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd HH:mm:ss.SSS" \
    -cp "$classpath" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
    </dev/null >>"$dir/zookeeper.log" 2>&1) &

  deadline=$((SECONDS + start_timeout))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      # Our own server (its data directory), not another one on the same
      # port, and done loading its data: ruok answers imok as soon as the
      # port is open, srvr names the mode only once requests are served.
      if four_letter "$port" conf | grep -qx "dataDir=$dir/data/version-2" &&
         four_letter "$port" srvr | grep -q '^Mode: '; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "zookeeper.sh: ZooKeeper on port $port did not serve within $start_timeout s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || true
      fi
      rm -f "$dir/pid"
      tail -c "+$log_start" "$dir/zookeeper.log" | tail -n 20 >&2 || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -c "+$log_start" "$dir/zookeeper.log" | grep -q "Address already in use"; then
    return 3
  fi
  echo "zookeeper.sh: ZooKeeper exited at start" >&2
  tail -c "+$log_start" "$dir/zookeeper.log" | tail -n 20 >&2 || true
  return 1
}

cmd_start() {
  local port="" rc line
  for line in "${extra[@]}"; do
    case "$line" in
      [A-Za-z]*=*) ;;
      *) echo "zookeeper.sh: extra arg '$line' is not a zoo.cfg line key=value" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  find_programs
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  local old
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "zookeeper.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  if [ -s "$dir/port" ]; then
    # A restart keeps the address clients already know.
    port="$(cat "$dir/port")"
    launch "$port" || { rc=$?; [ "$rc" -ne 3 ] || echo "zookeeper.sh: port $port is taken" >&2; exit 1; }
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
  echo "zookeeper://127.0.0.1:$port" >"$dir/uri"
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
      echo "zookeeper.sh: pid $pid ignored SIGTERM for $stop_timeout s; sending SIGKILL" >&2
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
    echo "zookeeper.sh: no server running in $dir" >&2
    exit 1
  fi
  kill "-$1" "$pid"
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "zookeeper.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
shift 2
extra=("$@")
java="" classpath=""
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
