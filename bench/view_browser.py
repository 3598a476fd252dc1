"""Times a `snapscan view` page in headless chromium (Debian's, driven by playwright):

* paint: from navigation start to the end of the timeline's first draw (`window.snapscan.paintMs`);
* zoom: the draw time of wheel zoom steps (in, around the peak, then out again), median and max;
* pan: the draw time of arrow-key pan steps (a fifth of the view each) once zoomed in 8 notches;
* scrub: the time to lay out and draw the segments at the peak, at the OOM and one event on.

    python3 bench/view_browser.py view.html [runs]
"""

import json
import shutil
import statistics
import sys

from playwright.sync_api import sync_playwright


def one(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    assert page.evaluate("window.snapscan.ready"), errors
    paint = page.evaluate("window.snapscan.paintMs")
    r = page.evaluate("window.snapscan.panel().canvasRect()")
    peak = page.evaluate("window.snapscan.panel().peak()")
    page.mouse.move(peak["x"], r["y"] + r["top"] + r["plot"] / 2)
    steps, pans = [], []
    for i, dy in enumerate([-240] * 8 + [240] * 8):
        page.mouse.wheel(0, dy)
        page.wait_for_timeout(50)
        steps.append(page.evaluate("window.snapscan.panel().view().drawMs"))
        if i == 7:
            # Zoomed in: pan by a fifth of the view, left then right (the arrow keys).
            page.focus("canvas.timeline")
            for key in ["ArrowLeft"] * 4 + ["ArrowRight"] * 4:
                page.keyboard.press(key)
                page.wait_for_timeout(50)
                pans.append(page.evaluate("window.snapscan.panel().view().drawMs"))
    scrub = page.evaluate(
        """() => {
          const p = window.snapscan.panel()._panel, out = [];
          const at = [p.peakState, p.peakState + 1].concat(p.dev.h.ooms.slice(0, 1).map((o) => o.event + 1));
          for (const k of at) { const t = performance.now(); p.setScrub(k); out.push(performance.now() - t); }
          return out;
        }"""
    )
    page.close()
    return {"paint_ms": paint, "zoom_ms": steps, "pan_ms": pans, "scrub_ms": scrub}


def main():
    html, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        results = [one(b, "file://" + html) for _ in range(runs)]
        b.close()
    paints = [r["paint_ms"] for r in results]
    zooms = [z for r in results for z in r["zoom_ms"]]
    scrubs = [s for r in results for s in r["scrub_ms"]]
    pans = [s for r in results for s in r["pan_ms"]]
    print(json.dumps({
        "runs": runs,
        "paint_ms_median": round(statistics.median(paints)),
        "paint_ms": [round(x) for x in paints],
        "zoom_step_ms_median": round(statistics.median(zooms), 1),
        "zoom_step_ms_max": round(max(zooms), 1),
        "zoom_steps_over_100ms": sum(z > 100 for z in zooms),
        "zoom_steps": len(zooms),
        "zoom_ms_first_run": [round(z) for z in results[0]["zoom_ms"]],
        "pan_step_ms_median": round(statistics.median(pans), 1),
        "pan_step_ms_max": round(max(pans), 1),
        "pan_steps_over_100ms": sum(p > 100 for p in pans),
        "pan_steps": len(pans),
        "scrub_ms_median": round(statistics.median(scrubs), 1),
        "scrub_ms_max": round(max(scrubs), 1),
    }, indent=1))


if __name__ == "__main__":
    main()
