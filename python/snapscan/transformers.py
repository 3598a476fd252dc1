"""A transformers ``TrainerCallback`` that explains CUDA out-of-memory errors in the log.

::

    from snapscan.transformers import SnapscanCallback
    trainer = Trainer(model=model, args=args, callbacks=[SnapscanCallback()])

Importable only when transformers is installed.
"""

from __future__ import annotations

import os

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError(
        "snapscan.transformers needs transformers: pip install transformers "
        "(or use snapscan.torch.on_oom() directly)"
    ) from e

from snapscan import torch as _st

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Optional

__all__ = ["SnapscanCallback"]


class SnapscanCallback(TrainerCallback):
    """Installs :func:`snapscan.torch.on_oom` when training begins.

    Args:
        dir: where the snapshots go; ``None`` means ``{args.output_dir}/snapscan``.
        report: print snapscan's report of an OOM snapshot to stderr.
        history: record the allocator's history from the start of training (see ``on_oom``).
        max_entries: trace entries kept.
        dump_at_end: also write ``snapshot_rank{RANK}.pickle`` into ``dir`` when training ends
            without an OOM (to see its peak).
    """

    def __init__(self, dir: Optional[str] = None, report: bool = True, history: bool = True,
                 max_entries: int = _st.DEFAULT_MAX_ENTRIES, dump_at_end: bool = False) -> None:
        self.dir = dir
        self.report = report
        self.history = history
        self.max_entries = max_entries
        self.dump_at_end = dump_at_end
        self.hook: Optional[_st.OomHook] = None

    def _dir(self, args: Any) -> str:
        if self.dir is not None:
            return self.dir
        root = getattr(args, "output_dir", None) or "."
        return os.path.join(os.fspath(root), "snapscan")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hook = _st.on_oom(self._dir(args), self.report, history=self.history,
                               max_entries=self.max_entries)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.dump_at_end and self.hook is not None and self.hook.enabled:
            try:
                path = _st.dump(os.path.join(self._dir(args), "snapshot_rank{rank}.pickle"))
                _st._warn(f"memory snapshot written to {path}")
            except Exception as e:
                _st._warn(f"could not write the snapshot at the end ({type(e).__name__}: {e})")
