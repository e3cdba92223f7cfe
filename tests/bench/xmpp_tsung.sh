#!/usr/bin/env bash
# xmpp_tsung.sh: the ejabberd 16.01 benchmark's scenario, scaled to this machine, in Tsung 1.7
# (the tool of that benchmark) against rtd and ejabberd 23.01 in one run, and a table of what
# each server did and cost, written under docs/bench/issue29-xmpp/.
#
#   tests/bench/xmpp_tsung.sh [--servers rtd,ejabberd] [--users N] [--rate R]
#                             [--messages M] [--interval S]
#                             [--build DIR] [--out DIR] [--keep]
#
# Per server, on a freshly started process: N accounts tsung1..tsungN (password pwN, as
# Tsung's jabber plugin names them; default 2,000, the issue's run is --users 19000), each
# with 18 contacts (its neighbours, mutual subscriptions made beforehand: in-band by
# rtbench xroster on rtd, by ejabberd's XEP-0227 import on ejabberd); then xmpp_tsung.py's
# scenario: the N sessions arrive at R a second (default 50) over direct TLS with SASL
# PLAIN, bind, fetch the roster, send presence (which goes to the online contacts, whose
# presences come back), send M chat messages (default 10), one each S seconds (default 10),
# to users online, stay until every message can have arrived, and close.
#
# Reported per server: sessions connected (Tsung's connects and authentications), Tsung's
# error counters, chat messages sent and received (each by its stamp, from Tsung's dump),
# the server's CPU-seconds over the run (utime + stime from /proc), its peak RSS (VmHWM) and
# (peak - RSS before) / the sessions that connected. Tsung runs on the same 2 cores; its CPU
# is not the server's.
#
# --keep leaves the servers' and Tsung's files (its dump, logs) in the mktemp folder it names.
#
# The servers come from xmpp_servers.sh (processes of ours, ended by PID; ejabberd 23.01
# installed as xmpp_peers.sh says), Tsung from tools/install-deps.sh --for test.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVERS=rtd,ejabberd
USERS=2000
RATE=50
MESSAGES=10
INTERVAL=10
KEEP=0
BUILD=${RT_BUILD_DIR:-build/release}
OUT="$ROOT/docs/bench/issue29-xmpp"
CASE_TIMEOUT_S=1800 # the in-band roster fill of the largest runs (19,000: 38,000 logins)

usage() {
    sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
    --servers) SERVERS=${2:?}; shift 2 ;;
    --users) USERS=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --messages) MESSAGES=${2:?}; shift 2 ;;
    --interval) INTERVAL=${2:?}; shift 2 ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --help | -h) usage 0 ;;
    *) echo "xmpp_tsung.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
((USERS > 18)) || { echo "xmpp_tsung.sh: --users wants more than 18 (the contacts)" >&2; exit 2; }
command -v tsung >/dev/null || { echo "xmpp_tsung.sh: tsung is missing" >&2; exit 2; }
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
RTD="$BUILD/rtd"
LOAD="$ROOT/tests/bench/xmpp_load.py"
RTBENCH="$BUILD/tools/rtbench/rtbench"
TSUNG_RUN="$ROOT/tests/bench/xmpp_tsung.py"
IFS=, read -r -a SERVER_LIST <<<"$SERVERS"
for s in "${SERVER_LIST[@]}"; do
    case "$s" in
    rtd) [[ -x "$RTD" ]] || { echo "xmpp_tsung.sh: $RTD not built (see --build)" >&2; exit 2; } ;;
    ejabberd) [[ -d /usr/lib/x86_64-linux-gnu/ejabberd-23.01 ]] || {
        echo "xmpp_tsung.sh: ejabberd 23.01 is not installed (see xmpp_peers.sh)" >&2; exit 2; } ;;
    *) echo "xmpp_tsung.sh: unknown server '$s' (rtd, ejabberd)" >&2; exit 2 ;;
    esac
done

# The server, the roster filler and Tsung each hold a descriptor per session.
ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/xmpp-tsung.XXXXXX)
SERVER_PID=''
cleanup() {
    [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true
    sleep 0.5
    [[ -n "$SERVER_PID" ]] && kill -9 "$SERVER_PID" 2>/dev/null || true
    if ((KEEP)); then echo "xmpp_tsung.sh: files kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
source "$ROOT/tests/bench/xmpp_servers.sh"

# One self-signed certificate for "localhost", key and certificate in one file (both servers
# take that); Tsung does not check it.
TLS_PEM="$WORK/tls.pem"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
cat "$WORK/key.pem" "$WORK/cert.pem" >"$TLS_PEM"

mkdir -p "$OUT"
ROWS="$WORK/rows.tsv"
printf 'server\tusers\tconnected\tauth\terrors\tsent\treceived\tlost\tcpu_s\trss_before_kb\trss_peak_kb\tload1\n' >"$ROWS"
json() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
hwm_kb() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

for s in "${SERVER_LIST[@]}"; do
    if [[ "$s" == ejabberd ]]; then
        load_rosters_piefxis "$s" 1 "$USERS" "tsung{}" "pw{}"
    else
        register "$s" 1 "$USERS" "tsung{}" "pw{}"
        start_server "$s" scram
        echo "xmpp_tsung.sh: $s: 18 contacts for each of $USERS accounts" >&2
        # Each login writes 36 presences' roster changes: few at once, and patient.
        out=$(timeout "$CASE_TIMEOUT_S" "$RTBENCH" xroster -u 'tsung%i' -P 'pw%i' -n 1 -c "$USERS" \
            --procs 2 -d $((CASE_TIMEOUT_S - 60)) --conn-parallel 16 --conn-timeout 120 \
            --ifaddr 127.0.0.2,127.0.0.3 -p "$PORT" --json --salt-cache "$WORK/$s/salts")
        [[ "$(json "$out" failed)" == 0 ]] || {
            echo "xmpp_tsung.sh: $s: rosters incomplete: $out" >&2; exit 1; }
        # The run starts on a fresh process: the rosters are in its files, not in its memory.
        stop_server
    fi
    start_server "$s" scram
    rss0=$(rss_kb "$SERVER_PID")
    c0=$(cpu_ticks "$SERVER_PID")
    echo "xmpp_tsung.sh: $s: Tsung, $USERS users (~$(python3 "$TSUNG_RUN" --port 0 \
        --users "$USERS" --rate "$RATE" --messages "$MESSAGES" --interval "$INTERVAL" \
        --print-timeline) s)" >&2
    out=$(python3 "$TSUNG_RUN" --port "$TLS_PORT" --users "$USERS" --rate "$RATE" \
        --messages "$MESSAGES" --interval "$INTERVAL" \
        --log "$WORK/$s/tsung") || { echo "xmpp_tsung.sh: $s: Tsung failed" >&2; exit 1; }
    echo "$out" >&2
    c1=$(cpu_ticks "$SERVER_PID")
    peak=$(hwm_kb "$SERVER_PID")
    errors=$(python3 -c 'import json,sys; print(sum(json.loads(sys.argv[1])["errors"].values()))' "$out")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$USERS" \
        "$(json "$out" connected)" "$(json "$out" auth)" "$errors" "$(json "$out" sent)" \
        "$(json "$out" received)" "$(json "$out" lost)" \
        "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')" \
        "$rss0" "$peak" "$(load1)" >>"$ROWS"
    kill -0 "$SERVER_PID" 2>/dev/null || echo "xmpp_tsung.sh: $s died" >&2
    stop_server
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
cp "$ROWS" "$OUT/tsung-rows-$STAMP.tsv"
awk -F'\t' 'NR == 1 {
        print "| server | users | connected | errors | chat sent | received | lost | CPU-s | " \
              "peak RSS MB | KB/session | load1 |"
        print "|---|---|---|---|---|---|---|---|---|---|---|"; next }
    { printf "| %s | %d | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | %s |\n", $1, $2, $3,
        $5, $6, $7, $8, $9, $11 / 1024, ($11 - $10) / ($3 ? $3 : 1), $12 }' "$ROWS" |
    tee "$OUT/tsung-table-$STAMP.md"
for s in "${SERVER_LIST[@]}"; do
    if grep -qiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log 2>/dev/null; then
        echo "xmpp_tsung.sh: $s logged errors:" >&2
        grep -hiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log | tail -20 >&2
    fi
done
# Every session up, nothing lost, no error: else the figures are not the scenario's.
awk -F'\t' 'NR > 1 && ($3 != $2 || $5 != 0 || $8 != 0 || $6 != $7) { bad = 1 } END { exit bad }' \
    "$ROWS" || { echo "xmpp_tsung.sh: sessions missing, errors or lost messages" >&2; exit 1; }
