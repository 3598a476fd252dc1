"""torch.cuda.memory: recording the allocator's history and dumping the snapshot."""

import sys

from .. import _fake


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                           device=None, clear_history=False):
    _fake.record("_record_memory_history", enabled=enabled, context=context, stacks=stacks,
                 max_entries=max_entries)
    _fake.state.recording = enabled is not None


def _dump_snapshot(filename="dump_snapshot.pickle"):
    _fake.record("_dump_snapshot", filename)
    _fake.dump_to(filename)
