#!/usr/bin/env bash
# Replays every fuzz target's seed corpus and past crash inputs (ctest -L fuzz), then fuzzes
# each target for SECONDS. A crash, leak, sanitizer report or timeout fails the run; the input
# that did it is left as BUILD_DIR/crashes/<target>/crash-* (replay: BUILD_DIR/tests/fuzz/<target> FILE).
# New inputs go to a scratch corpus in the build dir: the checked-in seeds stay as they are.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS]}
seconds=${2:-20}
src=$(cd "$(dirname "$0")" && pwd)

(cd "$build" && ctest --output-on-failure -L fuzz)

status=0
for seeds in "$src"/corpus/*/; do
    name=$(basename "$seeds")
    bin=$build/tests/fuzz/$name
    scratch=$build/corpus/$name
    crashes=$build/crashes/$name
    mkdir -p "$scratch" "$crashes"
    echo "fuzz: $name for ${seconds}s"
    if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$scratch" "$seeds" >"$build/$name.log" 2>&1; then
        tail -n 60 "$build/$name.log"
        echo "fuzz: $name FAILED (input in $crashes/, log $build/$name.log)"
        status=1
    fi
done
exit $status
