"""Times `snapscan view` pages that open on a section other than one panel, in headless
chromium (Debian's, driven by playwright): a job's overview, a compare page.

* paint: from navigation start to the first paint of what the page opens on
  (`window.snapscan.paintMs`: the overview of a big job, both panels of a compare page);
* ready: until the page's script has finished (every chunk inflated, the page built);
* open: for a job, the time from a click on the first overview row to its panel drawn.

    python3 bench/view_pages.py PAGE.html [runs]
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
    out = {
        "paint_ms": page.evaluate("window.snapscan.paintMs"),
        "ready_ms": page.evaluate("window.snapscan.loadMs") or None,
        "nav_to_load_ms": page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"),
    }
    if page.evaluate("!!(window.snapscan.overview && window.snapscan.overview())"):
        out["open_ms"] = page.evaluate(
            """() => { const t = performance.now();
                 document.querySelector('.ov-row').click();
                 return performance.now() - t; }"""
        )
    assert not errors, errors
    page.close()
    return out


def main():
    html, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        results = [one(b, "file://" + html) for _ in range(runs)]
        b.close()
    summary = {"runs": runs}
    for key in results[0]:
        values = [r[key] for r in results if r.get(key) is not None]
        if values:
            summary[key + "_median"] = round(statistics.median(values))
            summary[key] = [round(v) for v in values]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
