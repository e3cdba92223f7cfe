#!/bin/bash
# The EMQX seed shape for rules: QoS 1 publishers at a fixed rate, every message selected
# by etc/rules/archive.lua into the `archive` SQLite sink. Starts its own rtd (Release
# build), runs rtbench pub, waits for the rows to stop growing, stops rtd and prints:
#   label, rows in data_dir/rt.db, rtd CPU (utime+stime, centiseconds) over the publish
#   window and until the rows settled, load average, rtbench's sent/acked/rate, and the
#   shutdown lines rule.stopped (matched, passed) and sink.stopped (in, written, dropped).
# usage: tests/bench/rules_sqlite.sh LABEL PORT RATE SECONDS [rtd -o settings...]
#   env: C clients (40), S payload bytes (10: raw, no rtbench header), BD build dir,
#        OUT directory for logs (/tmp/rules-sqlite), CONF config file (etc/rtd.conf). Rules off: -o 'rules_dir="/tmp/empty-rules"' (an empty directory; rtd refuses a missing one).
# Only 127.0.0.1; every run is bounded by SECONDS + 40 s.
set -u
L=$1; P=$2; R=$3; D=$4; shift 4
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BD=${BD:-$ROOT/build/release}
OUT=${OUT:-/tmp/rules-sqlite}
DD=$OUT/data-$L
mkdir -p "$OUT"; rm -rf "$DD"; mkdir -p "$DD"
cd "$ROOT"
if ss -ltn | grep -q ":$P "; then echo "port $P busy"; exit 1; fi
"$BD/rtd" -c "${CONF:-etc/rtd.conf}" -o "listeners=\"127.0.0.1:$P\"" -o "data_dir=\"$DD\"" \
    -o log_level=info "$@" > "$OUT/$L.log" 2>&1 &
RP=$!
sleep 1
cpu() { awk '{print $14 + $15}' /proc/$RP/stat; }
c0=$(cpu)
timeout $((D + 40)) "$BD/tools/rtbench/rtbench" pub -p "$P" -c "${C:-40}" -q 1 -s "${S:-10}" \
    --rate "$R" -d "$D" -t 'bench/%i' --json --quiet > "$OUT/$L.json" 2> "$OUT/$L.err"
c1=$(cpu)
count() {
    python3 -c "import sqlite3; print(sqlite3.connect('file:$DD/rt.db?mode=ro', uri=True)
        .execute('select count(*) from messages').fetchone()[0])" 2>/dev/null || echo 0
}
last=-1
for _ in $(seq 1 30); do
    n=$(count)
    [ "$n" = "$last" ] && break
    last=$n; sleep 1
done
c2=$(cpu)
kill $RP; wait $RP 2>/dev/null
echo "label=$L rows=$n cpu_pub_cs=$((c1 - c0)) cpu_total_cs=$((c2 - c0)) load=$(cut -d' ' -f1-3 /proc/loadavg)"
grep -o '"sent":[0-9]*\|"acked":[0-9]*\|"pub_rate":[0-9.]*' "$OUT/$L.json" | tr '\n' ' '; echo
grep -E "rule.stopped rule=archive|rule.worker|sink.stopped sink=archive" "$OUT/$L.log" | cut -d' ' -f3-
