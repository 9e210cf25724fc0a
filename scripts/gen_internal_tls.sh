#!/usr/bin/env bash
# Make a private CA and one certificate for taskgate's internal gRPC links.
#   scripts/gen_internal_tls.sh DIR [EXTRA_DNS_NAME ...]
# DIR gets ca.pem, tls.pem (server and client use), tls.key (0600). The certificate
# names localhost, 127.0.0.1 and the compose service names; it is valid for one
# year. Rotate by running it again and restarting the services.
set -euo pipefail
dir=${1:?usage: $0 DIR [EXTRA_DNS_NAME ...]}
shift
mkdir -p "$dir"
chmod 700 "$dir"
umask 077
names=(localhost scheduler pending-registry telemetry-agent notifier gateway-http "$@")
san="IP:127.0.0.1"
for n in "${names[@]}"; do san+=",DNS:$n"; done

openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=taskgate internal CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=taskgate" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
cat > "$dir/ext.cnf" <<CNF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
CNF
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 365 \
  -extfile "$dir/ext.cnf" -out "$dir/tls.pem" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"
chmod 644 "$dir/ca.pem" "$dir/tls.pem"
echo "internal TLS material in $dir (ca.pem, tls.pem, tls.key; keep ca.key offline or delete it)"
