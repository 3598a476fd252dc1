#!/usr/bin/env python3
"""Tables and target checks from the results of bench/run.sh.

    python3 bench/summarize.py [DATA_DIR]        (default: bench/data)

Reads DATA_DIR/results/train<scale>.{json,rss} (hyperfine medians, peak RSS from
/usr/bin/time -v) and writes DATA_DIR/results/summary.md: one table of every command and size,
then the speed targets of snapscan on the largest file, each with the figures it is computed from.
"""
import json
import os
import re
import sys


def load(out, data):
    rows = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"train(\d+)\.rss", name)
        if not m:
            continue
        scale = int(m.group(1))
        size = os.path.getsize(os.path.join(data, f"train{scale}.pickle"))
        times = {}
        hf = os.path.join(out, f"train{scale}.json")
        if os.path.exists(hf):
            for r in json.load(open(hf))["results"]:
                times[r["command"]] = r
        for line in open(os.path.join(out, name)):
            cmd, kb, rest = line.rstrip("\n").split("\t", 2)
            r = times.get(cmd)
            rows.append(
                {
                    "scale": scale,
                    "bytes": size,
                    "command": cmd,
                    "median": r["median"] if r else None,
                    "runs": len(r["times"]) if r else 0,
                    "rss_mb": int(kb) / 1024 if kb.isdigit() else None,
                    "note": "" if kb.isdigit() else f"{kb} {rest}",
                }
            )
    rows.sort(key=lambda r: (r["scale"], r["median"] if r["median"] is not None else 1e9))
    return rows


def main():
    data = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "bench/data")
    out = os.path.join(data, "results")
    rows = load(out, data)
    lines = [
        "| file | command | median s (runs) | peak RSS MiB | vs snapscan report |",
        "|---|---|---:|---:|---:|",
    ]
    by = {(r["scale"], r["command"]): r for r in rows}
    for r in rows:
        base = by.get((r["scale"], "snapscan-report"))
        ratio = ""
        if base and base["median"] and r["median"]:
            ratio = f"{r['median'] / base['median']:.1f}×"
        t = f"{r['median']:.3f} ({r['runs']})" if r["median"] is not None else r["note"]
        rss = f"{r['rss_mb']:.0f}" if r["rss_mb"] is not None else "-"
        lines.append(f"| {r['bytes'] / 1e6:.0f} MB | {r['command']} | {t} | {rss} | {ratio} |")

    # Targets, on the largest file measured (and the one ten times smaller for the scaling).
    scales = sorted({r["scale"] for r in rows})
    checks = []
    if scales:
        big = scales[-1]
        rep, load1, one = (by.get((big, c)) for c in
                           ("snapscan-report", "python-pickle-load", "snapscan-report-1thread"))
        if rep and load1 and rep["median"] and load1["median"]:
            x = load1["median"] / rep["median"]
            checks.append(("report ≥ 20× faster than pickle.load",
                           f"{load1['median']:.2f} s / {rep['median']:.2f} s = {x:.1f}×", x >= 20))
        if rep and rep["rss_mb"]:
            f = rep["rss_mb"] * 2**20 / rep["bytes"]
            checks.append(("report peak RSS ≤ 0.5 × file",
                           f"{rep['rss_mb']:.0f} MiB / {rep['bytes'] / 2**20:.0f} MiB = {f:.2f}×",
                           f <= 0.5))
        small = [s for s in scales if s * 10 == big]
        srep = by.get((small[0], "snapscan-report")) if small else None
        if rep and srep and rep["median"] and srep["median"]:
            per_big = rep["median"] / (rep["bytes"] / 1e6)
            per_small = srep["median"] / (srep["bytes"] / 1e6)
            x = per_big / per_small
            checks.append(("time per MB at the largest file within 1.3× of the file 10× smaller",
                           f"{per_big * 1e3:.2f} ms/MB vs {per_small * 1e3:.2f} ms/MB = {x:.2f}×",
                           x <= 1.3))
        if rep and one and rep["median"] and one["median"]:
            x = one["median"] / rep["median"]
            checks.append(("all threads ≥ 1.6× faster than one (RAYON_NUM_THREADS=1)",
                           f"{one['median']:.2f} s / {rep['median']:.2f} s = {x:.2f}×", x >= 1.6))
    if checks:
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        for what, fig, ok in checks:
            lines.append(f"| {what} | {fig} | {'yes' if ok else 'no'} |")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "summary.md"), "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
