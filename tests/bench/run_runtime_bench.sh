#!/bin/sh
# Runs bench_runtime (rt) and bench_runtime.erl (BEAM) side by side, alternating
# rt, BEAM, rt, BEAM, ... so that drift in the machine's load hits both alike,
# takes the median of each figure, and prints a markdown table of the ratios.
# A full run writes the table to docs/bench/runtime.md; a --quick run only prints
# it unless --out is given. Without erl, only rt runs, and the table says so.
#
# usage: tests/bench/run_runtime_bench.sh [--quick] [--runs N] [--schedulers N] [--out FILE]
# The binary is ${RT_BUILD_DIR:-build/release}/tests/bench/bench_runtime. The report names
# the source as `git describe --always --dirty`, or $RT_BENCH_SOURCE when that is set (for
# a binary built from an exported tree).
set -eu

cd "$(dirname "$0")/../.."
quick=
runs=3
sched=
out=docs/bench/runtime.md
out_given=
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=--quick ;;
    --runs) runs="$2"; shift ;;
    --schedulers) sched="--schedulers $2"; shift ;;
    --out) out="$2"; out_given=1; shift ;;
    *) echo "usage: $0 [--quick] [--runs N] [--schedulers N] [--out FILE]" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$quick" ] && [ -z "$out_given" ] && out=

bin="${RT_BUILD_DIR:-build/release}/tests/bench/bench_runtime"
if [ ! -x "$bin" ]; then
    echo "$bin not found; build it first, e.g." >&2
    echo "  cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release &&" \
         "cmake --build build/release --target bench_runtime" >&2
    exit 1
fi
erl_note=
if ! command -v erl >/dev/null 2>&1 || ! command -v escript >/dev/null 2>&1; then
    erl_note="erl is not installed (Debian: erlang-base): BEAM was not measured."
    echo "$erl_note" >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Other work on the machine distorts both sides (preemption shows up as GC pauses), so the
# load average goes into the report.
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
i=1
while [ "$i" -le "$runs" ]; do
    echo "run $i/$runs: rt" >&2
    # shellcheck disable=SC2086 # $quick and $sched are deliberately split
    "$bin" $quick $sched --json >"$tmp/rt.$i.json"
    if [ -z "$erl_note" ]; then
        echo "run $i/$runs: BEAM" >&2
        # shellcheck disable=SC2086
        escript tests/bench/bench_runtime.erl $quick $sched --json >"$tmp/beam.$i.json"
    fi
    i=$((i + 1))
done

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
source="${RT_BENCH_SOURCE:-$(git describe --always --dirty 2>/dev/null || echo 'not a git checkout')}"
cmd="tests/bench/run_runtime_bench.sh${quick:+ $quick}${sched:+ $sched}"
cmd="$cmd\` (runs=$runs, binary $bin, source $source)"
table=$(/usr/bin/python3 - "$tmp" "$runs" "$cmd" "$erl_note" "$load_before" "$load_after" <<'EOF'
import json, os, statistics, sys, time

tmp, runs, cmd, erl_note = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
load_before, load_after = sys.argv[5], sys.argv[6]
def load(kind):
    out = []
    for i in range(1, runs + 1):
        p = os.path.join(tmp, f"{kind}.{i}.json")
        if os.path.exists(p):
            with open(p) as f:
                out.append(json.load(f))
    return out

rt, beam = load("rt"), load("beam")
rows = [
    ("spawn_per_s", "spawns/s, one spawner", 0, "higher"),
    ("bytes_per_idle_actor", "bytes per idle actor", 1, "lower"),
    ("ring_hops_per_s", "ring hops/s, 1 token", 0, "higher"),
    ("ring_parallel_msgs_per_s", "ring msgs/s, 1,000 tokens", 0, "higher"),
    ("gc_pause_p50_us", "GC pause p50 (us), 1 MB live", 0, "lower"),
    ("gc_pause_p99_us", "GC pause p99 (us), 1 MB live", 0, "lower"),
    ("gc_pause_max_us", "GC pause max (us), 1 MB live", 0, "lower"),
]
def med(runs, key):
    return statistics.median(r[key] for r in runs) if runs else None
def fmt(v, digits):
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}"

cpu = "?"
try:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
except OSError:
    pass
lines = []
lines.append(f"Command: `{cmd}  ")
lines.append(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"{os.cpu_count()} CPUs ({cpu}); rt schedulers: {rt[0]['schedulers']}; "
             + (f"BEAM: OTP {beam[0].get('otp', '?')}, {beam[0]['schedulers']} schedulers; "
                if beam else "")
             + f"{rt[0]['actors']:,} idle actors, {rt[0]['hops']:,} ring hops, "
             f"{rt[0]['gc_pauses']} GC pauses per run.  ")
lines.append(f"Medians of {runs} runs per side, run alternately (rt, BEAM, rt, BEAM, ...). "
             f"Load average before: {load_before}; after: {load_after}.")
if erl_note:
    lines.append("")
    lines.append(f"**{erl_note}**")
lines.append("")
lines.append("| metric | rt | BEAM | rt/BEAM |")
lines.append("|---|---:|---:|---:|")
for key, label, digits, better in rows:
    a, b = med(rt, key), med(beam, key)
    ratio = f"{a / b:.2f}x" if a is not None and b else "n/a"
    lines.append(f"| {label} (`{key}`, {better} is better) | {fmt(a, digits)} | "
                 f"{fmt(b, digits)} | {ratio} |")
lines.append("")
targets = [
    ("bytes_per_idle_actor", lambda v, b: v <= 512, "<= 512 B per idle actor"),
    ("spawn_per_s", lambda v, b: v >= 1e6, ">= 1M spawns/s"),
    ("ring_hops_per_s", lambda v, b: b is not None and v >= 3 * b, ">= 3x BEAM, ring 1 token"),
    ("ring_parallel_msgs_per_s", lambda v, b: b is not None and v >= 3 * b,
     ">= 3x BEAM, ring 1,000 tokens"),
    ("gc_pause_p99_us", lambda v, b: v <= 1000, "GC pause p99 <= 1 ms at 1 MB live"),
]
lines.append("Targets (issue 2): " + "; ".join(
    f"{name}: {'met' if ok(med(rt, key), med(beam, key)) else 'MISSED'}"
    for key, ok, name in targets) + ".")
lines.append("")
lines.append("Raw runs (JSON, in order):")
lines.append("")
for i in range(runs):
    if i < len(rt):
        lines.append(f"    rt   {json.dumps(rt[i])}")
    if i < len(beam):
        lines.append(f"    BEAM {json.dumps(beam[i])}")
print("\n".join(lines))
EOF
)

echo "$table"
if [ -n "$out" ]; then
    mkdir -p "$(dirname "$out")"
    {
        echo "# Runtime vs BEAM"
        echo
        echo "Written by tests/bench/run_runtime_bench.sh; definitions of every figure are at"
        echo "the top of tests/bench/bench_runtime.c and tests/bench/bench_runtime.erl."
        echo
        echo "$table"
    } >"$out"
    echo "written to $out" >&2
fi
