#!/usr/bin/env bash
# `snapscan view` on a big snapshot: its time against `snapscan report` (hyperfine), the size of
# the page, and in headless chromium the time to the first paint, per zoom step and per scrub.
#
#   bench/view.sh SNAPSHOT [OUT_DIR]      (OUT_DIR default: a temporary folder)
#
# Needs: a release build (cargo build --release), hyperfine, chromium, python3 with playwright.
# Environment: RUNS (hyperfine runs, default 3), SNAPSCAN (default target/release/snapscan),
# PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
SNAP=$1
OUT=${2:-$(mktemp -d)}
RUNS=${RUNS:-3}
BIN=${SNAPSCAN:-target/release/snapscan}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
hyperfine --runs "$RUNS" --warmup 1 --export-json "$OUT/view-vs-report.json" \
    -n report "$BIN report $SNAP -o $OUT/report.txt" \
    -n view "$BIN view $SNAP -o $OUT/view.html"
echo "page: $(wc -c < "$OUT/view.html") bytes"
"$PY" bench/view_browser.py "$(cd "$OUT" && pwd)/view.html" "$RUNS"
