"""torch._C: the out-of-memory observer hook."""

from . import _fake


def _cuda_attach_out_of_memory_observer(observer):
    _fake.record("_cuda_attach_out_of_memory_observer", observer)
    _fake.state.observers.append(observer)
