# shellcheck shell=bash
# Sourced by scripts/install-deps.sh and scripts/install-peers.sh.
#
#   apt_install_missing NAME PACKAGE...
#
# Installs the Debian packages of the list that are not installed yet, with
# apt-get (through sudo when not root), saying what it does as NAME; exits
# when nothing is missing or nothing can be installed.
apt_install_missing() {
  local name="$1"
  shift
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$name: all $# packages present"
    return 0
  fi
  echo "$name: installing ${missing[*]}"
  local as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then
      as_root=(sudo)
    else
      echo "$name: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
