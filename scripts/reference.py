#!/usr/bin/env python3
"""Independent reference figures for PyTorch CUDA memory snapshots (stdlib only, Python 3.8+).

Produces the expected values that snapscan's tests compare against. It deliberately shares no
code with snapscan and re-implements only what PyTorch's own tools compute:

* `python -m torch.cuda._memory_viz stats` (function `segsum` in torch/cuda/_memory_viz.py):
  segment count, total_reserved (sum of total_size), total_allocated (sum of the requested size of
  `active_allocated` blocks), and the free bytes split into internal (block size - requested size
  of `active_allocated` blocks) and external (size of every other block, `active_pending_free`
  included). The requested size of a block follows `_block_extra` exactly:
    - block has a `frames` key (torch >= 2.1 layout): b["requested_size"];
    - otherwise (torch <= 2.0 layout): b["history"][0]["real_size"] if `history` is present,
      else b.get("requested_size", b["size"])   (a present-but-zero requested_size stays 0).
* The peak of MemoryViz's "Active Memory Timeline" (`process_alloc_data(snapshot, device,
  plot_segments=false, max_entries=15000)` in torch/utils/viz/MemoryViz.js after
  `annotate_snapshot`):
    - a `free_completed` directly following a `free_requested` of the same address (in the
      annotated trace of that device) is collapsed into one `free` event; FREES = {free,
      free_completed}; a lone `free_requested` is ignored;
    - a free of an address with no open `alloc` creates a pre-existing element (size = the
      entry's size); `active_allocated` blocks of the device whose address has no open alloc are
      pre-existing "ghost" elements (size = the block's requested size as MemoryViz sees it:
      b["requested_size"], or for legacy blocks `requested_size || history[0].real_size` /
      `requested_size || size`);
    - the pre-existing list is reversed; if there are no actions, its last element becomes the
      only action;
    - viewer_peak_requested_bytes = MemoryViz's `max_size` with the default max_entries=15000
      (the y-axis top: sampled only after an action on a *drawn* element, so the level before the
      first action is never counted, and with more elements than max_entries the actions on
      summarized elements are not sampled either; 0 without actions);
    - peak_requested_bytes = max(initial level, max of `max_at_time`), the true maximum; it
      counts drawn and summarized bytes at every step and so does not depend on max_entries.
* Counts of blocks by state and of raw trace entries by action.

Devices: every `segment["device"]` plus every index of `device_traces` whose list is non-empty
(the device choices MemoryViz offers). "total" covers all segments and all trace entries of the
file (what `_memory_viz stats` prints; no peaks, which are per device).

Inputs: pickle (protocol 0-5), optionally gzip- (1f 8b) or zstd- (28 b5 2f fd) compressed,
detected by magic bytes, or a JSON file of the same structure; a bare list at top level is the
segment list of `torch.cuda.memory_snapshot()`. zstd needs `compression.zstd` (Python 3.14+) or
the `zstandard` module; without either such a file is skipped with a note on stderr.

Safety: a pickle is untrusted data. Before loading, every opcode is checked with
pickletools.genops and a pickle that could import or call anything is refused (exit status 2);
loading then uses an Unpickler whose find_class always raises.

Usage: python3 scripts/reference.py FILE...   -> one JSON object on stdout:
  {"files": [{"path": FILE, "devices": [{"device": 0, ...stats, "viewer_peak_requested_bytes",
   "peak_requested_bytes"}], "total": {...stats}}]}
Files are listed sorted by path (code-point order), keys sorted, indent 1: the output is a pure
function of the inputs.
"""
import gzip
import io
import json
import pickle
import pickletools
import sys

FORBIDDEN_OPCODES = frozenset({
    'GLOBAL', 'STACK_GLOBAL', 'REDUCE', 'BUILD', 'INST', 'OBJ', 'NEWOBJ', 'NEWOBJ_EX',
    'EXT1', 'EXT2', 'EXT4', 'PERSID', 'BINPERSID',
})
GZIP_MAGIC = b'\x1f\x8b'
ZSTD_MAGIC = b'\x28\xb5\x2f\xfd'
MAX_ENTRIES = 15000          # MemoryViz default (its "Detail" slider); see active_timeline_peaks


class Refused(Exception):
    """The input is not a snapshot we are willing to load (exit status 2)."""


class Skipped(Exception):
    """The input cannot be read in this Python (e.g. zstd without a zstd module)."""


class NoClassUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError('refusing to import %s.%s' % (module, name))

    def persistent_load(self, pid):
        raise pickle.UnpicklingError('refusing persistent id %r' % (pid,))


def zstd_decompress(data):
    try:
        from compression import zstd          # Python 3.14+
        return zstd.decompress(data)
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise Skipped('zstd-compressed and this Python has no zstd module')
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def decompress(data):
    if data[:2] == GZIP_MAGIC:
        return gzip.decompress(data)
    if data[:4] == ZSTD_MAGIC:
        return zstd_decompress(data)
    return data


def check_opcodes(data):
    try:
        for opcode, _arg, pos in pickletools.genops(io.BytesIO(data)):
            if opcode.name in FORBIDDEN_OPCODES:
                raise Refused('pickle opcode %s at byte %d (a snapshot never needs it)'
                              % (opcode.name, pos))
    except Refused:
        raise
    except Exception as exc:                  # malformed stream
        raise Refused('not a readable pickle: %s' % exc)


def load(path):
    with open(path, 'rb') as f:
        data = f.read()
    data = decompress(data)
    head = data.lstrip()[:1]
    if head in (b'{', b'['):                  # neither is a pickle opcode: JSON form
        try:
            return json.loads(data.decode('utf-8'))
        except ValueError as exc:
            raise Refused('not valid JSON: %s' % exc)
    check_opcodes(data)
    try:
        return NoClassUnpickler(io.BytesIO(data)).load()
    except Exception as exc:
        raise Refused('unpickling failed: %s' % exc)


def normalize(obj):
    """Top-level dict, or a bare segment list (pre-2.0 / torch.cuda.memory_snapshot())."""
    if isinstance(obj, list):
        return obj, []
    if isinstance(obj, dict) and isinstance(obj.get('segments'), list):
        traces = obj.get('device_traces') or []
        return obj['segments'], traces
    raise Refused('top level is neither a snapshot dict nor a segment list')


# ------------------------------------------------------------------------------------------
# `_memory_viz stats` (segsum)
# ------------------------------------------------------------------------------------------
def segsum_requested(b):
    """`_block_extra(b)[1]` of torch/cuda/_memory_viz.py."""
    if 'frames' not in b:
        if 'history' in b:
            return b['history'][0]['real_size']
        return b.get('requested_size', b['size'])
    return b['requested_size']


def stats(segments, traces):
    reserved = allocated = internal = external = 0
    by_state = {}
    for seg in segments:
        reserved += seg['total_size']
        seg_total = 0
        for b in seg['blocks']:
            by_state[b['state']] = by_state.get(b['state'], 0) + 1
            if b['state'] == 'active_allocated':
                req = segsum_requested(b)
                allocated += req
                internal += b['size'] - req
            else:
                external += b['size']
            seg_total += b['size']
        if seg_total != seg['total_size']:    # segsum asserts the same
            raise Refused('segment at %#x: blocks sum to %d, total_size is %d'
                          % (seg['address'], seg_total, seg['total_size']))
    by_action = {}
    for trace in traces:
        for e in trace:
            by_action[e['action']] = by_action.get(e['action'], 0) + 1
    return {
        'segments': len(segments),
        'reserved_bytes': reserved,
        'requested_bytes': allocated,
        'free_internal_bytes': internal,
        'free_external_bytes': external,
        'blocks_by_state': by_state,
        'trace_entries_by_action': by_action,
    }


# ------------------------------------------------------------------------------------------
# MemoryViz "Active Memory Timeline"
# ------------------------------------------------------------------------------------------
def annotate_trace(trace):
    """annotate_snapshot for one device: collapse free_requested+free_completed into 'free'.
    Returns a list of (action, addr, size); the input is not modified."""
    out = []
    for e in trace:
        action = e['action']
        if action == 'free_completed' and out:
            prev = out[-1]
            if prev[0] == 'free_requested' and prev[1] == e['addr']:
                out[-1] = ('free', prev[1], prev[2])
                continue
        out.append((action, e.get('addr'), e['size']))
    return out


def viewer_block_size(b):
    """Block requested size after annotate_snapshot (JS `||` semantics)."""
    if 'frames' not in b:
        if 'history' in b and b['history']:
            return b.get('requested_size') or b['history'][0]['real_size']
        return b.get('requested_size') or b['size']
    return b['requested_size']


def active_timeline_peaks(segments, trace, device, max_entries=MAX_ENTRIES):
    """(max_size, true peak) of process_alloc_data(device, plot_segments=false, max_entries).

    Only the largest max_entries elements are "drawn"; the rest go to the summarized band. Like
    MemoryViz, max_size is updated after actions on drawn elements only (the summarized branch
    `continue`s before the update), whereas max_at_time gets every step."""
    elements = []          # sizes
    initially = []
    actions = []
    addr_to_alloc = {}
    for action, addr, size in annotate_trace(trace):
        if action == 'alloc':
            elements.append(size)
            addr_to_alloc[addr] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif action in ('free', 'free_completed'):
            if addr in addr_to_alloc:
                actions.append(addr_to_alloc.pop(addr))
            else:
                elements.append(size)
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in segments:
        if seg['device'] != device:
            continue
        addr = seg['address']
        for b in seg['blocks']:
            if b['state'] == 'active_allocated' and addr not in addr_to_alloc:
                elements.append(viewer_block_size(b))
                initially.append(len(elements) - 1)
            addr += b['size']
    initially.reverse()
    if not actions and initially:
        actions.append(initially.pop())

    order = sorted(range(len(elements)), key=lambda i: -elements[i])   # stable, like JS sort
    draw = set(order[:max_entries])

    current = []           # drawn elements on the stack, bottom first
    total_mem = 0
    summarized_mem = 0
    summarized = {}        # elem -> True (open) / None (closed); membership is what counts
    max_at_time = []
    max_size = 0

    def advance(n):
        max_at_time.extend([total_mem + summarized_mem] * n)

    for elem in initially:
        if elem in draw:
            current.append(elem)
            total_mem += elements[elem]
        else:
            summarized_mem += elements[elem]
            summarized[elem] = True
    initial_level = total_mem + summarized_mem

    for elem in actions:
        size = elements[elem]
        if elem not in draw:
            if elem in summarized:
                advance(1)
                summarized_mem -= size
                summarized[elem] = None
            else:
                summarized_mem += size
                summarized[elem] = True
                advance(1)
            continue                   # MemoryViz skips the max_size update here
        idx = -1
        for j in range(len(current) - 1, -1, -1):
            if current[j] == elem:
                idx = j
                break
        if idx == -1:
            current.append(elem)
            total_mem += size
            advance(1)
        else:
            advance(1)
            del current[idx]
            if idx < len(current):
                advance(3)
            total_mem -= size
        max_size = max(max_size, total_mem + summarized_mem)

    true_peak = max([initial_level] + max_at_time)
    return max_size, true_peak


# ------------------------------------------------------------------------------------------
def analyse(path):
    segments, traces = normalize(load(path))
    devices = {seg['device'] for seg in segments}
    devices.update(i for i, t in enumerate(traces) if t)
    out_devices = []
    for d in sorted(devices):
        trace = traces[d] if d < len(traces) else []
        segs = [s for s in segments if s['device'] == d]
        row = stats(segs, [trace])
        row['device'] = d
        row['viewer_peak_requested_bytes'], row['peak_requested_bytes'] = \
            active_timeline_peaks(segments, trace, d)
        out_devices.append(row)
    return {'path': path, 'devices': out_devices, 'total': stats(segments, traces)}


def main(argv):
    if len(argv) < 2 or argv[1] in ('-h', '--help'):
        sys.stderr.write(__doc__)
        return 0 if len(argv) >= 2 else 2
    files = []
    for path in sorted(argv[1:]):
        try:
            files.append(analyse(path))
        except Skipped as exc:
            sys.stderr.write('reference.py: note: skipping %s: %s\n' % (path, exc))
        except Refused as exc:
            sys.stderr.write('reference.py: %s: refused: %s\n' % (path, exc))
            return 2
        except OSError as exc:
            sys.stderr.write('reference.py: %s: %s\n' % (path, exc))
            return 2
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            sys.stderr.write('reference.py: %s: unexpected structure: %r\n' % (path, exc))
            return 2
    json.dump({'files': files}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
