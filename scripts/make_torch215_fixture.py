#!/usr/bin/env python3
"""Writes fixtures/torch215/training-2026.pickle: a small training run's memory snapshot in the
exact shape torch 2.15 writes (`_dump_snapshot`, protocol 4, Python 3.11), with every field that
appeared in 2025-2026:

* `pool_id` on every trace entry (2.12+), a fresh (a, b) tuple per entry;
* a `torch.cuda.MemPool` (pool (0, 1)) whose allocations ran under
  `_set_memory_metadata({"pool": "comm", "name": "nccl buffers"})` (2.15: the dict is stored as
  compact JSON);
* a CUDA-graph capture pool (pool (1, 0));
* `_annotate_tensor(kv, "kv cache")` (the `annotate` action, 2.14+);
* an exact-address allocation whose entries carry `internal_metadata: "mallocWithAddress"` (2.15);
* pinned host memory (`record_pinned_host_memory=True`, 2.14+): `host_segments` and `host_traces`;
* `allocator_settings` with the pinned-host knobs `max_round_threshold`, `max_cached_size` (2.13+).

It also writes fixtures/torch215/unknown-fields.pickle: the same dump with a key, an action and a
top-level key that no torch release writes, for the test that they are counted and named, and
with one pool tuple shared by the host entries (fetched from the memo, not written again).

No GPU and no torch are needed: the script builds the dict `THCPModule_memorySnapshot` builds, in
its key order and with its object sharing (one str object per key and action name per dump; a
fresh str for `compile_context` and non-trivial metadata, a fresh tuple per pool id; "" and
one-character strings are CPython singletons; one frames list per captured traceback, shared by
the segment and block it created), and pickles it as `pickle.dump` does. The allocator's choices
follow the caching allocator's rules (round to 512 bytes; a new segment per request that no cached
block fits, 2 MiB for small requests, 20 MiB for 1-10 MiB, else rounded to 2 MiB; best fit by
size then address within a pool; split when the rest is over 1 MiB (large) or at least 512 bytes
(small); merge on free), so the end state agrees with the trace.

Run from the repository root:  python3 scripts/make_torch215_fixture.py
"""

import json
import os
import pickle
import sys

MIB = 1 << 20
OUT = os.path.join("fixtures", "torch215", "training-2026.pickle")
MUTATED = os.path.join("fixtures", "torch215", "unknown-fields.pickle")


def fresh(s):
    # A str as pybind11 makes it from a std::string: "" and one-character strings below U+0100
    # come back as CPython's cached singletons, anything longer is a new object each call.
    return s.encode("utf-8").decode("utf-8")


S = {k: fresh(k) for k in (
    "device address total_size allocated_size active_size requested_size stream segment_type "
    "segment_pool_id large small size state active_allocated active_pending_free inactive addr "
    "blocks is_expandable frames time_us compile_context user_metadata internal_metadata "
    "pool_id action alloc free_requested free_completed segment_alloc segment_free segment_map "
    "segment_unmap snapshot oom annotate device_free filename name line").split()}
EMPTY_FRAMES = []


def pair(a, b):
    # A new tuple each call, as pybind11 converts a std::pair (a literal (0, 0) would be one
    # constant object, written once and fetched after).
    return tuple([a, b])

_frame_dicts = {}


def stack(*frames):
    """One captured traceback: a new list; frame dicts shared within the dump."""
    out = []
    for filename, line, name in frames:
        key = (filename, line, name)
        if key not in _frame_dicts:
            _frame_dicts[key] = {S["filename"]: fresh(filename), S["name"]: fresh(name),
                                 S["line"]: line}
        out.append(_frame_dicts[key])
    return out


ENV = "/opt/conda/lib/python3.11/site-packages"
TRAIN = "/home/user/proj/train.py"
MODEL = "/home/user/proj/model.py"


def st_load(i):
    return stack((f"{ENV}/torch/nn/modules/module.py", 1340, "convert"),
                 (f"{ENV}/torch/nn/modules/module.py", 927, "_apply"),
                 (f"{ENV}/torch/nn/modules/module.py", 1355, "to"),
                 (TRAIN, 40 + i, "main"))


def st_forward(line):
    return stack((f"{ENV}/torch/nn/modules/linear.py", 125, "forward"),
                 (f"{ENV}/torch/nn/modules/module.py", 1773, "_call_impl"),
                 (MODEL, line, "forward"),
                 (f"{ENV}/torch/nn/modules/module.py", 1773, "_call_impl"),
                 (TRAIN, 71, "train_step"),
                 (TRAIN, 120, "main"))


def st_backward():
    return stack((f"{ENV}/torch/autograd/graph.py", 829, "_engine_run_backward"),
                 (f"{ENV}/torch/autograd/__init__.py", 353, "backward"),
                 (f"{ENV}/torch/_tensor.py", 648, "backward"),
                 (TRAIN, 74, "train_step"),
                 (TRAIN, 120, "main"))


def st_comm():
    return stack((f"{ENV}/torch/distributed/distributed_c10d.py", 2807, "all_reduce"),
                 (TRAIN, 60, "setup_comm"),
                 (TRAIN, 118, "main"))


def st_graph():
    return stack((MODEL, 210, "decode_step"),
                 (f"{ENV}/torch/cuda/graphs.py", 254, "__enter__"),
                 (TRAIN, 90, "capture_decode"),
                 (TRAIN, 125, "main"))


def st_pinned():
    return stack((f"{ENV}/torch/utils/data/_utils/pin_memory.py", 73, "pin_memory"),
                 (f"{ENV}/torch/utils/data/dataloader.py", 733, "__next__"),
                 (TRAIN, 66, "train_step"),
                 (TRAIN, 120, "main"))


class Allocator:
    """Just enough of the caching allocator for the requests below (one stream)."""

    def __init__(self):
        self.segments = []          # dicts: addr, size, small, pool, frames, blocks
        self.next_addr = 0x7F2A00000000
        self.trace = []
        self.t = 1_765_000_000_000_000

    def entry(self, action, addr, size, pool, frames=None, um="", im=None):
        self.t += 37
        d = {S["action"]: S[action], S["addr"]: addr, S["size"]: size, S["stream"]: 0,
             S["time_us"]: self.t, S["compile_context"]: fresh("N/A"), S["user_metadata"]: fresh(um)}
        if im:
            d[S["internal_metadata"]] = fresh(im)
        d[S["pool_id"]] = pair(*pool)
        if frames is not None:
            d[S["frames"]] = frames
        self.trace.append(d)

    def malloc(self, requested, frames, pool=(0, 0), um="", im=None):
        size = max(512, -(-requested // 512) * 512)
        small = size <= MIB
        fits = [(b["size"], b["addr"], seg, b) for seg in self.segments
                if seg["small"] == small and seg["pool"] == pool
                for b in seg["blocks"] if b["state"] == "inactive" and b["size"] >= size]
        if fits:
            _, _, seg, block = min(fits, key=lambda x: (x[0], x[1]))
        else:
            if small:
                seg_size = 2 * MIB
            elif size < 10 * MIB:
                seg_size = 20 * MIB
            else:
                seg_size = -(-size // (2 * MIB)) * (2 * MIB)
            seg = {"addr": self.next_addr, "size": seg_size, "small": small, "pool": pool,
                   "frames": frames, "blocks": [{"addr": self.next_addr, "size": seg_size,
                                                 "req": 0, "state": "inactive", "frames": None}]}
            self.next_addr += seg_size + 2 * MIB
            self.segments.append(seg)
            self.entry("segment_alloc", seg["addr"], seg_size, pool, frames, um, im)
            block = seg["blocks"][0]
        rest = block["size"] - size
        if (small and rest >= 512) or (not small and rest > MIB):
            i = seg["blocks"].index(block)
            seg["blocks"].insert(i + 1, {"addr": block["addr"] + size, "size": rest, "req": 0,
                                         "state": "inactive", "frames": None})
            block["size"] = size
        block.update(state="active_allocated", req=requested, frames=frames)
        self.entry("alloc", block["addr"], requested, pool, frames, um, im)
        return block["addr"]

    def free(self, addr, frames=None, um="", im=None):
        for seg in self.segments:
            for i, b in enumerate(seg["blocks"]):
                if b["addr"] == addr and b["state"] == "active_allocated":
                    self.entry("free_requested", addr, b["req"], seg["pool"], frames, um, im)
                    self.entry("free_completed", addr, b["req"], seg["pool"], frames, um, im)
                    b.update(state="inactive", req=0, frames=None)
                    blocks = seg["blocks"]
                    # Merge with free neighbours.
                    if i + 1 < len(blocks) and blocks[i + 1]["state"] == "inactive":
                        b["size"] += blocks.pop(i + 1)["size"]
                    if i > 0 and blocks[i - 1]["state"] == "inactive":
                        blocks[i - 1]["size"] += blocks.pop(i)["size"]
                    return
        raise KeyError(hex(addr))

    def block_at(self, addr):
        for seg in self.segments:
            for b in seg["blocks"]:
                if b["addr"] == addr:
                    return seg, b
        raise KeyError(hex(addr))

    def annotate(self, addr, text, frames):
        seg, b = self.block_at(addr)
        self.entry("annotate", addr, b["req"], seg["pool"], frames, um=text)

    def dump_segments(self, device):
        out = []
        for seg in sorted(self.segments, key=lambda s: s["addr"]):
            blocks = []
            for b in seg["blocks"]:
                blocks.append({S["address"]: b["addr"], S["size"]: b["size"],
                               S["requested_size"]: b["req"], S["state"]: S[b["state"]],
                               S["frames"]: b["frames"] if b["frames"] is not None else EMPTY_FRAMES})
            alloc = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
            req = sum(b["req"] for b in seg["blocks"] if b["state"] != "inactive")
            d = {S["device"]: device, S["address"]: seg["addr"], S["total_size"]: seg["size"],
                 S["allocated_size"]: alloc, S["active_size"]: alloc, S["requested_size"]: req,
                 S["stream"]: 0, S["segment_type"]: S["small" if seg["small"] else "large"],
                 S["segment_pool_id"]: pair(*seg["pool"]), S["is_expandable"]: False}
            # torch attaches a recorded stack after the blocks, the shared empty list before.
            if seg["frames"]:
                d[S["blocks"]] = blocks
                d[S["frames"]] = seg["frames"]
            else:
                d[S["frames"]] = EMPTY_FRAMES
                d[S["blocks"]] = blocks
            out.append(d)
        return out


def main():
    a = Allocator()
    # Loading: two weight matrices, three biases in the small pool.
    weights = [a.malloc(41_943_000, st_load(i)) for i in range(2)]
    biases = [a.malloc(4096, st_load(10 + i)) for i in range(3)]
    # Communication buffers in a MemPool, under dict metadata (stored as compact JSON).
    comm_meta = json.dumps({"pool": "comm", "name": "nccl buffers"}, separators=(",", ":"))
    comm = [a.malloc(16 * MIB, st_comm(), pool=(0, 1), um=comm_meta) for _ in range(2)]
    # Forward: four activations and a cache the user annotates.
    acts = [a.malloc(24 * MIB + 1000 * i, st_forward(30 + i)) for i in range(4)]
    kv = a.malloc(32 * MIB, st_forward(50))
    a.annotate(kv, "kv cache", stack((MODEL, 52, "forward"), (TRAIN, 71, "train_step"),
                                     (TRAIN, 120, "main")))
    # An exact-address allocation: a 2 MiB prefix block, the block asked for, the prefix freed.
    tag = "mallocWithAddress"
    prefix = a.malloc(2 * MIB, st_forward(60), im=tag)
    a.malloc(8 * MIB, st_forward(60), im=tag)
    a.free(prefix, im=tag)
    # Backward frees the activations; gradients are born.
    grads = [a.malloc(41_943_000, st_backward()) for _ in range(2)]
    for x in acts:
        a.free(x, st_backward())
    # A CUDA graph captured into its own pool.
    for _ in range(2):
        a.malloc(12 * MIB, st_graph(), pool=(1, 0))
    del weights, biases, comm, grads

    # Pinned host memory: a 64 MiB batch still pinned at the dump, a 32 MiB one freed and cached.
    host_trace = []
    t = a.t
    pinned = st_pinned()

    def host_entry(action, addr, size):
        nonlocal t
        t += 11
        host_trace.append({S["action"]: S[action], S["addr"]: addr, S["size"]: size,
                           S["stream"]: 0, S["time_us"]: t, S["compile_context"]: fresh(""),
                           S["user_metadata"]: fresh(""), S["pool_id"]: pair(0, 0),
                           S["frames"]: pinned})
    h1, h2 = 0x55D0_0000_0000, 0x55D0_0400_0000
    host_entry("segment_alloc", h1, 64 * MIB)
    host_entry("alloc", h1, 64 * MIB)
    host_entry("segment_alloc", h2, 32 * MIB)
    host_entry("alloc", h2, 32 * MIB)
    host_entry("free_requested", h2, 32 * MIB)
    host_entry("free_completed", h2, 32 * MIB)

    def host_segment(addr, size, allocated):
        block = {S["address"]: addr, S["size"]: size, S["requested_size"]: size,
                 S["state"]: S["active_allocated" if allocated else "inactive"],
                 S["frames"]: pinned}
        return {S["device"]: -1, S["address"]: addr, S["total_size"]: size,
                S["allocated_size"]: size if allocated else 0,
                S["active_size"]: size if allocated else 0, S["requested_size"]: size,
                S["stream"]: 0, S["segment_type"]: S["small"], S["segment_pool_id"]: pair(0, 0),
                S["is_expandable"]: False, S["blocks"]: [block], S["frames"]: pinned}

    snapshot = {
        fresh("segments"): a.dump_segments(0),
        fresh("device_traces"): [a.trace],
        fresh("allocator_settings"): {
            fresh("PYTORCH_CUDA_ALLOC_CONF"): fresh(""), fresh("max_split_size"): -1,
            fresh("garbage_collection_threshold"): 0.0, fresh("expandable_segments"): False,
            fresh("pinned_num_register_threads"): 1, fresh("release_lock_on_cudamalloc"): False,
            fresh("pinned_use_cuda_host_register"): False,
            fresh("graph_capture_record_stream_reuse"): False,
            fresh("max_round_threshold"): -1, fresh("max_cached_size"): -1,
            fresh("roundup_power2_divisions"): {fresh(str(2 ** i)): 0 for i in range(16)},
        },
        fresh("external_annotations"): [],
        fresh("host_segments"): [host_segment(h1, 64 * MIB, True), host_segment(h2, 32 * MIB, False)],
        fresh("host_traces"): host_trace,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes, {len(a.trace)} device entries, "
          f"{len(host_trace)} host entries)", file=sys.stderr)

    # The same dump mutated with what no torch release writes: a key on every alloc entry, an
    # unknown action and an unknown top-level key. A reader must count and name them.
    key = fresh("stream_priority")
    for e in a.trace:
        if e[S["action"]] is S["alloc"]:
            e[key] = -1
    last = a.trace[-1]
    a.trace.append({S["action"]: fresh("defragment"), S["addr"]: 0, S["size"]: 0, S["stream"]: 0,
                    S["time_us"]: last[S["time_us"]] + 1, S["compile_context"]: fresh("N/A"),
                    S["user_metadata"]: fresh(""), S["pool_id"]: pair(0, 0)})
    snapshot[fresh("process_info")] = {fresh("pid"): 4242}
    # And one pool tuple shared by the host entries and segments (as a constant tuple in a
    # Python writer would be): a reader must follow the memo to it.
    shared = pair(0, 0)
    for e in host_trace:
        e[S["pool_id"]] = shared
    for seg in snapshot["host_segments"]:
        seg[S["segment_pool_id"]] = shared
    with open(MUTATED, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    print(f"wrote {MUTATED} ({os.path.getsize(MUTATED)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
