#!/bin/bash
# A bridge's throughput to Mosquitto (issue 31 §2; docs/BENCHMARKS.md): rtbench fanin, 10
# publishers on rtd (make build) and one subscriber on Debian's Mosquitto, every message
# crossing the bridge (out = "#"), QoS 0 and 1, 64-byte payloads, 8 s, three rounds each.
# Prints the rate received at Mosquitto, losses, end-to-end p50, and the CPU seconds per
# million messages of rtd, Mosquitto and rtbench itself. The bridge's max_inflight is 1000:
# Mosquitto, not the window, is then the limit (it takes every message twice, in and out).
cd "$(dirname "$0")/../.."
R=$PWD/build/release/rtd; B=$PWD/build/release/tools/rtbench/rtbench; D=${TMPDIR:-/tmp}/rt-bridge-bench
rm -rf $D && mkdir -p $D/data /tmp/norules
MP=$((20000 + RANDOM % 20000)); RP=$((MP + 1))
printf 'listener %d 127.0.0.1\nallow_anonymous true\nmax_queued_messages 1000000\nmax_inflight_messages 0\nset_tcp_nodelay true\n' $MP > $D/m.conf
/usr/sbin/mosquitto -c $D/m.conf > $D/mosquitto.log 2>&1 & MPID=$!
cat > $D/rtd.conf <<CONF
listeners = { { bind = "127.0.0.1:$RP" } }
data_dir = "$D/data"
rules_dir = "/tmp/norules"
max_connections_per_ip = 0
max_connection_rate = 0
bridges = { m = { remote = "mqtt://127.0.0.1:$MP", out = { "#" }, max_inflight = 1000 } }
CONF
$R -c $D/rtd.conf > $D/rtd.log 2>&1 & RPID=$!
trap 'kill $RPID $MPID 2>/dev/null' EXIT
for _ in $(seq 100); do build/release/rtctl -s $D/data/rtd.sock bridges list 2>/dev/null | grep -q connected && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
for qos in 0 1; do
    for round in 1 2 3; do
        r0=$(ticks $RPID); m0=$(ticks $MPID)
        $B fanin --pubs 10 --subs 1 --pub-ports $RP --sub-ports $MP -q $qos -s 64 -d 8 --json --quiet \
            > $D/run.json 2>/dev/null
        r1=$(ticks $RPID); m1=$(ticks $MPID)
        python3 - "$D/run.json" $qos $round $((r1 - r0)) $((m1 - m0)) <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
qos, rnd, rt, mq = sys.argv[2], sys.argv[3], int(sys.argv[4]) / 100, int(sys.argv[5]) / 100
m = d["received"] / 1e6
print(json.dumps({"qos": int(qos), "round": int(rnd), "recv_rate": round(d["recv_rate"]),
                  "missing": d["missing"], "e2e_p50_ms": d["e2e"]["p50_ms"],
                  "rtd_cpu_s_per_M": round(rt / m, 2), "mosquitto_cpu_s_per_M": round(mq / m, 2),
                  "rtbench_cpu_s_per_M": round(d["cpu_seconds"] / m, 2)}))
PY
    done
done
