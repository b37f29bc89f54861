# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # script, kind, ...: set by the sourcing script; extra, server_cmd: read by it
# The main of every scripts/servers/<kind>.sh: start, stop, kill, pause,
# resume, status and uri of a private server in DIR, written once. Sourced,
# not run: a server script sets what differs and ends with
# `server_main "$@"`.
#
#   <kind>.sh start DIR [args...]  start (again) and print the uri
#   <kind>.sh stop DIR     stop_signal, then SIGKILL after stop_timeout s;
#                          no server is fine
#   <kind>.sh kill DIR     SIGKILL (a crash); DIR/port and the data are kept
#                          for a restart
#   <kind>.sh pause DIR    SIGSTOP (a server that hangs)
#   <kind>.sh resume DIR   SIGCONT
#   <kind>.sh status DIR   print "running PID URI" (exit 0) or "stopped"
#                          (exit 3)
#   <kind>.sh uri DIR      print the uri
#
# Every process is addressed by the PID recorded in DIR/pid, never by name,
# so servers of other people or other test runs are left alone. A start
# picks a free port (DIR/port) the first time and keeps it on a restart, so
# clients keep the address they know.
#
# Environment:
#   SIMBA_SERVER_OWNER_PID  a PID (or "parent" for the caller of this script):
#                           a watchdog stops the server once that process is
#                           gone, so a test binary that crashes or a ctest
#                           that is interrupted leaks no server.
#
# What a server script sets before server_main (defaults in brackets):
#   script         its own full path
#   kind           its name in messages and usage: "redis"
#   server_name    the server in messages: "redis-server"
#   server_comm    /proc/PID/comm of the server (a recycled PID is never
#                  signalled)
#   start_timeout  seconds a start waits for the server to serve [10]
#   stop_timeout   seconds a stop waits before SIGKILL [10]
#   stop_signal    the graceful stop [TERM]
#   log_name       the server's log in DIR (log_file: its path); a start
#                  that fails prints its tail, and "address already in use"
#                  in it means the port was taken [<kind>.log]
#   server_output  where the server's stdout and stderr go [log_file]
#   usage_args     what follows DIR in the usage line ["[args...]"]
# and the functions:
#   server_command PORT   sets the array server_cmd: the server's command
#                         line (extra start args are in ${extra[@]})
#   server_ready PORT PID true once the server on PORT is ours (not another
#                         one on the same port) and serves
#   server_uri PORT       prints the uri
# and optionally (no-ops by default):
#   parse_args ARGS...    sets extra from the start args [extra=(ARGS)]
#   validate_args         checks ${extra[@]} before anything is done
#   find_programs         locates the server's programs
#   prepare_start         after a leftover server is stopped: data
#                         directory, certificates, ...
#   before_launch PORT    before each launch: clean leftovers, write config
#   after_start PORT      once the server serves and is watched: create a
#                         database; a failure stops the server
#   server_is_ours PID    more than server_comm to recognise the server
#   kill_server PID       SIGKILL and wait [the PID alone]
#   continue_server PID   SIGCONT [the PID alone]
#   pause_server PID      SIGSTOP [the PID alone]
#   more_ports PORT       a first start picked PORT: pick the other ports
#   saved_ports           a restart: true if the other ports were kept
#                         (and loads them)
#   save_ports            writes the other ports beside DIR/port
#   forget_first_start    clears what a failed first start left behind
#   ports_text PORT       names the ports in messages ["port PORT"]

# True if $1 is a live process (not a zombie: PID 1 of some containers reaps
# late, and a process that has exited serves nobody).
process_alive() {
  local state
  [ -n "$1" ] || return 1
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# True if PID $1 runs and is our kind of server. The name check keeps a
# recycled PID from being signalled.
server_alive() {
  local pid="$1" comm
  process_alive "$pid" || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = "$server_comm" ] || return 1
  if declare -F server_is_ours >/dev/null; then server_is_ours "$pid"; fi
}

# The address the server in directory $1 (default: DIR) listens on:
# 127.0.0.1, or its host's in a lab of network namespaces (DIR/host).
# shellcheck disable=SC2120  # $1 is optional
member_host() {
  cat "${1:-$dir}/host" 2>/dev/null || echo 127.0.0.1
}

# With SIMBA_NETNS=LAB (scripts/servers/netns.sh): puts the server in
# directory $1 on host $2 of that lab before its first start (DIR/host, its
# address; DIR/netns, the namespace it runs in).
place_on_lab_host() {
  mkdir -p "$1"
  bash "$(dirname "$script")/netns.sh" addr "$SIMBA_NETNS" "$2" >"$1/host"
  bash "$(dirname "$script")/netns.sh" ns "$SIMBA_NETNS" "$2" >"$1/netns"
}

# True if something accepts connections on 127.0.0.1:$1.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A port in 20000-60000 that nothing listens on, other than $1 (if given).
# Ports of the kernel's ephemeral range are avoided: an outgoing connection
# may take one of those while the server is down, and a restart on the same
# port would then fail.
# shellcheck disable=SC2120  # $1 is optional
pick_port() {
  local not="${1:-}" lo=20000 hi=60000 eph_lo eph_hi p i
  read -r eph_lo eph_hi </proc/sys/net/ipv4/ip_local_port_range || { eph_lo=0; eph_hi=0; }
  for i in $(seq 1 100); do
    p=$((lo + ((RANDOM << 15 | RANDOM) % (hi - lo + 1))))
    if [ "$i" -le 80 ] && [ "$p" -ge "$eph_lo" ] && [ "$p" -le "$eph_hi" ]; then
      continue  # after 80 tries, accept any port of the range
    fi
    if [ "$p" != "$not" ] && ! port_in_use "$p"; then
      echo "$p"
      return 0
    fi
  done
  echo "$(basename "$script"): found no free port" >&2
  return 1
}

# Whether a start whose members' ports were picked together should run again
# on ports picked anew: one of the files $@ says a port was taken after it
# was picked (another test's server got it first), and fewer than 5 tries
# were made (SIMBA_PORT_TRIES counts them across the re-runs).
retry_on_taken_port() {
  local tries="${SIMBA_PORT_TRIES:-1}"
  [ "$tries" -lt 5 ] || return 1
  grep -qs "is taken" "$@" || return 1
  echo "$(basename "$script"): a member's port was taken as it started (try $tries); picking new ports" >&2
  export SIMBA_PORT_TRIES=$((tries + 1))
}

# Waits up to $2 seconds for server $1 to be gone.
wait_gone() {
  local pid="$1" deadline=$((SECONDS + $2))
  while server_alive "$pid"; do
    if [ "$SECONDS" -ge "$deadline" ]; then return 1; fi
    sleep 0.05
  done
}

read_pid() {
  if [ -s "$dir/pid" ]; then cat "$dir/pid"; fi
}

usage() {
  echo "usage: $kind.sh start|stop|kill|pause|resume|status|uri DIR ${usage_args:-[args...]}" >&2
  exit 2
}

# Calls hook $1 with the rest as its args if the script defines it.
hook() {
  if declare -F "$1" >/dev/null; then "$@"; fi
}

# Starts `<kind>.sh watch` detached: it stops the server when the owner dies.
start_watchdog() {
  local owner="${SIMBA_SERVER_OWNER_PID:-}"
  [ -n "$owner" ] || return 0
  if [ "$owner" = parent ]; then owner="$PPID"; fi
  setsid bash "$script" watch "$dir" "$owner" "$(read_pid)" </dev/null >/dev/null 2>&1 &
}

# Internal: polls until the owner or the server is gone; stops the server
# if it is still the one this watchdog was started for.
cmd_watch() {
  local owner="$1" pid="$2"
  while process_alive "$owner" && server_alive "$pid"; do
    sleep 1
  done
  if server_alive "$pid" && [ "$(read_pid)" = "$pid" ]; then
    cmd_stop
  fi
}

default_kill_server() {
  kill -KILL "$1" 2>/dev/null || true
  wait_gone "$1" 10
}

# Starts the server on port $1, detached, and waits until it serves.
# Returns 3 if the port was taken under our feet.
launch() {
  local port="$1" pid="" deadline log_start
  rm -f "$dir/pid"
  hook before_launch "$port"
  touch "$log_file"
  log_start=$(($(stat -c %s "$log_file") + 1))
  server_cmd=()
  server_command "$port"
  # setsid: the server outlives this script and is out of the reach of
  # signals sent to ctest's process group. Its stdin goes to /dev/null and
  # its output to server_output (ctest waits for its pipes to close), and the
  # wrapper closes every other inherited descriptor (a test's client socket
  # held open by the server would hide the client's disconnects). The
  # wrapper writes its own PID, which stays the server's after exec (a
  # setpriv in front execs too), whether or not setsid had to fork.
  # shellcheck disable=SC2016  # expanded by the wrapper, not here
  (cd "$dir" && exec setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv "$0.tmp" "$0"
    exec "$@"
  ' "$dir/pid" "${server_cmd[@]}" </dev/null >>"$server_output" 2>&1) &

  deadline=$((SECONDS + start_timeout))
  while :; do
    pid="$(read_pid)"
    if [ -n "$pid" ]; then
      if ! server_alive "$pid" && ! process_alive "$pid"; then
        break  # it died
      fi
      if server_ready "$port" "$pid"; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$kind.sh: $server_name on port $port was not ready within $start_timeout s" >&2
      if [ -n "$pid" ] && server_alive "$pid"; then kill_server "$pid" || true; fi
      rm -f "$dir/pid"
      tail -c "+$log_start" "$log_file" | tail -n 20 >&2 || true
      return 1
    fi
    sleep 0.05
  done
  rm -f "$dir/pid"
  if tail -c "+$log_start" "$log_file" | grep -qi "address already in use"; then
    return 3
  fi
  echo "$kind.sh: $server_name exited at start" >&2
  tail -c "+$log_start" "$log_file" | tail -n 20 >&2 || true
  return 1
}

cmd_start() {
  local port="" rc old
  hook validate_args
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  log_file="$dir/${log_name:-$kind.log}"
  server_output="${server_output:-$log_file}"
  hook find_programs
  # A server still running here is a leftover (an interrupted run): replace
  # it, so that the extra args asked for now are the ones in force.
  old="$(read_pid)"
  if server_alive "$old"; then
    echo "$kind.sh: stopping the server left running in $dir (pid $old)" >&2
    cmd_stop
  fi
  hook prepare_start
  if [ -s "$dir/port" ] && { ! declare -F saved_ports >/dev/null || saved_ports; }; then
    # A restart keeps the address clients already know.
    port="$(cat "$dir/port")"
    launch "$port" || {
      rc=$?
      [ "$rc" -ne 3 ] || echo "$kind.sh: $(ports_text "$port") is taken" >&2
      exit 1
    }
  else
    hook forget_first_start
    for _ in 1 2 3 4 5; do
      port="$(pick_port)"
      hook more_ports "$port"
      rc=0
      launch "$port" || rc=$?
      [ "$rc" -eq 3 ] || break  # 3: another process took the port since we looked
      hook forget_first_start
    done
    [ "$rc" -eq 0 ] || exit 1
  fi
  echo "$port" >"$dir/port"
  hook save_ports
  # Watched from here on: a failure below must not leak the server.
  start_watchdog
  if ! hook after_start "$port"; then
    cmd_stop
    exit 1
  fi
  server_uri "$port" >"$dir/uri"
  cat "$dir/uri"
}

ports_text() {
  echo "port $1"
}

cmd_stop() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then
    kill "-$stop_signal" "$pid" 2>/dev/null || true
    # A paused server acts on the signal only once resumed.
    continue_server "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$stop_timeout"; then
      echo "$kind.sh: pid $pid did not stop within $stop_timeout s of SIG$stop_signal; sending SIGKILL" >&2
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

# The live server's PID, or a message and exit 1.
running_pid() {
  local pid
  pid="$(read_pid)"
  if ! server_alive "$pid"; then
    echo "$kind.sh: no server running in $dir" >&2
    exit 1
  fi
  echo "$pid"
}

cmd_status() {
  local pid
  pid="$(read_pid)"
  if server_alive "$pid"; then
    echo "running $pid $(cat "$dir/uri" 2>/dev/null || true)"
  else
    echo stopped
    return 3
  fi
}

cmd_uri() {
  if [ ! -s "$dir/uri" ]; then
    echo "$kind.sh: no server was started in $dir" >&2
    exit 1
  fi
  cat "$dir/uri"
}

# server_main "$@": the script's command line.
server_main() {
  local cmd pid
  [ $# -ge 2 ] || usage
  cmd="$1"
  dir="$2"
  shift 2
  start_timeout="${start_timeout:-10}"
  stop_timeout="${stop_timeout:-10}"
  stop_signal="${stop_signal:-TERM}"
  server_name="${server_name:-$kind}"
  declare -F kill_server >/dev/null || kill_server() { default_kill_server "$@"; }
  declare -F continue_server >/dev/null || continue_server() { kill -CONT "$1"; }
  declare -F pause_server >/dev/null || pause_server() { kill -STOP "$1"; }
  if [ "$cmd" = watch ]; then
    [ $# -eq 2 ] || usage
    cmd_watch "$1" "$2"
    return
  fi
  extra=()
  if declare -F parse_args >/dev/null; then parse_args "$@"; else extra=("$@"); fi
  case "$cmd" in
    start) cmd_start ;;
    stop) [ ! -d "$dir" ] || cmd_stop ;;
    kill) [ ! -d "$dir" ] || cmd_kill ;;
    pause) pid="$(running_pid)"; pause_server "$pid" ;;
    resume) pid="$(running_pid)"; continue_server "$pid" ;;
    status) cmd_status ;;
    uri) cmd_uri ;;
    *) usage ;;
  esac
}
