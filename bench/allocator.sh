#!/usr/bin/env bash
# The allocator model's commands against the report on the 1 GB files: `replay` (the goal is
# at most 1.5x the report) and one `whatif` (which runs the exact replay, the identity replay
# and the what-if replay, the last two side by side). Runs alternate; medians of wall time and
# the largest peak RSS are printed.
#
#   bench/allocator.sh [DATA_DIR]      (default bench/data; RUNS=5)
#
# Files: notHanmin x280 (replicate_trace.py, about 1 GB of real-shaped trace) and snapgen train
# --scale 1000 (about 1 GB, a trace the model places exactly). The replicated file repeats one
# run's trace at shifted addresses, so the model, which sees every copy's free blocks, places
# most of its allocs elsewhere than the copies did: that file measures the diverging path.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-bench/data}
RUNS=${RUNS:-5}
TOOLS=${TOOLS:-../shared/tools}
mkdir -p "$DATA"
cargo build --release --quiet
BIN=target/release/snapscan
big=$DATA/notHanmin-x280.pickle
[ -f "$big" ] || python3 "$TOOLS/replicate_trace.py" \
    fixtures/real/notHanmin__assignment2-systems__memory_snapshot.pickle 280 "$big"
sg=$DATA/snapgen-train-1000.pickle
[ -f "$sg" ] || python3 "$TOOLS/snapgen.py" --scenario train --seed 7 --scale 1000 --out "$sg" >/dev/null

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for f in "$big" "$sg"; do
    declare -A wall=() rss=()
    for run in $(seq "$RUNS"); do
        for cmd in report replay whatif; do
            args=("$cmd")
            [ "$cmd" = whatif ] && args+=(--set expandable_segments:True)
            out=$( { /usr/bin/time -f "%e %M" "$BIN" "${args[@]}" "$f" >/dev/null; } 2>&1 | tail -1)
            wall[$cmd]+="${out% *} "
            rss[$cmd]+="${out#* } "
        done
    done
    echo "$(basename "$f") ($RUNS runs each, alternating):"
    base=$(echo "${wall[report]}" | tr ' ' '\n' | grep . | median)
    for cmd in report replay whatif; do
        w=$(echo "${wall[$cmd]}" | tr ' ' '\n' | grep . | median)
        m=$(echo "${rss[$cmd]}" | tr ' ' '\n' | grep . | sort -n | tail -1)
        printf '  %-7s median %6.2f s  (%.2fx the report)  peak RSS %d MB\n' \
            "$cmd" "$w" "$(echo "$w / $base" | bc -l)" "$((m / 1024))"
    done
    unset wall rss
done
