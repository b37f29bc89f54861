#!/usr/bin/env bash
# `cmake --install` of a built tree into a scratch prefix, then a user's
# project built against that prefix alone: with CMake (find_package, shared
# and static libraries) and with pkg-config. Run by ctest (label install).
#
#   install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# (No `cmd | grep -q`: grep -q stops reading at its match, and under pipefail
# the writer's SIGPIPE then fails the check. Here-strings instead.)
src="$1"
build="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/simba-install-test-XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
consumer="$src/tests/install/consumer"

fail() { echo "install_test: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install failed"; }

libdir=""
for d in lib lib64 lib/x86_64-linux-gnu; do
  if [ -f "$prefix/$d/cmake/simba/simbaConfig.cmake" ]; then libdir="$prefix/$d"; fi
done
[ -n "$libdir" ] || fail "no lib*/cmake/simba/simbaConfig.cmake under $prefix"
for f in bin/simba include/simba/contend_service.h include/simba/backends/sqlite.h; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
for f in libsimba.a libsimba_core.a libsimba_backend_sqlite.a libsimba.so libsimba_core.so \
         pkgconfig/simba.pc cmake/simba/simbaConfigVersion.cmake \
         cmake/simba/simba-static-targets.cmake cmake/simba/simba-shared-targets.cmake; do
  [ -e "$libdir/$f" ] || fail "missing $libdir/$f"
done
# Nothing of the build tree leaks into the installed package files.
if grep -rl "$build\|$src" "$libdir/cmake/simba" "$libdir/pkgconfig" >/dev/null; then
  grep -rn "$build\|$src" "$libdir/cmake/simba" "$libdir/pkgconfig" >&2
  fail "the installed package files name the build or source tree"
fi
"$prefix/bin/simba" --help >/dev/null || fail "the installed simba --help failed"

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# A consumer configured against the prefix only (no package registry, no
# source tree), built, and run on memory:// and SQLite.
build_consumer() {  # build_consumer NAME [cmake args...]
  local name="$1"
  shift
  step "CMake consumer ($name)"
  cmake -S "$consumer" -B "$work/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    "${launcher[@]}" "$@" >"$work/$name.configure.log" 2>&1 ||
    { cat "$work/$name.configure.log"; fail "$name: configure failed"; }
  grep -- "-- simba " "$work/$name.configure.log"
  cmake --build "$work/$name" >"$work/$name.build.log" 2>&1 ||
    { cat "$work/$name.build.log"; fail "$name: build failed"; }
  "$work/$name/lock_by_uri" "memory://install-test" job
  "$work/$name/lock_by_uri" "sqlite://$work/$name-uri.db" job
  "$work/$name/sqlite_only" "$work/$name-only.db"
}

build_consumer shared
grep -q "shared libraries" "$work/shared.configure.log" || fail "shared: not the shared libraries"
grep -q "$prefix/.*libsimba\.so" <<<"$(ldd "$work/shared/lock_by_uri")" ||
  { ldd "$work/shared/lock_by_uri" >&2; fail "shared: lock_by_uri does not load libsimba.so from the prefix"; }

build_consumer static -DSIMBA_USE_STATIC_LIBS=ON
grep -q "static libraries" "$work/static.configure.log" || fail "static: not the static libraries"
if grep -q "libsimba" <<<"$(ldd "$work/static/lock_by_uri")"; then
  ldd "$work/static/lock_by_uri" >&2
  fail "static: lock_by_uri loads a libsimba shared library"
fi

step "CMake consumer asking for a backend this build lacks"
cat >"$work/missing.cmake" <<'CMAKE'
cmake_minimum_required(VERSION 3.24)
project(missing LANGUAGES CXX)
find_package(simba CONFIG REQUIRED COMPONENTS no_such_store)
CMAKE
mkdir -p "$work/missing-src"
cp "$work/missing.cmake" "$work/missing-src/CMakeLists.txt"
if cmake -S "$work/missing-src" -B "$work/missing" -DCMAKE_PREFIX_PATH="$prefix" >"$work/missing.log" 2>&1; then
  fail "find_package(simba COMPONENTS no_such_store) succeeded"
fi
grep -q "no_such_store" "$work/missing.log" || { cat "$work/missing.log"; fail "the failure does not name the component"; }

step "pkg-config consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists --print-errors simba || fail "pkg-config cannot read simba.pc"
[ "$(pkg-config --modversion simba)" = "$("$prefix/bin/simba" --version | awk '{print $NF}')" ] ||
  fail "simba.pc's version differs from simba --version"
pkg-config --static --libs simba >/dev/null || fail "pkg-config --static cannot resolve simba's private requirements"
# shellcheck disable=SC2046
g++ -std=c++20 -o "$work/pkg_config_main" "$consumer/pkg_config_main.cc" \
  $(pkg-config --cflags --libs simba) -Wl,-rpath,"$libdir" ||
  fail "building with pkg-config --cflags --libs simba failed"
"$work/pkg_config_main" "memory://pkg-config"
"$work/pkg_config_main" "sqlite://$work/pkg-config.db"
echo "install_test: all passed"
