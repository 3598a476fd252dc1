#!/usr/bin/env python3
"""The real path of snapscan.torch on a CUDA machine (the tests use a stand-in torch).

Needs torch with CUDA and the snapscan wheel installed in the same environment:

    pip install snapscan torch        # or: pip install . (from a clone) and torch
    python scripts/gpu_smoke.py [--dir DIR]

1. trains a tiny model for a few steps inside `snapscan.torch.record()` and checks that the
   snapshot exists and that `snapscan.report()` finds the training's peak in it;
2. installs `snapscan.torch.on_oom()` and allocates more than the device holds: checks that
   torch's OutOfMemoryError still reaches the caller, that `oom_rank{RANK}_{pid}_1.pickle` was
   written, that the report printed to stderr (by a thread, after the observer) names the
   OOM, and that `snapscan.report()` of the dump lists it; prints the observer's time and the
   snapshot's size.

Prints what it checked; exit status 0 when everything held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where the snapshots go (default: a temporary directory)")
    parser.add_argument("--device", type=int, default=0)
    opts = parser.parse_args()

    import torch

    import snapscan
    import snapscan.torch as st

    if not torch.cuda.is_available():
        print("gpu_smoke: CUDA is not available here; nothing was checked", file=sys.stderr)
        return 2
    device = torch.device("cuda", opts.device)
    torch.cuda.set_device(device)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, "
          f"snapscan {snapscan.__version__} ({snapscan.find_bin()})")
    out_dir = opts.dir or tempfile.mkdtemp(prefix="snapscan-gpu-smoke-")
    os.makedirs(out_dir, exist_ok=True)
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # 1. record() around a few training steps of a tiny model.
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with st.record(os.path.join(out_dir, "train.pickle")) as rec:
        for _ in range(3):
            x = torch.randn(256, 1024, device=device)
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
    check(os.path.isfile(rec.path), f"record() wrote {rec.path}")
    rep = snapscan.report(rec.path)
    devs = {d["device"]: d for d in rep["files"][0]["devices"]}
    dev = devs.get(opts.device)
    peak = dev["peak"]["requested_bytes"] if dev else 0
    check(peak > 0, f"report() of it: peak {peak} requested bytes on device {opts.device}")
    check(dev is not None and not dev["oom"], "no OOM in the training snapshot")

    # 2. a deliberate OOM under on_oom().
    hook = st.on_oom(out_dir)
    _free, total = torch.cuda.mem_get_info(device)
    stderr = io.StringIO()
    raised = None
    with contextlib.redirect_stderr(stderr):
        t = time.monotonic()
        try:
            torch.empty(int(total) * 2, dtype=torch.uint8, device=device)
        except torch.cuda.OutOfMemoryError as e:
            raised = e
        # What the OOM cost the failing call: the observer, which writes the snapshot.
        observer_s = time.monotonic() - t
        # The report is printed by a thread after the observer returned.
        reported = hook.wait(120)
    log = stderr.getvalue()
    sys.stderr.write(log)
    check(raised is not None, "torch.cuda.OutOfMemoryError reached the caller: "
          + (str(raised).splitlines()[0] if raised else "nothing was raised"))
    expected = os.path.join(out_dir, f"oom_rank{st.rank()}_{os.getpid()}_1.pickle")
    check(os.path.isfile(expected), f"on_oom() wrote {expected}")
    check(reported, "the report finished")
    if os.path.isfile(expected):
        print(f"the observer took {observer_s:.3f} s; the snapshot is "
              f"{os.path.getsize(expected):,} bytes")
    check("OUT OF MEMORY" in log, "the report on stderr names the OOM")
    check(hook.paths == [expected], f"hook.paths == {hook.paths}")
    if os.path.isfile(expected):
        rep = snapscan.report(expected)
        ooms = [o for d in rep["files"][0]["devices"] for o in d["oom"]]
        check(bool(ooms), f"report() of the OOM dump lists {len(ooms)} OOM event(s)")
    hook.disable()

    print(f"snapshots in {out_dir}")
    print("gpu_smoke: " + ("all checks held" if not failures else f"{len(failures)} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
