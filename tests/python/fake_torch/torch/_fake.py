"""State and knobs of the stand-in torch."""

import os
import shutil

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


class State:
    def __init__(self):
        self.reset()

    def reset(self):
        #: (name, args, kwargs) of every call into the stand-in
        self.calls = []
        #: observers attached with _cuda_attach_out_of_memory_observer
        self.observers = []
        #: the file _dump_snapshot copies
        self.snapshot = os.path.join(_REPO, "fixtures", "synth", "train-oom-forward.pickle")
        #: what torch.cuda.is_available() returns
        self.cuda_available = True
        #: an exception _dump_snapshot raises instead of writing
        self.dump_error = None
        #: whether _record_memory_history has history on
        self.recording = False


state = State()


def record(name, *args, **kwargs):
    state.calls.append((name, args, kwargs))


def names():
    """The names of the calls so far, in order."""
    return [c[0] for c in state.calls]


def dump_to(path):
    if state.dump_error is not None:
        raise state.dump_error
    shutil.copyfile(state.snapshot, path)


def simulate_oom(device=0, alloc=750 * 2**20, total=80 * 2**30, free=476 * 2**20):
    """A failed cudaMalloc: observers first, then the error torch raises."""
    from .cuda import OutOfMemoryError

    record("oom", device, alloc)
    for obs in list(state.observers):
        obs(device, alloc, total, free)
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {alloc / 2**20:.2f} MiB. GPU {device} has a total "
        f"capacity of {total / 2**30:.2f} GiB of which {free / 2**20:.2f} MiB is free.")
