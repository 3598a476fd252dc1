#!/usr/bin/env python3
"""Scaling benchmark: hostile input shapes at growing sizes, time per size and doubling ratio.

Each family is a shape of input that once took more than linear time. For each size (about 1, 2,
4, ... MB up to --max-mb) the file is generated here with the standard library (`pickle`, or
pickle bytes written directly), the release binary runs the family's command on it, and the
wall time (best of --runs) is printed with the ratio to the previous size. Linear time gives a
ratio of about 2 at each doubling.

    cargo build --release
    python3 bench/scaling.py [--families a,b] [--max-mb 100] [--runs 3] [--data DIR]

Families:
    after-stop   a small valid snapshot followed by zero bytes (report)
    devices      one trace entry per device, many devices (report)
    ooms         a trace of alloc/oom/free triples, as a batch-size finder makes (report)
    timeline     a trace of allocations that each live for a while (timeline, default --detail)
    explain      one log line holding many OOM messages (explain)
    names        many inputs rankN/x.pickle sharing one file name (report --svg), of about 700
                 bytes each (1 MB: 1 500 files; by default up to 8 MB, see --max-mb-names)

Not a timed test: this prints figures (BENCHMARKS.md, "Scaling") and exits 0.
"""

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "snapscan")
MB = 1 << 20

FRAMES = [{"filename": "train.py", "line": 10, "name": "step"},
          {"filename": "model.py", "line": 42, "name": "forward"}]


def entry(action, addr, size, t, **kw):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": FRAMES}
    e.update(kw)
    return e


def small_snapshot(n=50):
    """A valid snapshot of a few KB: one segment, `n` allocations and frees."""
    trace = [entry("segment_alloc", 1 << 30, 64 * MB, 0)]
    for i in range(n):
        trace.append(entry("alloc", (1 << 30) + i * 512, 512, 2 * i + 1))
        trace.append(entry("free_requested", (1 << 30) + i * 512, 512, 2 * i + 2))
        trace.append(entry("free_completed", (1 << 30) + i * 512, 512, 2 * i + 2))
    seg = {"device": 0, "address": 1 << 30, "total_size": 64 * MB, "allocated_size": 0,
           "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": FRAMES,
           "blocks": [{"address": 1 << 30, "size": 64 * MB, "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    return {"segments": [seg], "device_traces": [trace]}


def dump(obj):
    return pickle.dumps(obj, protocol=4)


def gen_after_stop(size, path):
    head = dump(small_snapshot())
    with open(path, "wb") as f:
        f.write(head)
        f.write(b"\0" * max(0, size - len(head)))
    return ["report", path]


def gen_devices(size, path):
    # About 25 bytes per device: one trace entry (memoized dict keys and frames).
    n = max(1, size // 40)
    traces = [[entry("alloc", (1 << 30) + 512 * d, 512 * (1 + d % 7), d)] for d in range(n)]
    with open(path, "wb") as f:
        f.write(dump({"segments": [], "device_traces": traces}))
    return ["report", path]


def gen_ooms(size, path):
    # alloc, oom, free: a batch-size finder that catches the OOM and retries smaller.
    n = max(1, size // 120)
    trace = [entry("segment_alloc", 1 << 30, 1 << 32, 0)]
    t = 1
    for i in range(n):
        trace.append(entry("alloc", 1 << 30, 1 << 20, t))
        trace.append({"action": "oom", "device_free": 1 << 20, "size": (1 << 31) + 512 * (i % 977),
                      "stream": 0, "time_us": t + 1, "frames": FRAMES})
        trace.append(entry("free_requested", 1 << 30, 1 << 20, t + 2))
        trace.append(entry("free_completed", 1 << 30, 1 << 20, t + 2))
        t += 3
    with open(path, "wb") as f:
        f.write(dump({"segments": [], "device_traces": [trace]}))
    return ["report", path]


def gen_timeline(size, path):
    # Allocations that each outlive the next 100: many overlap at every moment.
    n = max(1, size // 80)
    trace = [entry("segment_alloc", 1 << 30, 1 << 40, 0)]
    live = []
    for i in range(n):
        addr = (1 << 30) + 4096 * i
        trace.append(entry("alloc", addr, 4096 + 512 * (i % 101), i))
        live.append((addr, 4096 + 512 * (i % 101)))
        if len(live) > 100:
            a, s = live.pop(0)
            trace.append(entry("free_completed", a, s, i))
    with open(path, "wb") as f:
        f.write(dump({"segments": [], "device_traces": [trace]}))
    return ["timeline", path, "-o", os.devnull]


OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. "


def gen_explain(size, path):
    # Lines of 1 MiB (the longest stretch of a line that explain reads), each full of short
    # messages: the cost per line was quadratic in its messages.
    per_line = MB // len(OOM_MESSAGE)
    lines, rest = divmod(max(1, size // len(OOM_MESSAGE)), per_line)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(OOM_MESSAGE * per_line + "\n")
        if rest:
            f.write(OOM_MESSAGE * rest + "\n")
    return ["explain", path]


def gen_names(size, path):
    blob = dump(small_snapshot(2))
    n = max(2, size // len(blob))
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    files = []
    for r in range(n):
        d = os.path.join(path, f"rank{r}")
        os.makedirs(d)
        p = os.path.join(d, "x.pickle")
        with open(p, "wb") as f:
            f.write(blob)
        files.append(p)
    out = path + ".svg"
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    return ["report", "--svg", out, "-o", os.devnull, *files]


FAMILIES = {
    "after-stop": gen_after_stop,
    "devices": gen_devices,
    "ooms": gen_ooms,
    "timeline": gen_timeline,
    "explain": gen_explain,
    "names": gen_names,
}


def sizes(max_mb):
    s = 1
    while s < max_mb:
        yield s
        s *= 2
    yield max_mb


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--max-mb", type=int, default=100)
    ap.add_argument("--min-mb", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120, help="seconds; a longer run stops the family")
    ap.add_argument("--data", default=None, help="folder for the generated files (default: a temporary one)")
    ap.add_argument("--bin", default=BIN)
    args = ap.parse_args()
    if not os.path.exists(args.bin):
        sys.exit(f"scaling: no binary at {args.bin} (cargo build --release)")
    data = args.data or tempfile.mkdtemp(prefix="snapscan-scaling-")
    os.makedirs(data, exist_ok=True)
    print("| family | size | input bytes | time (s) | ratio to previous |")
    print("|---|---:|---:|---:|---:|")
    for fam in args.families.split(","):
        gen = FAMILIES[fam]
        prev = None
        for mb in sizes(args.max_mb):
            if mb < args.min_mb:
                continue
            path = os.path.join(data, f"{fam}-{mb}")
            cmd = gen(mb * MB, path)
            nbytes = (sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs)
                      if os.path.isdir(path) else os.path.getsize(path))
            best = None
            for _ in range(args.runs):
                start = time.perf_counter()
                try:
                    r = subprocess.run([args.bin, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    best = None
                    break
                took = time.perf_counter() - start
                if r.returncode not in (0, 1):
                    sys.exit(f"scaling: {fam} {mb} MB: exit {r.returncode}: {r.stderr.decode()[:500]}")
                best = took if best is None else min(best, took)
            if best is None:
                print(f"| {fam} | {mb} MB | {nbytes} | > {args.timeout:.0f} | |", flush=True)
                break
            ratio = f"{best / prev:.2f}" if prev else ""
            print(f"| {fam} | {mb} MB | {nbytes} | {best:.3f} | {ratio} |", flush=True)
            prev = best
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    if not args.data:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
