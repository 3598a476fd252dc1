#!/usr/bin/env bash
# Runs every target one after the other, one process at a time, continuing past findings.
#   fuzz/run-all.sh [seconds per target]      (default 600)
# Findings land in fuzz/artifacts/<target>/ (crash-*, timeout-*, oom-*).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
[ -d fuzz/corpus/pickle_parse ] || fuzz/seed.sh
export RUSTC_BOOTSTRAP=1
for target in pickle_parse snapshot_report json_report parallel_reader compressed_report; do
    mkdir -p "fuzz/artifacts/$target"
    cargo fuzz run -s none -a "$target" "fuzz/corpus/$target" -- \
        -dict=fuzz/snapshot.dict -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -artifact_prefix="fuzz/artifacts/$target/" || true
done
