#!/usr/bin/env python3
"""Cross-checks `snapscan report` against the simulator's ground truth on many seeds and scales.

For each scenario × seed × scale it writes a snapshot with the simulator (../shared/tools/snapgen.py, or $SNAPGEN) into a temporary
directory, runs `snapscan report --format json` on it, and compares, per device: the peak
(requested bytes and event), the live set at the peak (address + birth event), reserved peak,
allocations before the window, every OOM's figures and verdict, the phase of the peak and of each
OOM, and the bytes per category at the peak (within 5 % of the peak). Exit status 1 on any
mismatch.

    cargo build --release
    python3 scripts/check_truth.py --seeds 1-6 --scales 1,2
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The simulator is run from the maintainers' shared tools, next to the checkout.
SNAPGEN = os.environ.get('SNAPGEN', os.path.join(HERE, '..', '..', 'shared', 'tools', 'snapgen.py'))
SCENARIOS = ['train', 'train-oom', 'fragmented', 'eval-peak', 'load-oom', 'multi-stream',
             'graphs', 'truncated']
OOM_KEYS = ['event_index', 'requested_bytes', 'device_free_bytes', 'reserved_bytes',
            'allocated_bytes', 'reserved_unallocated_bytes', 'largest_free_block_bytes', 'verdict',
            'phase']


def parse_range(text):
    out = []
    for part in text.split(','):
        if '-' in part:
            a, b = part.split('-')
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def compare(truth, report, stacks):
    problems = []
    for dev in report['files'][0]['devices']:
        t = truth['devices'][str(dev['device'])]
        d = 'device %d: ' % dev['device']
        if dev['peak']['requested_bytes'] != t['peak_requested_bytes']:
            problems.append(d + 'peak %s != %s' % (dev['peak']['requested_bytes'],
                                                   t['peak_requested_bytes']))
        if dev['peak']['event_index'] != t['peak_requested_event']:
            problems.append(d + 'peak event %s != %s' % (dev['peak']['event_index'],
                                                         t['peak_requested_event']))
        if dev['peak_reserved']['bytes'] != t['peak_reserved_bytes']:
            problems.append(d + 'reserved peak differs')
        if dev['window']['allocations_before_window'] != t['allocations_before_window']:
            problems.append(d + 'allocations before window differ')
        ours = sorted((a['address'], a['alloc_event']) for a in dev['live_at_peak'])
        theirs = sorted((a['address'], a['alloc_event']) for a in t['live_at_peak'])
        if ours != theirs:
            problems.append(d + 'live set differs (%d vs %d)' % (len(ours), len(theirs)))
        if len(dev['oom']) != len(t['oom']):
            problems.append(d + 'oom count %d != %d' % (len(dev['oom']), len(t['oom'])))
        for o, w in zip(dev['oom'], t['oom']):
            for k in OOM_KEYS:
                if k == 'phase' and stacks == 'none':
                    continue
                if o[k] != w[k]:
                    problems.append(d + 'oom %s: %s != %s' % (k, o[k], w[k]))
        if stacks == 'none':
            continue  # no frames and few annotations: phases/categories are honestly unknown
        if dev['peak']['phase'] != t['peak_requested_phase']:
            problems.append(d + 'peak phase %s != %s' % (dev['peak']['phase'],
                                                         t['peak_requested_phase']))
        want = {}
        for a in t['live_at_peak']:
            want[a['category']] = want.get(a['category'], 0) + a['requested_bytes']
        total = max(1, dev['peak']['requested_bytes'])
        for name, got in dev['categories_at_peak'].items():
            err = abs(got - want.get(name, 0)) / total
            if err > 0.05:
                problems.append(d + 'category %s off by %.1f%% of the peak' % (name, 100 * err))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--snapscan', default=os.path.join(HERE, '..', 'target', 'release', 'snapscan'))
    ap.add_argument('--seeds', default='1-4')
    ap.add_argument('--scales', default='1')
    ap.add_argument('--scenarios', default=','.join(SCENARIOS))
    ap.add_argument('--stacks', default='python')
    args = ap.parse_args()
    failures = 0
    runs = 0
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenarios.split(','):
            for scale in parse_range(args.scales):
                for seed in parse_range(args.seeds):
                    pk = os.path.join(tmp, 'snap.pickle')
                    tj = os.path.join(tmp, 'truth.json')
                    subprocess.run([sys.executable, SNAPGEN, '--scenario', scenario, '--seed',
                                    str(seed), '--scale', str(scale), '--stacks', args.stacks,
                                    '--out', pk, '--truth', tj], check=True,
                                   stdout=subprocess.DEVNULL)
                    out = subprocess.run([args.snapscan, 'report', '--format', 'json', '--full', pk],
                                         check=True, capture_output=True).stdout
                    with open(tj) as f:
                        truth = json.load(f)
                    problems = compare(truth, json.loads(out), args.stacks)
                    runs += 1
                    status = 'ok' if not problems else 'MISMATCH'
                    print('%-12s scale %-3d seed %-3d %s' % (scenario, scale, seed, status))
                    for p in problems:
                        print('    ' + p)
                    failures += bool(problems)
    print('%d runs, %d with mismatches' % (runs, failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
