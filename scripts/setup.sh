#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the
# main job through the `simba` command line on SQLite (scripts/demo.sh:
# processes taking turns on a mutex, and an elected leader killed and
# replaced).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build --target simba-cli

echo
SIMBA_BIN=build/bin/simba scripts/demo.sh
