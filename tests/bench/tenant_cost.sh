#!/bin/bash
# What a tenant's mountpoint costs a message (issue 31 §6; docs/BENCHMARKS.md): one rtd (make
# build) with a plain listener and one mounted at "bench/", the same rtbench case against
# each in turn, three rounds: pairs (1,000 publisher/subscriber pairs) and fan-out (1 to
# 1,000), QoS 0 and 1, 16-byte payloads, 8 s. Prints rtd's CPU seconds per million messages
# delivered on each listener (the mounted clients' topics are put under bench/ and taken off
# again) and their ratio.
cd "$(dirname "$0")/../.."
R=$PWD/build/release/rtd; B=$PWD/build/release/tools/rtbench/rtbench; D=${TMPDIR:-/tmp}/rt-tenant-bench
rm -rf $D && mkdir -p $D/data /tmp/norules
PP=$((20000 + RANDOM % 20000)); MP=$((PP + 1))
cat > $D/rtd.conf <<CONF
listeners = { "127.0.0.1:$PP", { bind = "127.0.0.1:$MP", mountpoint = "bench/" } }
data_dir = "$D/data"
rules_dir = "/tmp/norules"
persistence = false
max_connections_per_ip = 0
max_connection_rate = 0
CONF
ulimit -n "$(ulimit -Hn)"
$R -c $D/rtd.conf > $D/rtd.log 2>&1 & RPID=$!
trap 'kill $RPID 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S $D/data/rtd.sock ] && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
for case in "pairs -c 1000" "fanout -c 1000"; do
    for qos in 0 1; do
        for round in 1 2 3; do
            for port in $PP $MP; do
                r0=$(ticks $RPID)
                $B $case -p $port -q $qos -s 16 -d 8 --json --quiet > $D/run.json 2>/dev/null
                r1=$(ticks $RPID)
                python3 - "$D/run.json" "$case" $qos $round $([ $port = $MP ] && echo mounted || echo plain) $((r1 - r0)) <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
m = d["received"] / 1e6
print(json.dumps({"case": sys.argv[2].split()[0], "qos": int(sys.argv[3]), "round": int(sys.argv[4]),
                  "listener": sys.argv[5], "recv_rate": round(d["recv_rate"]), "missing": d["missing"],
                  "rtd_cpu_s_per_M": round(int(sys.argv[6]) / 100 / m, 3)}))
PY
            done
        done
    done
done
