#!/usr/bin/env bash
# Renders snapscan's SVG pictures of two fixtures in headless Chromium and writes PNG screenshots,
# to look at what a reader sees.
#
#   scripts/render_svgs.sh OUT_DIR [FIXTURE...]
#
# Default fixtures: fixtures/synth/train-oom-forward.pickle (an OOM) and
# fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle (a real training run).
# For each fixture it writes into OUT_DIR:
#   <stem>.timeline.svg, <stem>.segments.svg        the pictures
#   <stem>.timeline.png, <stem>.segments.png        1200x800 window (what a browser shows first)
#   <stem>.timeline-full.png, <stem>.segments-full.png   1200 wide, the whole picture
#   <stem>.timeline-small.png                        600 wide (as when scaled down in a page)
# Needs Debian's `chromium` (installed with apt-get when missing). Set SNAPSCAN to use a given
# binary instead of building one with cargo.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [FIXTURE...]" >&2
    exit 2
fi
out=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
fixtures=()
for a in "$@"; do
    fixtures+=("$(realpath --relative-to="$root" "$a")")
done
if [ ${#fixtures[@]} -eq 0 ]; then
    fixtures=(
        fixtures/synth/train-oom-forward.pickle
        fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle
    )
fi

if ! command -v chromium >/dev/null 2>&1; then
    echo "chromium not found: installing Debian's package" >&2
    apt-get update
    apt-get install -y chromium
fi

bin=${SNAPSCAN:-}
if [ -z "$bin" ]; then
    (cd "$root" && cargo build --release --quiet)
    target=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    bin="$target/release/snapscan"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

# shot SVG PNG WIDTH HEIGHT
shot() {
    rm -rf "$profile"/*
    timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --hide-scrollbars --user-data-dir="$profile" --screenshot="$2" \
        --window-size="$3,$4" "file://$1" >/dev/null 2>&1
    if [ ! -s "$2" ]; then
        echo "no screenshot written for $1" >&2
        exit 1
    fi
    echo "$2"
}

# Height of the picture when it is $1 pixels wide (from the viewBox).
height_at() {
    local vb
    vb=$(grep -o 'viewBox="[^"]*"' "$2" | head -1 | tr -d '"' | cut -d= -f2)
    awk -v w="$1" -v vb="$vb" 'BEGIN { split(vb, a, " "); printf "%d", w * a[4] / a[3] + 1 }'
}

# Relative paths, so that the pictures name the fixture as the repository does.
cd "$root"
for f in "${fixtures[@]}"; do
    stem=$(basename "$f")
    stem=${stem%.gz}
    stem=${stem%.pickle}
    "$bin" timeline "$f" -o "$out/$stem.timeline.svg"
    "$bin" segments "$f" -o "$out/$stem.segments.svg"
    for kind in timeline segments; do
        svg="$out/$stem.$kind.svg"
        shot "$svg" "$out/$stem.$kind.png" 1200 800
        shot "$svg" "$out/$stem.$kind-full.png" 1200 "$(height_at 1200 "$svg")"
    done
    svg="$out/$stem.timeline.svg"
    shot "$svg" "$out/$stem.timeline-small.png" 600 "$(height_at 600 "$svg")"
done
