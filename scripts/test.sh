#!/usr/bin/env bash
# The README's second command, and exactly what CI runs (.ci/run): the whole
# test suite on every backend, then the unit and conformance tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer.
#
# Environment:
#   JOBS                    parallel build/test jobs (default: nproc)
#   SIMBA_SKIP_SANITIZERS=1 skip the sanitizer pass (local iteration only)
#   CI=true                 a skipped test fails the run: nothing passes by
#                           skipping
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"

scripts/install-deps.sh --servers

run_ctest() {  # run_ctest BUILD_DIR [ctest args...]; RUN_JOBS overrides $jobs
  local dir="$1"
  shift
  local log="$dir/ctest.log"
  (cd "$dir" && ctest --output-on-failure -j "${RUN_JOBS:-$jobs}" "$@") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    return "$rc"
  fi
  if [ "${CI:-}" = "true" ] || [ "${SIMBA_REQUIRE_SERVERS:-}" = "1" ]; then
    if grep -q '\*\*\*Skipped' "$log"; then
      echo "test.sh: tests were skipped; under CI a skipped test is a failure" >&2
      return 1
    fi
  fi
}

echo "== Build (RelWithDebInfo) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMBA_WERROR=ON
cmake --build build -j "$jobs"
echo "== All tests but the fault runs =="
run_ctest build -LE faults
# The fault runs (docs/reliability.md) spend their time waiting out leases
# and fault windows, not computing: four at a time on two cores.
echo "== Fault runs =="
RUN_JOBS=4 run_ctest build -L faults

if [ "${SIMBA_SKIP_SANITIZERS:-}" != "1" ]; then
  echo "== Build (AddressSanitizer + UndefinedBehaviorSanitizer) =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSIMBA_WERROR=ON \
    -DSIMBA_SANITIZE=address,undefined -DSIMBA_BUILD_EXAMPLES=OFF
  cmake --build build-asan -j "$jobs"
  echo "== Unit and conformance tests under ASan/UBSan =="
  # Sanitized code runs slower: stretch the tests' real-time waits.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    SIMBA_TEST_TIME_SCALE=2 run_ctest build-asan -L 'unit|conformance'
  echo "== Keyed and clustered locks on the embedded stores under ASan/UBSan =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    SIMBA_TEST_TIME_SCALE=2 run_ctest build-asan -L 'keyed|clustered' -R '^(Memory|Sqlite)/'
fi
echo "test.sh: all passed"
