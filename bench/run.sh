#!/usr/bin/env bash
# Benchmark: snapscan against Python's pickle.load on real-shaped snapshots first (the real
# traces of the fixtures repeated by the maintainers' replicate_trace.py, which keeps the object
# sharing of torch's dumps), then on simulator files. Generated once, not committed.
#
#   bench/run.sh [DATA_DIR]          (default: bench/data, git-ignored)
#
# Environment:
#   SETS     which files, in this order (default: "compressed real100 real1g snapgen"; the
#            compressed set first: the .zst report decodes into 1.1 GB of fresh memory, and right
#            after the 1 GB set's pickle.load runs (4 GB each) it took 1.58 s against 1.32-1.40 s
#            otherwise, on a virtual machine that hands freed memory back to its host):
#            real100    notHanmin x28, MAGMA27 x200, ZidongLiu x50 (about 100 MB each)
#            real1g     notHanmin x280 (about 1 GB)
#            compressed the 1 GB file as .zst and .gz
#            real4g     notHanmin x1100 (about 4 GB; written to BIG_DIR, default $TMPDIR or /tmp)
#            snapgen    simulator `train` files of about 100 MB and 1 GB (seed 7)
#            captured   DATA_DIR/long_run.pickle.gz, a real run of about 1.2 million events that
#                       bench/capture_long_run.py records on a GPU machine (not in the default)
#   RUNS     hyperfine runs per command (default 5)
#   SETTLE   seconds of rest before each file's timed runs (default 30)
#   TOOLS    folder with replicate_trace.py and snapgen.py (default ../shared/tools, next to the
#            checkout: the tools are run from there, never copied into the project)
#
# Needs: cargo, python3, hyperfine, GNU time (/usr/bin/time), zstd and gzip (for `compressed`).
# Writes, per file NAME, DATA_DIR/results/NAME.json (hyperfine) and NAME.rss (peak RSS from
# /usr/bin/time -v), then the table and the speed targets (summary.md, by bench/summarize.py).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
DATA=${1:-bench/data}
SETS=${SETS:-"compressed real100 real1g snapgen"}
RUNS=${RUNS:-5}
SETTLE=${SETTLE:-30}
TOOLS=${TOOLS:-$ROOT/../shared/tools}
BIG_DIR=${BIG_DIR:-${TMPDIR:-/tmp}}
mkdir -p "$DATA/results"
DATA=$(cd "$DATA" && pwd)
OUT=$DATA/results
REAL=$ROOT/fixtures/real

for tool in hyperfine /usr/bin/time python3 cargo; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is missing" >&2; exit 2; }
done
[ -f "$TOOLS/replicate_trace.py" ] || { echo "bench: no replicate_trace.py in $TOOLS" >&2; exit 2; }

# --- build -----------------------------------------------------------------------------------
cargo build --release --quiet
TARGET=${CARGO_TARGET_DIR:-target}
SNAPSCAN=$(cd "$TARGET/release" && pwd)/snapscan

# --- machine ---------------------------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpus: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "kernel: $(uname -r)"
    echo "snapscan: $("$SNAPSCAN" --version) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "python: $(python3 --version 2>&1)"
    echo "hyperfine: $(hyperfine --version)"
} | tee "$OUT/machine.txt"

# --- data ------------------------------------------------------------------------------------
# replica NAME FIXTURE COPIES [DIR]: FIXTURE's trace repeated COPIES times.
replica() {
    local f=${4:-$DATA}/$1.pickle
    if [ ! -f "$f" ]; then
        echo "bench: writing $f ($3 copies of $2)"
        python3 "$TOOLS/replicate_trace.py" "$REAL/$2" "$3" "$f.part"
        mv "$f.part" "$f"
    fi
    echo "$f"
}
snapgen() {
    local f=$DATA/$1.pickle
    if [ ! -f "$f" ]; then
        echo "bench: writing $f (snapgen train --scale $2)"
        python3 "$TOOLS/snapgen.py" --scenario train --seed 7 --scale "$2" --out "$f.part" >/dev/null
        mv "$f.part" "$f"
    fi
    echo "$f"
}
HAN=notHanmin__assignment2-systems__memory_snapshot.pickle
MAGMA=MAGMA27__assignment2-systems__memory_snapshot.pickle
ZIDONG=ZidongLiu__DeComFL__memory.pickle

FILES=()
for set in $SETS; do
    case $set in
    real100)
        FILES+=("$(replica notHanmin-x28 $HAN 28 | tail -1)")
        FILES+=("$(replica MAGMA27-x200 $MAGMA 200 | tail -1)")
        FILES+=("$(replica ZidongLiu-x50 $ZIDONG 50 | tail -1)")
        ;;
    real1g) FILES+=("$(replica notHanmin-x280 $HAN 280 | tail -1)") ;;
    compressed)
        big=$(replica notHanmin-x280 $HAN 280 | tail -1)
        [ -f "$big.zst" ] || zstd -q -3 -T0 -o "$big.zst" "$big"
        [ -f "$big.gz" ] || gzip -6 -c "$big" >"$big.gz"
        FILES+=("$big.zst" "$big.gz")
        ;;
    real4g) FILES+=("$(replica notHanmin-x1100 $HAN 1100 "$BIG_DIR" | tail -1)") ;;
    captured)
        # One real long training run, no repetition: bench/capture_long_run.py writes
        # long_run.pickle.gz on a GPU machine; put it into DATA_DIR.
        f=$DATA/long_run.pickle
        if [ ! -f "$f" ]; then
            [ -f "$f.gz" ] || {
                echo "bench: no $f.gz (bench/capture_long_run.py writes it on a GPU machine)" >&2
                exit 2
            }
            gzip -dc "$f.gz" >"$f.part"
            mv "$f.part" "$f"
        fi
        FILES+=("$f")
        ;;
    snapgen)
        FILES+=("$(snapgen snapgen-train100 100 | tail -1)")
        FILES+=("$(snapgen snapgen-train1000 1000 | tail -1)")
        ;;
    *) echo "bench: unknown set $set" >&2; exit 2 ;;
    esac
done

# --- measurements ----------------------------------------------------------------------------
# One run under /usr/bin/time -v: peak RSS (kB) and wall time, or "failed".
rss_of() {
    local name=$1
    shift
    local log
    log=$(mktemp)
    if /usr/bin/time -v "$@" >/dev/null 2>"$log"; then
        local kb wall
        kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
        echo "$name	$kb	$wall"
    else
        echo "$name	failed	rc=$?: $(grep -v '^\s' "$log" | tail -1)"
    fi
    rm -f "$log"
}

LOAD="python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],\"rb\"))'"
for f in "${FILES[@]}"; do
    name=$(basename "$f")
    name=${name%.pickle}
    name=${name/.pickle/}
    base=$OUT/$name
    echo "$f" >"$base.path"
    echo "== $name ($(du -h "$f" | cut -f1))"
    names=(snapscan-report)
    cmds=("$SNAPSCAN report --format json $f")
    case $f in
    *.zst | *.gz)
        plain=${f%.*}
        tool=zstd
        [[ $f == *.gz ]] && tool=gzip
        # The system decompressor alone, then the report of the plain file (summed by the
        # summary): what a user would do by hand.
        names+=("$tool-dc" snapscan-report-plain)
        cmds+=("$tool -dc $f >/dev/null" "$SNAPSCAN report --format json $plain")
        ;;
    *x1100*)
        # The 4 GB file: its target is the report's time per MB and memory; pickle.load would
        # take minutes and about 16 GB per run.
        ;;
    *)
        names+=(snapscan-report-1thread python-pickle-load)
        cmds+=("RAYON_NUM_THREADS=1 $SNAPSCAN report --format json $f" "$LOAD $f")
        ;;
    esac

    : >"$base.rss"
    hf_args=()
    for i in "${!names[@]}"; do
        line=$(rss_of "${names[$i]}" bash -c "${cmds[$i]}")
        echo "$line" | tee -a "$base.rss"
        case "$line" in *failed*) continue ;; esac
        hf_args+=(-n "${names[$i]}" "${cmds[$i]}")
    done
    # After a process of several GB exits, a virtual machine may hand the freed memory back to
    # its host for some seconds, and commands timed then ran up to 50 % slower: rest, then one
    # untimed run of the first command (the file is in the page cache from the runs above).
    sleep "$SETTLE"
    bash -c "${cmds[0]}" >/dev/null 2>&1 || true
    hyperfine --warmup 0 --runs "$RUNS" --export-json "$base.json" "${hf_args[@]}"
done

# --- summary ---------------------------------------------------------------------------------
python3 bench/summarize.py "$DATA"
