"""The Lightning and transformers callbacks: importable only with the framework installed."""

import sys
import types

import pytest


def test_lightning_callback_needs_lightning(fake_torch, monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    with pytest.raises(ImportError, match="pip install lightning"):
        import snapscan.lightning  # noqa: F401


def test_transformers_callback_needs_transformers(fake_torch, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="pip install transformers"):
        import snapscan.transformers  # noqa: F401


def fake_module(monkeypatch, name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


class _Base:
    def __init__(self, *a, **k):
        pass


def test_lightning_callback_installs_the_hook(fake_torch, monkeypatch, tmp_path):
    fake_module(monkeypatch, "lightning")
    fake_module(monkeypatch, "lightning.pytorch")
    fake_module(monkeypatch, "lightning.pytorch.callbacks", Callback=_Base)
    from snapscan.lightning import SnapscanCallback

    cb = SnapscanCallback(dump_at_end=True)
    assert isinstance(cb, _Base)
    trainer = types.SimpleNamespace(default_root_dir=str(tmp_path))
    cb.setup(trainer, None, "fit")
    assert len(fake_torch._fake.state.observers) == 1
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert cb.hook.paths and cb.hook.paths[0].startswith(str(tmp_path / "snapscan"))
    cb.teardown(trainer, None, "fit")
    assert (tmp_path / "snapscan" / "snapshot_rank0.pickle").exists()


def test_lightning_callback_falls_back_to_pytorch_lightning(fake_torch, monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)
    fake_module(monkeypatch, "pytorch_lightning")
    fake_module(monkeypatch, "pytorch_lightning.callbacks", Callback=_Base)
    from snapscan.lightning import SnapscanCallback

    assert issubclass(SnapscanCallback, _Base)


def test_transformers_callback_installs_the_hook(fake_torch, monkeypatch, tmp_path):
    fake_module(monkeypatch, "transformers", TrainerCallback=_Base)
    from snapscan.transformers import SnapscanCallback

    monkeypatch.setenv("RANK", "2")
    cb = SnapscanCallback()
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    cb.on_train_begin(args, None, None)
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    files = list((tmp_path / "snapscan").iterdir())
    assert [f.name.split("_")[1] for f in files] == ["rank2"]
    cb.on_train_end(args, None, None)
    assert len(list((tmp_path / "snapscan").iterdir())) == 1, "no dump at the end by default"
