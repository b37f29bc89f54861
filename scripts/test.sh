#!/usr/bin/env bash
# The README's second command, and exactly what CI runs (.ci/run): the whole
# test suite on every backend, then the unit and conformance tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer, and the unit,
# conformance and CLI tests on memory and SQLite under ThreadSanitizer.
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

# Each stage's heading says when it began, and the last line the whole
# time: the CI budget (60 min on 2 cores, cold build included) is watched
# stage by stage.
stage() {
  echo "== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s) =="
}

run_ctest() {  # run_ctest BUILD_DIR STAGE [ctest args...]; RUN_JOBS overrides $jobs
  local dir="$1" stage="$2"
  shift 2
  local log="$dir/ctest-$stage.log"
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

stage "Build (RelWithDebInfo)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMBA_WERROR=ON
cmake --build build -j "$jobs"
# Layout (.clang-format) and names (.clang-tidy): a diff or a finding fails
# the run. After the build, which writes compile_commands.json.
stage "Style"
scripts/check-style.sh build
stage "All tests but the fault runs"
run_ctest build all -LE faults
# The fault runs (docs/reliability.md) spend their time waiting out leases
# and fault windows, not computing: four at a time on two cores.
stage "Fault runs"
RUN_JOBS=4 run_ctest build faults -L faults

if [ "${SIMBA_SKIP_SANITIZERS:-}" != "1" ]; then
  stage "Build (AddressSanitizer + UndefinedBehaviorSanitizer)"
  # Only what the sanitized stages run (the unit and conformance tests, the
  # keyed and clustered suites on the embedded stores, and the CLI the unit
  # tests call): a full sanitized build would cost CI minutes for binaries
  # these stages never start. Targets pull in their helper programs.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSIMBA_WERROR=ON \
    -DSIMBA_SANITIZE=address,undefined -DSIMBA_BUILD_EXAMPLES=OFF \
    -DSIMBA_BUILD_BENCH=OFF -DSIMBA_BUILD_SHARED=OFF
  asan_targets=(simba_unit_tests simba_sqlite_tests simba-cli simba-man
    simba_keyed_memory simba_keyed_sqlite simba_clustered_memory simba_clustered_sqlite)
  for store in memory sqlite redis postgres mysql zookeeper etcd; do
    asan_targets+=("simba_conformance_$store")
  done
  cmake --build build-asan -j "$jobs" --target "${asan_targets[@]}"
  stage "Unit and conformance tests under ASan/UBSan"
  # Sanitized code runs slower: stretch the tests' real-time waits. Left out
  # here, because the pass above ran them and sanitized they only repeat
  # code paths other tests cover, at length: ThousandServices on the server
  # stores (run alone, ~15 s each; memory and SQLite still run it here).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    SIMBA_TEST_TIME_SCALE=2 run_ctest build-asan asan -L 'unit|conformance' \
    -E '^(Redis|Postgres|Mysql|Zookeeper|Etcd)/Conformance\.ThousandServices'
  stage "Keyed and clustered locks on the embedded stores under ASan/UBSan"
  # With the library's debug lines (shown only for a test that fails): a
  # rare failure here must say which lock moved when.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 SIMBA_LOG=debug \
    SIMBA_TEST_TIME_SCALE=2 run_ctest build-asan asan-embedded -L 'keyed|clustered' -R '^(Memory|Sqlite)/'

  stage "Build (ThreadSanitizer)"
  # The unit tests and the conformance suite on the two stores that need no
  # server, and the CLI's tests on SQLite: its reaper forks in a threaded
  # process (tools/cli), which only a TSan run of the real binary checks.
  # At -O1 (TSan's advice: -O1 or higher) it compiles in half the time of
  # -O2 -g; the line tables (SIMBA_DEBUG_INFO) still name every frame.
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMBA_WERROR=ON \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DSIMBA_SANITIZE=thread \
    -DSIMBA_BUILD_EXAMPLES=OFF -DSIMBA_BUILD_BENCH=OFF -DSIMBA_BUILD_SHARED=OFF
  cmake --build build-tsan -j "$jobs" --target simba_unit_tests simba_sqlite_tests \
    simba_conformance_memory simba_conformance_sqlite simba-cli simba-man simba_cli_tests
  stage "Unit, conformance and CLI tests (memory, SQLite) under TSan"
  # halt_on_error: a data race fails its test (the report is in the log).
  # The scale stretches real-time waits; TSan runs code 5-15x slower.
  # ThousandServices measures capacity (1,000 renewals per ttl), which TSan's
  # slowdown would turn into lost leases; the other tests cover its paths.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/testing/tsan.supp" \
    SIMBA_TEST_TIME_SCALE=3 run_ctest build-tsan tsan -L 'unit|conformance|cli' \
    -E 'ThousandServices'
fi
echo "test.sh: all passed in $((SECONDS / 60)) min $((SECONDS % 60)) s"
