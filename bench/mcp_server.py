"""`snapscan mcp` on one snapshot: the first call (load and analysis), later calls on the same
file, and the server's peak RSS against its budget, beside `snapscan report`'s time.

    python3 bench/mcp_server.py [SNAPSHOT] [--budget 4GiB]     (needs PyPI `mcp`; default snapshot:
                                                       bench/data/notHanmin-x280.pickle)
"""

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def server_pid(binary):
    out = subprocess.run(["pgrep", "-n", "-f", f"{binary} mcp"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


async def main(args):
    snap = str(Path(args.snapshot).resolve())
    binary = str(ROOT / "target/release/snapscan")
    t = time.perf_counter()
    subprocess.run([binary, "report", "--format", "json", snap, "-o", "/dev/null"], check=True)
    report_s = time.perf_counter() - t
    print(f"report: {report_s:.2f} s")
    params = StdioServerParameters(command=binary, args=["mcp", "--root", str(Path(snap).parent),
                                                         "--memory-budget", args.budget])
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            pid = server_pid(binary)
            t = time.perf_counter()
            res = await s.call_tool("peak", {"path": snap})
            first = time.perf_counter() - t
            assert not res.is_error, res.content[0].text
            print(f"first call (peak): {first:.2f} s = {first / report_s:.2f}x the report")
            calls = [("peak", {}), ("report", {"top": 10}), ("live_at", {}), ("why_oom", {}),
                     ("segments_at", {}), ("live_at", {"event": 1000}), ("allocation", {"event": 1000}), ("check", {"max_peak": "1TiB"})]
            for name, extra in calls:
                times = []
                for _ in range(3):
                    t = time.perf_counter()
                    res = await s.call_tool(name, {"path": snap, **extra})
                    times.append(time.perf_counter() - t)
                print(f"later {name} {extra}: {min(times) * 1000:.0f}-{max(times) * 1000:.0f} ms"
                      f"{' (tool error: ' + res.content[0].text[:60] + ')' if res.is_error else ''}")
            # A new moment each call: nothing of the last layout can be reused.
            times = []
            report = json.loads((await s.call_tool("report", {"path": snap, "top": 1})).content[0].text)
            n = max(2, report["files"][0]["devices"][0]["window"]["events"])
            for k in range(1, 9):
                t = time.perf_counter()
                res = await s.call_tool("segments_at", {"path": snap, "event": str(k * n // 9)})
                times.append(time.perf_counter() - t)
                assert not res.is_error, res.content[0].text
            print(f"segments_at, eight new moments: {min(times) * 1000:.0f}-{max(times) * 1000:.0f} ms")
            print(f"server peak RSS: {peak_rss_kb(pid) / 1024:.0f} MB (budget {args.budget}; "
                  f"snapshot {os.path.getsize(snap) / 2**20:.0f} MB)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("snapshot", nargs="?", default=str(ROOT / "bench/data/notHanmin-x280.pickle"))
    p.add_argument("--budget", default="4GiB")
    asyncio.run(main(p.parse_args()))
