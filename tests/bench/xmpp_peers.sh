#!/usr/bin/env bash
# xmpp_peers.sh: rtd's XMPP server beside ejabberd 23.01 and Prosody 0.12 in one run, every
# server driven by the same client (tests/bench/xmpp_load.py, or rtbench for the last three
# cases below), and writes raw rows and a median table under docs/bench/issue29-xmpp/.
#
#   tests/bench/xmpp_peers.sh [--servers rtd,ejabberd,prosody] [--rounds N] [--smoke]
#                             [--cases idle-anon,idle-scram,login,chat] [--settle S]
#                             [--idle N] [--accounts K] [--logins L] [--messages M]
#                             [--rtd-archive on|off]
#                             [--storm-logins L] [--roster-users R] [--chat-seconds S]
#                             [--leave-at S]
#                             [--seed-data DIR [--seed-rosters]] [--build DIR] [--out DIR]
#
# Cases, each on a freshly started server, servers alternating within a round:
#   idle-anon   N sessions (SASL ANONYMOUS, bind, roster get, presence) held open:
#               (VmRSS after - VmRSS before) / N, after --settle seconds (default 3; rtd
#               hibernates a session idle for 5 s, so 8 shows its resting size)
#   idle-scram  K sessions of K registered accounts (SCRAM-SHA-256), likewise
#   login       L SCRAM-SHA-256 logins (open, SASL, bind, roster, presence, close), 50 at
#               once over the K accounts: server utime+stime / L, and logins/s
#   chat        50 pairs of online users, M messages in all, at most 10 unreceived per
#               sender: server CPU-seconds per million messages routed, messages/s
# Cases driven by rtbench (C, libcrypto's SCRAM; its XMPP commands: rtbench --help), which
# the client's own CPU does not bound the way xmpp_load.py's does:
#   login-storm    L SCRAM-SHA-256 logins (--storm-logins, default 20000) over the K accounts,
#                  50 connectors from 127.0.0.2-9, after one warm-up login per account (so the
#                  client's PBKDF2 and the server's caches are out of the clock): server CPU
#                  per login, logins/s, login p99
#   chat-storm     the issue's seed: 40 pairs (u0..u79) chat at 100 messages/s per pair while
#                  the other R - 80 roster users log in as fast as the client can and stay,
#                  for --chat-seconds (default 30): chat p99 overall and of the worst second
#                  (the pairs in an rtbench process of their own, the storm in two others);
#                  --leave-at S: S seconds into the chat every storm session's connection
#                  drops at once (no stream end), so the worst second shows the mass
#                  disconnect (rtbench xchat --leave-at)
#   idle-roster18  R sessions (--roster-users, default 19000) of accounts whose rosters hold
#                  18 contacts with subscription both: RSS per session as idle-anon
# Both roster cases need R accounts (registered with the others) and their rosters, which
# `rtbench xroster` makes once per server before the rounds. --seed-data DIR: rtd's
# accounts come from DIR/xmpp.db (an earlier data dir with u0.. and password pw) instead
# of `rtd xmpp user add`, which takes minutes for 19,000; with --seed-rosters those accounts
# already have their rosters (`rtbench xroster -c R` was run on them) and rtd's set-up is
# skipped (idle-roster18 still checks that every login sees 18 contacts with subscription both).
# rtbench keeps its SCRAM salted passwords for seeded accounts in DIR.salts, across runs: the
# first run's first round would otherwise spend ~30 CPU-s of the client on PBKDF2 (the rounds
# after it find them cached, as the set-up's logins leave them for the other servers).
# --servers may also name ejabberd-plain: ejabberd as its package ships it, storing passwords
# in clear (auth_password_format: plain, its default), so that each SCRAM login derives the
# keys (4096 PBKDF2 rounds) where "ejabberd" reads stored ones as rtd and Prosody do.
# Figures are medians of --rounds (default 3). --smoke: rtd alone, tiny counts, seconds.
# rtd runs without its message archive (xmpp.archive = false), as the peers run without MAM;
# --rtd-archive on measures what archiving every chat costs.
#
# Nothing is installed at run time. The peers come from Debian, once, at set-up time:
#   printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
#   apt-get install ejabberd prosody; rm /usr/sbin/policy-rc.d
# (the policy-rc.d keeps the packages from starting their system services). Each server here
# is a process this script starts with its own config and data in a mktemp -d folder, on its
# own loopback port, and ends by its PID. ejabberd runs as a bare Erlang node (no -sname, so
# no epmd), accounts come by in-band registration (XEP-0077, enabled for loopback in these
# configs) for ejabberd and Prosody and by `rtd xmpp user add` for rtd, all with 4096 PBKDF2
# rounds and SHA-256 keys. Prosody serves SASL ANONYMOUS only with authentication =
# "anonymous" for the whole host, so its idle-anon case runs with that config.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVERS=rtd,ejabberd,prosody
ROUNDS=3
SETTLE=3 # seconds between the last session up and the idle RSS sample
CASES=idle-anon,idle-scram,login,chat
SMOKE=0
IDLE=10000
ACCOUNTS=1000
LOGINS=3000
MESSAGES=200000
BUILD=${RT_BUILD_DIR:-build/release}
OUT="$ROOT/docs/bench/issue29-xmpp"
CASE_TIMEOUT_S=300 # hard cap on one client run, beyond the client's own deadlines
RTD_ARCHIVE=false
STORM_LOGINS=20000
ROSTER_USERS=19000
CHAT_SECONDS=30
LEAVE_AT=
SEED_DATA=''
SEED_ROSTERS=0

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
    --servers) SERVERS=${2:?}; shift 2 ;;
    --cases) CASES=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --settle) SETTLE=${2:?}; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --idle) IDLE=${2:?}; shift 2 ;;
    --accounts) ACCOUNTS=${2:?}; shift 2 ;;
    --logins) LOGINS=${2:?}; shift 2 ;;
    --messages) MESSAGES=${2:?}; shift 2 ;;
    --rtd-archive)
        case "${2:-}" in on) RTD_ARCHIVE=true ;; off) RTD_ARCHIVE=false ;;
        *) echo "xmpp_peers.sh: --rtd-archive wants on or off" >&2; exit 2 ;; esac
        shift 2 ;;
    --storm-logins) STORM_LOGINS=${2:?}; shift 2 ;;
    --roster-users) ROSTER_USERS=${2:?}; shift 2 ;;
    --chat-seconds) CHAT_SECONDS=${2:?}; shift 2 ;;
    --leave-at) LEAVE_AT=${2:?}; shift 2 ;;
    --seed-data) SEED_DATA=${2:?}; shift 2 ;;
    --seed-rosters) SEED_ROSTERS=1; shift ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --help | -h) usage 0 ;;
    *) echo "xmpp_peers.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
if ((SMOKE)); then
    SERVERS=rtd; ROUNDS=1; IDLE=200; ACCOUNTS=100; LOGINS=300; MESSAGES=20000
    STORM_LOGINS=500; ROSTER_USERS=120; CHAT_SECONDS=3
fi
((ROSTER_USERS >= 100)) || { echo "xmpp_peers.sh: --roster-users wants >= 100" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9]$ ]] || { echo "xmpp_peers.sh: --rounds wants 1..9" >&2; exit 2; }
((ACCOUNTS >= 100)) || { echo "xmpp_peers.sh: --accounts wants >= 100 (50 chat pairs)" >&2; exit 2; }
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
RTD="$BUILD/rtd"
LOAD="$ROOT/tests/bench/xmpp_load.py"
RTBENCH="$BUILD/tools/rtbench/rtbench"
RTCTL="$BUILD/rtctl"
IFS=, read -r -a SERVER_LIST <<<"$SERVERS"
for s in "${SERVER_LIST[@]}"; do
    case "$s" in
    rtd) [[ -x "$RTD" ]] || { echo "xmpp_peers.sh: $RTD not built (see --build)" >&2; exit 2; } ;;
    ejabberd | ejabberd-plain) [[ -d /usr/lib/x86_64-linux-gnu/ejabberd-23.01 ]] || {
        echo "xmpp_peers.sh: ejabberd 23.01 is not installed (see the set-up above)" >&2; exit 2; } ;;
    prosody) command -v prosody >/dev/null || {
        echo "xmpp_peers.sh: prosody is not installed (see the set-up above)" >&2; exit 2; } ;;
    *) echo "xmpp_peers.sh: unknown server '$s'" >&2; exit 2 ;;
    esac
done

IFS=, read -r -a CASE_LIST <<<"$CASES"
for c in "${CASE_LIST[@]}"; do
    [[ "$c" =~ ^(idle-anon|idle-scram|login|chat|login-storm|chat-storm|idle-roster18)$ ]] || {
        echo "xmpp_peers.sh: unknown case '$c'" >&2; exit 2; }
    [[ "$c" =~ ^(login-storm|chat-storm|idle-roster18)$ && ! -x "$RTBENCH" ]] && {
        echo "xmpp_peers.sh: $RTBENCH not built (case $c)" >&2; exit 2; }
done
ROSTERS=0 # 1 when a case needs the R roster accounts
[[ ",$CASES," =~ ,(chat-storm|idle-roster18), ]] && ROSTERS=1
NEED=$ACCOUNTS # accounts to register
((ROSTERS && ROSTER_USERS > NEED)) && NEED=$ROSTER_USERS

# The servers and the client processes each hold up to IDLE / 2 + a few descriptors.
ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/xmpp-peers.XXXXXX)
SERVER_PID=''
CLIENT_PIDS=()
cleanup() {
    local p
    for p in "${CLIENT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true
    sleep 0.5
    [[ -n "$SERVER_PID" ]] && kill -9 "$SERVER_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT"
ROWS="$WORK/rows.tsv"
printf 'server\tcase\tround\tcount\tfailed\trss_before_kb\trss_after_kb\tcpu_s\tseconds\tclient_cpu_s\tload1\tp99_ms\tworst_second_p99_ms\tgc_over_1ms\n' >"$ROWS"
JSONL="$WORK/rtbench.jsonl" # rtbench's summaries, one per run, with server/case/round

source "$ROOT/tests/bench/xmpp_servers.sh"

# Appends one row: server case round count failed rss0 rss1 cpu_s seconds client_cpu load
# [p99_ms worst_second_p99_ms] (rtbench's cases; empty for the others).
row() {
    local a=("$@")
    while ((${#a[@]} < 14)); do a+=(""); done
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${a[@]}" >>"$ROWS"
    tail -1 "$ROWS" >&2
}

json() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# A field of rtbench's JSON summary, nested names joined by dots (login.p99_ms).
jget() {
    python3 -c 'import json,sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"
}

# rtbench's SCRAM cache for NAME's accounts: beside the seed for seeded rtd (its salts stay).
salt_cache() {
    if [[ "$1" == rtd && -n "$SEED_DATA" ]]; then echo "${SEED_DATA%/}.salts"; else echo "$WORK/$1/salts"; fi
}

# ---- the rtbench cases ----
# rtbench NAME CASE ROUND ARGS...: runs rtbench with --json on the server's port, keeps its
# per-second lines in $WORK/rtbench.log and its summary in $JSONL; sets RB_OUT (the JSON).
rtbench_run() {
    local name=$1 kind=$2 round=$3
    shift 3
    RB_OUT=$(timeout "${RB_TIMEOUT:-$CASE_TIMEOUT_S}" "$RTBENCH" "$@" -p "$PORT" --json \
        --salt-cache "$(salt_cache "$name")" 2>>"$WORK/rtbench.log") || true
    echo "== $name $kind $round: rtbench $*" >>"$WORK/rtbench.log"
    [[ "$RB_OUT" == '{'* ]] || { echo "xmpp_peers.sh: $name $kind: rtbench failed" >&2; return 1; }
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(server=sys.argv[2], case=sys.argv[3], round=int(sys.argv[4])); print(json.dumps(d))' \
        "$RB_OUT" "$name" "$kind" "$round" >>"$JSONL"
}

# The roster users' rosters, once per server: 18 contacts each, subscription both.
setup_rosters() {
    local name=$1 RB_TIMEOUT=1800 # 19,000 accounts x 2 logins x 36 presences
    echo "xmpp_peers.sh: $name: rosters of $ROSTER_USERS accounts (rtbench xroster)" >&2
    start_server "$name" scram
    # Each login writes 36 presences' roster changes: few at once, and patient.
    rtbench_run "$name" setup 0 xroster -c "$ROSTER_USERS" --procs 2 -d 1500 \
        --conn-parallel 16 --conn-timeout 120 --ifaddr 127.0.0.2,127.0.0.3 || exit 1
    stop_server
    [[ $(jget "$RB_OUT" failed) == 0 ]] || { echo "xmpp_peers.sh: $name: xroster: $RB_OUT" >&2; exit 1; }
}

SRC8=127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9

case_login_storm() {
    local name=$1 round=$2 c0 c1 rss0 rss1
    start_server "$name" scram
    rss0=$(rss_kb "$SERVER_PID")
    # One login per account first, outside the clock (the client's PBKDF2, server caches).
    rtbench_run "$name" login-warm "$round" xlogin -c 50 -L "$ACCOUNTS" --accounts "$ACCOUNTS" \
        --ifaddr "$SRC8" -d 240 || { stop_server; return; }
    c0=$(cpu_ticks "$SERVER_PID")
    rtbench_run "$name" login-storm "$round" xlogin -c 50 -L "$STORM_LOGINS" \
        --accounts "$ACCOUNTS" --ifaddr "$SRC8" -d 240 || { stop_server; return; }
    c1=$(cpu_ticks "$SERVER_PID")
    rss1=$(rss_kb "$SERVER_PID")
    row "$name" login-storm "$round" "$(jget "$RB_OUT" logins)" "$(jget "$RB_OUT" failed)" \
        "$rss0" "$rss1" "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')" \
        "$(jget "$RB_OUT" login_seconds)" "$(jget "$RB_OUT" cpu_seconds)" "$(load1)" \
        "$(jget "$RB_OUT" login.p99_ms)" ""
    stop_server
}

case_chat_storm() {
    local name=$1 round=$2 c0 c1 rss0 rss1 failed
    start_server "$name" scram
    rss0=$(rss_kb "$SERVER_PID")
    c0=$(cpu_ticks "$SERVER_PID")
    # Three processes: the 40 pairs in one, whose loop then measures the chat with no storm
    # login's work queued ahead of it; the storm's sessions over the other two (20,000
    # descriptors a process at most).
    rtbench_run "$name" chat-storm "$round" xchat --pairs 40 --rate 100 -d "$CHAT_SECONDS" \
        --storm $((ROSTER_USERS - 80)) --hold --accounts "$ROSTER_USERS" --procs 3 \
        --pairs-apart --conn-timeout 60 --ifaddr "$SRC8" ${LEAVE_AT:+--leave-at "$LEAVE_AT"} ||
        { stop_server; return; }
    c1=$(cpu_ticks "$SERVER_PID")
    rss1=$(rss_kb "$SERVER_PID")
    failed=$(($(jget "$RB_OUT" missing) + $(jget "$RB_OUT" failed) + $(jget "$RB_OUT" lost)))
    row "$name" chat-storm "$round" "$(jget "$RB_OUT" received)" "$failed" "$rss0" "$rss1" \
        "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')" \
        "$(jget "$RB_OUT" run_seconds)" "$(jget "$RB_OUT" cpu_seconds)" "$(load1)" \
        "$(jget "$RB_OUT" chat.p99_ms)" "$(jget "$RB_OUT" worst_second_p99_ms)" \
        "$(gc_over_1ms "$name")"
    if [[ "$name" == rtd ]]; then # whose collections were the longest
        echo "xmpp_peers.sh: rtd chat-storm $round: the longest collections" >&2
        "$RTCTL" -c "$WORK/rtd/rtd.conf" top --once --sort gc_pause -n 5 | tail -6 >&2 || true
    fi
    stop_server
}

# rtd's heap collections over 1 ms since it started (its rt_gc_pause_seconds histogram:
# the count less those within 1 ms); empty for the peers, whose pauses are not ours to count.
gc_over_1ms() {
    [[ "$1" == rtd ]] || return 0
    "$RTCTL" -c "$WORK/rtd/rtd.conf" metrics prometheus |
        awk '/^rt_gc_pause_seconds_bucket\{le="0.001"\}/ { within = $2 }
             /^rt_gc_pause_seconds_count/ { all = $2 } END { print all - within }'
}

# R sessions held by two rtbench processes; RSS sampled --settle s after both are up.
case_idle_roster() {
    local name=$1 round=$2 rss0 rss1 t0 up_s pid fifo="$WORK/roster-in" k
    start_server "$name" scram
    sleep 2
    rss0=$(rss_kb "$SERVER_PID")
    rm -f "$fifo" && mkfifo "$fifo"
    t0=$EPOCHREALTIME
    timeout "$CASE_TIMEOUT_S" "$RTBENCH" xidle -c "$ROSTER_USERS" --procs 2 --go-stdin -d 1 --conn-timeout 60 \
        -p "$PORT" --ifaddr "$SRC8" --json --quiet --salt-cache "$(salt_cache "$name")" \
        <"$fifo" >"$WORK/roster-out" 2>"$WORK/roster-err" &
    pid=$!
    CLIENT_PIDS=("$pid")
    exec {fd}>"$fifo"
    for ((k = 0; k < 2500; k++)); do
        grep -q 'rtbench: ready' "$WORK/roster-err" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    up_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
    sleep "$SETTLE"
    rss1=$(rss_kb "$SERVER_PID")
    echo go >&"$fd"
    exec {fd}>&-
    wait "$pid" || true
    CLIENT_PIDS=()
    RB_OUT=$(tail -1 "$WORK/roster-out")
    if [[ "$RB_OUT" != '{'* ]]; then
        echo "xmpp_peers.sh: $name idle-roster18 failed:" >&2
        cat "$WORK/roster-err" >&2
        row "$name" idle-roster18 "$round" 0 1 "$rss0" "$rss1" 0 0 0 "$(load1)"
        stop_server
        return
    fi
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(server=sys.argv[2], case="idle-roster18", round=int(sys.argv[3])); print(json.dumps(d))' \
        "$RB_OUT" "$name" "$round" >>"$JSONL"
    [[ $(jget "$RB_OUT" roster_both_per_login) == 18.0 ]] ||
        echo "xmpp_peers.sh: $name: rosters are not 18 both: $RB_OUT" >&2
    row "$name" idle-roster18 "$round" "$(jget "$RB_OUT" logins)" \
        "$(($(jget "$RB_OUT" failed) + $(jget "$RB_OUT" lost)))" "$rss0" "$rss1" 0 "$up_s" \
        "$(jget "$RB_OUT" cpu_seconds)" "$(load1)"
    stop_server
}

# idle: held sessions over two client processes (20,000 descriptors each at most) from
# 127.0.0.2-5; RSS sampled once every client has printed "ready" and 3 s have passed.
case_idle() {
    local name=$1 round=$2 mode=$3 n=$4 auth rss0 rss1 t0 i fifo total=0 failed=0 ccpu=0
    start_server "$name" "$mode"
    auth=(--anon)
    [[ "$mode" == scram ]] && auth=(--users "u%d:pw:$ACCOUNTS")
    sleep 2
    rss0=$(rss_kb "$SERVER_PID")
    t0=$EPOCHREALTIME
    CLIENT_PIDS=()
    for i in 0 1; do
        fifo="$WORK/idle-in-$i"
        rm -f "$fifo" && mkfifo "$fifo"
        # Each client takes its own half of the accounts: one session per account.
        local half=$(((n + 1 - i) / 2)) users=()
        [[ "$mode" == scram ]] && users=(--users "u%d:pw:$ACCOUNTS" --offset $((i * ((n + 1) / 2))))
        [[ "$mode" == anon ]] && users=(--anon)
        timeout "$CASE_TIMEOUT_S" python3 "$LOAD" idle --port "$PORT" "${users[@]}" -n "$half" \
            -C 200 --hold 200 --deadline 240 \
            --ifaddr "127.0.0.$((2 + 2 * i)),127.0.0.$((3 + 2 * i))" \
            <"$fifo" >"$WORK/idle-out-$i" 2>"$WORK/idle-err-$i" &
        CLIENT_PIDS+=($!)
        exec {fd}>"$fifo" # held open: the client's stdin ends when it is closed below
        eval "IDLE_FD_$i=$fd"
    done
    for i in 0 1; do
        local k
        for ((k = 0; k < 2500; k++)); do
            grep -q '^ready' "$WORK/idle-out-$i" 2>/dev/null && break
            kill -0 "${CLIENT_PIDS[$i]}" 2>/dev/null || break
            sleep 0.1
        done
    done
    local up_s
    up_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
    sleep "$SETTLE"
    rss1=$(rss_kb "$SERVER_PID")
    for i in 0 1; do
        eval "exec {IDLE_FD_$i}>&-"
    done
    for i in 0 1; do
        wait "${CLIENT_PIDS[$i]}" || true
        local out
        out=$(tail -1 "$WORK/idle-out-$i")
        if [[ "$out" == '{'* ]]; then
            total=$((total + $(json "$out" sessions)))
            failed=$((failed + $(json "$out" failed)))
            head -3 "$WORK/idle-err-$i" >&2
            ccpu=$(awk -v a="$ccpu" -v b="$(json "$out" client_cpu_s)" 'BEGIN {print a + b}')
        else
            failed=$((failed + half))
            cat "$WORK/idle-err-$i" >&2
        fi
    done
    CLIENT_PIDS=()
    kill -0 "$SERVER_PID" 2>/dev/null || echo "xmpp_peers.sh: $name died in idle-$mode" >&2
    row "$name" "idle-$mode" "$round" "$total" "$failed" "$rss0" "$rss1" 0 "$up_s" "$ccpu" "$(load1)"
    stop_server
}

# login and chat: one client process; the server's CPU is read when the client prints
# "start" (after its warm-up) and when it ends.
case_timed() {
    local name=$1 round=$2 kind=$3 c0 c1 rss0 rss1 out pid
    start_server "$name" scram
    rss0=$(rss_kb "$SERVER_PID")
    local args=(--users "u%d:pw:$ACCOUNTS" --ifaddr 127.0.0.2,127.0.0.3 --deadline 240)
    if [[ "$kind" == login ]]; then
        args+=(-n "$LOGINS" -C 50)
    else
        args+=(-n "$MESSAGES" --pairs 50 -w 10)
    fi
    rm -f "$WORK/t-out"
    timeout "$CASE_TIMEOUT_S" python3 "$LOAD" "$kind" --port "$PORT" "${args[@]}" \
        >"$WORK/t-out" 2>"$WORK/t-err" &
    pid=$!
    CLIENT_PIDS=("$pid")
    local k
    for ((k = 0; k < 2500; k++)); do
        grep -q '^start' "$WORK/t-out" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.02
    done
    c0=$(cpu_ticks "$SERVER_PID")
    wait "$pid" || true
    c1=$(cpu_ticks "$SERVER_PID")
    rss1=$(rss_kb "$SERVER_PID")
    CLIENT_PIDS=()
    out=$(tail -1 "$WORK/t-out")
    if [[ "$out" != '{'* ]]; then
        echo "xmpp_peers.sh: $name $kind failed:" >&2
        cat "$WORK/t-err" >&2
        row "$name" "$kind" "$round" 0 1 "$rss0" "$rss1" 0 0 0 "$(load1)"
        stop_server
        return
    fi
    local count failed
    if [[ "$kind" == login ]]; then
        count=$(json "$out" logins); failed=$(json "$out" failed)
    else
        count=$(json "$out" received); failed=$(($(json "$out" sent) - count))
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || echo "xmpp_peers.sh: $name died in $kind" >&2
    row "$name" "$kind" "$round" "$count" "$failed" "$rss0" "$rss1" \
        "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')" \
        "$(json "$out" seconds)" "$(json "$out" client_cpu_s)" "$(load1)"
    stop_server
}

if [[ ",$CASES," != ,idle-anon, ]]; then
    for s in "${SERVER_LIST[@]}"; do
        register "$s" 0 "$NEED" "u{}" pw
        [[ "$s" == rtd && -n "$SEED_DATA" ]] && ((SEED_ROSTERS)) && continue
        ((ROSTERS)) && setup_rosters "$s"
    done
fi
SCRAM_IDLE=$((ACCOUNTS < IDLE ? ACCOUNTS : IDLE))
for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CASE_LIST[@]}"; do
        for s in "${SERVER_LIST[@]}"; do
            case "$c" in
            idle-anon) case_idle "$s" "$r" anon "$IDLE" ;;
            idle-scram) case_idle "$s" "$r" scram "$SCRAM_IDLE" ;;
            login | chat) case_timed "$s" "$r" "$c" ;;
            login-storm) case_login_storm "$s" "$r" ;;
            chat-storm) case_chat_storm "$s" "$r" ;;
            idle-roster18) case_idle_roster "$s" "$r" ;;
            esac
        done
    done
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
((SMOKE)) && STAMP="smoke-$STAMP"
cp "$ROWS" "$OUT/rows-$STAMP.tsv"
[[ -s "$JSONL" ]] && cp "$JSONL" "$OUT/rtbench-$STAMP.jsonl"
[[ -s "$WORK/rtbench.log" ]] && cp "$WORK/rtbench.log" "$OUT/rtbench-$STAMP.log"
python3 "$ROOT/tests/bench/xmpp_report.py" "$OUT/rows-$STAMP.tsv" | tee "$OUT/table-$STAMP.md"
for s in "${SERVER_LIST[@]}"; do
    if grep -qiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log 2>/dev/null; then
        echo "xmpp_peers.sh: $s logged errors:" >&2
        grep -hiE 'level=(error|fatal)|crash|CRASH REPORT' "$WORK/$s"/*.log | tail -20 >&2
    fi
done
if ((SMOKE)); then
    # The smoke run proves the pipeline, not figures: every session up, every message in.
    awk -F'\t' 'NR > 1 && ($5 != 0 || $4 == 0) { bad = 1 } END { exit bad }' "$ROWS" || {
        echo "xmpp_peers.sh: smoke: failed sessions or lost messages" >&2
        exit 1
    }
fi
