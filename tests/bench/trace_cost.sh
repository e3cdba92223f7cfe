#!/usr/bin/env bash
# trace_cost.sh: what packet tracing costs rtd, measured with compare.sh (A/B alternating per
# case and round, broker CPU-seconds per million delivered messages):
#
#   tests/bench/trace_cost.sh --base DIR [--build DIR] [--rounds N] [--only CASES] [--out DIR]
#                             [--which off,miss,all]
#
#   off   rtd built in DIR (--base) with tracing compiled out (cmake -DRT_TRACING=OFF, the
#         same sources otherwise) against rtd with it compiled in and no trace on: the cost of
#         the per-packet test alone
#   miss  no trace against one trace on that matches none of the bench's packets
#         (a topic trace on no/such/topic: every PUBLISH's topic is read and matched)
#   all   no trace against one topic trace on '#': every PUBLISH in and out is an event,
#         read by an rtctl that writes to /dev/null (drops when it falls behind are counted)
#
# CASES is compare.sh's --only list (default: fan-in, fan-out and pairs at QoS 0 and 1,
# 16 B, quick sizes). Tables land in OUT/{off,miss,all}/compare.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE=''
BUILD=${RT_BUILD_DIR:-$ROOT/build/release}
ROUNDS=3
ONLY='fanin-20-q0-16B,fanin-20-q1-16B,fanout-100-q0-16B,fanout-100-q1-16B,pairs-100-q0-16B,pairs-100-q1-16B'
OUT="$ROOT/docs/bench/issue16-trace"
WHICH=off,miss,all

while (($#)); do
    case "$1" in
    --base) BASE=${2:?}; shift 2 ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --only) ONLY=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --which) WHICH=${2:?}; shift 2 ;;
    --help | -h) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "trace_cost.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[[ -x "$BASE/rtd" ]] || { echo "trace_cost.sh: --base DIR must hold a built rtd" >&2; exit 2; }
[[ -x "$BUILD/rtd" && -x "$BUILD/rtctl" ]] || { echo "trace_cost.sh: $BUILD/rtd not built" >&2; exit 2; }
mkdir -p /tmp/rt-trace-norules && mkdir -p -m 0700 /tmp/rt-trace-data

# The broker as compare.sh runs it: no persistence, no rules, its own admin socket per port.
rtd_cmd() {
    echo "$1/rtd -c $ROOT/etc/rtd.conf -o listeners=127.0.0.1:{port} -o persistence=false" \
        "-o rules_dir=/tmp/rt-trace-norules -o data_dir=/tmp/rt-trace-data -o admin_socket=/tmp/rt-trace-{port}.sock"
}
# rtd with a trace on FILTER from its first second: rtctl waits for the admin socket, then
# streams to /dev/null; it ends with rtd (its socket closes). exec keeps rtd's pid the one
# compare.sh samples.
traced_cmd() {
    local filter=$1
    echo "sh -c '(for i in \$(seq 50); do [ -S /tmp/rt-trace-{port}.sock ] && break; sleep 0.1; done;" \
        "exec $BUILD/rtctl -s /tmp/rt-trace-{port}.sock trace topic \"$filter\" --duration 86400" \
        ">/dev/null 2>&1) & exec $(rtd_cmd "$BUILD")'"
}

compare() {
    local name=$1 a=$2 b=$3
    echo "== $name: A = $a"
    echo "   B = $b"
    "$ROOT/tests/bench/compare.sh" --quick --rounds "$ROUNDS" --build "$BUILD" --only "$ONLY" \
        --out "$OUT/$name" --a "$a" --b "$b"
}

for which in ${WHICH//,/ }; do
    case "$which" in
    off) compare off "$(rtd_cmd "$BASE")" "$(rtd_cmd "$BUILD")" ;;
    miss) compare miss "$(rtd_cmd "$BUILD")" "$(traced_cmd no/such/topic)" ;;
    all) compare all "$(rtd_cmd "$BUILD")" "$(traced_cmd '#')" ;;
    *) echo "trace_cost.sh: --which takes off, miss, all" >&2; exit 2 ;;
    esac
done
