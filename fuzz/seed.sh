#!/usr/bin/env bash
# Fills fuzz/corpus/<target>/ from the fixtures (the corpora are not committed).
#
#   fuzz/seed.sh            # small fixtures only (fast mutations)
#   SEED_ALL=1 fuzz/seed.sh # every fixture, however big
#
# The JSON seeds are made from the pickles with a restricted unpickler that refuses every
# import, so no fixture can run code while being converted; without python3 only the hand-made
# JSON seeds are written.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
max_bytes="${SEED_MAX_BYTES:-200000}"
if [ "${SEED_ALL:-0}" = 1 ]; then max_bytes=1000000000; fi

mkdir -p "$here/corpus/pickle_parse" "$here/corpus/snapshot_report" "$here/corpus/json_report" \
    "$here/corpus/parallel_reader" "$here/corpus/slow_input"

small_pickles=()
for f in "$root"/fixtures/real/*.pickle "$root"/fixtures/synth/*.pickle; do
    [ -f "$f" ] || continue
    if [ "$(wc -c < "$f")" -le "$max_bytes" ]; then small_pickles+=("$f"); fi
done
for f in "${small_pickles[@]}"; do
    cp "$f" "$here/corpus/pickle_parse/"
    cp "$f" "$here/corpus/snapshot_report/"
    cp "$f" "$here/corpus/parallel_reader/"
    cp "$f" "$here/corpus/slow_input/"
done

# Hand-made JSON snapshots: one clean, and the shapes the data-quality checks look at.
json="$here/corpus/json_report"
cat > "$json/clean.json" <<'JSON'
{"segments":[{"device":0,"address":1048576,"total_size":2097152,"allocated_size":1024,"active_size":1024,"requested_size":1000,"stream":0,"segment_type":"small","segment_pool_id":[0,0],"is_expandable":false,"frames":[],"blocks":[{"address":1048576,"size":1024,"requested_size":1000,"state":"active_allocated","frames":[{"name":"f","filename":"a.py","line":3}]},{"address":1049600,"size":2096128,"requested_size":0,"state":"inactive","frames":[]}]}],"device_traces":[[{"action":"segment_alloc","addr":1048576,"size":2097152,"stream":0,"time_us":1,"frames":[]},{"action":"alloc","addr":1048576,"size":1000,"stream":0,"time_us":2,"frames":[{"name":"f","filename":"a.py","line":3}]},{"action":"snapshot","addr":0,"size":1024,"stream":0,"time_us":3}]],"allocator_settings":{"expandable_segments":false,"max_split_size":-1},"external_annotations":[{"device":0,"stage":"START","name":"step","time_us":2}]}
JSON
cat > "$json/inconsistent.json" <<'JSON'
{"segments":[{"device":0,"address":4096,"total_size":4096,"allocated_size":9999,"blocks":[{"address":4096,"size":2048,"requested_size":10,"state":"active_allocated"},{"address":5000,"size":2048,"requested_size":10,"state":"active_allocated"}]},{"device":0,"address":4096,"total_size":4096,"blocks":[{"size":4096,"requested_size":1,"state":"inactive"}]},{"device":3,"address":0,"total_size":512,"blocks":[{"size":512,"requested_size":512,"state":"active_pending_free"}]}],"device_traces":[[{"action":"free_completed","addr":123,"size":512},{"action":"alloc","addr":4096,"size":9223372036854775807},{"action":"alloc","addr":5000,"size":9223372036854775807},{"action":"snapshot","addr":0,"size":1},{"action":"oom","size":1048576,"device_free":0}],[],[{"action":"bogus","size":1}]]}
JSON
cat > "$json/segment-list.json" <<'JSON'
[{"device":0,"address":0,"total_size":1024,"blocks":[{"size":512,"state":"active_allocated","history":[{"addr":0,"real_size":500,"frames":[{"filename":"x.py","name":"g","line":1}]}]},{"size":512,"state":"inactive"}]}]
JSON
# Extreme values in every numeric field of the clean snapshot (sizes and addresses near 2^64,
# times at the ends of i64): overflow checks in the analysis.
if command -v python3 >/dev/null 2>&1; then
    python3 - "$json/clean.json" "$json" <<'PY'
import copy, json, os, sys
base = json.load(open(sys.argv[1]))
def leaves(v, path=()):
    if isinstance(v, dict):
        for k, x in v.items(): yield from leaves(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v): yield from leaves(x, path + (i,))
    elif isinstance(v, int) and not isinstance(v, bool):
        yield path
n = 0
for path in leaves(base):
    signed = path[-1] in ("time_us", "device", "line") or "segment_pool_id" in path
    values = [-2**63, 2**63 - 1, -1] if signed else [2**64 - 1, 2**63, 2**63 - 1, 2**48 + 1]
    for v in values:
        d = copy.deepcopy(base)
        target = d
        for p in path[:-1]: target = target[p]
        target[path[-1]] = v
        n += 1
        with open(os.path.join(sys.argv[2], f"extreme-{n:03d}.json"), "w") as f:
            json.dump(d, f, separators=(",", ":"))
PY
fi
# Inputs that once crashed (tests/regressions/) are good seeds too.
cp "$root"/tests/regressions/* "$json/" 2>/dev/null || true
cp "$json"/*.json "$here/corpus/snapshot_report/"

if command -v python3 >/dev/null 2>&1 && [ "${#small_pickles[@]}" -gt 0 ]; then
    python3 - "$json" "$here/corpus/pickle_parse:$here/corpus/snapshot_report:$here/corpus/parallel_reader" "${SEED_ALL:-0}" "${small_pickles[@]}" <<'PY'
import json, os, pickle, sys

class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")

def short_frames(v):
    """A copy with every `frames` list cut to 3 frames (JSON repeats shared stacks)."""
    if isinstance(v, dict):
        return {k: (short_frames(x[:3]) if k == "frames" and isinstance(x, list) else short_frames(x))
                for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [short_frames(x) for x in v]
    return v

json_dir, pickle_dirs, full = sys.argv[1], sys.argv[2].split(":"), sys.argv[3] == "1"
for path in sys.argv[4:]:
    with open(path, "rb") as f:
        data = PlainData(f).load()
    base = os.path.basename(path).rsplit(".", 1)[0]
    if full:
        with open(os.path.join(json_dir, base + ".json"), "w") as f:
            json.dump(data, f, separators=(",", ":"))
    # A small cut of the same file (a few segments and trace entries) mutates much faster.
    if isinstance(data, dict):
        small = dict(data)
        small["segments"] = data.get("segments", [])[:6]
        small["device_traces"] = [t[:150] for t in data.get("device_traces", [])]
    else:
        small = data[:6]
    small = short_frames(small)
    with open(os.path.join(json_dir, base + ".small.json"), "w") as f:
        json.dump(small, f, separators=(",", ":"))
    for d in pickle_dirs:
        with open(os.path.join(d, base + ".small.pickle"), "wb") as f:
            pickle.dump(small, f, protocol=4)
PY
fi
# slow_input: the tiny fixture's trace repeated 2, 4 and 8 times in shifted address ranges,
# each copy with its own frames lists but the frame dicts of the first (memo references far
# back, as in a long real dump); the same restricted unpickler.
if command -v python3 >/dev/null 2>&1; then
    python3 - "$root/fixtures/synth/tiny.pickle" "$here/corpus/slow_input" <<'PY'
import io, os, pickle, sys

class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")

src, out = sys.argv[1], sys.argv[2]
snap = Plain(open(src, "rb")).load()
trace = snap["device_traces"][0]
for copies in (2, 4, 8):
    entries = []
    for r in range(copies):
        own = {}
        for e in trace:
            e = dict(e, addr=e.get("addr", 0) + (r << 40))
            if "frames" in e:
                e["frames"] = own.setdefault(id(e["frames"]), list(e["frames"]))
            entries.append(e)
    with open(os.path.join(out, f"tiny-x{copies}.pickle"), "wb") as f:
        pickle.dump(dict(snap, device_traces=[entries]), f, protocol=4)
PY
fi
for t in pickle_parse snapshot_report json_report parallel_reader slow_input; do
    echo "$t: $(ls "$here/corpus/$t" | wc -l) inputs"
done
