#!/usr/bin/env python3
"""Tables and target checks from the results of bench/run.sh.

    python3 bench/summarize.py [DATA_DIR]        (default: bench/data)

Reads DATA_DIR/results/NAME.{json,rss,path} (hyperfine medians, peak RSS from /usr/bin/time -v,
the file measured) and writes DATA_DIR/results/summary.md: one table of every file and command
(real-shaped files first), then the speed targets, each with the figures it is computed from.
"""
import json
import os
import sys

# Files of about 100 MB, the 1 GB one and the 4 GB one (names written by bench/run.sh).
HUNDRED = ["notHanmin-x28", "MAGMA27-x200", "ZidongLiu-x50"]
GIGA, FOUR = "notHanmin-x280", "notHanmin-x1100"


def load(out):
    files = {}
    for name in sorted(os.listdir(out)):
        if not name.endswith(".rss"):
            continue
        stem = name[: -len(".rss")]
        path = open(os.path.join(out, stem + ".path")).read().strip()
        times = {}
        hf = os.path.join(out, stem + ".json")
        if os.path.exists(hf):
            for r in json.load(open(hf))["results"]:
                times[r["command"]] = r
        cmds = {}
        for line in open(os.path.join(out, name)):
            cmd, kb, rest = line.rstrip("\n").split("\t", 2)
            r = times.get(cmd)
            cmds[cmd] = {
                "median": r["median"] if r else None,
                "runs": len(r["times"]) if r else 0,
                "rss_mb": int(kb) / 1024 if kb.isdigit() else None,
                "note": "" if kb.isdigit() else f"{kb} {rest}",
            }
        files[stem] = {"bytes": os.path.getsize(path), "cmds": cmds}
    return files


def order(stem):
    real = not stem.startswith("snapgen")
    return (not real, stem.endswith((".zst", ".gz")), stem)


def main():
    data = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "bench/data")
    out = os.path.join(data, "results")
    files = load(out)
    lines = [
        "| file | MB | command | median s (runs) | peak RSS MiB | vs snapscan report |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for stem in sorted(files, key=order):
        f = files[stem]
        base = f["cmds"].get("snapscan-report", {}).get("median")
        for cmd, r in sorted(f["cmds"].items(), key=lambda kv: kv[1]["median"] or 1e9):
            ratio = f"{r['median'] / base:.1f}×" if base and r["median"] else ""
            t = f"{r['median']:.3f} ({r['runs']})" if r["median"] is not None else r["note"]
            rss = f"{r['rss_mb']:.0f}" if r["rss_mb"] is not None else "-"
            lines.append(f"| {stem} | {f['bytes'] / 1e6:.0f} | {cmd} | {t} | {rss} | {ratio} |")

    def fig(stem, cmd, key="median"):
        return files.get(stem, {}).get("cmds", {}).get(cmd, {}).get(key)

    checks = []

    def speed(stem, times):
        rep, load = fig(stem, "snapscan-report"), fig(stem, "python-pickle-load")
        if rep and load:
            x = load / rep
            checks.append((f"{stem}: report ≥ {times}× faster than pickle.load",
                           f"{load:.2f} s / {rep:.3f} s = {x:.1f}×", x >= times))

    def rss(stem):
        mb = fig(stem, "snapscan-report", "rss_mb")
        if mb:
            x = mb * 2**20 / files[stem]["bytes"]
            checks.append((f"{stem}: report peak RSS ≤ 0.5 × file",
                           f"{mb:.0f} MiB / {files[stem]['bytes'] / 2**20:.0f} MiB = {x:.2f}×",
                           x <= 0.5))

    for stem in HUNDRED:
        speed(stem, 15)
        rss(stem)
    speed(GIGA, 20)
    rss(GIGA)
    one, two = fig(GIGA, "snapscan-report-1thread"), fig(GIGA, "snapscan-report")
    if one and two:
        checks.append((f"{GIGA}: two threads ≥ 1.6× faster than one",
                       f"{one:.2f} s / {two:.2f} s = {one / two:.2f}×", one / two >= 1.6))
    big, small = fig(FOUR, "snapscan-report"), fig(HUNDRED[0], "snapscan-report")
    if big and small:
        per_big = big / (files[FOUR]["bytes"] / 1e6)
        per_small = small / (files[HUNDRED[0]]["bytes"] / 1e6)
        checks.append((f"{FOUR}: time per MB within 1.3× of {HUNDRED[0]}'s",
                       f"{per_big * 1e3:.2f} ms/MB vs {per_small * 1e3:.2f} ms/MB = "
                       f"{per_big / per_small:.2f}×", per_big / per_small <= 1.3))
        rss(FOUR)
    for ext, tool in ((".zst", "zstd-dc"), (".gz", "gzip-dc")):
        stem = GIGA + ext
        rep, dc, plain = (fig(stem, c) for c in ("snapscan-report", tool, "snapscan-report-plain"))
        if rep and dc and plain:
            checks.append((f"{stem}: report no slower than `{tool.replace('-', ' -')}` + report of the plain file",
                           f"{rep:.2f} s vs {dc:.2f} + {plain:.2f} = {dc + plain:.2f} s",
                           rep <= dc + plain))
    if checks:
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        for what, f, ok in checks:
            lines.append(f"| {what} | {f} | {'yes' if ok else 'no'} |")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "summary.md"), "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
