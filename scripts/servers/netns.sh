#!/usr/bin/env bash
# A small network of hosts on this machine for the fault runs: N network
# namespaces, each a "host" with an address of its own on a bridge of the
# caller's namespace, so that one member of a cluster can be cut off from
# its peers while clients (in the caller's namespace, on the bridge) still
# reach it. Loopback cannot do that: every process there shares one
# address, and a connection cannot be told apart by who made it. Needs
# root (CAP_NET_ADMIN) and iproute2.
#
#   netns.sh up NAME N      make the lab NAME: bridge NAME-br with the
#                           host side of the subnet (10.231.X.254/24, X
#                           the first subnet no route uses), namespaces
#                           NAME-1..NAME-N, each with loopback up and eth0
#                           at 10.231.X.I; prints "I ADDRESS" per member
#   netns.sh down NAME      remove it (what is missing is skipped); the
#                           processes inside must have ended (or they keep
#                           the namespace alive, unnamed)
#   netns.sh addr NAME I    member I's address
#   netns.sh ns NAME I      member I's namespace (for `ip netns exec`)
#   netns.sh isolate NAME I member I and every other member stop reaching
#                           each other (blackhole routes on both sides);
#                           the bridge's side still reaches every member
#   netns.sh heal NAME I    undo isolate
#   netns.sh cut-clients NAME I   member I stops reaching the bridge's side
#                           (the clients) and still reaches every member
#   netns.sh heal-clients NAME I  undo cut-clients
#   netns.sh sweep          remove labs named simba<PID>-* whose PID is gone
#                           (a run that was killed before its `down`)
#
# NAME is at most 10 characters (interface names are 15): the fault runs
# use simba<PID>.
set -euo pipefail

usage() {
  sed -n '10,30p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need_name() {
  [[ "$1" =~ ^[a-z][a-z0-9]{0,9}$ ]] || {
    echo "netns.sh: lab name '$1' must be a lowercase letter then up to 9 letters or digits" >&2
    exit 2
  }
}

# The lab's namespaces, by number, from `ip netns list`.
members() {
  ip netns list | sed -n "s/^$1-\([0-9]\{1,\}\)\( .*\)\{0,1\}$/\1/p" | sort -n
}

# The lab's subnet prefix ("10.231.X"), read from its bridge.
prefix() {
  ip -4 -o addr show dev "$1-br" 2>/dev/null |
    sed -n 's/.* inet \(10\.231\.[0-9]\{1,3\}\)\.254\/24 .*/\1/p' | head -n1
}

lab_up() {
  local name="$1" n="$2" x p i
  [[ "$n" =~ ^[1-9]$ ]] || { echo "netns.sh: 1 to 9 members" >&2; exit 2; }
  if ip link show "$name-br" >/dev/null 2>&1 || [ -n "$(members "$name")" ]; then
    echo "netns.sh: a lab $name exists already (netns.sh down $name)" >&2
    exit 1
  fi
  # One lab at a time picks a subnet and claims it (with its bridge's
  # address): two runs that start together must not take the same one.
  exec 9>"${TMPDIR:-/tmp}/simba-netns.lock"
  flock 9
  for x in $(seq 1 254); do
    if ! ip -4 route show to match "10.231.$x.1" | grep -qv '^default'; then
      p="10.231.$x"
      break
    fi
  done
  [ -n "${p:-}" ] || { echo "netns.sh: no free 10.231.X.0/24 subnet" >&2; exit 1; }
  # Undone on any failure below.
  trap 'lab_down "$name"' ERR
  ip link add "$name-br" type bridge
  ip addr add "$p.254/24" dev "$name-br"
  ip link set "$name-br" up
  flock -u 9
  for i in $(seq 1 "$n"); do
    ip netns add "$name-$i"
    ip link add "$name-h$i" type veth peer name "$name-m$i"
    ip link set "$name-h$i" master "$name-br"
    ip link set "$name-h$i" up
    ip link set "$name-m$i" netns "$name-$i"
    ip -n "$name-$i" link set "$name-m$i" name eth0
    ip -n "$name-$i" addr add "$p.$i/24" dev eth0
    ip -n "$name-$i" link set eth0 up
    ip -n "$name-$i" link set lo up
  done
  trap - ERR
  for i in $(seq 1 "$n"); do echo "$i $p.$i"; done
}

lab_down() {
  local name="$1" i
  for i in $(members "$name"); do
    ip link del "$name-h$i" 2>/dev/null || true
    ip netns del "$name-$i" 2>/dev/null || true
  done
  ip link del "$name-br" 2>/dev/null || true
}

# Adds (add) or removes (del) the blackhole routes between member $2 and the
# others of lab $1.
# The subnet prefix of lab $1, after checking it has a member $2.
member_prefix() {
  local p
  p="$(prefix "$1")"
  [ -n "$p" ] || { echo "netns.sh: no lab $1" >&2; exit 1; }
  ip netns list | grep -q "^$1-$2\b" || { echo "netns.sh: no member $2 in $1" >&2; exit 2; }
  echo "$p"
}

routes() {
  local name="$1" i="$2" op="$3" p j
  p="$(member_prefix "$name" "$i")" || exit $?
  for j in $(members "$name"); do
    [ "$j" != "$i" ] || continue
    if [ "$op" = add ]; then
      ip -n "$name-$i" route replace blackhole "$p.$j/32"
      ip -n "$name-$j" route replace blackhole "$p.$i/32"
    else
      ip -n "$name-$i" route del blackhole "$p.$j/32" 2>/dev/null || true
      ip -n "$name-$j" route del blackhole "$p.$i/32" 2>/dev/null || true
    fi
  done
}

# Member $2 of lab $1 and the bridge's side (where the clients are) stop
# reaching each other ($3: add) or reach each other again (del): a
# blackhole route in the member to the bridge's address, so what the
# clients send arrives but no answer (nor handshake) comes back.
client_route() {
  local name="$1" i="$2" op="$3" p
  p="$(member_prefix "$name" "$i")" || exit $?
  if [ "$op" = add ]; then
    ip -n "$name-$i" route replace blackhole "$p.254/32"
  else
    ip -n "$name-$i" route del blackhole "$p.254/32" 2>/dev/null || true
  fi
}

sweep() {
  local lab pid
  for lab in $( (ip netns list | sed -n 's/^\(simba[0-9]\{1,\}\)-[0-9].*/\1/p'
    ip -o link show type bridge | sed -n 's/^[0-9]*: \(simba[0-9]\{1,\}\)-br[:@].*/\1/p') | sort -u); do
    pid="${lab#simba}"
    if ! kill -0 "$pid" 2>/dev/null; then lab_down "$lab"; fi
  done
}

[ $# -ge 1 ] || usage
cmd="$1"
shift
case "$cmd" in
  up) [ $# -eq 2 ] || usage; need_name "$1"; lab_up "$1" "$2" ;;
  down) [ $# -eq 1 ] || usage; need_name "$1"; lab_down "$1" ;;
  addr)
    [ $# -eq 2 ] || usage
    need_name "$1"
    p="$(prefix "$1")"
    [ -n "$p" ] || { echo "netns.sh: no lab $1" >&2; exit 1; }
    echo "$p.$2"
    ;;
  ns) [ $# -eq 2 ] || usage; need_name "$1"; echo "$1-$2" ;;
  isolate) [ $# -eq 2 ] || usage; need_name "$1"; routes "$1" "$2" add ;;
  heal) [ $# -eq 2 ] || usage; need_name "$1"; routes "$1" "$2" del ;;
  cut-clients) [ $# -eq 2 ] || usage; need_name "$1"; client_route "$1" "$2" add ;;
  heal-clients) [ $# -eq 2 ] || usage; need_name "$1"; client_route "$1" "$2" del ;;
  sweep) [ $# -eq 0 ] || usage; sweep ;;
  *) usage ;;
esac
