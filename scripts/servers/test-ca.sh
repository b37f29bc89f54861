#!/usr/bin/env bash
# Makes throw-away certificates for testing TLS against Simba's test servers
# (scripts/servers/<kind>.sh start DIR --tls CERTS). Never for production:
# the keys are unencrypted and the CA signs anything this script asks.
#
#   test-ca.sh DIR    make DIR and, unless they are all there already:
#
#   DIR/ca.pem, ca-key.pem                 the test CA ("Simba test CA")
#   DIR/server-cert.pem, server-key.pem    signed by it, for the names the
#                                          servers listen on: CN localhost,
#                                          SAN DNS:localhost and IP:127.0.0.1
#   DIR/client-cert.pem, client-key.pem    signed by it, CN simba-test-client
#                                          (for a user that REQUIREs X509)
#   DIR/other-ca.pem, other-ca-key.pem     an unrelated CA with the same
#                                          subject: verifying the server
#                                          against it must fail on the
#                                          signature, not on a name
#   DIR/expired-cert.pem, expired-key.pem  like server-cert.pem, signed by
#                                          the test CA, but valid only in
#                                          January 2020: a server using it
#                                          must be refused as expired
#
# Keys are EC P-256 (fast to make); certificates are valid for 30 days from
# now (the CAs for 31); a set whose certificates end within a day is made
# again, so a DIR kept between test runs stays usable.
# Files are written into a temporary directory and moved into DIR, so an
# interrupted run leaves no half-made set behind it. Needs openssl (1.1.1 or
# later).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: test-ca.sh DIR" >&2; exit 2; }
dir="$1"
files=(ca.pem ca-key.pem server-cert.pem server-key.pem client-cert.pem client-key.pem
  other-ca.pem other-ca-key.pem expired-cert.pem expired-key.pem)

mkdir -p "$dir"
complete=1
for f in "${files[@]}"; do
  [ -s "$dir/$f" ] || complete=0
done
if [ "$complete" -eq 1 ]; then
  for f in ca.pem server-cert.pem client-cert.pem other-ca.pem; do
    openssl x509 -checkend 86400 -noout -in "$dir/$f" >/dev/null 2>&1 || complete=0
  done
fi
[ "$complete" -eq 0 ] || exit 0

command -v openssl >/dev/null || { echo "test-ca.sh: openssl not found" >&2; exit 1; }
tmp="$(mktemp -d "$dir/.test-ca.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# A self-signed CA: ca NAME (writes NAME.pem and NAME-key.pem).
ca() {
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$tmp/$1-key.pem" -out "$tmp/$1.pem" -days 31 -subj "/CN=Simba test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>"$tmp/openssl.log" ||
    { cat "$tmp/openssl.log" >&2; return 1; }
}

# A certificate signed by the test CA: leaf NAME CN EXTENSIONS.
leaf() {
  local name="$1" cn="$2" ext="$3"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$tmp/$name-key.pem" -out "$tmp/$name.csr" -subj "/CN=$cn" 2>"$tmp/openssl.log" ||
    { cat "$tmp/openssl.log" >&2; return 1; }
  printf '%s\n' "$ext" >"$tmp/$name.ext"
  openssl x509 -req -in "$tmp/$name.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca-key.pem" \
    -set_serial "0x$(openssl rand -hex 16)" -days 30 -extfile "$tmp/$name.ext" \
    -out "$tmp/$name-cert.pem" 2>"$tmp/openssl.log" ||
    { cat "$tmp/openssl.log" >&2; return 1; }
  rm -f "$tmp/$name.csr" "$tmp/$name.ext"
}

# A certificate like leaf's, but valid only from START to END (openssl ca,
# the one openssl 3.0 command that takes explicit dates): dated NAME CN
# EXTENSIONS START END, dates as YYYYMMDDHHMMSSZ.
dated() {
  local name="$1" cn="$2" ext="$3" start="$4" end="$5"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$tmp/$name-key.pem" -out "$tmp/$name.csr" -subj "/CN=$cn" 2>"$tmp/openssl.log" ||
    { cat "$tmp/openssl.log" >&2; return 1; }
  printf '%s\n' "$ext" >"$tmp/$name.ext"
  mkdir -p "$tmp/ca-db"
  : >"$tmp/ca-db/index.txt"
  openssl rand -hex 16 >"$tmp/ca-db/serial"
  cat >"$tmp/ca-db/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
database = $tmp/ca-db/index.txt
serial = $tmp/ca-db/serial
new_certs_dir = $tmp/ca-db
default_md = sha256
policy = anything
unique_subject = no
[anything]
commonName = supplied
CNF
  openssl ca -batch -notext -config "$tmp/ca-db/ca.cnf" -cert "$tmp/ca.pem" \
    -keyfile "$tmp/ca-key.pem" -in "$tmp/$name.csr" -out "$tmp/$name-cert.pem" \
    -startdate "$start" -enddate "$end" -extfile "$tmp/$name.ext" \
    2>"$tmp/openssl.log" >/dev/null || { cat "$tmp/openssl.log" >&2; return 1; }
  rm -rf "$tmp/$name.csr" "$tmp/$name.ext" "$tmp/ca-db"
}

ca ca
ca other-ca
leaf server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
dated expired localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1" 20200101000000Z 20200131000000Z
leaf client simba-test-client "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

# Readable by the servers' users (mysql, postgres, ...) when run as root:
# the keys are throw-away test keys.
chmod 644 "$tmp"/*.pem
for f in "${files[@]}"; do
  mv -f "$tmp/$f" "$dir/$f"
done
