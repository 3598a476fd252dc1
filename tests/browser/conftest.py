"""Browser tests of `snapscan view`: the pages are opened in Debian's chromium, driven by
playwright (launched with ``executable_path``: playwright's own browser download is not used).

The snapscan binary is the one on PATH (the wheel's, in CI), else ``SNAPSCAN`` or the debug build.
Without a chromium the tests are skipped, unless ``SNAPSCAN_REQUIRE_BROWSER=1`` (set by .ci/run).
Screenshots go to ``SNAPSCAN_SCREENSHOTS`` when it is set.
"""

import json
import os
import pickle
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "fixtures")


def fixture(*parts):
    return os.path.join(FIXTURES, *parts)


def snapscan_exe():
    exe = os.environ.get("SNAPSCAN") or shutil.which("snapscan")
    if not exe:
        debug = os.path.join(REPO, "target", "debug", "snapscan")
        exe = debug if os.path.exists(debug) else None
    assert exe, "no snapscan: put it on PATH or set SNAPSCAN"
    return exe


def chromium_path():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def run(*args):
    return subprocess.run([snapscan_exe(), *args], check=True, capture_output=True, text=True)


def replicate(src, reps, out):
    """A real-shaped bigger snapshot: the device-0 trace of `src` repeated `reps` times, each copy
    in its own address range (with a copy of the segments of the dump) and later in time, the
    frame lists shared between copies as a long capture shares them."""
    with open(src, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    times = [e["time_us"] for e in trace if e.get("time_us")]
    span = (max(times) - min(times) + 1000) if times else 0
    segments = [s for s in snap["segments"] if s.get("device", 0) == 0]
    others = [s for s in snap["segments"] if s.get("device", 0) != 0]
    new_trace, new_segments = [], []
    for r in range(reps):
        off = r << 40
        for e in trace:
            e = dict(e)
            if e.get("action") not in ("oom", "snapshot") and "addr" in e:
                e["addr"] += off
            if e.get("time_us"):
                e["time_us"] += r * span
            new_trace.append(e)
        for s in segments:
            s = dict(s)
            s["address"] += off
            s["blocks"] = [dict(b, address=b["address"] + off) for b in s["blocks"]]
            new_segments.append(s)
    snap["device_traces"] = [new_trace] + snap["device_traces"][1:]
    snap["segments"] = new_segments + others
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return out


def format_bytes(b):
    """units.rs format_bytes."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    v, u = float(abs(b)), 0
    while v >= 1024 and u + 1 < len(units):
        v /= 1024
        u += 1
    return ("-" if b < 0 else "") + f"{v:.1f}{units[u]}"


# name -> (how to make the snapshot, has an OOM)
CASES = {
    "fixture-train-oom-forward": (lambda d: fixture("synth", "train-oom-forward.pickle"), True),
    # A real OOM whose largest usable hole the allocator model decides (22.9 MiB; the
    # request-rounded estimate said 48.0 MiB): the page must show the report's figure.
    "captured-oom-backward": (lambda d: fixture("captured", "oom_backward.pickle"), True),
    "real-notHanmin": (
        lambda d: fixture("real", "notHanmin__assignment2-systems__memory_snapshot.pickle"),
        False,
    ),
    "replica-notHanmin-x4": (
        lambda d: replicate(
            fixture("real", "notHanmin__assignment2-systems__memory_snapshot.pickle"),
            4,
            os.path.join(d, "notHanmin-x4.pickle"),
        ),
        False,
    ),
    "replica-train-oom-forward-x3": (
        lambda d: replicate(
            fixture("synth", "train-oom-forward.pickle"), 3, os.path.join(d, "oom-x3.pickle")
        ),
        True,
    ),
}


class Case:
    def __init__(self, name, snapshot, html, report, oom):
        self.name, self.snapshot, self.html, self.oom = name, snapshot, html, oom
        self.report = report
        self.device = report["files"][0]["devices"][0]


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    return str(tmp_path_factory.mktemp("view"))


@pytest.fixture(scope="session", params=sorted(CASES))
def case(request, work):
    make, oom = CASES[request.param]
    snapshot = make(work)
    html = os.path.join(work, request.param + ".html")
    run("view", snapshot, "-o", html)
    report = json.loads(run("report", "--format", "json", "--full", snapshot).stdout)
    return Case(request.param, snapshot, html, report, oom)


@pytest.fixture(scope="session")
def browser():
    exe = chromium_path()
    if not exe:
        if os.environ.get("SNAPSCAN_REQUIRE_BROWSER") == "1":
            pytest.fail("no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


class Opened:
    """A page of a view file, with everything it asked the network for and every console
    message and uncaught error."""

    def __init__(self, browser, html, width=1400, height=1000):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.requests, self.console, self.errors = [], [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = "file://" + html
        self.page.goto(self.url)
        assert self.page.evaluate("window.snapscan.ready") is True, self.errors or self.console

    def api(self, expr):
        return self.page.evaluate("(() => { const p = window.snapscan.panel(); return " + expr + "; })()")

    def screenshot(self, name, full_page=False):
        out = os.environ.get("SNAPSCAN_SCREENSHOTS")
        if out:
            os.makedirs(out, exist_ok=True)
            self.page.screenshot(path=os.path.join(out, name + ".png"), full_page=full_page)

    def close(self):
        self.page.close()


@pytest.fixture
def opened(browser, case):
    o = Opened(browser, case.html)
    yield o
    o.close()
