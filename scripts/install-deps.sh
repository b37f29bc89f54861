#!/usr/bin/env bash
# Installs the Debian 12 packages Simba needs, and only those that are
# missing (idempotent: a second run installs nothing).
#
#   install-deps.sh             what building needs (compiler, client libraries,
#                               GoogleTest): the README's first command
#   install-deps.sh --servers   that plus the database servers the tests start
#                               (and ZooKeeper's JVM) and Chromium for the
#                               dashboard test: the test suite, CI
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config git
  libsqlite3-dev            # the SQLite backend
  libhiredis-dev            # the Redis backend,
  libssl-dev                #   and its TLS (rediss://), which hiredis 0.14 lacks
  libpq-dev                 # the PostgreSQL backend
  libmariadb-dev            # the MySQL/MariaDB backend
  libzookeeper-mt-dev       # the ZooKeeper backend (C client)
  libgrpc++-dev libprotobuf-dev       # the etcd backend: etcd's gRPC API (libraries;
  protobuf-compiler protobuf-compiler-grpc  #   protoc and its gRPC plugin compile our .proto)
  libgtest-dev libgmock-dev # tests
)
if [ "${1:-}" = "--servers" ]; then
  packages+=(
    redis-server redis-tools  # scripts/servers/redis.sh
    postgresql                # scripts/servers/postgres.sh
    mariadb-server            # scripts/servers/mysql.sh,
    mariadb-client            #   which queries it with the mariadb client
    openssl                   # scripts/servers/test-ca.sh (the TLS tests' certificates)
    zookeeper                 # scripts/servers/zookeeper.sh; it depends on
                              #   default-jre, the JVM it runs in
    libslf4j-java             #   slf4j-simple, the logging binding zookeeper.jar lacks
    etcd-server               # scripts/servers/etcd.sh,
    etcd-client               #   which queries it with etcdctl
    chromium chromium-driver  # the dashboard's browser test (ctest -L dashboard)
    dpkg-dev file binutils    # cpack -G DEB's dpkg-shlibdeps, and the package
                              #   test's checks (tests/install/deb_test.sh)
    man-db groff-base         # the man page test renders simba.1
    clang-format-14           # scripts/check-style.sh: the layout rule and
    clang-tidy-14             #   the naming rule (.clang-format, .clang-tidy)
    iproute2                  # scripts/servers/netns.sh: a host per member of the
                              #   etcd and ZooKeeper fault runs (ip netns, veth)
  )
elif [ $# -gt 0 ]; then
  echo "usage: install-deps.sh [--servers]" >&2
  exit 64
fi

# shellcheck source-path=SCRIPTDIR source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
apt_install_missing install-deps "${packages[@]}"
