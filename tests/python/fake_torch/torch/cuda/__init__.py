"""torch.cuda: is_available, OutOfMemoryError and the memory module."""

from .. import _fake
from . import memory  # noqa: F401


class OutOfMemoryError(RuntimeError):
    pass


def is_available():
    _fake.record("is_available")
    return _fake.state.cuda_available
