#!/usr/bin/env bash
# `cpack -G DEB` on a built tree, then the packages checked as a Debian user
# meets them. Run by ctest (label install).
#
#   deb_test.sh SOURCE_DIR BUILD_DIR [--chroot]
#
# Always, with no change to this machine:
#   * the three packages are made: simba, libsimba<ABI>, libsimba-dev;
#   * every shared library their ELF files load (DT_NEEDED) belongs to a
#     Debian package the .deb names in Depends (so apt brings the client
#     libraries: libhiredis0.14, libpq5, libmariadb3, libzookeeper-mt2, ...);
#   * libsimba-dev depends on libsimba<ABI> of the same version and on the
#     client -dev packages a static link needs;
#   * the simba package, unpacked into a scratch root, runs `simba --help`
#     with every library resolved (ldd), and its man page and completion are
#     where man and bash-completion look.
# With --chroot (or SIMBA_DEB_CHROOT=1), also in a throw-away Debian 12 root:
# debootstrap --variant=minbase bookworm, `apt-get install ./simba_*.deb`
# there (apt fetches the dependencies from the Debian mirror), then `simba
# --help` and a real `simba run` on SQLite inside the chroot. Needs root and
# the network to deb.debian.org; takes minutes, so CI does not run it.
set -euo pipefail
# (No `cmd | grep -q`: grep -q stops reading at its match, and under pipefail
# the writer's SIGPIPE then fails the check. Here-strings instead.)
src="$1"
build="$2"
chroot_too="${SIMBA_DEB_CHROOT:-0}"
[ "${3:-}" = "--chroot" ] && chroot_too=1
work="$(mktemp -d "${TMPDIR:-/tmp}/simba-deb-test-XXXXXX")"
cleanup() {
  if [ -d "$work/root/proc" ] && mountpoint -q "$work/root/proc"; then umount "$work/root/proc" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "deb_test: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack failed"; }
version="$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")"
[ -n "$version" ] || fail "no CPACK_PACKAGE_VERSION in $build/CPackConfig.cmake"
runtime_deb="$(ls "$work/out"/simba_*.deb)"
libs_deb="$(ls "$work/out"/libsimba[0-9]*.deb)"
dev_deb="$(ls "$work/out"/libsimba-dev_*.deb)"
for deb in "$runtime_deb" "$libs_deb" "$dev_deb"; do
  echo "$(basename "$deb"): Depends: $(dpkg-deb -f "$deb" Depends)"
done
libs_package="$(dpkg-deb -f "$libs_deb" Package)"

# The package of this machine that holds a library file (by its soname).
package_of_library() {
  local path
  path="$(ldconfig -p | awk -v lib="$1" '$1 == lib && !found { print $NF; found = 1 }')"
  [ -n "$path" ] || return 1
  dpkg -S "$(readlink -f "$path")" 2>/dev/null | sed -n '1s/:.*//p' ||
    dpkg -S "$path" 2>/dev/null | sed -n '1s/:.*//p'
}

# Every DT_NEEDED of every ELF file in DEB is provided by a package it depends on.
check_depends() {  # check_depends DEB
  local deb="$1" root="$work/unpacked-$(basename "$1" .deb)" depends needed package file
  dpkg-deb -x "$deb" "$root"
  depends="$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/^ *//; s/[ (].*//')"
  while IFS= read -r file; do
    grep -q '^ELF' <<<"$(file -b "$file")" || continue
    for needed in $(objdump -p "$file" | awk '$1 == "NEEDED" { print $2 }'); do
      case "$needed" in libsimba*) continue ;; esac  # ours: in libsimba<ABI>
      package="$(package_of_library "$needed")" || fail "$(basename "$file") needs $needed, which no package here provides"
      grep -qx "$package" <<<"$depends" ||
        fail "$(basename "$deb"): $(basename "$file") needs $needed from $package, which Depends does not name"
    done
  done < <(find "$root" -type f \( -perm -u+x -o -name '*.so*' \))
}

step "Depends names the packages of every library the binaries load"
check_depends "$runtime_deb"
check_depends "$libs_deb"
for client in libhiredis libpq5 libmariadb3 libzookeeper-mt libsqlite3; do
  grep -q "$client" <<<"$(dpkg-deb -f "$runtime_deb" Depends)" ||
    fail "simba's Depends names no $client package"
done

step "libsimba-dev depends on $libs_package (= $version-...) and the client -dev packages"
dev_depends="$(dpkg-deb -f "$dev_deb" Depends)"
grep -qF "$libs_package (= $version" <<<"$dev_depends" || fail "libsimba-dev: no exact dependency on $libs_package"
for dev in libsqlite3-dev libhiredis-dev libpq-dev libmariadb-dev libzookeeper-mt-dev libgrpc++-dev libprotobuf-dev; do
  grep -q "$dev" <<<"$dev_depends" || fail "libsimba-dev's Depends names no $dev"
done

step "the simba package, unpacked, runs"
root="$work/unpacked-$(basename "$runtime_deb" .deb)"
"$root/usr/bin/simba" --help | sed -n '1,3p'
if grep -q "not found" <<<"$(ldd "$root/usr/bin/simba")"; then
  ldd "$root/usr/bin/simba" >&2
  fail "simba has unresolved libraries"
fi
# The etcd backend speaks etcd's gRPC API through Debian's gRPC (#22): no
# client of our own remains.
for lib in libgrpc++ libprotobuf; do
  grep -q "$lib" <<<"$(ldd "$root/usr/bin/simba")" || fail "simba does not load $lib (the etcd backend's gRPC)"
done
[ -f "$root/usr/share/man/man1/simba.1" ] || [ -f "$root/usr/share/man/man1/simba.1.gz" ] ||
  fail "no man page in the simba package"
[ -f "$root/usr/share/bash-completion/completions/simba" ] || fail "no bash completion in the simba package"
dev_root="$work/unpacked-$(basename "$dev_deb" .deb)"
dpkg-deb -x "$dev_deb" "$dev_root"
pc="$(find "$dev_root" -name simba.pc)"
[ -n "$pc" ] || fail "no simba.pc in libsimba-dev"
[ -n "$(find "$dev_root" -name simbaConfig.cmake)" ] || fail "no simbaConfig.cmake in libsimba-dev"
[ -n "$(find "$dev_root" -name 'libsimba.a')" ] || fail "no libsimba.a in libsimba-dev"
[ -n "$(find "$dev_root" -name contend_service.h)" ] || fail "no headers in libsimba-dev"
# Where the package puts it, simba.pc names /usr (found from its own place).
[ "$(PKG_CONFIG_SYSROOT_DIR='' PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --variable=includedir simba)" = \
  "$(dirname "$pc")/../../include" ] || fail "simba.pc does not find its prefix from where it lies"

if [ "$chroot_too" = "1" ]; then
  step "a clean Debian 12 root (debootstrap --variant=minbase bookworm)"
  [ "$(id -u)" = 0 ] || fail "--chroot needs root"
  command -v debootstrap >/dev/null || fail "--chroot needs debootstrap (apt-get install debootstrap)"
  mirror="${SIMBA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  debootstrap --variant=minbase bookworm "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 30 "$work/debootstrap.log"; fail "debootstrap failed"; }
  cp "$runtime_deb" "$libs_deb" "$work/root/tmp/"
  mount -t proc proc "$work/root/proc"
  in_root() { chroot "$work/root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
  in_root apt-get update -q >"$work/apt.log" 2>&1 || { tail -n 30 "$work/apt.log"; fail "apt-get update failed in the chroot"; }
  in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$runtime_deb")" >>"$work/apt.log" 2>&1 ||
    { tail -n 30 "$work/apt.log"; fail "apt-get install of the simba package failed in the chroot"; }
  in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$libs_deb")" >>"$work/apt.log" 2>&1 ||
    { tail -n 30 "$work/apt.log"; fail "apt-get install of the $libs_package package failed in the chroot"; }
  in_root simba --help | sed -n '1,3p'
  in_root simba run --store sqlite:///tmp/chroot.db --mutex deb-test -- sh -c 'echo "ran as $SIMBA_MUTEX with token $SIMBA_FENCING_TOKEN"'
  in_root man -w simba 2>/dev/null || true
  umount "$work/root/proc"
fi
echo "deb_test: all passed"
