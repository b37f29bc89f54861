#!/usr/bin/env bash
# Installs the Debian 12 packages of the peer libraries scripts/bench-peers.sh
# measures beside Simba (bench/peers/, docs/benchmarks.md "Peers"), and only
# those that are missing (idempotent: a second run installs nothing). The
# servers themselves come from scripts/install-deps.sh --servers.
#
#   install-peers.sh
set -euo pipefail

packages=(
  python3                   # /usr/bin/python3, the interpreter that sees these modules
  python3-redis             # redis-py: redis.lock.Lock (Redis)
  python3-psycopg2          # psycopg2: pg_advisory_lock (PostgreSQL)
  python3-pymysql           # PyMySQL: GET_LOCK (MariaDB)
  python3-kazoo             # kazoo: kazoo.recipe.lock.Lock (ZooKeeper)
  golang-go                 # go build, offline (GO111MODULE=off, GOPATH=/usr/share/gocode)
  golang-etcd-server-dev    #   of the etcd client's concurrency.Mutex (etcd)
  default-jdk-headless      # javac
  libcurator-recipes-java   # Curator's InterProcessMutex (ZooKeeper); pulls in
                            #   curator-client/-framework, guava, zookeeper, slf4j
)
if [ $# -gt 0 ]; then
  echo "usage: install-peers.sh" >&2
  exit 64
fi

# shellcheck source-path=SCRIPTDIR source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
apt_install_missing install-peers "${packages[@]}"
