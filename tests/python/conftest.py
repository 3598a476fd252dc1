"""Shared fixtures: the repository's fixture files, the installed binary, the stand-in torch."""

import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "fixtures")
FAKE_TORCH = os.path.join(HERE, "fake_torch")


def fixture(*parts):
    return os.path.join(FIXTURES, *parts)


@pytest.fixture
def snapscan_exe():
    """The snapscan on PATH: the test environment's, from the wheel."""
    exe = shutil.which("snapscan")
    assert exe, "snapscan is not on PATH: install the wheel into this environment"
    return exe


def _forget(prefixes):
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            del sys.modules[name]
            parent, _, child = name.rpartition(".")
            if parent in sys.modules and getattr(sys.modules[parent], child, None) is not None:
                delattr(sys.modules[parent], child)


@pytest.fixture
def fake_torch(monkeypatch):
    """The stand-in torch (tests/python/fake_torch) as ``torch``, fresh for each test.

    ``snapscan.torch`` is re-imported too, so no hook carries over between tests.
    """
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    _forget(["torch", "snapscan.torch", "snapscan.lightning", "snapscan.transformers"])
    monkeypatch.syspath_prepend(FAKE_TORCH)
    import torch

    assert torch.__version__.endswith("+fake")
    torch._fake.state.reset()
    yield torch
    # The OOM reports run in a thread: none may print into the next test.
    st = sys.modules.get("snapscan.torch")
    hook = getattr(st, "_hook", None)
    if hook is not None:
        hook.wait(60)
    _forget(["torch", "snapscan.torch", "snapscan.lightning", "snapscan.transformers"])
