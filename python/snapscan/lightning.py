"""A Lightning callback that explains CUDA out-of-memory errors in the training log.

::

    from snapscan.lightning import SnapscanCallback
    trainer = lightning.Trainer(callbacks=[SnapscanCallback()])

Importable only when Lightning (``lightning`` or ``pytorch_lightning``) is installed.
"""

from __future__ import annotations

import os

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:
        raise ImportError(
            "snapscan.lightning needs Lightning: pip install lightning "
            "(or use snapscan.torch.on_oom() directly)"
        ) from e

from snapscan import torch as _st

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Optional

__all__ = ["SnapscanCallback"]


class SnapscanCallback(Callback):
    """Installs :func:`snapscan.torch.on_oom` when the trainer sets up.

    Args:
        dir: where the snapshots go; ``None`` means ``{trainer.default_root_dir}/snapscan``.
        report: print snapscan's report of an OOM snapshot to stderr.
        history: record the allocator's history from setup on (see ``on_oom``).
        max_entries: trace entries kept.
        dump_at_end: also write ``snapshot_rank{RANK}.pickle`` into ``dir`` at teardown, for
            runs that end without an OOM (to see their peak).
    """

    def __init__(self, dir: Optional[str] = None, report: bool = True, history: bool = True,
                 max_entries: int = _st.DEFAULT_MAX_ENTRIES, dump_at_end: bool = False) -> None:
        super().__init__()
        self.dir = dir
        self.report = report
        self.history = history
        self.max_entries = max_entries
        self.dump_at_end = dump_at_end
        self.hook: Optional[_st.OomHook] = None

    def _dir(self, trainer: Any) -> str:
        if self.dir is not None:
            return self.dir
        root = getattr(trainer, "default_root_dir", None) or "."
        return os.path.join(os.fspath(root), "snapscan")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.hook = _st.on_oom(self._dir(trainer), self.report, history=self.history,
                               max_entries=self.max_entries)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.dump_at_end and self.hook is not None and self.hook.enabled:
            try:
                path = _st.dump(os.path.join(self._dir(trainer), "snapshot_rank{rank}.pickle"))
                _st._warn(f"memory snapshot written to {path}")
            except Exception as e:
                _st._warn(f"could not write the snapshot at teardown ({type(e).__name__}: {e})")
