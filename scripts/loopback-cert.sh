#!/usr/bin/env bash
# A self-signed TLS certificate for a Redis on loopback (scripts/fleet.sh MZ_FLEET_TLS=1,
# bench/remote_read.sh --tls): DIR/cert.pem and DIR/key.pem (P-256, unencrypted), naming the IP
# address 127.0.0.1 (subjectAltName), valid for DAYS days. The certificate is its own CA: give it as
# redis's --tls-ca-cert-file and mzcache's --remote-ca-file.
# Usage: scripts/loopback-cert.sh DIR [DAYS (default 30)]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
DIR=${1:?usage: scripts/loopback-cert.sh DIR [DAYS]}
DAYS=${2:-30}
command -v openssl >/dev/null || { echo "loopback-cert: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$DIR"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$DAYS" -subj /CN=mz-loopback \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$DIR/key.pem" -out "$DIR/cert.pem" >/dev/null 2>&1 ||
  { echo "loopback-cert: openssl req could not make the certificate in $DIR" >&2; exit 1; }
