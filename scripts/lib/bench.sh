# shellcheck shell=bash
# Sourced by the scripts/bench*.sh scripts, from the repository's root.

# Builds TARGETS... (Release, benchmarks only: no tests, examples or CLI)
# into $BENCH_BUILD (default build-bench) with $JOBS jobs (default nproc);
# the build's chatter goes to stderr. Sets `build` to the directory.
build_bench() {
  build="${BENCH_BUILD:-build-bench}"
  echo "== Build (Release) into $build ==" >&2
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSIMBA_BUILD_TESTS=OFF -DSIMBA_BUILD_EXAMPLES=OFF -DSIMBA_BUILD_CLI=OFF \
    -DSIMBA_BUILD_BENCH=ON >&2
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "$@" >&2
}

# The machine a benchmark ran on: CPUs, kernel, load average.
print_machine() {
  echo "cpus: $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "kernel: $(uname -sr)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# Makes bench_dir, a private directory for a store of kind $1 (the name's
# prefix: $2), removed at exit with the server start_bench_server started
# in it (stopped by its directory and PID).
make_bench_dir() {
  bench_kind="$1"
  bench_dir="$(mktemp -d "${TMPDIR:-/tmp}/$2-$1.XXXXXX")"
  chmod 755 "$bench_dir"
  bench_started=""
  trap cleanup_bench_dir EXIT
}
cleanup_bench_dir() {
  if [ -n "$bench_started" ]; then
    scripts/servers/"$bench_kind".sh stop "$bench_dir" >/dev/null 2>&1 || true
  fi
  rm -rf "$bench_dir"
}
# Starts the private server in bench_dir; sets bench_uri (for the caller).
# shellcheck disable=SC2034
start_bench_server() {
  SIMBA_SERVER_OWNER_PID=$$ scripts/servers/"$bench_kind".sh start "$bench_dir" >/dev/null
  bench_started=1
  bench_uri="$(cat "$bench_dir/uri")"
}
