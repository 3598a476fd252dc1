#!/usr/bin/env python3
"""Digest of the plain-data tree of each snapshot, decoded by CPython's own unpickler.

An independent check of snapscan's pickle reader: both sides serialise the decoded tree as
canonical JSON (sorted keys, no spaces, tuples and sets as lists, UTF-8 not escaped) and hash
the text with 64-bit FNV-1a. The loader is scripts/reference.py's safe one (refuses pickles that
import or call anything; never runs code).

    python3 scripts/canonical_digest.py fixtures/real/*.pickle fixtures/captured/*.pickle \
        fixtures/synth/*.pickle \
        fixtures/synth/*.gz > tests/expected/canonical.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (the safe loader)

FNV_OFFSET = 0xcbf29ce484222325
FNV_PRIME = 0x100000001b3


def fnv1a64(data):
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def plain(obj):
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((plain(v) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, (bytes, bytearray)):
        return list(obj)
    return obj


def main(paths):
    out = {}
    for path in sorted(paths):
        text = json.dumps(plain(reference.load(path)), sort_keys=True, separators=(',', ':'),
                          ensure_ascii=False).encode('utf-8')
        out[path] = {'bytes': len(text), 'fnv1a64': '%016x' % fnv1a64(text)}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write('\n')


if __name__ == '__main__':
    main(sys.argv[1:])
