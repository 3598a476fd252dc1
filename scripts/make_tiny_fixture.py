#!/usr/bin/env python3
"""Cuts a small real-format snapshot out of a bigger one (for tests that decode a file
thousands of times). Keeps the object sharing of the original (CPython's pickler memoizes
shared frames lists again), so the result exercises MEMOIZE/BINGET like a full dump.

    python3 scripts/make_tiny_fixture.py fixtures/synth/train-oom-expandable.pickle \
        fixtures/synth/tiny.pickle --segments 4 --entries 40
"""
import argparse
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (safe loader: refuses pickles that import anything)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('src')
    ap.add_argument('dst')
    ap.add_argument('--segments', type=int, default=4)
    ap.add_argument('--entries', type=int, default=40)
    args = ap.parse_args()
    snap = reference.load(args.src)
    snap['segments'] = snap['segments'][:args.segments]
    snap['device_traces'] = [t[:args.entries] for t in snap['device_traces']]
    if 'external_annotations' in snap:
        snap['external_annotations'] = snap['external_annotations'][:4]
    with open(args.dst, 'wb') as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == '__main__':
    main()
