#!/bin/bash
# Connect rate by authentication kind (issue 31; docs/BENCHMARKS.md): rtbench hs (connect,
# CONNECT/CONNACK, DISCONNECT loops, 10 connectors, 8 s) against rtd (make build) with:
# anonymous; a password file user (PBKDF2 once, then the remembered tag); JWT HS256, RS256
# (PEM) and ES256 (PEM); HTTP authentication cached and uncached against a Python service on
# this machine. Three rounds each; prints one JSON line per run and rtd's CPU ticks.
# Needs python3-jwt and python3-cryptography (tools/install-deps.sh --for test).
cd "$(dirname "$0")/../.."
R=build/release/rtd; B=build/release/tools/rtbench/rtbench; D=${TMPDIR:-/tmp}/rt-auth-bench
rm -rf $D && mkdir -p $D /tmp/norules
/usr/bin/python3 - "$D" <<'PY'
import json, time, jwt, os
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
import sys
D = sys.argv[1]
secret = b"bench-secret-that-is-long-enough-for-hs256-0123"
open(f"{D}/secret", "wb").write(secret)
rk = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ek = ec.generate_private_key(ec.SECP256R1())
open(f"{D}/rsa.pem", "wb").write(rk.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
open(f"{D}/ec.pem", "wb").write(ek.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
exp = int(time.time()) + 86400
open(f"{D}/hs.tok", "w").write(jwt.encode({"exp": exp}, secret, algorithm="HS256"))
open(f"{D}/rs.tok", "w").write(jwt.encode({"exp": exp}, rk, algorithm="RS256"))
open(f"{D}/es.tok", "w").write(jwt.encode({"exp": exp}, ek, algorithm="ES256"))
for f in os.listdir(D): os.chmod(f"{D}/{f}", 0o600)
PY
$R passwd -c -b $D/pw bench benchpw >/dev/null
chmod 600 $D/pw
run() { # name user pass extra...
  local name=$1 user=$2 pass=$3; shift 3
  local port=$((20000 + RANDOM % 5000)) dir=$D/data-$name
  rm -rf $dir; mkdir -p $dir
  $R -c etc/rtd.conf -o listeners=127.0.0.1:$port -o data_dir=$dir -o rules_dir=/tmp/norules \
     -o max_connection_rate=0 -o max_connections_per_ip=0 -o log_level=warning "$@" > $dir.log 2>&1 &
  local pid=$!
  for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  local cred=()
  [ -n "$user" ] && cred+=(-u "$user")
  [ -n "$pass" ] && cred+=(-P "$pass")
  local out=$($B hs -p $port -c 10 -d 8 "${cred[@]}" --json --quiet 2>/dev/null | tail -1)
  local cpu=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill $pid; wait $pid 2>/dev/null
  echo "$name $out rtd_cpu_ticks=$cpu"
}
for round in 1 2 3; do
  run anonymous "" ""
  run file bench benchpw -o password_file=$D/pw -o allow_anonymous=false
  run jwt_hs256 "" "$(cat $D/hs.tok)" -o allow_anonymous=false -o "auth={{kind=\"jwt\",secret_file=\"$D/secret\"}}"
  run jwt_rs256 "" "$(cat $D/rs.tok)" -o allow_anonymous=false -o "auth={{kind=\"jwt\",public_key=\"$D/rsa.pem\"}}"
  run jwt_es256 "" "$(cat $D/es.tok)" -o allow_anonymous=false -o "auth={{kind=\"jwt\",public_key=\"$D/ec.pem\"}}"
done
# HTTP: a Python http.server service on this machine (it shares the 2 cores; uncached, it is
# what limits the rate).
cat > $D/svc.py <<'PY'
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        out = b'{"result": "allow"}'
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
ThreadingHTTPServer(("127.0.0.1", 18097), H).serve_forever()
PY
/usr/bin/python3 $D/svc.py & SVC=$!
sleep 0.5
for round in 1 2 3; do
  run http_cached bench benchpw -o allow_anonymous=false -o 'auth={{kind="http",url="http://127.0.0.1:18097/auth",cache_ttl_s=3600}}'
  run http_uncached bench benchpw -o allow_anonymous=false -o 'auth={{kind="http",url="http://127.0.0.1:18097/auth",cache_ttl_s=0}}'
done
kill $SVC
