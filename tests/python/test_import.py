"""`import snapscan` is cheap and imports neither torch nor the frameworks."""

import os
import re
import subprocess
import sys

from conftest import FAKE_TORCH

PROBE = (
    "import sys, snapscan, snapscan.torch; "
    "heavy = [m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers', 'numpy') "
    "if m in sys.modules]; "
    "print(','.join(heavy))"
)


def test_import_does_not_import_torch():
    # With a torch importable (the stand-in) on the path, importing snapscan and
    # snapscan.torch must still leave it alone.
    env = dict(os.environ, PYTHONPATH=FAKE_TORCH)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE,
                         check=True).stdout.decode().strip()
    assert out == ""


def test_import_takes_under_50_ms():
    # Cumulative import time of the package as Python measures it (-X importtime), best of 5.
    best = None
    for _ in range(5):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import snapscan"],
                             stderr=subprocess.PIPE, check=True).stderr.decode()
        m = re.search(r"^import time:\s+\d+ \|\s+(\d+) \| snapscan$", err, re.M)
        assert m, err
        us = int(m.group(1))
        best = us if best is None else min(best, us)
    assert best < 50_000, f"import snapscan took {best} us"


def _best_wall(code, runs=7):
    import time

    best = None
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best


def test_python_c_import_adds_under_50_ms_to_startup():
    # `python -c "import snapscan"` against `python -c pass`: what the import adds to a run.
    extra = _best_wall("import snapscan") - _best_wall("pass")
    assert extra < 0.050, f"import snapscan added {extra * 1000:.1f} ms"
