#!/usr/bin/env bash
# Benchmark: snapscan against Python's pickle.load, the PyPI peers and serde-pickle on snapgen
# `train` snapshots of ~10 MB, ~100 MB and ~1 GB (fixed seed; generated once, not committed).
#
#   bench/run.sh [DATA_DIR]          (default: bench/data, git-ignored)
#
# Environment: SIZES (snapgen --scale values, default "10 100 1000"), RUNS (hyperfine runs per
# command, default 5), TIMEOUT (seconds for one run of a peer before it is recorded as not
# finishing, default 900), PEERS=0 to skip the PyPI peers, SETTLE (seconds of rest before the
# timed runs of each size, default 30).
#
# Needs: cargo, python3 (with venv), hyperfine, GNU time (/usr/bin/time). Writes, per size,
# DATA_DIR/results/train<scale>.json (hyperfine) and .rss (peak RSS from /usr/bin/time -v), the
# peaks each tool prints (peaks.txt), and the table and the speed targets
# (summary.md, by bench/summarize.py).
set -euo pipefail

cd "$(dirname "$0")/.."
DATA=${1:-bench/data}
SIZES=${SIZES:-"10 100 1000"}
RUNS=${RUNS:-5}
TIMEOUT=${TIMEOUT:-900}
PEERS=${PEERS:-1}
SETTLE=${SETTLE:-30}
mkdir -p "$DATA/results"
DATA=$(cd "$DATA" && pwd)
OUT=$DATA/results

for tool in hyperfine /usr/bin/time python3 cargo; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is missing" >&2; exit 2; }
done

# --- build -----------------------------------------------------------------------------------
cargo build --release --quiet
cargo build --release --quiet --features bench --example serde_pickle_decode
TARGET=${CARGO_TARGET_DIR:-target}
SNAPSCAN=$(cd "$TARGET/release" && pwd)/snapscan
SERDE=$(cd "$TARGET/release/examples" && pwd)/serde_pickle_decode

# --- machine ---------------------------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpus: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "kernel: $(uname -r)"
    echo "snapscan: $("$SNAPSCAN" --version)"
    echo "python: $(python3 --version 2>&1)"
    echo "hyperfine: $(hyperfine --version)"
} | tee "$OUT/machine.txt"

# --- data ------------------------------------------------------------------------------------
for s in $SIZES; do
    f=$DATA/train$s.pickle
    if [ ! -f "$f" ]; then
        echo "bench: generating $f"
        python3 scripts/snapgen.py --scenario train --seed 7 --scale "$s" --out "$f.part"
        mv "$f.part" "$f"
    fi
done

# --- peers -----------------------------------------------------------------------------------
VENV=$DATA/venv
NOTES=$OUT/notes.txt
: >"$NOTES"
if [ "$PEERS" = 1 ]; then
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    for pkg in pt-snap-cli ptmem; do
        if ! (cd "$DATA" && "$VENV/bin/pip" download --quiet --no-deps -d "$DATA/wheels" "$pkg"); then
            echo "$pkg: not found on PyPI (pip download failed)" >>"$NOTES"
        elif ! "$VENV/bin/pip" install --quiet "$pkg"; then
            echo "$pkg: pip install failed" >>"$NOTES"
        fi
    done
fi
# PyTorch's own CLI, `python -m torch.cuda._memory_viz stats`: with torch when it imports; else
# the same module file taken from the torch wheel on PyPI (its `stats` path uses only the
# standard library: pickle.load, then a summary of the segments), run as a script.
MEMVIZ=()
if python3 -c "import torch" 2>/dev/null; then
    MEMVIZ=(python3 -m torch.cuda._memory_viz)
    echo "memory_viz: python3 -m torch.cuda._memory_viz (torch $(python3 -c 'import torch; print(torch.__version__)'))" >>"$NOTES"
elif [ "$PEERS" = 1 ]; then
    mkdir -p "$DATA/wheels" "$DATA/memviz"
    if [ ! -f "$DATA/memviz/_memory_viz.py" ] &&
        (cd "$DATA" && pip download --quiet --no-deps -d "$DATA/wheels" torch); then
        wheel=$(ls "$DATA"/wheels/torch-*.whl | head -1)
        python3 - "$wheel" "$DATA/memviz/_memory_viz.py" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    open(sys.argv[2], "wb").write(z.read("torch/cuda/_memory_viz.py"))
PY
        basename "$wheel" >"$DATA/memviz/FROM"
    fi
    if [ -f "$DATA/memviz/_memory_viz.py" ]; then
        MEMVIZ=(python3 "$DATA/memviz/_memory_viz.py")
        echo "memory_viz: torch/cuda/_memory_viz.py from $(cat "$DATA/memviz/FROM") run as a script (torch itself is not installed)" >>"$NOTES"
    fi
fi
[ ${#MEMVIZ[@]} -gt 0 ] || echo "memory_viz: neither torch nor its wheel available, not measured" >>"$NOTES"

# --- measurements ----------------------------------------------------------------------------
# One run under /usr/bin/time -v: peak RSS (kB) and wall seconds, or "timeout"/"failed".
rss_of() {
    local name=$1
    shift
    local log
    log=$(mktemp)
    if timeout "$TIMEOUT" /usr/bin/time -v "$@" >/dev/null 2>"$log"; then
        local kb wall
        kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
        echo "$name	$kb	$wall"
    else
        local rc=$?
        if [ "$rc" = 124 ]; then
            echo "$name	timeout	>${TIMEOUT}s"
        else
            echo "$name	failed	rc=$rc: $(grep -v '^\s' "$log" | tail -1)"
        fi
    fi
    rm -f "$log"
}

for s in $SIZES; do
    f=$DATA/train$s.pickle
    base=$OUT/train$s
    echo "== train$s ($(du -h "$f" | cut -f1))"
    db=$DATA/ptsnap$s
    cache=$DATA/.train$s.pickle.memcache
    # name, command (run by a shell), and for peers a preparation step.
    names=(snapscan-report snapscan-report-1thread snapscan-stats python-pickle-load serde-pickle)
    cmds=(
        "$SNAPSCAN report --format json $f"
        "RAYON_NUM_THREADS=1 $SNAPSCAN report --format json $f"
        "$SNAPSCAN stats $f"
        "python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],\"rb\"))' $f"
        "$SERDE $f || true"
    )
    preps=("" "" "" "" "")
    if [ ${#MEMVIZ[@]} -gt 0 ]; then
        names+=(memory-viz-stats)
        cmds+=("${MEMVIZ[*]} stats $f")
        preps+=("")
    fi
    if [ "$PEERS" = 1 ] && [ -x "$VENV/bin/pt-snap" ]; then
        names+=(pt-snap-import+report)
        cmds+=("HOME=$DATA/home $VENV/bin/pt-snap import --force --no-focus -o $db $f && HOME=$DATA/home $VENV/bin/pt-snap report peak-memory $db/train$s.pickle.db")
        preps+=("rm -rf $db")
    fi
    if [ "$PEERS" = 1 ] && [ -x "$VENV/bin/ptmem" ]; then
        names+=(ptmem-summary)
        cmds+=("$VENV/bin/ptmem -s $f")
        preps+=("rm -f $cache")
    fi

    : >"$base.rss"
    hf_args=()
    for i in "${!names[@]}"; do
        [ -n "${preps[$i]}" ] && bash -c "${preps[$i]}"
        line=$(rss_of "${names[$i]}" bash -c "${cmds[$i]}")
        echo "$line" | tee -a "$base.rss"
        # Commands that did not finish once are not timed again.
        case "$line" in
        *timeout* | *failed*) continue ;;
        esac
        hf_args+=(-n "${names[$i]}")
        if [ -n "${preps[$i]}" ]; then
            hf_args+=(--prepare "${preps[$i]}")
        else
            hf_args+=(--prepare true)
        fi
        hf_args+=("${cmds[$i]}")
    done
    # The /usr/bin/time runs above end with processes of up to 10 GB: for some seconds after
    # such a process exits, a virtual machine may be handing the freed memory back to its host,
    # and commands timed then ran up to 50 % slower. Rest first, then one untimed run of the
    # first command (the first run after a rest pays for fresh memory again); the file is in
    # the page cache from the runs above.
    sleep "$SETTLE"
    bash -c "${cmds[0]}" >/dev/null 2>&1 || true
    hyperfine --warmup 0 --runs "$RUNS" --export-json "$base.json" --export-markdown "$base.md" \
        "${hf_args[@]}"

    # The peaks each tool prints, side by side (a sanity check: same event, same bytes).
    {
        echo "== train$s"
        "$SNAPSCAN" report --format json "$f" | python3 -c "
import json, sys
d = json.load(sys.stdin)['files'][0]['devices'][0]
p, a, r = d['peak'], d['peak_allocated'], d['peak_reserved']
print('snapscan: requested {} B, blocks {} B at event {}; blocks peak {} B at event {}; '
      'reserved peak {} B at event {}'.format(p['requested_bytes'], p['allocated_bytes'],
      p['event_index'], a['bytes'], a['event_index'], r['bytes'], r['event_index']))"
        if [ -x "$VENV/bin/pt-snap" ] && [ -f "$db/train$s.pickle.db" ]; then
            { HOME=$DATA/home "$VENV/bin/pt-snap" report peak-memory "$db/train$s.pickle.db" 2>/dev/null || true; } |
                sed -n 's/^ *\(allocated\|active\|reserved\): \(.*\)/pt-snap \1: \2/p'
        fi
        if [ -x "$VENV/bin/ptmem" ]; then
            { "$VENV/bin/ptmem" -s "$f" 2>/dev/null || true; } | sed -n 's/^ *Peak: *\(.*\)/ptmem peak: \1/p'
        fi
        if [ ${#MEMVIZ[@]} -gt 0 ]; then
            # The dump's state (not a peak): compare with `snapscan stats`.
            { "${MEMVIZ[@]}" stats "$f" 2>/dev/null || true; } |
                sed -n 's/^total_\(reserved\|allocated\): \(.*\)/memory_viz \1 at the dump: \2/p'
            "$SNAPSCAN" stats --format json "$f" | python3 -c "
import json, sys
t = json.load(sys.stdin)['files'][0]['total']
# memory_viz's total_allocated is the sum of requested sizes.
print('snapscan stats at the dump: reserved {} B, requested {} B'.format(t['reserved_bytes'], t['requested_bytes']))" || true
        fi
        { "$SERDE" "$f" 2>&1 || true; } | head -1
    } | tee -a "$OUT/peaks.txt"
done

# --- summary ---------------------------------------------------------------------------------
# One table of every command and size, and the speed targets with the figures behind them.
python3 bench/summarize.py "$DATA"
cat "$NOTES"
