#!/usr/bin/env bash
# Starts and stops a private ZooKeeper server (standalone) for Simba's tests:
# bound to 127.0.0.1, on a free port, with its data directory (DIR/data),
# zoo.cfg, log, pid, port and uri files in DIR. Every process is addressed by
# the PID recorded in DIR (the JVM), never by name, so servers of other people
# or other test runs are left alone. The commands are
# scripts/servers/common.sh's; this script says how ZooKeeper runs.
#
#   zookeeper.sh start DIR [key=value...]  start (again) and print the uri
#   zookeeper.sh stop DIR    SIGTERM, then SIGKILL after 10 s; no server is fine
#   zookeeper.sh kill DIR    SIGKILL to the JVM (a crash); DIR/port and the
#                            data are kept for a restart
#   zookeeper.sh pause DIR   SIGSTOP (a server that hangs)
#   zookeeper.sh resume DIR  SIGCONT
#   zookeeper.sh status DIR  "running PID URI" or "stopped" (exit 3)
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
# shellcheck disable=SC2034  # the settings above server_main are read by common.sh
set -euo pipefail

script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=scripts/servers/common.sh
source "$(dirname "$script")/common.sh"

kind=zookeeper
server_name=ZooKeeper
server_comm=java
usage_args="[zoo.cfg lines key=value...]"
start_timeout=30
stop_timeout=10
java="" classpath=""

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

# A java is ours only if it runs ZooKeeper's server.
server_is_ours() {
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qx org.apache.zookeeper.server.ZooKeeperServerMain
}

validate_args() {
  local line
  for line in "${extra[@]}"; do
    case "$line" in
      [A-Za-z]*=*) ;;
      *) echo "zookeeper.sh: extra arg '$line' is not a zoo.cfg line key=value" >&2; exit 2 ;;
    esac
  done
}

before_launch() {
  mkdir -p "$dir/data"
  write_config "$1"
}

# -XX:-UsePerfData: no /tmp/hsperfdata file, which a killed JVM would leave
# behind.
server_command() {
  server_cmd=("$java" -Xmx512m -XX:-UsePerfData
    -Dorg.slf4j.simpleLogger.showDateTime=true
    -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd HH:mm:ss.SSS"
    -cp "$classpath" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg")
}

# Our own server (its data directory), not another one on the same port,
# and done loading its data: ruok answers imok as soon as the port is open,
# srvr names the mode only once requests are served.
server_ready() {
  four_letter "$1" conf | grep -qx "dataDir=$dir/data/version-2" &&
    four_letter "$1" srvr | grep -q '^Mode: '
}

server_uri() {
  echo "zookeeper://127.0.0.1:$1"
}

server_main "$@"
