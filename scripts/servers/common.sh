# shellcheck shell=bash
# shellcheck disable=SC2154  # script, dir: defined by the sourcing script
# Functions every scripts/servers/<kind>.sh shares; sourced, not run.
# They expect the sourcing script to define `script` (its own path), `dir`
# (the server's directory, set before any of these run), `server_alive PID`
# (is that PID our server?) and `cmd_stop`.

# Like server_alive, for any process (the watchdog's owner).
process_alive() {
  local state
  state="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ]
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
