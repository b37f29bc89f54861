#!/usr/bin/env bash
# Installs the Debian 12 packages Simba needs to build and test, and only
# those that are missing (idempotent: a second run installs nothing).
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config git
  libsqlite3-dev            # the SQLite backend
  libhiredis-dev            # the Redis backend
  redis-server redis-tools  # its tests run a real server (scripts/servers/redis.sh)
  libpq-dev                 # the PostgreSQL backend
  postgresql                # its tests run a real server (scripts/servers/postgres.sh)
  libmariadb-dev            # the MySQL/MariaDB backend
  mariadb-server            # its tests run a real server (scripts/servers/mysql.sh),
  mariadb-client            #   which that script queries with the mariadb client
  libzookeeper-mt-dev       # the ZooKeeper backend (C client)
  zookeeper                 # its tests run a real server (scripts/servers/zookeeper.sh);
                            #   it depends on default-jre, the JVM it runs in
  libslf4j-java             #   slf4j-simple, the logging binding zookeeper.jar lacks
  etcd-server               # the etcd backend's tests run a real server
  etcd-client               #   (scripts/servers/etcd.sh), which that script queries with etcdctl
  libgtest-dev libgmock-dev # tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    as_root=(sudo)
  else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
