#!/usr/bin/env python3
"""Gives the C++ frames of a `stacks="all"` snapshot the line PyTorch writes when its unwinder
could not resolve one: 2**64 - 1 (a 9-byte LONG1 in the pickle, outside int64). Python frames
(filenames ending in .py) keep their lines; nothing else changes, so the source's truth file
still holds.

    python3 scripts/make_unresolved_lines_fixture.py fixtures/synth/truncated-stacks-all.pickle \
        fixtures/synth/stacks-all-unresolved-lines.pickle
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (safe loader: refuses pickles that import anything)

UNRESOLVED = 2**64 - 1


def frame_lists(snap):
    for seg in snap['segments']:
        yield seg.get('frames') or []
        for block in seg.get('blocks', []):
            yield block.get('frames') or []
    for trace in snap['device_traces']:
        for entry in trace:
            yield entry.get('frames') or []


def main():
    src, dst = sys.argv[1], sys.argv[2]
    snap = reference.load(src)
    changed = set()
    for frames in frame_lists(snap):
        for frame in frames:
            if not frame['filename'].endswith('.py') and id(frame) not in changed:
                frame['line'] = UNRESOLVED
                changed.add(id(frame))
    if not changed:
        sys.exit(f'{src}: no C++ frames to change')
    with open(dst, 'wb') as f:
        pickle.dump(snap, f, protocol=4)
    print(f'{dst}: {len(changed)} C++ frame dicts now have line {UNRESOLVED}')


if __name__ == '__main__':
    main()
