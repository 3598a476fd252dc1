#!/usr/bin/env python3
"""Puts single-device snapshots side by side as the devices of one multi-GPU dump: source k
becomes device k (its segments, its `device_traces[0]` and its annotations), the way
`_dump_snapshot()` of a DataParallel or multi-GPU process lays them out. The top-level keys
other than these come from the first source. Object sharing inside each source is kept
(CPython's pickler memoizes shared objects again).

    python3 scripts/combine_devices.py OUT.pickle SRC0.pickle SRC1.pickle [SRC2.pickle ...]
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (safe loader: refuses pickles that import anything)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, sources = sys.argv[1], sys.argv[2:]
    combined = None
    for device, src in enumerate(sources):
        snap = reference.load(src)
        for seg in snap['segments']:
            seg['device'] = device
        for ann in snap.get('external_annotations', []):
            ann['device'] = device
        traces = snap['device_traces']
        trace = traces[0] if traces else []
        if combined is None:
            combined = snap
            combined['device_traces'] = [trace]
            continue
        combined['segments'].extend(snap['segments'])
        combined['device_traces'].append(trace)
        if 'external_annotations' in snap:
            combined.setdefault('external_annotations', []).extend(snap['external_annotations'])
    with open(out, 'wb') as f:
        pickle.dump(combined, f, protocol=4)


if __name__ == '__main__':
    main()
