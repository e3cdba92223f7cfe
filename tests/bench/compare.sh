#!/usr/bin/env bash
# compare.sh: runs a fixed MQTT benchmark matrix with rtbench against one to three brokers
# and writes a markdown table and PNG charts under docs/bench/.
#
#   tests/bench/compare.sh [--a CMD] [--b CMD] [--c CMD] [--quick] [--rounds N] [--build DIR]
#                          [--out DIR] [--only CASE-PREFIX[,PREFIX...]] [--from-tsv FILE]
#
# --from-tsv skips the runs and re-renders the table and charts from the raw rows
# (compare.tsv) of an earlier run.
# CMD is a broker command line; {port} is replaced by a free loopback port, {conf} by the
# path of a Mosquitto config written for that port (listener, anonymous access, big queues,
# TCP_NODELAY, unlimited connections) and {flashmq_conf} by a FlashMQ config for it
# (listener, anonymous access, everything else FlashMQ's default). The default A is
# Debian's Mosquitto; B and C are optional (ratios are B/A and B/C: B is the broker under
# test). Each case starts a fresh broker, and the brokers alternate A/B/C/A/B/C per case
# (--rounds rounds, default 2) so that drift on the machine hits all alike.
#
# Per case the script samples the broker's /proc/PID (VmRSS, utime+stime) and reports
# broker CPU-seconds per million delivered messages: with client and broker sharing two
# cores, throughput alone mostly measures how the cores were split.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
A_CMD='/usr/sbin/mosquitto -c {conf}'
B_CMD=''
C_CMD=''
QUICK=0
ROUNDS=2
BUILD=${RT_BUILD_DIR:-build/release}
OUT="$ROOT/docs/bench"
ONLY=''
FROM_TSV=''
CASE_TIMEOUT_S=300 # hard cap per rtbench run, beyond its own -d and deadlines

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
    --a) A_CMD=${2:?--a needs a command}; shift 2 ;;
    --b) B_CMD=${2:?--b needs a command}; shift 2 ;;
    --c) C_CMD=${2:?--c needs a command}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --only) ONLY=${2:?}; shift 2 ;;
    --from-tsv) FROM_TSV=${2:?}; shift 2 ;;
    --help | -h) usage 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
[[ "$ROUNDS" =~ ^[1-9][0-9]?$ ]] || { echo "compare.sh: --rounds wants 1..99" >&2; exit 2; }
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
RTBENCH="$BUILD/tools/rtbench/rtbench"
[[ -n "$FROM_TSV" || -x "$RTBENCH" ]] || {
    echo "compare.sh: $RTBENCH not built (see --build)" >&2
    exit 2
}
for tool in gnuplot jq /usr/bin/python3; do
    command -v "$tool" >/dev/null || { echo "compare.sh: $tool is missing" >&2; exit 2; }
done

# Both the brokers and rtbench need more than the default 1024 descriptors.
ulimit -n "$(ulimit -Hn)"

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/rtb-compare.XXXXXX)
RESULTS="$WORK/results.tsv"
if [[ -n "$FROM_TSV" ]]; then
    cp "$FROM_TSV" "$RESULTS"
else
    : >"$RESULTS"
fi
BROKER_PID=''
SAMPLER_PID=''

cleanup() {
    [[ -n "$SAMPLER_PID" ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    [[ -n "$BROKER_PID" ]] && kill "$BROKER_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if ((QUICK)); then
    DUR=3; IDLE=2000; FANIN=20; FANOUT=100; PAIRS=100; SEED=2000
else
    DUR=10; IDLE=19000; FANIN=100; FANOUT=1000; PAIRS=1000; SEED=19000
fi

# Spreading clients over source addresses keeps the kernel's ephemeral-port search short
# (and is what lets a client exceed ~28K connections per address).
IFADDR=127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4
# name|rtbench arguments. Load cases run closed loop (rtbench's default for scenarios).
# The idle case needs two processes: one may hold at most 20,000 descriptors here.
CASES=("idle-$IDLE|conn -c $IDLE -i 0 --procs 2 -d 5 --ifaddr $IFADDR")
# The emqttd seed's shape at rest: every client holds one QoS 1 subscription on test/%i.
CASES+=("idle-sub-$IDLE|sub -c $IDLE -i 0 -t test/%i -q 1 --procs 2 -d 5 --ifaddr $IFADDR")
for qos in 0 1; do
    for size in 16 1024; do
        CASES+=("fanin-$FANIN-q$qos-${size}B|fanin -c $FANIN -q $qos -s $size -d $DUR --ifaddr $IFADDR")
        CASES+=("fanout-$FANOUT-q$qos-${size}B|fanout -c $FANOUT -q $qos -s $size -d $DUR --ifaddr $IFADDR")
        CASES+=("pairs-$PAIRS-q$qos-${size}B|pairs -c $PAIRS -q $qos -s $size -d $DUR --ifaddr $IFADDR")
    done
done
# Fan-in at QoS 1/2 with a small publisher window over two processes: the subscriber acks
# once per read, so what this measures is whether the broker's outbound window covers
# everything the publishers keep in flight (100 x 5) between two of its reads.
for qos in 1 2; do
    for size in 16 1024; do
        CASES+=("fanin-$FANIN-w5-q$qos-${size}B|fanin -c $FANIN -q $qos -s $size --window 5 --procs 2 -d $DUR --ifaddr $IFADDR")
    done
done
# The emqttd seed shape, open loop: SEED subscribers on test/%i, 40 publishers, 4,000 QoS 1
# msg/s in total; what it measures is latency at a fixed rate, not peak throughput.
CASES+=("seed-$SEED-q1|seed --subs $SEED -q 1 -d $((DUR * 2)) --procs 2 --ifaddr $IFADDR")

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Prints "rss_kb cpu_ticks" of a process.
proc_sample() {
    local pid=$1 rss cpu
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    cpu=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    echo "${rss:-0} ${cpu:-0}"
}

start_broker() {
    local cmd=$1 port conf
    port=$(free_port)
    conf="$WORK/broker-$port.conf"
    cat >"$conf" <<EOF
listener $port 127.0.0.1
allow_anonymous true
max_queued_messages 1000000
max_inflight_messages 0
set_tcp_nodelay true
max_connections -1
EOF
    cat >"$WORK/flashmq-$port.conf" <<EOF
listen {
    protocol mqtt
    port $port
    inet4_bind_address 127.0.0.1
}
allow_anonymous true
EOF
    cmd=${cmd//\{port\}/$port}
    cmd=${cmd//\{conf\}/$conf}
    cmd=${cmd//\{flashmq_conf\}/$WORK/flashmq-$port.conf}
    bash -c "exec $cmd" >"$WORK/broker.log" 2>&1 &
    BROKER_PID=$!
    BROKER_PORT=$port
    local i
    for ((i = 0; i < 100; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        kill -0 "$BROKER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "compare.sh: broker '$cmd' did not listen on $port:" >&2
    cat "$WORK/broker.log" >&2
    exit 1
}

stop_broker() {
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

# Prints "cpu_seconds seconds": the broker's CPU over the steady part of the run phase (its
# first and last STEADY_MARGIN_S cut off: no connects, no ramp, no drain), interpolated
# between the sampler's readings; "0 0" when the run was too short or not timed.
STEADY_MARGIN_S=2
steady_cpu() {
    awk -v t0="$1" -v t1="$2" -v hz="$3" -v m="$STEADY_MARGIN_S" '
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

# Runs one case against the running broker and appends a row to $RESULTS.
run_case() {
    local label=$1 round=$2 name=$3 args=$4
    local base cpu0 rss_max=0 line
    read -r base cpu0 <<<"$(proc_sample "$BROKER_PID")"
    (
        # Bounded: the sampler dies with the case (killed below) or after CASE_TIMEOUT_S.
        for ((n = 0; n < CASE_TIMEOUT_S * 4; n++)); do
            echo "$EPOCHREALTIME $(proc_sample "$BROKER_PID")"
            sleep 0.25
        done
    ) >"$WORK/samples" &
    SAMPLER_PID=$!
    # shellcheck disable=SC2086
    timeout "$CASE_TIMEOUT_S" "$RTBENCH" $args -p "$BROKER_PORT" --json --quiet \
        >"$WORK/out.json" 2>"$WORK/err" || {
        echo "compare.sh: rtbench failed in $name:" >&2
        cat "$WORK/err" >&2
    }
    kill "$SAMPLER_PID" 2>/dev/null || true
    wait "$SAMPLER_PID" 2>/dev/null || true
    SAMPLER_PID=''
    local cpu1
    read -r _ cpu1 <<<"$(proc_sample "$BROKER_PID")"
    rss_max=$(awk 'BEGIN {m = 0} {if ($2 > m) m = $2} END {print m}' "$WORK/samples")
    local hz steady
    hz=$(getconf CLK_TCK)
    [[ -s "$WORK/out.json" ]] || return 0
    steady=$(steady_cpu "$(jq -r '.run_start_unix // 0' "$WORK/out.json")" \
        "$(jq -r '.run_end_unix // 0' "$WORK/out.json")" "$hz")
    line=$(jq -r --arg b "$label" --arg r "$round" --arg n "$name" \
        --arg base "$base" --arg rss "$rss_max" --arg cpu "$(((cpu1 - cpu0)))" --arg hz "$hz" \
        --arg steady_cpu "${steady% *}" --arg steady_s "${steady#* }" \
        '[$b, $r, $n, .connected, .failed, .connect_rate, .sent, .received, .expected // 0,
          .missing, .duplicates, .recv_rate, .e2e.p50_ms, .e2e.p99_ms, .cpu_seconds,
          $base, $rss, (($cpu | tonumber) / ($hz | tonumber)), $steady_cpu, $steady_s] | @tsv' \
        "$WORK/out.json")
    echo "$line" >>"$RESULTS"
    echo "$line" | awk -F'\t' '{printf "  %-4s r%s %-24s conn=%s fail=%s recv=%s recv/s=%.0f missing=%s p99=%.2fms broker_cpu=%.2fs rtbench_cpu=%.2fs rss_max=%sKB\n", $1, $2, $3, $4, $5, $8, $12, $10, $14, $18, $15, $17}'
}

BROKERS=("A|$A_CMD")
[[ -n "$B_CMD" ]] && BROKERS+=("B|$B_CMD")
[[ -n "$C_CMD" ]] && BROKERS+=("C|$C_CMD")
echo "compare.sh: rtbench=$RTBENCH quick=$QUICK rounds=$ROUNDS"
for b in "${BROKERS[@]}"; do echo "  ${b%%|*}: ${b#*|}"; done

for c in "${CASES[@]}"; do
    [[ -n "$FROM_TSV" ]] && break
    name=${c%%|*}
    args=${c#*|}
    if [[ -n "$ONLY" ]]; then
        wanted=0
        IFS=, read -ra prefixes <<<"$ONLY"
        for p in "${prefixes[@]}"; do [[ "$name" == "$p"* ]] && wanted=1; done
        ((wanted)) || continue
    fi
    echo "case $name: rtbench $args"
    for ((round = 1; round <= ROUNDS; round++)); do
        for b in "${BROKERS[@]}"; do
            start_broker "${b#*|}"
            sleep 0.5 # let the broker settle so the RSS baseline is its idle size
            run_case "${b%%|*}" "$round" "$name" "$args"
            stop_broker
        done
    done
done

/usr/bin/python3 - "$RESULTS" "$OUT" "$QUICK" "$ROUNDS" "$A_CMD" "$B_CMD" "$C_CMD" <<'PY'
import os, statistics, subprocess, sys, time

results, out, quick, rounds, a_cmd, b_cmd, c_cmd = sys.argv[1:8]
cols = ["broker", "round", "case", "connected", "failed", "connect_rate", "sent", "received",
        "expected", "missing", "dups", "recv_rate", "p50", "p99", "rtb_cpu", "rss_base",
        "rss_max", "broker_cpu", "steady_cpu", "steady_s"]
rows = []
for line in open(results):
    f = line.rstrip("\n").split("\t")
    if len(f) == len(cols) - 2:
        f += ["0", "0"]  # rows written before the steady window was measured
    if len(f) != len(cols):
        continue
    r = dict(zip(cols, f))
    for k in cols[3:]:
        r[k] = float(r[k]) if r[k] not in ("", "null") else 0.0
    rows.append(r)

cases = []
for r in rows:
    if r["case"] not in cases:
        cases.append(r["case"])
brokers = [b for b in ("A", "B", "C") if any(r["broker"] == b for r in rows)]

def med(case, broker, fn):
    vals = [fn(r) for r in rows if r["case"] == case and r["broker"] == broker]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

def per_m(cpu, n):
    return cpu / (n / 1e6) if n else None

def steady_per_m(r):
    # Broker CPU over the steady window per million messages delivered at the run's rate.
    n = r["recv_rate"] * r["steady_s"]
    return r["steady_cpu"] / (n / 1e6) if r["steady_s"] and n else None

def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"

md = []
mode = "quick" if quick == "1" else "full"
md.append(f"# Broker comparison ({mode} matrix, median of {rounds} round(s))\n")
md.append(f"Generated by `tests/bench/compare.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n")
md.append(f"- A: `{a_cmd}`")
if b_cmd:
    md.append(f"- B: `{b_cmd}`")
if c_cmd:
    md.append(f"- C: `{c_cmd}`")
md.append("")
md.append("## Idle connections\n")
md.append("| case | broker | connected | failed | connect rate /s | broker RSS base KB | RSS max KB | bytes per connection |")
md.append("|---|---|---|---|---|---|---|---|")
idle = [c for c in cases if c.startswith("idle")]
for c in idle:
    for b in brokers:
        conn = med(c, b, lambda r: r["connected"])
        bpc = med(c, b, lambda r: (r["rss_max"] - r["rss_base"]) * 1024 / r["connected"] if r["connected"] else None)
        md.append(f"| {c} | {b} | {fmt(conn,0)} | {fmt(med(c,b,lambda r:r['failed']),0)} | "
                  f"{fmt(med(c,b,lambda r:r['connect_rate']),0)} | {fmt(med(c,b,lambda r:r['rss_base']),0)} | "
                  f"{fmt(med(c,b,lambda r:r['rss_max']),0)} | {fmt(bpc,0)} |")
md.append("")
md.append("## Load cases (closed loop)\n")
md.append("Broker CPU is utime+stime of the broker process over the whole case (connect, run, "
          "drain, disconnect), from /proc/PID/stat; per million delivered messages. Steady CPU "
          "is the same over the run phase less its first and last 2 s (no connects, no drain), "
          "per million messages at the delivered rate: the figure for open-loop cases such as "
          "seed, whose connects would otherwise dominate.\n")
hdr = "| case | broker | delivered /s | missing | dups | e2e p50 ms | e2e p99 ms | broker CPU s/M | steady CPU s/M | rtbench CPU s/M | broker RSS max KB |"
md.append(hdr)
md.append("|---|---|---|---|---|---|---|---|---|---|---|")
load = [c for c in cases if not c.startswith("idle")]
for c in load:
    for b in brokers:
        md.append(f"| {c} | {b} | {fmt(med(c,b,lambda r:r['recv_rate']),0)} | "
                  f"{fmt(med(c,b,lambda r:r['missing']),0)} | {fmt(med(c,b,lambda r:r['dups']),0)} | "
                  f"{fmt(med(c,b,lambda r:r['p50']),2)} | {fmt(med(c,b,lambda r:r['p99']),2)} | "
                  f"{fmt(med(c,b,lambda r:per_m(r['broker_cpu'], r['received'])),2)} | "
                  f"{fmt(med(c,b,steady_per_m),2)} | "
                  f"{fmt(med(c,b,lambda r:per_m(r['rtb_cpu'], r['received'])),2)} | "
                  f"{fmt(med(c,b,lambda r:r['rss_max']),0)} |")
for base in [b for b in ("A", "C") if "B" in brokers and b in brokers]:
    md.append(f"\n## Ratios B/{base}\n")
    md.append("| case | delivered /s | broker CPU s/M | steady CPU s/M | e2e p99 | RSS max / bytes per conn |")
    md.append("|---|---|---|---|---|---|")
    for c in cases:
        def ratio(fn):
            a, b = med(c, base, fn), med(c, "B", fn)
            return f"{b / a:.2f}" if a and b is not None else "-"
        if c.startswith("idle"):
            md.append(f"| {c} | - | - | - | - | {ratio(lambda r: (r['rss_max'] - r['rss_base']) / r['connected'] if r['connected'] else None)} |")
        else:
            md.append(f"| {c} | {ratio(lambda r: r['recv_rate'])} | "
                      f"{ratio(lambda r: per_m(r['broker_cpu'], r['received']))} | "
                      f"{ratio(steady_per_m)} | "
                      f"{ratio(lambda r: r['p99'])} | {ratio(lambda r: r['rss_max'])} |")
md.append("\n![delivered per second](compare-throughput.png)\n")
md.append("![broker CPU per million](compare-cpu.png)\n")
with open(os.path.join(out, "compare.md"), "w") as f:
    f.write("\n".join(md) + "\n")
print("\n".join(md))

# Charts: one clustered bar per load case and broker.
dat = os.path.join(out, "compare.tmp")
with open(dat, "w") as f:
    for c in load:
        vals = []
        for b in brokers:
            vals.append(fmt(med(c, b, lambda r: r["recv_rate"]), 1).replace(",", ""))
            vals.append(fmt(med(c, b, lambda r: per_m(r["broker_cpu"], r["received"])), 3).replace(",", ""))
        f.write(f"{c} " + " ".join(v if v != "-" else "0" for v in vals) + "\n")
if load:
    plot = f"""
set terminal png size 1200,600 noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -35
set grid ytics
set yrange [0:*]
set bmargin 8
set rmargin 12
set key top right
set output '{out}/compare-throughput.png'
set title 'Delivered messages per second (higher is better)'
plot {", ".join(f"'{dat}' using {2 + 2 * i}{':xtic(1)' if i == 0 else ''} title '{b}'" for i, b in enumerate(brokers))}
set output '{out}/compare-cpu.png'
set title 'Broker CPU seconds per million delivered messages (lower is better)'
plot {", ".join(f"'{dat}' using {3 + 2 * i}{':xtic(1)' if i == 0 else ''} title '{b}'" for i, b in enumerate(brokers))}
"""
    subprocess.run(["gnuplot"], input=plot, text=True, check=True)
os.unlink(dat)
PY
cp "$RESULTS" "$OUT/compare.tsv"
echo "compare.sh: wrote $OUT/compare.md, compare.tsv (raw rows) and charts"
