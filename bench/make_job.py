"""Makes a job of rank files from one snapshot, for the job page's benchmark and screenshots:
`rank0.pickle` … copies of SNAPSHOT, with rank BIG's every address and size times 2 (the same
allocator history at twice the scale, so its layout stays valid).

    python3 bench/make_job.py SNAPSHOT RANKS OUT_DIR [BIG]     (BIG default: RANKS // 3)
"""

import os
import pickle
import shutil
import sys

SIZES = {"address", "total_size", "allocated_size", "active_size", "requested_size", "size", "addr"}


def scaled(o, factor):
    if isinstance(o, dict):
        return {k: (v * factor if k in SIZES and isinstance(v, int) else scaled(v, factor)) for k, v in o.items()}
    if isinstance(o, list):
        return [scaled(x, factor) for x in o]
    return o


def main():
    src, ranks, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    big = int(sys.argv[4]) if len(sys.argv) > 4 else ranks // 3
    os.makedirs(out, exist_ok=True)
    with open(src, "rb") as f:
        snap = pickle.load(f)
    for r in range(ranks):
        path = os.path.join(out, f"rank{r}.pickle")
        if r == big:
            with open(path, "wb") as f:
                pickle.dump(scaled(snap, 2), f, protocol=4)
        else:
            shutil.copyfile(src, path)


if __name__ == "__main__":
    main()
