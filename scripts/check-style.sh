#!/usr/bin/env bash
# Fails when a tracked C++ file is not formatted as .clang-format says, or
# when clang-tidy (.clang-tidy: the naming rule and a few bug-prone checks)
# reports anything. Needs a configured build tree for compile_commands.json.
#
#   check-style.sh [BUILD_DIR]     default: build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mapfile -t sources < <(git ls-files '*.cc' '*.h')

echo "check-style: clang-format on ${#sources[@]} files"
clang-format-14 --dry-run -Werror "${sources[@]}"

if [ ! -f "$build/compile_commands.json" ]; then
  echo "check-style: $build/compile_commands.json missing: configure the build first" >&2
  exit 1
fi
mapfile -t units < <(git ls-files '*.cc')
echo "check-style: clang-tidy on ${#units[@]} translation units"
# GCC-only warning flags in the compile commands mean nothing to clang.
run-clang-tidy-14 -quiet -p "$build" -j "$(nproc)" \
  -extra-arg=-Wno-unknown-warning-option "${units[@]/#/$PWD/}" >"$build/clang-tidy.log" 2>&1 || {
  grep -E 'warning:|error:' "$build/clang-tidy.log" | sort -u | head -100 >&2
  echo "check-style: clang-tidy found problems (all of them: $build/clang-tidy.log)" >&2
  exit 1
}
echo "check-style: clean"
