#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the
# main job on SQLite (for now the leader-election example; the `simba` CLI
# takes this over when it lands).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build --target leader_election

db="${TMPDIR:-/tmp}/simba-example.db"
echo
echo "== Leader election on sqlite://$db =="
build/bin/leader_election --store "sqlite://$db"
