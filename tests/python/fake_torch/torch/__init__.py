"""A stand-in for torch, for testing snapscan.torch without a GPU (a real torch is several GB).

It has just what snapscan.torch calls. Every call is appended to ``torch._fake.calls``;
``torch.cuda.memory._dump_snapshot(path)`` copies ``torch._fake.state.snapshot`` (a fixture
snapshot) to ``path``; ``torch._fake.simulate_oom()`` does what the caching allocator does when
an allocation fails: it calls the attached observers, then raises ``torch.cuda.OutOfMemoryError``.
"""

from . import _fake  # noqa: F401
from . import _C  # noqa: F401
from . import cuda  # noqa: F401

__version__ = "0.0.0+fake"
