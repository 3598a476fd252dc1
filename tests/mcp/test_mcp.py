"""`snapscan mcp` through the official Python MCP client (PyPI `mcp`): every tool is listed and
called on real fixtures, and its answer agrees with the CLI's JSON; paths outside the roots,
a hostile pickle and malformed messages get errors while the server keeps serving.

Run by .ci/run in a throwaway venv; SNAPSCAN names the binary (default: `snapscan` on PATH).
"""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
SNAPSCAN = os.environ.get("SNAPSCAN") or shutil.which("snapscan")
OOM = "captured/oom_backward.pickle"
FRAG = "captured/fragmentation_oom.pickle"
TRAIN = "real/MAGMA27__assignment2-systems__memory_snapshot.pickle"
TWO_DEVICES = "synth/load-oom-2dev.pickle"
TOOLS = {
    "report", "peak", "live_at", "allocation", "segments_at", "why_oom", "diff",
    "explain_message", "check", "whatif", "query",
}


def cli(*args):
    out = subprocess.run([SNAPSCAN, *args], cwd=FIXTURES, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


async def session_run(body, roots=(str(FIXTURES),)):
    args = ["mcp"]
    for r in roots:
        args += ["--root", r]
    params = StdioServerParameters(command=SNAPSCAN, args=args, cwd=str(FIXTURES))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            return await body(s)


async def call(s, tool, **arguments):
    result = await s.call_tool(tool, arguments)
    text = result.content[0].text
    return result.is_error, (text if result.is_error else json.loads(text))


def run(body, **kw):
    return asyncio.run(session_run(body, **kw))


def test_every_tool_is_listed_with_a_schema_and_a_description():
    async def body(s):
        return (await s.list_tools()).tools

    tools = run(body)
    assert {t.name for t in tools} == TOOLS
    for t in tools:
        assert len(t.description) > 40, t.name
        assert t.input_schema["type"] == "object", t.name


def test_each_tool_agrees_with_the_cli():
    report = cli("report", "--format", "json", OOM)["files"][0]["devices"][0]
    train = cli("report", "--format", "json", TRAIN)["files"][0]["devices"][0]
    stats = cli("stats", "--format", "json", OOM)["files"][0]["devices"][0]["final"]
    diff = cli("diff", "--format", "json", TRAIN, OOM)
    log = next(p for p in sorted((FIXTURES / "oom-logs").glob("*.log")) if "not-oom" not in p.name)
    explain = cli("explain", "--format", "json", str(log))
    check = cli("check", "--max-peak", "1GiB", "--format", "json", OOM)
    whatif = cli("whatif", "--set", "expandable_segments:True", "--format", "json", FRAG)
    sql = "SELECT category, COUNT(*) AS n, SUM(requested_bytes) AS bytes FROM allocations GROUP BY 1 ORDER BY 1"
    query = cli("query", OOM, sql, "--format", "json")
    top = report["live_at_peak"][0]

    async def body(s):
        out = {}
        out["report"] = await call(s, "report", path=OOM, top=5)
        out["peak"] = await call(s, "peak", path=OOM)
        out["live_at"] = await call(s, "live_at", path=TRAIN, top=100)
        out["allocation"] = await call(s, "allocation", path=OOM, address=hex(top["address"]))
        out["segments_at"] = await call(s, "segments_at", path=OOM, event="dump")
        out["why_oom"] = await call(s, "why_oom", path=OOM)
        out["diff"] = await call(s, "diff", base=TRAIN, new=OOM, top=100)
        out["explain_message"] = await call(s, "explain_message", message=log.read_text())
        out["check"] = await call(s, "check", path=OOM, max_peak="1GiB")
        out["whatif"] = await call(s, "whatif", path=FRAG, set="expandable_segments:True")
        out["query"] = await call(s, "query", path=OOM, sql=sql)
        # The second call on the same file comes from the kept analysis.
        out["again"] = await call(s, "peak", path=OOM)
        # One device of a two-device file: its own headline, as the CLI's --device gives it.
        out["one_device"] = await call(s, "report", path=TWO_DEVICES, device=1)
        # The segments at the peak, page after page.
        pages, cursor = [], None
        while len(pages) < 200:
            more = {} if cursor is None else {"cursor": cursor}
            is_error, page = await call(s, "segments_at", path=OOM, top=3, **more)
            assert not is_error, page
            pages.append(page)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        out["pages"] = (False, pages)
        return out

    out = run(body)
    assert set(out) - {"again", "one_device", "pages"} == TOOLS
    for tool, (is_error, _) in out.items():
        assert not is_error, (tool, out[tool])

    one = cli("report", "--format", "json", "--device", "1", TWO_DEVICES)["files"][0]
    got = out["one_device"][1]["files"][0]
    assert got["summary"] == one["summary"] and got["summary"]["devices"] == 1
    assert [d["device"] for d in got["devices"]] == [1]

    r = out["report"][1]["files"][0]["devices"][0]
    assert r["peak"] == report["peak"]
    assert r["oom"][0]["verdict"] == report["oom"][0]["verdict"]
    assert r["live_at_peak_by_call_site"][:5] == report["live_at_peak_by_call_site"][:5]
    assert len(r["live_at_peak"]) == 5

    p = out["peak"][1]
    assert p["peak"] == report["peak"] and p["peak_reserved"] == report["peak_reserved"]
    assert p["categories_at_peak"] == report["categories_at_peak"]
    assert out["again"][1]["peak"] == report["peak"]

    live = out["live_at"][1]
    assert live["event"] == train["peak"]["event_index"]
    assert live["requested_bytes"] == train["peak"]["requested_bytes"]
    cli_sites = {s["call_site"]: (s["bytes"], s["count"]) for s in train["live_at_peak_by_call_site"]}
    for site in live["by_call_site"]:
        if site["call_site"] in cli_sites:
            assert (site["bytes"], site["count"]) == cli_sites[site["call_site"]], site

    lives = out["allocation"][1]["allocations"]
    this = [a for a in lives if a["alloc_event"] == top["alloc_event"]]
    assert this and this[0]["requested_bytes"] == top["requested_bytes"]
    assert this[0]["category"] == top["category"]

    seg = out["segments_at"][1]["totals"]
    assert seg["reserved_bytes"] == stats["reserved_bytes"]
    assert seg["segments"] == stats["segments"]
    # The pages at the peak hold every segment once, most free bytes first, then by address,
    # and their sums are the totals.
    pages = out["pages"][1]
    shown = [x for p in pages for x in p["segments"]]
    totals = pages[0]["totals"]
    assert pages[0]["event"] == report["peak"]["event_index"]
    assert len(shown) == totals["segments"] > 3
    assert len({x["address"] for x in shown}) == len(shown)
    keys = [(-x["free_bytes"], x["address"]) for x in shown]
    assert keys == sorted(keys)
    assert sum(x["free_bytes"] for x in shown) == totals["free_bytes"]
    assert sum(x["total_bytes"] for x in shown) == totals["reserved_bytes"]

    w = out["why_oom"][1]["oom"]
    assert (w["event_index"], w["requested_bytes"], w["verdict"]) == (
        report["oom"][0]["event_index"], report["oom"][0]["requested_bytes"], report["oom"][0]["verdict"])

    d = out["diff"][1]
    assert d["devices"][0]["peak"] == diff["devices"][0]["peak"]
    assert d["devices"][0]["call_sites_at_peak"][:3] == diff["devices"][0]["call_sites_at_peak"][:3]

    assert out["explain_message"][1]["messages"] == explain["messages"]
    assert out["check"][1]["passed"] == check["passed"] is False
    strip = lambda vs: [{k: v for k, v in x.items() if k != "path"} for x in vs]  # noqa: E731
    assert strip(out["check"][1]["violations"]) == strip(check["violations"])

    got = out["whatif"][1]["files"][0]["devices"][0]
    want = whatif["files"][0]["devices"][0]
    assert got["whatif"] == want["whatif"] and got["real"] == want["real"]

    assert out["query"][1]["rows"] == query["rows"]


def test_paths_outside_the_roots_hostile_files_and_bad_messages_get_errors_and_the_server_goes_on():
    with tempfile.TemporaryDirectory() as tmp:
        hostile = Path(tmp) / "hostile.pickle"
        # A pickle that would run code if unpickled, then cut short.
        hostile.write_bytes(b"\x80\x04\x95\x20\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R")

        async def body(s):
            out = []
            out.append(await call(s, "report", path=str(ROOT / "Cargo.toml")))
            out.append(await call(s, "report", path="../Cargo.toml"))
            out.append(await call(s, "report", path=str(hostile)))
            out.append(await call(s, "query", path=OOM, sql="DELETE FROM allocations"))
            out.append(await call(s, "live_at", path=OOM, event=10**9))
            out.append(await call(s, "peak", path=OOM))
            return out

        out = run(body, roots=(str(FIXTURES), tmp))
    (e1, m1), (e2, m2), (e3, m3), (e4, m4), (e5, m5), (e6, _) = out
    assert e1 and "outside" in m1
    assert e2 and "outside" in m2
    assert e3 and "hostile.pickle" in m3
    assert e4 and ("not authorized" in m4.lower() or "read" in m4.lower()), m4
    assert e5 and "past the trace" in m5
    assert not e6

    # Malformed JSON-RPC: an error reply for each bad line, and the next request is answered.
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    lines = [json.dumps(init), json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             "{not json", json.dumps({"id": 5, "method": 3}),
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})]
    proc = subprocess.Popen([SNAPSCAN, "mcp", "--root", str(FIXTURES)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        replies = []
        # Until the request after the bad lines is answered (the server kept serving).
        while not any(r.get("id") == 2 for r in replies):
            line = proc.stdout.readline()
            assert line, f"the server stopped: {replies}"
            replies.append(json.loads(line))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    codes = sorted(r["error"]["code"] for r in replies if "error" in r)
    assert codes == [-32700, -32600], replies
    assert any(r.get("id") == 5 for r in replies if "error" in r), replies
    assert "tools" in next(r for r in replies if r.get("id") == 2)["result"]
