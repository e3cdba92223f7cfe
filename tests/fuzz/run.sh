#!/usr/bin/env bash
# Replays every fuzz target's seed corpus and past crash inputs (ctest -L fuzz), then fuzzes
# each target for SECONDS. A crash, leak, sanitizer report or timeout fails the run; the input
# that did it is left as BUILD_DIR/crashes/<target>/crash-* (replay: BUILD_DIR/tests/fuzz/<target> FILE).
# New inputs go to a scratch corpus in the build dir: the checked-in seeds stay as they are.
#
# A libFuzzer process is one thread, so JOBS targets (default: one per core) fuzz at once,
# each for its full SECONDS on a core of its own: the same fuzzing per target as one after
# another, in 1/JOBS of the wall time. Each target's log is printed whole (in target order)
# when it fails.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS] [JOBS]}
seconds=${2:-20}
jobs=${3:-$(nproc)}
src=$(cd "$(dirname "$0")" && pwd)

(cd "$build" && ctest --output-on-failure -j"$jobs" -L fuzz)

fuzz_one() {
    local name=$1 seeds=$2
    local bin=$build/tests/fuzz/$name scratch=$build/corpus/$name crashes=$build/crashes/$name
    mkdir -p "$scratch" "$crashes"
    if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$scratch" "$seeds" >"$build/$name.log" 2>&1; then
        echo ok >"$build/$name.status"
    else
        echo failed >"$build/$name.status"
    fi
}

names=()
running=0
for seeds in "$src"/corpus/*/; do
    name=$(basename "$seeds")
    names+=("$name")
    rm -f "$build/$name.status"
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "fuzz: $name for ${seconds}s"
    fuzz_one "$name" "$seeds" &
    running=$((running + 1))
done
wait

status=0
for name in "${names[@]}"; do
    if [ "$(cat "$build/$name.status" 2>/dev/null)" != ok ]; then
        tail -n 60 "$build/$name.log"
        echo "fuzz: $name FAILED (input in $build/crashes/$name/, log $build/$name.log)"
        status=1
    fi
done
exit $status
