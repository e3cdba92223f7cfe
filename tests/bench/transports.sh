#!/usr/bin/env bash
# transports.sh: rtd against Mosquitto over TLS and WebSocket, side by side, with rtbench.
#
#   tests/bench/transports.sh [--rounds N] [--only SECTION[,SECTION]] [--quick]
#                             [--build DIR] [--out DIR] [--mosquitto PATH]
#                             [--brokers mosq,rtd] [--merge FILE.jsonl]
#
# SECTIONs (all by default), each a median of --rounds rounds (default 3), brokers
# alternating within a round, a fresh broker per measurement:
#   idle   broker memory per idle connection at 19,000 connections (2 rtbench processes,
#          source addresses 127.0.0.1-4): tcp, tls (ECDSA P-256) and ws per broker.
#   hs     TLS handshakes per second, full and resumed, ECDSA P-256 and RSA 2048 server
#          certificates (rtbench hs: 32 connectors, 2 processes, 6 s), with broker CPU per
#          handshake and rtbench's own CPU.
#   storm  a QoS 1 publisher/subscriber pair over TLS at 500 msg/s while 20 connectors
#          make 2,000 full ECDSA handshakes: the pair's PUBACK p99 alone and in the storm.
#   cpu    broker CPU-seconds per million delivered (compare.sh's arithmetic: whole case
#          and steady window) for pairs-1000-q1-16B and fanout-1000-q1-16B over tcp, tls
#          and ws.
# Certificates (a CA, an ECDSA P-256 and an RSA 2048 server certificate for IP 127.0.0.1)
# are made at run time with the openssl CLI; both brokers load the same files.
# rtd comes from RT_BUILD_DIR (default build/release); when it has no TLS or WebSocket
# listeners yet (a probe connection fails), its side of that transport is skipped with a
# message and Mosquitto's is still measured. Writes transports.md and transports.jsonl
# (raw rows) to --out (default docs/bench/issue15-transports); rows are copied there after
# every measurement. --brokers runs only some brokers; --merge adds the rows of an earlier
# run (e.g. the other broker's) to the report.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=3
ONLY='idle,hs,storm,cpu'
QUICK=0
BUILD=${RT_BUILD_DIR:-build/release}
OUT="$ROOT/docs/bench/issue15-transports"
MOSQ=/usr/sbin/mosquitto
BROKER_LIST=mosq,rtd
MERGE=''
RUN_TIMEOUT_S=300 # hard cap per rtbench run, beyond its own -d and deadlines

usage() {
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --only) ONLY=${2:?}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --mosquitto) MOSQ=${2:?}; shift 2 ;;
    --brokers) BROKER_LIST=${2:?}; shift 2 ;;
    --merge) MERGE=${2:?}; shift 2 ;;
    --help | -h) usage 0 ;;
    *) echo "transports.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
[[ "$ROUNDS" =~ ^[1-9]$ ]] || { echo "transports.sh: --rounds wants 1..9" >&2; exit 2; }
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
[[ "$OUT" = /* ]] || OUT="$PWD/$OUT"
RTBENCH="$BUILD/tools/rtbench/rtbench"
RTD="$BUILD/rtd"
[[ -x "$RTBENCH" ]] || { echo "transports.sh: $RTBENCH not built (see --build)" >&2; exit 2; }
[[ -x "$MOSQ" ]] || { echo "transports.sh: $MOSQ not found" >&2; exit 2; }
for tool in jq openssl /usr/bin/python3; do
    command -v "$tool" >/dev/null || { echo "transports.sh: $tool is missing" >&2; exit 2; }
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

# 19,000 connections need more than the default 1024 descriptors (hard limit here: 20,000).
ulimit -n "$(ulimit -Hn)"

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/rtb-transports.XXXXXX)
chmod 755 "$WORK" # Mosquitto started as root reads the certificates as user mosquitto
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
BROKER_PID=''
SAMPLER_PID=''
BG_PIDS=()

cleanup() {
    [[ -n "$SAMPLER_PID" ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    [[ -n "$BROKER_PID" ]] && kill "$BROKER_PID" 2>/dev/null || true
    local p
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

if ((QUICK)); then
    IDLE=2000; CELL=100; DUR=4; HS_D=3; STORM=400
else
    IDLE=19000; CELL=1000; DUR=10; HS_D=6; STORM=2000
fi
IFADDR=127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4

# ---- certificates -----------------------------------------------------------------------
C="$WORK/certs"
mkdir -p "$C"
(
    cd "$C"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
        -out ca.pem -days 2 -subj /CN=rtbench-ca
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >ext.cnf
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ec.key -out ec.csr \
        -subj /CN=127.0.0.1
    openssl req -newkey rsa:2048 -nodes -keyout rsa.key -out rsa.csr -subj /CN=127.0.0.1
    for k in ec rsa; do
        openssl x509 -req -in $k.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $k.pem \
            -days 2 -extfile ext.cnf
    done
    chmod 644 ./*.key
) >"$WORK/certs.log" 2>&1 || { cat "$WORK/certs.log" >&2; exit 1; }
mkdir -p "$WORK/empty_rules"

# ---- brokers ----------------------------------------------------------------------------
# A free port below the ephemeral range (32768-60999 here): rtbench's many connections
# leave TIME_WAIT sockets on ephemeral ports, where libwebsockets (Mosquitto's WebSocket
# listener) then fails to bind.
free_port() {
    /usr/bin/python3 -c '
import random, socket
for _ in range(200):
    p = random.randint(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    print(p)
    break
'
}

# Prints "rss_kb cpu_ticks" of a process.
proc_sample() {
    local pid=$1 rss cpu
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    cpu=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    echo "${rss:-0} ${cpu:-0}"
}

# start_broker rtd|mosq tcp|tls|ws|wss ec|rsa: sets BROKER_PID and PORT; returns 1 if the
# broker did not start listening (for rtd: the transport is not supported yet).
start_broker() {
    local b=$1 kind=$2 cert=$3 i
    PORT=$(free_port)
    if [[ $b == mosq ]]; then
        {
            echo "per_listener_settings false"
            echo "allow_anonymous true"
            echo "max_queued_messages 1000000"
            echo "max_inflight_messages 0"
            echo "set_tcp_nodelay true"
            echo "max_connections -1"
            # Mosquitto 2.0.11 exits ("Unable to start any listening sockets") when all
            # its listeners are WebSocket ones; an unused TCP listener keeps it up.
            [[ $kind == ws* ]] && echo "listener $(free_port) 127.0.0.1"
            echo "listener $PORT 127.0.0.1"
            [[ $kind == ws* ]] && echo "protocol websockets"
            if [[ $kind == tls || $kind == wss ]]; then
                echo "certfile $C/$cert.pem"
                echo "keyfile $C/$cert.key"
            fi
        } >"$WORK/mosq.conf"
        "$MOSQ" -c "$WORK/mosq.conf" >"$WORK/broker.log" 2>&1 &
    else
        local l="\"127.0.0.1:$PORT\"" tls=''
        [[ $kind == tls || $kind == wss ]] && tls="tls={cert=\"$C/$cert.pem\", key=\"$C/$cert.key\"}"
        case $kind in
        tls) l="{bind=\"127.0.0.1:$PORT\", $tls}" ;;
        ws) l="{bind=\"127.0.0.1:$PORT\", websocket=\"/mqtt\"}" ;;
        wss) l="{bind=\"127.0.0.1:$PORT\", websocket=\"/mqtt\", $tls}" ;;
        esac
        rm -rf "$WORK/data"
        "$RTD" -c "$ROOT/etc/rtd.conf" -o "listeners={$l}" -o persistence=false \
            -o "rules_dir=$WORK/empty_rules" -o "data_dir=$WORK/data" >"$WORK/broker.log" 2>&1 &
    fi
    BROKER_PID=$!
    for ((i = 0; i < 100; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
            sleep 0.5 # settle, so that the RSS baseline is the idle size
            return 0
        fi
        kill -0 "$BROKER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "transports.sh: $b ($kind) did not listen on $PORT:" >&2
    tail -5 "$WORK/broker.log" >&2
    stop_broker
    return 1
}

stop_broker() {
    [[ -n "$BROKER_PID" ]] || return 0
    kill "$BROKER_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do
        kill -0 "$BROKER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
    BROKER_PID=''
}

# rtbench flags for a transport.
xflags() {
    case $1 in
    tcp) echo "" ;;
    tls) echo "--tls --cafile $C/ca.pem" ;;
    ws) echo "--ws /mqtt" ;;
    wss) echo "--tls --cafile $C/ca.pem --ws /mqtt" ;;
    esac
}

# Whether rtd serves a transport: one client must connect (CONNACK) through it.
declare -A RTD_OK
probe_rtd() {
    local kind=$1
    RTD_OK[$kind]=0
    if [[ ! -x "$RTD" ]]; then
        echo "transports.sh: SKIP rtd $kind: $RTD not built"
        return
    fi
    start_broker rtd "$kind" ec || {
        echo "transports.sh: SKIP rtd $kind: rtd does not start with a $kind listener"
        return
    }
    # shellcheck disable=SC2046
    if timeout 20 "$RTBENCH" conn -c 1 -d 0.2 -p "$PORT" $(xflags "$kind") --json --quiet \
        --conn-timeout 3 >"$WORK/probe.json" 2>"$WORK/probe.err" &&
        [[ $(jq -r .connected "$WORK/probe.json") == 1 ]]; then
        RTD_OK[$kind]=1
    else
        echo "transports.sh: SKIP rtd $kind: no CONNACK over $kind ($(head -c 200 "$WORK/probe.err"))"
    fi
    stop_broker
}

# Samples the broker every 0.25 s into $WORK/samples until stopped (bounded).
start_sampler() {
    (
        for ((n = 0; n < RUN_TIMEOUT_S * 4; n++)); do
            echo "$EPOCHREALTIME $(proc_sample "$BROKER_PID")"
            sleep 0.25
        done
    ) >"$WORK/samples" &
    SAMPLER_PID=$!
}

stop_sampler() {
    kill "$SAMPLER_PID" 2>/dev/null || true
    wait "$SAMPLER_PID" 2>/dev/null || true
    SAMPLER_PID=''
}

# Prints "cpu_seconds seconds" of the broker over the run phase less 2 s at each end (as
# compare.sh's steady window), interpolated between samples; "0 0" when too short.
steady_cpu() {
    awk -v t0="$1" -v t1="$2" -v hz="$(getconf CLK_TCK)" -v m=2 '
        function at(t,    i) {
            for (i = 2; i <= n; i++)
                if (ts[i] >= t)
                    return cpu[i - 1] + (cpu[i] - cpu[i - 1]) * (t - ts[i - 1]) / (ts[i] - ts[i - 1])
            return -1
        }
        { n++; ts[n] = $1; cpu[n] = $3 }
        END {
            a = t0 + m; b = t1 - m
            if (t0 <= 0 || b - a < 2 || n < 2 || ts[1] > a) { print "0 0"; exit }
            ca = at(a); cb = at(b)
            if (ca < 0 || cb < 0) { print "0 0"; exit }
            printf "%.3f %.3f\n", (cb - ca) / hz, b - a
        }' "$WORK/samples"
}

# measure SECTION BROKER TRANSPORT ROUND EXTRA-JSON rtbench-args...: runs rtbench against
# the running broker under the sampler and appends one row to $RESULTS.
measure() {
    local section=$1 b=$2 kind=$3 round=$4 extra=$5
    shift 5
    local base cpu0 cpu1 hz rss_max steady
    read -r base cpu0 <<<"$(proc_sample "$BROKER_PID")"
    start_sampler
    # shellcheck disable=SC2046
    timeout "$RUN_TIMEOUT_S" "$RTBENCH" "$@" -p "$PORT" $(xflags "$kind") --json --quiet \
        >"$WORK/out.json" 2>"$WORK/err" || {
        echo "transports.sh: rtbench failed ($section $b $kind): $(head -c 300 "$WORK/err")" >&2
    }
    stop_sampler
    read -r _ cpu1 <<<"$(proc_sample "$BROKER_PID")"
    [[ -s "$WORK/out.json" ]] || return 0
    hz=$(getconf CLK_TCK)
    rss_max=$(awk 'BEGIN {m = 0} {if ($2 > m) m = $2} END {print m}' "$WORK/samples")
    steady=$(steady_cpu "$(jq -r '.run_start_unix // 0' "$WORK/out.json")" \
        "$(jq -r '.run_end_unix // 0' "$WORK/out.json")")
    jq -c --arg s "$section" --arg b "$b" --arg k "$kind" --argjson r "$round" \
        --argjson base "$base" --argjson rss "$rss_max" \
        --argjson bcpu "$(awk -v a="$cpu0" -v b="$cpu1" -v hz="$hz" 'BEGIN {printf "%.3f", (b - a) / hz}')" \
        --argjson sc "${steady% *}" --argjson ss "${steady#* }" --argjson extra "$extra" \
        '{section: $s, broker: $b, transport: $k, round: $r, rss_base_kb: $base,
          rss_max_kb: $rss, broker_cpu: $bcpu, steady_cpu: $sc, steady_s: $ss} + $extra + .' \
        "$WORK/out.json" >>"$RESULTS"
    cp "$RESULTS" "$OUT/transports.jsonl"
    jq -r '"  \(.section) \(.broker) \(.transport) r\(.round) \(.cell // "") conn=\(.connected) fail=\(.failed) recv=\(.received) hs/s=\(.hs_rate // 0) broker_cpu=\(.broker_cpu)s rtbench_cpu=\(.cpu_seconds)s rss_max=\(.rss_max_kb)KB"' \
        <<<"$(tail -1 "$RESULTS")"
}

IFS=, read -r -a BROKERS <<<"$BROKER_LIST"
declare -A STORM_S # seconds a storm took per broker, from its first (unmeasured) run
echo "transports.sh: rtbench=$RTBENCH rtd=$RTD quick=$QUICK rounds=$ROUNDS only=$ONLY"
for k in tcp tls ws; do probe_rtd "$k"; done
# Prints the brokers that serve a transport.
brokers_for() {
    local b
    for b in "${BROKERS[@]}"; do
        [[ $b == rtd && ${RTD_OK[$1]:-0} != 1 ]] && continue
        echo "$b"
    done
}

# ---- idle memory --------------------------------------------------------------------------
if want idle; then
    echo "== idle: $IDLE connections"
    for ((round = 1; round <= ROUNDS; round++)); do
        for kind in tcp tls ws; do
            for b in $(brokers_for "$kind"); do
                start_broker "$b" "$kind" ec || continue
                measure idle "$b" "$kind" "$round" '{"cert":"ec"}' \
                    conn -c "$IDLE" -i 0 --procs 2 -d 5 --ifaddr "$IFADDR" --conn-timeout 30
                stop_broker
            done
        done
    done
fi

# ---- handshakes ---------------------------------------------------------------------------
if want hs; then
    echo "== hs: TLS handshakes per second"
    for ((round = 1; round <= ROUNDS; round++)); do
        for cert in ec rsa; do
            for mode in full resumed; do
                for b in $(brokers_for tls); do
                    start_broker "$b" tls "$cert" || continue
                    resume=()
                    [[ $mode == resumed ]] && resume=(--tls-resume)
                    measure hs "$b" tls "$round" "{\"cert\":\"$cert\",\"mode\":\"$mode\"}" \
                        hs -c 32 --procs 2 -d "$HS_D" --ifaddr "$IFADDR" "${resume[@]}"
                    stop_broker
                done
            done
        done
    done
fi

# ---- handshake storm under a QoS 1 pair -----------------------------------------------------
if want storm; then
    echo "== storm: $STORM handshakes beside a QoS 1 pair at 500 msg/s"
    for ((round = 1; round <= ROUNDS; round++)); do
        for b in $(brokers_for tls); do
            start_broker "$b" tls ec || continue
            # Alone: the pair's own PUBACK latency.
            measure storm "$b" tls "$round" '{"cert":"ec","phase":"alone"}' \
                pairs -c 1 -q 1 -s 64 --rate 500 -d 5
            # In the storm: the storm runs first; the pair starts 0.1 s later for a run that
            # the storm should outlast (sized from the rate of a first, unmeasured storm).
            if [[ -z "${STORM_S[$b]:-}" ]]; then
                # shellcheck disable=SC2046
                timeout "$RUN_TIMEOUT_S" "$RTBENCH" hs -c 20 -L $((STORM / 20)) -d 60 -p "$PORT" \
                    $(xflags tls) --json --quiet >"$WORK/cal.json" 2>/dev/null || true
                STORM_S[$b]=$(jq -r '.run_seconds // 2' "$WORK/cal.json" 2>/dev/null || echo 2)
            fi
            pair_s=$(awk -v s="${STORM_S[$b]}" 'BEGIN {d = s * 0.8 - 0.1; printf "%.1f", d < 1 ? 1 : d}')
            # shellcheck disable=SC2046
            timeout "$RUN_TIMEOUT_S" "$RTBENCH" hs -c 20 -L $((STORM / 20)) -d 60 -p "$PORT" \
                $(xflags tls) --json --quiet >"$WORK/storm.json" 2>"$WORK/storm.err" &
            STORM_PID=$!
            BG_PIDS+=("$STORM_PID")
            sleep 0.1
            measure storm "$b" tls "$round" "{\"cert\":\"ec\",\"phase\":\"storm\",\"pair_s\":$pair_s}" \
                pairs -c 1 -q 1 -s 64 --rate 500 -d "$pair_s"
            wait "$STORM_PID" || echo "transports.sh: storm rtbench failed: $(head -c 200 "$WORK/storm.err")" >&2
            BG_PIDS=()
            if [[ -s "$WORK/storm.json" ]]; then
                jq -c --arg b "$b" --argjson r "$round" \
                    '{section: "storm", broker: $b, transport: "tls", round: $r, phase: "storm-hs",
                      connected, failed, hs_full, hs_rate, run_start_unix, run_end_unix,
                      cpu_seconds}' "$WORK/storm.json" >>"$RESULTS"
            fi
            stop_broker
        done
    done
fi

# ---- CPU per million delivered ------------------------------------------------------------
if want cpu; then
    echo "== cpu: broker CPU per million delivered"
    CELLS=("pairs-$CELL-q1-16B|pairs -c $CELL -q 1 -s 16 -d $DUR --ifaddr $IFADDR"
        "fanout-$CELL-q1-16B|fanout -c $CELL -q 1 -s 16 -d $DUR --ifaddr $IFADDR")
    for ((round = 1; round <= ROUNDS; round++)); do
        for c in "${CELLS[@]}"; do
            for kind in tcp tls ws; do
                for b in $(brokers_for "$kind"); do
                    start_broker "$b" "$kind" ec || continue
                    # shellcheck disable=SC2086
                    measure cpu "$b" "$kind" "$round" "{\"cell\":\"${c%%|*}\"}" ${c#*|}
                    stop_broker
                done
            done
        done
    done
fi

cp "$RESULTS" "$OUT/transports.jsonl"
[[ -n "$MERGE" ]] && cat "$MERGE" >>"$OUT/transports.jsonl"
/usr/bin/python3 "$ROOT/tests/bench/transports_report.py" "$OUT/transports.jsonl" \
    "$OUT/transports.md" "$ROUNDS" "$QUICK"
echo "transports.sh: wrote $OUT/transports.md and transports.jsonl"
