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
    "$here/corpus/parallel_reader" "$here/corpus/slow_input" "$here/corpus/compressed_report"

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
# Hostile JSON: nesting at and past serde_json's depth limit (128), numbers past i64, u64
# and f64, long strings (at the interner's 16 KiB cut, with multi-byte characters across it),
# duplicated keys (the last one wins, as in serde_json's own map), long arrays, and bytes
# around the document. Each under 64 kB, the size the campaigns run.
if command -v python3 >/dev/null 2>&1; then
    python3 - "$json/clean.json" "$json" <<'PY'
import copy, json, os, sys
base = json.load(open(sys.argv[1]))
out = sys.argv[2]
def write(name, text):
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    assert len(data) <= 65536, (name, len(data))
    with open(os.path.join(out, f"json-{name}.json"), "wb") as f:
        f.write(data)
def dumps(v):
    return json.dumps(v, separators=(",", ":"))
def with_raw(path, raw):
    """The clean snapshot with the value at `path` replaced by the JSON text `raw`."""
    d = copy.deepcopy(base)
    target = d
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = "@@RAW@@"
    return dumps(d).replace('"@@RAW@@"', raw, 1)
text = dumps(base)
# Nesting, to 127 levels in all (the most serde_json reads), 128 and 2000: in the traces
# (read by the decoder), in the allocator settings (kept as they are), and as the document.
for total in (127, 128, 2000):
    depth = total - 1
    write(f"deep-traces-{total}", with_raw(("device_traces",), "[" * depth + "]" * depth))
    write(f"deep-settings-{total}",
          with_raw(("allocator_settings",), '{"a":' * depth + "0" + "}" * depth))
    write(f"deep-document-{total}", "[" * total + "]" * total)
# Numbers the snapshot's integer fields cannot hold, and numbers JSON allows but no dump has.
numbers = ["1e308", "1e309", "-1e309", "18446744073709551615", "18446744073709551616",
           "-9223372036854775808", "-9223372036854775809", "1" + "0" * 400, "1.5", "-0",
           "5e-324", "1e-400", "1E+2", "0.0000000000000000000001e22"]
paths = [("segments", 0, "total_size"), ("segments", 0, "address"),
         ("segments", 0, "blocks", 0, "size"), ("device_traces", 0, 1, "size"),
         ("device_traces", 0, 1, "time_us"), ("segments", 0, "blocks", 0, "frames", 0, "line")]
for i, path in enumerate(paths):
    for j, num in enumerate(numbers):
        write(f"number-{i}-{j:02d}", with_raw(path, num))
# Long strings: a file name of 60,000 bytes; names just over the 16 KiB cut made of 2-, 3- and
# 4-byte characters (as UTF-8 and as JSON escapes) after 0-3 ASCII bytes, so that the cut falls
# inside a character; escapes; a long key; a lone surrogate (refused) and a surrogate pair.
frame = ("segments", 0, "blocks", 0, "frames", 0)
write("long-filename", with_raw(frame + ("filename",), dumps("x" * 60000)))
for label, ch, size in [("u2", "\u00e9", 2), ("u3", "\u20ac", 3), ("u4", "\U0001F600", 4),
                        ("e2", r"\u00e9", 2), ("e4", r"\ud83d\ude00", 4)]:
    for extra in ("", "a", "ab", "abc"):
        name = '"' + extra + ch * (16384 // size + 1) + '"'
        write(f"long-name-{label}-{len(extra)}", with_raw(frame + ("name",), name))
write("escapes", with_raw(frame + ("name",), '"' + r'\n\t\\\"\/\u0000' * 2000 + '"'))
write("long-key", text[:-1] + ',' + dumps("k" * 60000) + ":0}")
write("long-action", with_raw(("device_traces", 0, 1, "action"), dumps("alloc" * 12000)))
write("lone-surrogate", with_raw(frame + ("name",), r'"\ud800"'))
write("surrogate-pair", with_raw(frame + ("name",), r'"\ud83d\ude00"'))
# Duplicated keys: the whole segment list, a block's size, a trace entry's action, and one key
# a thousand times in one dict.
seg = dumps(base["segments"])
write("dup-segments", "{" + '"segments":' + seg + "," + text[1:-1] + ',"segments":[]}')
write("dup-segments-last", text[:-1] + ',"segments":' + seg + "}")
write("dup-size", with_raw(("segments", 0, "blocks", 0, "size"), '1024,"size":9223372036854775807'))
write("dup-action",
      with_raw(("device_traces", 0, 1, "action"), '"alloc","action":"free_completed"'))
write("dup-key-1000", text[:-1] + "," + ",".join('"segments":[]' for _ in range(1000)) + "}")
# Long arrays: many small trace entries, a long stack, many segments, many devices, and
# arrays of values of the wrong type.
entry = {"action": "alloc", "addr": 1048576, "size": 512, "stream": 0, "time_us": 2}
entries = []
for i in range(700):
    entries.append(dict(entry, addr=1048576 + 512 * (i % 64), time_us=i,
                        action="alloc" if i % 2 == 0 else "free_completed"))
write("long-trace", with_raw(("device_traces",), dumps([entries])))
f0 = {"name": "f", "filename": "a.py", "line": 3}
write("long-stack", with_raw(("device_traces", 0, 1, "frames"), dumps([f0] * 1500)))
s0 = {"device": 0, "address": 0, "total_size": 512,
      "blocks": [{"size": 512, "requested_size": 1, "state": "active_allocated"}]}
write("many-segments", with_raw(("segments",),
      dumps([dict(s0, address=512 * i) for i in range(500)])))
write("many-devices", with_raw(("device_traces",), "[" + ",".join(["[]"] * 20000) + "]"))
write("many-zeros", with_raw(("device_traces",), "[[" + ",".join(["0"] * 30000) + "]]"))
write("many-empty-dicts", with_raw(("device_traces",), "[[" + ",".join(["{}"] * 20000) + "]]"))
write("many-nulls-segments", with_raw(("segments",), "[" + ",".join(["null"] * 12000) + "]"))
# Bytes around the document, and what JSON does not allow.
write("bom", b"\xef\xbb\xbf" + text.encode())
write("leading-whitespace", " \n\t\r" * 1000 + text)
write("trailing-garbage", text + "garbage")
write("two-documents", text + text)
write("nan", with_raw(("device_traces", 0, 1, "size"), "NaN"))
write("infinity", with_raw(("device_traces", 0, 1, "size"), "-Infinity"))
write("cut", text[: len(text) // 2])
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
# compressed_report: small snapshots compressed in every form the reader takes: gzip, gzip
# members one after another, gzip with bytes after it, zstd with and without its size in the
# header, two zstd frames, a skippable frame first, and cut copies (the salvage paths; the cut
# zstd has 1 KiB blocks, so that some blocks before the cut are whole).
comp="$here/corpus/compressed_report"
compress_seeds() {
    local f="$1" base half
    base="$(basename "$f")"
    half=$(( $(wc -c < "$f") / 2 ))
    if command -v gzip >/dev/null 2>&1; then
        gzip -9 -n -c "$f" > "$comp/$base.gz"
        { head -c "$half" "$f" | gzip -n -c; tail -c +"$((half + 1))" "$f" | gzip -n -c; } \
            > "$comp/$base.members.gz"
        { gzip -n -c "$f"; printf 'a log line after the gzip data\n'; } > "$comp/$base.trailing.gz"
        head -c "$(( $(wc -c < "$comp/$base.gz") * 2 / 3 ))" "$comp/$base.gz" > "$comp/$base.cut.gz"
    fi
    if command -v zstd >/dev/null 2>&1; then
        zstd -q -19 -c "$f" > "$comp/$base.zst"
        # From a pipe, zstd does not know the size and leaves it out of the header.
        cat "$f" | zstd -q -3 -c > "$comp/$base.nosize.zst"
        { head -c "$half" "$f" | zstd -q -c; tail -c +"$((half + 1))" "$f" | zstd -q -c; } \
            > "$comp/$base.frames.zst"
        { printf '\x50\x2a\x4d\x18\x04\x00\x00\x00seed'; zstd -q -c "$f"; } \
            > "$comp/$base.skippable.zst"
        zstd -q --zstd=wlog=10 -c "$f" > "$comp/$base.blocks.zst"
        head -c "$(( $(wc -c < "$comp/$base.blocks.zst") * 2 / 3 ))" "$comp/$base.blocks.zst" \
            > "$comp/$base.cut.zst"
    fi
}
for f in "$root/fixtures/synth/tiny.pickle" "$root/fixtures/synth/load-oom.pickle" \
    "$here/corpus/pickle_parse/Yiyi-philosophy__LLM-inference__oom_snapshot.small.pickle" \
    "$json/clean.json" "$json/inconsistent.json"; do
    if [ -f "$f" ]; then compress_seeds "$f"; fi
done
for t in pickle_parse snapshot_report json_report parallel_reader slow_input compressed_report; do
    echo "$t: $(ls "$here/corpus/$t" | wc -l) inputs"
done
