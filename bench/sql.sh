#!/usr/bin/env bash
# snapscan sql and query against the report on one snapshot: wall time and peak RSS of each,
# the database's size against the pickle's, and the live set at the peak as a query.
#   bench/sql.sh [SNAPSHOT] [RUNS]     (default: bench/data/notHanmin-x280.pickle, 3 runs)
# The 1 GB file is made by bench/run.sh (its real1g family).
set -euo pipefail
cd "$(dirname "$0")/.."
SNAP=${1:-bench/data/notHanmin-x280.pickle}
RUNS=${2:-3}
BIN=${SNAPSCAN:-target/release/snapscan}
[ -f "$SNAP" ] || { echo "bench: no $SNAP (bench/run.sh real1g writes it)" >&2; exit 2; }
[ -x "$BIN" ] || cargo build --release
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LIVE="SELECT COALESCE(s.call_site, '<' || a.origin || '>'), COUNT(*), SUM(a.requested_bytes) FROM allocations a JOIN devices d USING (file_id, device) LEFT JOIN stacks s USING (file_id, stack_id) WHERE (a.alloc_event IS NULL OR a.alloc_event <= d.peak_event) AND (a.free_event IS NULL OR a.free_event > d.peak_event) GROUP BY 1 ORDER BY 3 DESC LIMIT 20"
echo "snapshot: $SNAP ($(stat -c %s "$SNAP") bytes); $(nproc) cores"
for i in $(seq "$RUNS"); do
    /usr/bin/time -f "report: %e s, %M KB" "$BIN" report --format json "$SNAP" -o "$OUT/r.json"
    rm -f "$OUT/snap.db"
    /usr/bin/time -f "sql: %e s, %M KB" "$BIN" sql "$SNAP" -o "$OUT/snap.db" >/dev/null
    echo "database: $(stat -c %s "$OUT/snap.db") bytes"
    /usr/bin/time -f "query (live set at the peak): %e s, %M KB" "$BIN" query "$OUT/snap.db" "$LIVE" >/dev/null
done
