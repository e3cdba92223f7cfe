#!/bin/bash
# A mass disconnect of MQTT clients beside live traffic (docs/BENCHMARKS.md, "A mass
# disconnect"): rtd (make build, or the build directory given as $1) with 19,000 subscribers,
# one topic each at QoS 1, held by an rtbench of their own; 40 publisher/subscriber pairs at
# 4,000 msg/s in all from another rtbench; 10 s into the pairs' run the subscribers' rtbench
# is killed (SIGKILL: the kernel closes its 19,000 sockets at once, no DISCONNECT). Prints, for
# --rounds rounds (3), the pairs' worst per-second latency p99 around the drop (seconds 8-14)
# and rtd's CPU seconds over the drop (9 s to 14 s). Loopback only; it stops what it started.
#   tests/bench/mqtt_drop.sh [BUILD_DIR] [--rounds N] [--subs N] [--clean false]
cd "$(dirname "$0")/../.." || exit 2
BUILD=$PWD/build/release ROUNDS=3 SUBS=19000 CLEAN=true
[[ $# -gt 0 && $1 != --* ]] && { BUILD=$(cd "$1" && pwd); shift; }
while (($#)); do
    case "$1" in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --subs) SUBS=${2:?}; shift 2 ;;
    --clean) CLEAN=${2:?}; shift 2 ;;
    *) echo "mqtt_drop.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
R=$BUILD/rtd B=$BUILD/tools/rtbench/rtbench D=${TMPDIR:-/tmp}/rt-mqtt-drop
[[ -x $R && -x $B ]] || { echo "mqtt_drop.sh: no rtd or rtbench in $BUILD" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)"
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
RPID='' SPID=''
trap '[[ -n $SPID ]] && pkill -KILL -P $SPID; kill -KILL $SPID $RPID 2>/dev/null' EXIT
for ((round = 1; round <= ROUNDS; round++)); do
    rm -rf "$D" && mkdir -p "$D/data" "$D/rules"
    PORT=$((20000 + RANDOM % 20000))
    cat > "$D/rtd.conf" <<CONF
listeners = { "127.0.0.1:$PORT" }
data_dir = "$D/data"
rules_dir = "$D/rules"
max_connections_per_ip = 0
max_connection_rate = 0
log_level = "warning"
CONF
    "$R" -c "$D/rtd.conf" > "$D/rtd.log" 2>&1 & RPID=$!
    for _ in $(seq 100); do [ -S "$D/data/rtd.sock" ] && break; sleep 0.1; done
    "$B" sub -p "$PORT" -c "$SUBS" -t 'idle/%i' -q 1 -C "$CLEAN" -d 300 -i 0 --procs 2 \
        --ifaddr 127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5 --prefix idle > "$D/sub.out" \
        2> "$D/sub.err" & SPID=$!
    for _ in $(seq 600); do grep -q "conn=$SUBS " "$D/sub.err" && break; sleep 0.1; done
    grep -q "conn=$SUBS " "$D/sub.err" || { echo "round $round: the subscribers did not connect" >&2; exit 1; }
    "$B" pairs -p "$PORT" -c 40 -q 0 --rate 4000 -d 20 --ifaddr 127.0.0.9 --prefix pair \
        > "$D/pairs.out" 2> "$D/pairs.err" & PAIRS=$!
    sleep 9; t0=$(ticks $RPID)
    sleep 1; pkill -KILL -P "$SPID"; kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
    sleep 4; t1=$(ticks $RPID)
    wait "$PAIRS"
    kill "$RPID"; wait "$RPID" 2>/dev/null; RPID=''
    awk -v r="$round" -v cpu="$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')" '
        /rtbench\[/ { s = $2; gsub(/[^0-9]/, "", s); p = $10; gsub(/p99=|ms/, "", p)
                      if (s + 0 >= 8 && s + 0 <= 14 && p + 0 > m) m = p + 0 }
        END { printf "round %d: worst p99 of seconds 8-14 %.2f ms; rtd CPU 9-14 s %s s\n", r, m, cpu }' \
        "$D/pairs.err"
done
