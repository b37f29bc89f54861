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
# An ensemble (--servers N, N >= 2; 3 is the usual one): N servers on
# 127.0.0.1 (or, with SIMBA_NETNS=LAB, server I on host I of that lab of
# network namespaces, scripts/servers/netns.sh: in its namespace, on its
# address), each with a free client, quorum and election port, its own
# DIR/<n> (data, myid, zoo.cfg, log, pid) and the shared list
# server.<n>=127.0.0.1:QUORUM:ELECTION, started in parallel. DIR/servers
# holds N, DIR/uri zookeeper://127.0.0.1:C1,127.0.0.1:C2,...
#
#   zookeeper.sh start DIR --servers N [key=value...]  start every member
#   zookeeper.sh stop|kill|pause|resume DIR [n]   every member, or member n
#   zookeeper.sh restart DIR n   start member n again (same ports and data)
#   zookeeper.sh status DIR      a line per member: "n running PID MODE PORT"
#                                or "n stopped" (exit 3 if any is stopped)
#   zookeeper.sh leader DIR      n of the member that leads (exit 1: none)
#   zookeeper.sh connected DIR SESSION  n of the member that serves the
#                                session (hex id, as in zoo_client_id)
#   zookeeper.sh port DIR n      member n's client port
# A member is the standalone machinery below (DIR/<n> is its DIR) with the
# quorum lines appended and QuorumPeerMain instead of ZooKeeperServerMain.
# Members run with a small heap (-Xmx128m, serial GC, C1 only): three JVMs
# start in 2-4 s on this 2-core machine.
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


# Sends four-letter word $2 to HOST:PORT $1 (a port alone: this server's
# host) and prints the answer (the server closes the connection after it).
# Bash's /dev/tcp: no nc needed. A paused server accepts (the kernel does)
# but never answers: hence timeout.
four_letter() {
  local address="$1"
  [[ "$address" == *:* ]] || address="$(member_host):$address"
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/${0%:*}/${0##*:}" && printf %s "$1" >&3 && cat <&3' \
    "$address" "$2" 2>/dev/null
}

# Writes DIR/zoo.cfg for port $1; the extra args are appended as lines.
write_config() {
  local port="$1" line
  {
    echo "# Written by zookeeper.sh on every start; extra start args at the end."
    echo "tickTime=500"
    echo "dataDir=$dir/data"
    echo "clientPort=$port"
    echo "clientPortAddress=$(member_host)"
    echo "maxClientCnxns=0"
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=ruok,srvr,mntr,stat,conf,cons"
    if member; then
      # Quick failure detection and elections on loopback: a follower
      # syncs within initLimit ticks, falls out after syncLimit.
      echo "initLimit=10"
      echo "syncLimit=4"
      cat "$dir/member.cfg"
    fi
    for line in "${extra[@]}"; do echo "$line"; done
  } >"$dir/zoo.cfg.tmp"
  mv "$dir/zoo.cfg.tmp" "$dir/zoo.cfg"
}

# A member of an ensemble: DIR/member.cfg (its server.N lines) and DIR/myid
# were written by the ensemble's start.
member() {
  [ -f "$dir/member.cfg" ]
}

# A java is ours only if it runs ZooKeeper's server.
server_is_ours() {
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null |
    grep -qx -e org.apache.zookeeper.server.ZooKeeperServerMain \
      -e org.apache.zookeeper.server.quorum.QuorumPeerMain
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
  if member; then cp "$dir/myid" "$dir/data/myid"; fi
  write_config "$1"
}

# -XX:-UsePerfData: no /tmp/hsperfdata file, which a killed JVM would leave
# behind.
server_command() {
  server_cmd=()
  # A member of a lab runs in its host's namespace (`ip netns exec` execs:
  # the PID stays the server's).
  if [ -s "$dir/netns" ]; then server_cmd=(ip netns exec "$(cat "$dir/netns")"); fi
  if member; then
    server_cmd+=("$java" -Xms32m -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
      -XX:-UsePerfData
      -Dorg.slf4j.simpleLogger.showDateTime=true
      -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd HH:mm:ss.SSS"
      -cp "$classpath" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg")
    return
  fi
  server_cmd+=("$java" -Xmx512m -XX:-UsePerfData
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
  echo "zookeeper://$(member_host):$1"
}

# ---- ensembles ----------------------------------------------------------------

ensemble_usage() {
  echo "usage: zookeeper.sh start DIR --servers N [key=value...] | stop|kill|pause|resume DIR [n] | restart DIR n | status|leader|uri DIR | connected DIR SESSION | port DIR n" >&2
  exit 2
}

# Runs this script's standalone command $1 on member directory $2 (more
# args after), quietly; its output goes to $2/last.out.
member_cmd() {
  local cmd="$1" mdir="$2"
  shift 2
  bash "$script" "$cmd" "$mdir" "$@" >"$mdir/last.out" 2>&1
}

members() {
  seq 1 "$(cat "$dir/servers")"
}

# Member n (checked).
member_dir() {
  case "$1" in
    '' | *[!0-9]*) ensemble_usage ;;
  esac
  if [ "$1" -lt 1 ] || [ "$1" -gt "$(cat "$dir/servers")" ]; then
    echo "zookeeper.sh: no member $1 in $dir (1-$(cat "$dir/servers"))" >&2
    exit 2
  fi
  echo "$dir/$1"
}

ensemble_start() {
  local n="$1" i q e c port ports=() pids=() failed=0 started
  shift
  case "$n" in
    '' | *[!0-9]*) ensemble_usage ;;
  esac
  [ "$n" -ge 2 ] || { echo "zookeeper.sh: --servers wants 2 or more" >&2; exit 2; }
  for line in "$@"; do
    case "$line" in
      [A-Za-z]*=*) ;;
      *) echo "zookeeper.sh: extra arg '$line' is not a zoo.cfg line key=value" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  find_programs
  # A leftover ensemble (an interrupted run) is replaced.
  if [ -s "$dir/servers" ]; then ensemble_stop_all; fi
  # Each member's ports: kept from an earlier start of the same size (a
  # restart keeps the addresses clients know), otherwise picked afresh.
  local fresh=0
  if [ "$(cat "$dir/servers" 2>/dev/null)" != "$n" ] || [ ! -s "$dir/ports" ]; then
    fresh=1
    : >"$dir/ports.tmp"
    for i in $(seq 1 "$n"); do
      c="$(pick_port)"; q="$(pick_port "$c")"; e="$(pick_port "$q")"
      while [ "$e" = "$c" ]; do e="$(pick_port "$q")"; done
      for port in "${ports[@]}"; do
        if [ "$port" = "$c" ] || [ "$port" = "$q" ] || [ "$port" = "$e" ]; then
          echo "zookeeper.sh: port clash, try again" >&2; exit 1
        fi
      done
      ports+=("$c" "$q" "$e")
      echo "$i $c $q $e" >>"$dir/ports.tmp"
    done
    mv "$dir/ports.tmp" "$dir/ports"
    for i in $(seq 1 "$n"); do
      rm -rf "${dir:?}/$i"
      mkdir -p "$dir/$i"
      if [ -n "${SIMBA_NETNS:-}" ]; then
        # Member i on host i of the lab (scripts/servers/netns.sh).
        place_on_lab_host "$dir/$i" "$i"
      fi
    done
  fi
  echo "$n" >"$dir/servers"
  local list=""
  while read -r i c q e; do
    list+="server.$i=$(member_host "$dir/$i"):$q:$e"$'\n'
  done <"$dir/ports"
  # The owner of the watchdogs: resolved here, since each member's start
  # runs in a child of this script.
  if [ "${SIMBA_SERVER_OWNER_PID:-}" = parent ]; then export SIMBA_SERVER_OWNER_PID="$PPID"; fi
  started=$SECONDS
  while read -r i c q e; do
    mkdir -p "$dir/$i"
    # The extra lines go with the quorum's, so a restart of the member
    # (which passes none) keeps them.
    { printf %s "$list"; for line in "$@"; do echo "$line"; done; } >"$dir/$i/member.cfg"
    echo "$i" >"$dir/$i/myid"
    echo "$c" >"$dir/$i/port"
    # Every member at once: none serves before a quorum has formed.
    member_cmd start "$dir/$i" &
    pids+=($!)
  done <"$dir/ports"
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      failed=1
      echo "zookeeper.sh: member $((i + 1)) did not start:" >&2
      cat "$dir/$((i + 1))/last.out" >&2 || true
    fi
  done
  if [ "$failed" -ne 0 ]; then
    # (Read before the stops, which write each member's last.out anew.)
    local again=0
    if [ "$fresh" = 1 ] && retry_on_taken_port "$dir"/*/last.out; then again=1; fi
    ensemble_stop_all
    if [ "$again" = 1 ]; then
      rm -f "$dir/ports" "$dir/servers"
      exec bash "$script" start "$dir" --servers "$n" "$@"
    fi
    exit 1
  fi
  # TestServer and the fixtures read DIR/port and DIR/uri.
  head -n1 "$dir/ports" | cut -d' ' -f2 >"$dir/port"
  local uri="zookeeper://"
  while read -r i c q e; do
    uri+="$(member_host "$dir/$i"):$c,"
  done <"$dir/ports"
  echo "${uri%,}" >"$dir/uri"
  echo "zookeeper.sh: $n members serving after $((SECONDS - started)) s" >&2
  cat "$dir/uri"
}

ensemble_stop_all() {
  local i pids=()
  for i in $(members); do
    if [ -d "$dir/$i" ]; then
      member_cmd stop "$dir/$i" &
      pids+=($!)
    fi
  done
  for i in "${pids[@]}"; do wait "$i" || true; done
}

# Prints the mode of member directory $1 ("leader", "follower", or
# "stopped" / "not serving").
member_mode() {
  local mdir="$1" pid mode
  pid="$(cat "$mdir/pid" 2>/dev/null || true)"
  if ! server_alive "$pid"; then echo stopped; return; fi
  if [ "$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status")" = T ]; then
    echo paused; return
  fi
  mode="$(four_letter "$(member_host "$mdir"):$(cat "$mdir/port")" srvr | sed -n 's/^Mode: //p')"
  echo "${mode:-not-serving}"
}

ensemble_main() {
  local cmd="$1" i pid mode any_stopped=0 session hex
  shift
  case "$cmd" in
    stop | kill | pause | resume)
      if [ $# -ge 1 ]; then
        member_dir "$1" >/dev/null
        bash "$script" "$cmd" "$dir/$1"
      elif [ "$cmd" = stop ]; then
        ensemble_stop_all
      else
        for i in $(members); do bash "$script" "$cmd" "$dir/$i" || true; done
      fi
      ;;
    restart)
      [ $# -eq 1 ] || ensemble_usage
      member_dir "$1" >/dev/null
      # Same ports, data and zoo.cfg lines (member.cfg).
      bash "$script" start "$dir/$1" >/dev/null
      ;;
    status)
      for i in $(members); do
        pid="$(cat "$dir/$i/pid" 2>/dev/null || true)"
        mode="$(member_mode "$dir/$i")"
        if [ "$mode" = stopped ]; then
          echo "$i stopped"; any_stopped=1
        else
          echo "$i running $pid $mode $(cat "$dir/$i/port")"
        fi
      done
      [ "$any_stopped" -eq 0 ] || return 3
      ;;
    leader)
      for i in $(members); do
        if [ "$(member_mode "$dir/$i")" = leader ]; then echo "$i"; return 0; fi
      done
      echo "zookeeper.sh: no member of $dir leads" >&2
      return 1
      ;;
    connected)
      [ $# -eq 1 ] || ensemble_usage
      session="${1#0x}"
      # cons prints sid=0x<hex> without leading zeros.
      hex="$(printf '%x' "$((16#$session))")"
      for i in $(members); do
        if four_letter "$(member_host "$dir/$i"):$(cat "$dir/$i/port")" cons |
          grep -q "sid=0x${hex}[,)]"; then
          echo "$i"; return 0
        fi
      done
      echo "zookeeper.sh: no member of $dir serves session 0x$hex" >&2
      return 1
      ;;
    port)
      [ $# -eq 1 ] || ensemble_usage
      cat "$(member_dir "$1")/port"
      ;;
    uri) cat "$dir/uri" ;;
    *) ensemble_usage ;;
  esac
}

if [ "${1:-}" = start ] && [ "${3:-}" = --servers ] && [ $# -ge 4 ]; then
  dir="$2"
  n="$4"
  shift 4
  ensemble_start "$n" "$@"
  exit 0
fi
if [ $# -ge 2 ] && [ "$1" != watch ] && [ -s "$2/servers" ]; then
  dir="$2"
  cmd="$1"
  shift 2
  ensemble_main "$cmd" "$@"
  exit $?
fi
server_main "$@"
