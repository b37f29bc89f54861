#!/usr/bin/env bash
# Runs the peer libraries Debian ships (bench/peers/) on a private store of
# one kind, started and stopped by scripts/servers/<kind>.sh as bench-run.sh
# does for simba-bench: the uncontended, contended (processes) and hand-off
# scenarios, each peer with its library's defaults. docs/benchmarks.md,
# "Peers"; install the peers first with scripts/install-peers.sh.
#
#   scripts/bench-peers.sh redis|postgres|mysql|zookeeper|etcd [options]
#     --seconds S          each contended run (default 3)
#     --contenders LIST    contending processes (default 1,4,16)
#     --iterations N       uncontended acquire + release pairs (default 1000)
#     --handoffs N         hand-offs (default 50)
#     --scenario LIST      of uncontended,contended,handoff (default: all)
#     --peer NAME          only this peer of the store
#     --packages           print "NAME PACKAGE" of each peer and exit
#                          (scripts/bench-report.sh checks them with it)
#
# The peers: redis: redis-py (redis.lock.Lock); postgres: psycopg2
# (pg_advisory_lock), and psycopg2+token, the same lock plus a durable
# fencing token (a floor for the SQL mutex, not a peer); mysql: pymysql
# (GET_LOCK) and pymysql+token likewise; zookeeper: kazoo
# (kazoo.recipe.lock.Lock) and curator (InterProcessMutex, Java); etcd:
# etcd-go (clientv3/concurrency.Mutex, Go).
#
# stdout: one JSON line per result (bench/peers/run.py says which fields),
# beside simba-bench's (scripts/bench-run.sh KIND --json); stderr: the
# machine and the server and build chatter. Exits non-zero if a peer failed
# (the other peers still run).
#
# Environment:
#   PEERS_BUILD   where the Go and Java peers are built (default: build-peers)
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  sed -n '8,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 64
}
kind="${1:-}"
case "$kind" in
  redis | postgres | mysql | zookeeper | etcd) shift ;;
  *) usage ;;
esac
opts=()
only=""
list_packages=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds | --contenders | --iterations | --handoffs | --scenario)
      [ $# -ge 2 ] || usage
      opts+=("$1" "$2")
      shift 2
      ;;
    --peer)
      [ $# -ge 2 ] || usage
      only="$2"
      shift 2
      ;;
    --packages)
      list_packages=1
      shift
      ;;
    *) usage ;;
  esac
done
build="${PEERS_BUILD:-build-peers}"
python=/usr/bin/python3  # Debian's: the one that sees python3-redis & co.

# NAME PACKAGE API COMMAND... of every peer of the store.
peers=()
peer() {
  local IFS=$'\x1f'
  peers+=("$*")
}
case "$kind" in
  redis) peer redis-py python3-redis "redis.lock.Lock" "$python" bench/peers/redis_py.py ;;
  postgres)
    peer psycopg2 python3-psycopg2 "pg_advisory_lock / pg_advisory_unlock" \
      "$python" bench/peers/psycopg2_advisory.py
    # A floor, not a peer (bench/report.py: "+token"): the same lock plus a
    # durable fencing token.
    peer psycopg2+token python3-psycopg2 "pg_advisory_lock + a durable token / pg_advisory_unlock" \
      "$python" bench/peers/psycopg2_fenced.py
    ;;
  mysql)
    peer pymysql python3-pymysql "GET_LOCK / RELEASE_LOCK" \
      "$python" bench/peers/pymysql_get_lock.py
    peer pymysql+token python3-pymysql "GET_LOCK + a durable token / RELEASE_LOCK" \
      "$python" bench/peers/pymysql_fenced.py
    ;;
  zookeeper)
    peer kazoo python3-kazoo "kazoo.recipe.lock.Lock" "$python" bench/peers/kazoo_lock.py
    # slf4j-nop: Curator and ZooKeeper log through slf4j; no binding keeps
    # 16 JVMs from writing INFO lines to the terminal.
    cp="$build/java"
    for jar in curator-recipes curator-framework curator-client zookeeper zookeeper-jute \
      guava slf4j-api slf4j-nop; do
      cp+=":/usr/share/java/$jar.jar"
    done
    peer curator libcurator-recipes-java "InterProcessMutex" java -cp "$cp" PeerCurator
    ;;
  etcd)
    peer etcd-go golang-etcd-server-dev "clientv3/concurrency.Mutex" "$build/etcd-mutex"
    ;;
esac

if [ -n "$list_packages" ]; then
  for p in "${peers[@]}"; do
    IFS=$'\x1f' read -r -a f <<<"$p"
    echo "${f[0]} ${f[1]}"
  done
  exit 0
fi

if [ -n "$only" ] && ! printf '%s\n' "${peers[@]}" | grep -q "^$only"$'\x1f'; then
  echo "bench-peers.sh: no peer '$only' for $kind" >&2
  exit 64
fi

# A peer whose package is missing would fail deep in Python, Go or Java
# ("No module named 'pymysql'"); say what to install instead.
missing=()
for p in "${peers[@]}"; do
  IFS=$'\x1f' read -r -a f <<<"$p"
  if [ -n "$only" ] && [ "$only" != "${f[0]}" ]; then continue; fi
  if ! dpkg-query -W -f='${Status}' "${f[1]}" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("${f[0]} needs ${f[1]}")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  printf 'bench-peers.sh: not installed: %s\n' "${missing[@]}" >&2
  echo "bench-peers.sh: run scripts/install-peers.sh first" >&2
  exit 1
fi

# Builds what the store's peers need (the Go and Java peers), offline.
build_peers() {
  mkdir -p "$build"
  case "$kind" in
    zookeeper)
      echo "== javac PeerCurator.java into $build/java ==" >&2
      mkdir -p "$build/java"
      javac -Xlint:all,-path -cp "${cp#*:}" -d "$build/java" bench/peers/PeerCurator.java >&2
      ;;
    etcd)
      # Debian's Go sources (/usr/share/gocode: the etcd client and what it
      # imports), GOPATH mode: no module download.
      echo "== go build bench/peers/etcd_mutex.go into $build/etcd-mutex ==" >&2
      mkdir -p "$build/gopath" "$build/gocache"
      GO111MODULE=off GOFLAGS='' GOPROXY=off GOPATH="$PWD/$build/gopath:/usr/share/gocode" \
        GOCACHE="$PWD/$build/gocache" go build -o "$build/etcd-mutex" bench/peers/etcd_mutex.go >&2
      ;;
  esac
}
build_peers

# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh
print_machine >&2
make_bench_dir "$kind" simba-peers
start_bench_server
uri="$bench_uri"
echo "server: $uri" >&2

failed=()
for p in "${peers[@]}"; do
  IFS=$'\x1f' read -r -a f <<<"$p"
  name="${f[0]}"
  if [ -n "$only" ] && [ "$only" != "$name" ]; then continue; fi
  package="$(dpkg-query -W -f='${Package} ${Version}' "${f[1]}" 2>/dev/null || echo "${f[1]} (not installed)")"
  echo "== $name ($package): ${f[2]} ==" >&2
  if ! "$python" bench/peers/run.py --peer "$name" --package "$package" --api "${f[2]}" \
    --uri "$uri" "${opts[@]}" -- "${f[@]:3}"; then
    failed+=("$name")
  fi
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench-peers.sh: failed: ${failed[*]}" >&2
  exit 1
fi
