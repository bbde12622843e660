#!/usr/bin/env bash
# Make a private CA and a server certificate for a Flower SuperLink (and SuperNode Runtime API).
#
# Usage: bash deploy/make_certs.sh [--force] [OUT_DIR] [EXTRA_SAN ...]
#   OUT_DIR    where to write the files (default: deploy/certs beside this script; keep it
#              out of git -- the repo's .gitignore lists deploy/certs/)
#   EXTRA_SAN  more subject alternative names for the server certificate, e.g.
#              DNS:superlink.example.org IP:10.0.0.5 (127.0.0.1 and localhost are always in)
#   --force    replace an existing CA and server key. Without it an OUT_DIR that holds any
#              of them is refused: a new CA invalidates the ca.crt every SuperNode and
#              `flwr` connection already trusts.
#
# Writes: ca.crt ca.key (the CA; ca.key stays with whoever runs the SuperLink),
#         server.pem server.key (SuperLink --ssl-certfile / --ssl-keyfile).
# SuperNodes and the `flwr` CLI only need ca.crt (--root-certificates / root-certificates).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
out="${1:-$here/certs}"
shift || true
days="${CERT_DAYS:-365}"

command -v openssl >/dev/null || { echo "make_certs.sh: openssl not found" >&2; exit 2; }
if [ "$force" = 0 ]; then
    existing=""
    for f in ca.crt ca.key server.pem server.key; do
        [ -e "$out/$f" ] && existing="$existing $f"
    done
    if [ -n "$existing" ]; then
        echo "make_certs.sh: $out already holds$existing; refusing to replace the CA and" \
             "server key (every node trusts the current ca.crt). Run with --force to make" \
             "new ones, then give every SuperNode and flwr connection the new ca.crt" >&2
        exit 2
    fi
fi
mkdir -p "$out"
chmod 700 "$out"

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for extra in "$@"; do san="$san,$extra"; done

# CA
openssl genrsa -out "$out/ca.key" 4096 2>/dev/null
openssl req -x509 -new -nodes -key "$out/ca.key" -sha256 -days "$days" \
    -subj "/CN=fedrec-privacy local CA" -out "$out/ca.crt"

# Server key + CSR + certificate signed by the CA, with SANs (TLS clients check SANs, not CN)
openssl genrsa -out "$out/server.key" 4096 2>/dev/null
openssl req -new -key "$out/server.key" -subj "/CN=localhost" -out "$out/server.csr"
ext="$(mktemp)"
trap 'rm -f "$ext"' EXIT
cat >"$ext" <<EXT
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
EXT
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -out "$out/server.pem" -days "$days" -sha256 -extfile "$ext" 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"
chmod 600 "$out/ca.key" "$out/server.key"

echo "certificates written to $out (SAN: $san)"
