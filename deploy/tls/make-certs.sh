#!/bin/sh
# A test CA and one certificate per name, for trying holdfast with TLS (compose.tls.yaml runs
# it; the README's "Running with TLS" uses the same openssl commands). NOT for production: use
# your PKI or cert-manager there (see deploy/README.md).
#
#   sh deploy/tls/make-certs.sh OUT_DIR NAME...
#
# Writes OUT_DIR/ca.crt (+ ca.key) and, per NAME, NAME.crt + NAME.key: an ECDSA P-256
# certificate valid for DNS:NAME, DNS:localhost and IP:127.0.0.1, usable as a server and as a
# client certificate (the coordinator presents its own to mTLS participants). Existing files
# are kept, so running it again is harmless. Keys are made readable by the uid in KEY_OWNER
# (default 10001, holdfast's user in the image); postgres.key goes to uid 999 (the postgres
# image's user), as PostgreSQL insists on owning its key.
set -eu
out=$1
shift
mkdir -p "$out"
cd "$out"
if [ ! -s ca.crt ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
    -subj "/CN=holdfast test CA" -keyout ca.key -out ca.crt 2>/dev/null
fi
for name in "$@"; do
  [ -s "$name.crt" ] && continue
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$name" -keyout "$name.key" -out "$name.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' "$name" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 397 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
done
rm -f ca.srl
chmod 0644 ./*.crt
chmod 0600 ./*.key
if [ "$(id -u)" = 0 ]; then
  for key in ./*.key; do
    case "$key" in
      ./ca.key) ;;
      ./postgres.key) chown 999:999 "$key" ;;
      *) chown "${KEY_OWNER:-10001}" "$key" ;;
    esac
  done
fi
