#!/usr/bin/env bash
# xmpp_muc.sh: group chat (XEP-0045) on rtd beside ejabberd 23.01 and Prosody 0.12 (issue 32),
# every server driven by `rtbench xmuc` (SASL ANONYMOUS sessions), one server at a time on a
# fresh process, servers alternating within a round; raw rows, rtbench's summaries and a
# median table under docs/bench/issue32-muc/.
#
#   tests/bench/xmpp_muc.sh [--servers rtd,ejabberd,prosody] [--rounds N] [--cases room,rooms]
#                           [--occupants N] [--senders S] [--rate R] [--seconds D]
#                           [--rooms K] [--per-room M] [--settle S] [--smoke]
#                           [--build DIR] [--out DIR]
#
# Cases:
#   room    one room of --occupants (1000) sessions, --senders (10) of them sending groupchat
#           messages at --rate (200) msg/s in all for --seconds (20): each message reaches
#           every occupant (sender included), so deliveries = sent x occupants. Server
#           CPU-seconds (utime+stime of /proc/PID/stat, sampled every 0.2 s and cut to the
#           run: from the first send to the last delivery) per million deliveries, deliveries
#           per server CPU-second, latency p50/p99 (send to delivery), lost (expected -
#           delivered after the drain), rtbench's own CPU over the same window.
#   rooms   --rooms (10000) rooms of --per-room (2) occupants: the K x M sessions log in
#           (not joined), --settle s (8: rtd hibernates a session or a room quiet for 5 s),
#           RSS; then every session joins its room, --settle s, RSS again:
#           bytes per room = (RSS joined - RSS logged in) / K.
# Servers: rtd with muc_host = "conference.@HOST@", muc_max_occupants >= the room's,
# muc_message_rate = 0 (no limit, as the peers), muc_max_rooms >= K, muc_room_locking = false
# (as ejabberd; Prosody's muc_room_locking = false too); ejabberd's mod_muc and Prosody's muc
# component from tests/integration/xmpp_peer.py's bench profiles with --muc N (no shapers,
# max_users N, every presence broadcast). Figures are medians of --rounds (3).
# --smoke: rtd alone, 50 occupants, 20 rooms, seconds.
#
# Every client and server is a process this script starts, on 127.0.0.0/8, ended by its PID;
# each client run has a timeout. The peers come from Debian (see xmpp_peers.sh's header).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVERS=rtd,ejabberd,prosody
ROUNDS=3
CASES=room,rooms
OCCUPANTS=1000
SENDERS=10
RATE=200
SECONDS_RUN=20
ROOMS=10000
PER_ROOM=2
SETTLE=8
SMOKE=0
BUILD=${RT_BUILD_DIR:-build/release}
OUT="$ROOT/docs/bench/issue32-muc"
CASE_TIMEOUT_S=300

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
    --servers) SERVERS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --cases) CASES=${2:?}; shift 2 ;;
    --occupants) OCCUPANTS=${2:?}; shift 2 ;;
    --senders) SENDERS=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --seconds) SECONDS_RUN=${2:?}; shift 2 ;;
    --rooms) ROOMS=${2:?}; shift 2 ;;
    --per-room) PER_ROOM=${2:?}; shift 2 ;;
    --settle) SETTLE=${2:?}; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --help | -h) usage 0 ;;
    *) echo "xmpp_muc.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
if ((SMOKE)); then
    SERVERS=rtd; ROUNDS=1; OCCUPANTS=50; SENDERS=5; RATE=50; SECONDS_RUN=3; ROOMS=20; SETTLE=2
fi
[[ "$ROUNDS" =~ ^[1-9]$ ]] || { echo "xmpp_muc.sh: --rounds wants 1..9" >&2; exit 2; }
((OCCUPANTS >= 2 && OCCUPANTS <= 100000 && ROOMS >= 1 && ROOMS <= 100000 && PER_ROOM >= 1 &&
  ROOMS * PER_ROOM <= 40000 && SECONDS_RUN <= 600)) ||
    { echo "xmpp_muc.sh: counts out of range" >&2; exit 2; }
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
RTD="$BUILD/rtd"
RTCTL="$BUILD/rtctl"
RTBENCH="$BUILD/tools/rtbench/rtbench"
LOAD="$ROOT/tests/bench/xmpp_load.py" # xmpp_servers.sh's register (not used here)
REPORT="$ROOT/tests/bench/xmpp_muc_report.py"
[[ -x "$RTBENCH" ]] || { echo "xmpp_muc.sh: $RTBENCH not built" >&2; exit 2; }
IFS=, read -r -a SERVER_LIST <<<"$SERVERS"
for s in "${SERVER_LIST[@]}"; do
    case "$s" in
    rtd) [[ -x "$RTD" ]] || { echo "xmpp_muc.sh: $RTD not built (see --build)" >&2; exit 2; } ;;
    ejabberd) [[ -d /usr/lib/x86_64-linux-gnu/ejabberd-23.01 ]] || {
        echo "xmpp_muc.sh: ejabberd 23.01 is not installed (xmpp_peers.sh's header)" >&2; exit 2; } ;;
    prosody) command -v prosody >/dev/null || {
        echo "xmpp_muc.sh: prosody is not installed (xmpp_peers.sh's header)" >&2; exit 2; } ;;
    *) echo "xmpp_muc.sh: unknown server '$s'" >&2; exit 2 ;;
    esac
done
IFS=, read -r -a CASE_LIST <<<"$CASES"
for c in "${CASE_LIST[@]}"; do
    [[ "$c" =~ ^(room|rooms)$ ]] || { echo "xmpp_muc.sh: unknown case '$c'" >&2; exit 2; }
done
MAX_OCC=$((OCCUPANTS > PER_ROOM ? OCCUPANTS : PER_ROOM))
MAX_OCC=$((MAX_OCC + 100))

ulimit -n "$(ulimit -Hn)"
WORK=$(mktemp -d /tmp/xmpp-muc.XXXXXX)
SERVER_PID=''
CLIENT_PIDS=()
SAMPLER_PID=''
cleanup() {
    local p
    [[ -n "$SAMPLER_PID" ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    for p in "${CLIENT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true
    sleep 0.5
    [[ -n "$SERVER_PID" ]] && kill -9 "$SERVER_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT"

source "$ROOT/tests/bench/xmpp_servers.sh"

# xmpp_servers.sh's start_server calls write_config: this one adds group chat.
write_config() {
    local name=$1 mode=$2 port=$3 dir="$WORK/$1"
    mkdir -p "$dir/data" "$dir/rules"
    case "$name" in
    rtd)
        cat >"$dir/rtd.conf" <<EOF
listeners = { "127.0.0.1:$(free_port)" }
data_dir = "$dir/data"
rules_dir = "$dir/rules"
max_connections_per_ip = 0
max_connection_rate = 0
log_level = "${RTD_LOG_LEVEL:-warning}"
connect_timeout = 120
xmpp = { hosts = { "localhost" }, anonymous = { "localhost" },
         listeners = { "127.0.0.1:$port" }, archive = false,
         muc_host = "conference.@HOST@", muc_max_occupants = $MAX_OCC, muc_history = 20,
         muc_max_rooms = $((ROOMS + 1000)), muc_message_rate = 0, muc_room_locking = false }
EOF
        ;;
    ejabberd)
        python3 "$ROOT/tests/integration/xmpp_peer.py" config ejabberd "$dir" "$port" bench \
            --muc "$MAX_OCC"
        ;;
    prosody) # ANONYMOUS needs Prosody's anonymous-only host (bench-anon)
        python3 "$ROOT/tests/integration/xmpp_peer.py" config prosody "$dir" "$port" bench-anon \
            --muc "$MAX_OCC"
        ;;
    esac
}

COLS=(server case round occupants rooms senders rate seconds sent expected delivered lost
    server_cpu_s cpu_s_per_M deliveries_per_cpu_s p50_ms p99_ms worst_second_p99_ms max_ms
    client_cpu_s joined failed rss0_kb rss_login_kb rss_joined_kb bytes_per_session
    bytes_per_room join_s load1)
ROWS="$WORK/rows.tsv"
(IFS=$'\t'; echo "${COLS[*]}") >"$ROWS"
JSONL="$WORK/rtbench.jsonl"
LOG="$WORK/rtbench.log"

# row key=value ...: one TSV row in COLS' order (missing keys empty).
row() {
    local -A v=()
    local kv c out=()
    for kv in "$@"; do v[${kv%%=*}]=${kv#*=}; done
    for c in "${COLS[@]}"; do out+=("${v[$c]:-}"); done
    (IFS=$'\t'; echo "${out[*]}") >>"$ROWS"
    tail -1 "$ROWS" >&2
}

jget() {
    python3 -c 'import json,sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"
}

# The server's utime+stime every 0.2 s into FILE, for at most MAX_S seconds.
sampler_start() {
    local file=$1 max_s=$2 pid=$SERVER_PID
    (
        for ((i = 0; i < max_s * 5; i++)); do
            [[ -r /proc/$pid/stat ]] || break
            echo "$EPOCHREALTIME $(awk '{print $14 + $15}' "/proc/$pid/stat")"
            sleep 0.2
        done
    ) >"$file" 2>/dev/null &
    SAMPLER_PID=$!
}
sampler_stop() {
    [[ -n "$SAMPLER_PID" ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    wait "$SAMPLER_PID" 2>/dev/null || true
    SAMPLER_PID=''
}

# A server gone during a case: said, and its log kept beside the rows.
died() {
    kill -0 "$SERVER_PID" 2>/dev/null && return 0
    local st=0
    wait "$SERVER_PID" 2>/dev/null || st=$?
    echo "xmpp_muc.sh: $1 died in $2 $3 (exit status $st); its log: $OUT/died-$1-$2-$3.log" >&2
    cat "$WORK/$1"/*.log >"$OUT/died-$1-$2-$3.log" 2>/dev/null || true
    echo "== $1 $2 $3: the server died (exit status $st)" >>"$LOG"
}

SRC8=127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9

case_room() {
    local name=$1 round=$2 out t0 t1 cpu del
    start_server "$name" anon
    local samples="$WORK/samples-$name-$round"
    sampler_start "$samples" $((CASE_TIMEOUT_S + 30))
    echo "== $name room $round" >>"$LOG"
    out=$(timeout "$CASE_TIMEOUT_S" "$RTBENCH" xmuc -p "$PORT" --anon -c "$OCCUPANTS" \
        --senders "$SENDERS" --rate "$RATE" -d "$SECONDS_RUN" --drain 30 --procs 2 \
        --conn-timeout 60 --ifaddr "$SRC8" --json 2>>"$LOG") || true
    sampler_stop
    if [[ "$out" != '{'* ]]; then
        echo "xmpp_muc.sh: $name room $round: rtbench failed (see the log)" >&2
        tail -5 "$LOG" >&2
        row server="$name" case=room round="$round" occupants="$OCCUPANTS" failed=1 load1="$(load1)"
        stop_server
        return
    fi
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(server=sys.argv[2], case="room", round=int(sys.argv[3])); print(json.dumps(d))' \
        "$out" "$name" "$round" >>"$JSONL"
    t0=$(jget "$out" run_start_unix)
    t1=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(max(d["run_end_unix"], d["recv_last_unix"]))' "$out")
    cpu=$(python3 "$REPORT" window "$samples" "$t0" "$t1")
    del=$(jget "$out" delivered)
    row server="$name" case=room round="$round" occupants="$OCCUPANTS" rooms=1 senders="$SENDERS" \
        rate="$RATE" seconds="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')" \
        sent="$(jget "$out" sent)" expected="$(jget "$out" expected)" delivered="$del" \
        lost="$(jget "$out" lost_deliveries)" server_cpu_s="$cpu" \
        cpu_s_per_M="$(awk -v c="$cpu" -v d="$del" 'BEGIN {if (d > 0) printf "%.3f", c / (d / 1e6)}')" \
        deliveries_per_cpu_s="$(awk -v c="$cpu" -v d="$del" 'BEGIN {if (c > 0) printf "%.0f", d / c}')" \
        p50_ms="$(jget "$out" latency.p50_ms)" p99_ms="$(jget "$out" latency.p99_ms)" \
        worst_second_p99_ms="$(jget "$out" worst_second_p99_ms)" max_ms="$(jget "$out" latency.max_ms)" \
        client_cpu_s="$(jget "$out" run_cpu_seconds)" joined="$(jget "$out" joined)" \
        failed="$(($(jget "$out" failed) + $(jget "$out" join_failed) + $(jget "$out" lost)))" \
        load1="$(load1)"
    died "$name" room "$round"
    stop_server
}

# The last per-second line of rtbench's stderr file, as "logins failed joined join_failed".
tick_counts() {
    grep -a '^rtbench\[' "$1" 2>/dev/null | tail -1 |
        sed -E 's/.* logins=([0-9]+) failed=([0-9]+) lost=[0-9]+ joined=([0-9]+) join_failed=([0-9]+).*/\1 \2 \3 \4/'
}

case_rooms() {
    local name=$1 round=$2 n=$((ROOMS * PER_ROOM)) rss0 rss1 rss2 pid k fifo="$WORK/rooms-in"
    local err="$WORK/rooms-err-$name-$round" t0 join_s counts
    start_server "$name" anon
    sleep 2
    rss0=$(rss_kb "$SERVER_PID" || echo 0)
    rm -f "$fifo" && mkfifo "$fifo"
    # The hold (-d) outlasts the joins and both samples; the process is ended after them.
    timeout "$CASE_TIMEOUT_S" "$RTBENCH" xmuc -p "$PORT" --anon -c "$n" --rooms "$ROOMS" --hold \
        --go-stdin -d 240 --procs 2 --conn-timeout 60 --ifaddr "$SRC8" --json \
        <"$fifo" >"$WORK/rooms-out" 2>"$err" &
    pid=$!
    CLIENT_PIDS=("$pid")
    exec {fd}>"$fifo"
    for ((k = 0; k < 2400; k++)); do
        grep -q 'rtbench: ready' "$err" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    sleep "$SETTLE"
    rss1=$(rss_kb "$SERVER_PID" || echo 0)
    t0=$EPOCHREALTIME
    echo go >&"$fd"
    exec {fd}>&-
    counts=''
    for ((k = 0; k < 2400; k++)); do
        counts=$(tick_counts "$err")
        read -r _ _ j jf <<<"${counts:-0 0 0 0}"
        ((j + jf >= n)) && break
        kill -0 "$pid" 2>/dev/null || break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    join_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
    sleep "$SETTLE"
    rss2=$(rss_kb "$SERVER_PID" || echo 0)
    counts=$(tick_counts "$err")
    read -r lg lf j jf <<<"${counts:-0 0 0 0}"
    if [[ "$name" == rtd && -x "$RTCTL" ]]; then
        {
            echo "== rtd rooms $round: rtctl top --once -n 8 (sorted by memory)"
            "$RTCTL" -c "$WORK/rtd/rtd.conf" top --once --sort memory -n 8 2>&1 || true
        } >>"$LOG"
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    CLIENT_PIDS=()
    { echo "== $name rooms $round"; grep -av '^rtbench\[' "$err" | head -20; tick_counts "$err"; } >>"$LOG"
    row server="$name" case=rooms round="$round" occupants="$n" rooms="$ROOMS" joined="$j" \
        failed="$((lf + jf + n - lg))" rss0_kb="$rss0" rss_login_kb="$rss1" rss_joined_kb="$rss2" \
        bytes_per_session="$(awk -v a="$rss0" -v b="$rss1" -v n="$n" 'BEGIN {printf "%.0f", (b - a) * 1024 / n}')" \
        bytes_per_room="$(awk -v a="$rss1" -v b="$rss2" -v n="$ROOMS" 'BEGIN {printf "%.0f", (b - a) * 1024 / n}')" \
        join_s="$join_s" load1="$(load1)"
    died "$name" rooms "$round"
    stop_server
}

echo "xmpp_muc.sh: $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CASE_LIST[@]}"; do
        for s in "${SERVER_LIST[@]}"; do
            case "$c" in
            room) case_room "$s" "$r" ;;
            rooms) case_rooms "$s" "$r" ;;
            esac
        done
    done
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
((SMOKE)) && STAMP="smoke-$STAMP"
cp "$ROWS" "$OUT/rows-$STAMP.tsv"
[[ -s "$JSONL" ]] && cp "$JSONL" "$OUT/rtbench-$STAMP.jsonl"
[[ -s "$LOG" ]] && cp "$LOG" "$OUT/rtbench-$STAMP.log"
python3 "$REPORT" table "$OUT/rows-$STAMP.tsv" | tee "$OUT/table-$STAMP.md"
for s in "${SERVER_LIST[@]}"; do
    if grep -qiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log 2>/dev/null; then
        echo "xmpp_muc.sh: $s logged errors:" >&2
        grep -hiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log | tail -20 >&2
    fi
done
if ((SMOKE)); then
    awk -F'\t' 'NR > 1 && ($22 != 0 || ($2 == "room" && $12 != 0)) { bad = 1 } END { exit bad }' "$ROWS" || {
        echo "xmpp_muc.sh: smoke: failed sessions or lost deliveries" >&2
        exit 1
    }
fi
