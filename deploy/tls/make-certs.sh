#!/usr/bin/env bash
# Certificates for Kafka's EXTERNAL listener (SASL_SSL: devices and hosts outside the compose network).
#
#   deploy/tls/make-certs.sh HOST[,HOST...] [DIR]
#
# HOST is what KAFKA_EXTERNAL_HOST advertises (a DNS name or an IP address; list every name devices use). Writes DIR
# (default deploy/tls/certs, what KAFKA_TLS_DIR mounts):
#   ca.crt        the CA devices trust (kafka.ssl_ca_location, kcat's ssl.ca.location); give it to every device
#   ca.key        the CA's key (kept 0600; made once, reused for the next certificate)
#   external.crt  the broker's certificate, for HOST, signed by the CA
#   external.p12  the broker's key and certificate chain as a PKCS12 keystore, encrypted with
#                 KAFKA_TLS_KEYSTORE_PASSWORD (from the environment, else from .env)
# A local CA is for trials. In production give the broker a certificate from your own CA: put its PKCS12 keystore
# at DIR/external.p12 and its CA at DIR/ca.crt; `make-certs.sh --check HOST [DIR]` says whether it covers HOST.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

die() { echo "make-certs: $*" >&2; exit 2; }
is_ip() { [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $1 == *:* ]]; }

check() {  # check HOSTS DIR: the certificate names every host (the name a device verifies it against)
  local crt=$2/external.crt host
  [[ -f $crt ]] || die "no certificate at $crt"
  for host in ${1//,/ }; do
    kind=-checkhost; is_ip "$host" && kind=-checkip
    openssl x509 -in "$crt" -noout "$kind" "$host" 2>/dev/null | grep -q "does match" \
      || die "the certificate $crt does not name $host (KAFKA_EXTERNAL_HOST): devices would refuse it; make one for $host"
  done
  echo "make-certs: $crt names ${1//,/, }"
}

if [[ ${1:-} == --check ]]; then
  [[ -n ${2:-} ]] || die "usage: $0 --check HOST[,HOST...] [DIR]"
  check "$2" "${3:-$ROOT/deploy/tls/certs}"
  exit 0
fi
[[ -n ${1:-} && ${1:0:1} != - ]] || die "usage: $0 HOST[,HOST...] [DIR]   (HOST: what KAFKA_EXTERNAL_HOST advertises)"
hosts=$1
dir=${2:-$ROOT/deploy/tls/certs}
password=${KAFKA_TLS_KEYSTORE_PASSWORD:-$(sed -n 's/^KAFKA_TLS_KEYSTORE_PASSWORD=//p' "$ROOT/.env" 2>/dev/null)}
[[ -n $password ]] || die "set KAFKA_TLS_KEYSTORE_PASSWORD (in .env or the environment) first"
[[ $password != change-me* ]] || die "KAFKA_TLS_KEYSTORE_PASSWORD is still the change-me placeholder: set it in .env"
mkdir -p "$dir"

san=""
for host in ${hosts//,/ }; do
  if is_ip "$host"; then san+="IP:$host,"; else san+="DNS:$host,"; fi
done
san=${san%,}
first=${hosts%%,*}

if [[ ! -f $dir/ca.key ]]; then
  (umask 077; openssl req -x509 -newkey rsa:3072 -nodes -sha256 -days 825 -subj "/CN=streamtrain trial CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null)
  echo "make-certs: new CA $dir/ca.crt (a trial CA: devices must trust it)"
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
openssl req -newkey rsa:3072 -nodes -sha256 -subj "/CN=$first" -keyout "$work/external.key" \
  -out "$work/external.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' "$san" \
  > "$work/ext.cnf"
openssl x509 -req -in "$work/external.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
  -sha256 -extfile "$work/ext.cnf" -out "$dir/external.crt" 2>/dev/null
KEYSTORE_PASSWORD=$password openssl pkcs12 -export -name kafka -in "$dir/external.crt" -inkey "$work/external.key" \
  -certfile "$dir/ca.crt" -out "$dir/external.p12" -passout env:KEYSTORE_PASSWORD
# The broker runs as its image's own user: the keystore is encrypted, so it may be readable by it.
chmod 0644 "$dir/external.p12" "$dir/external.crt" "$dir/ca.crt"
rm -f "$dir/ca.srl"
check "$hosts" "$dir"
echo "make-certs: $dir/external.p12 for $san; set KAFKA_EXTERNAL_HOST=$first and KAFKA_TLS_DIR=$dir in .env"
