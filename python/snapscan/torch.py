"""PyTorch helpers: record a memory snapshot, and explain an out-of-memory error in the log.

torch is imported only when one of these functions runs, so ``import snapscan.torch`` is cheap.

::

    import snapscan.torch

    snapscan.torch.on_oom()          # one line: an OOM dumps oom_rank{RANK}_{pid}_{n}.pickle
                                     # and prints snapscan's report of it to stderr

    with snapscan.torch.record("snapshot.pickle"):
        train_one_epoch()            # the snapshot is written when the block ends

Ranks: the file names carry the process's rank, read from ``RANK``, else ``LOCAL_RANK``, else 0
(torchrun, Lightning, accelerate and DeepSpeed set them), so the ranks of one job never overwrite
each other's snapshots and ``snapscan report`` reads the rank numbers back from the names.

They use the allocator API of torch 2.1 and newer (``_record_memory_history(enabled="all",
...)``, ``_cuda_attach_out_of_memory_observer``). Neither helper ever hides the exception that
ended the run: a failing dump or report is a warning on stderr, and the original
``torch.cuda.OutOfMemoryError`` propagates unchanged.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    import threading
    from types import TracebackType
    from typing import Any, Deque, List, Optional, Type

__all__ = ["rank", "snapshot_path", "record", "Recording", "on_oom", "OomHook", "dump"]

DEFAULT_MAX_ENTRIES = 100_000
#: seconds the report of an OOM snapshot may take (it runs in the background, see on_oom)
DEFAULT_OOM_TIMEOUT = 10.0
#: snapshots one process writes at OOMs before it stops writing them
DEFAULT_MAX_FILES = 5
#: reports of OOM snapshots running or waiting at once; the next ones are skipped
DEFAULT_MAX_REPORTS = 2


def _torch() -> Any:
    import torch

    return torch


def _warn(message: str) -> None:
    """A line on stderr that must never raise (stderr may be closed while a run dies)."""
    try:
        err = sys.stderr
        if err is not None:
            err.write(f"snapscan: {message}\n")
            err.flush()
    except Exception:
        pass


def rank() -> int:
    """This process's rank: ``RANK``, else ``LOCAL_RANK``, else 0."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                pass
    return 0


def _distributed() -> bool:
    return any(os.environ.get(n, "").strip() for n in ("RANK", "LOCAL_RANK"))


def snapshot_path(path: str | os.PathLike[str] = "snapshot.pickle") -> str:
    """The file name :func:`record` writes for ``path`` in this process.

    ``{rank}``, ``{local_rank}`` and ``{pid}`` in ``path`` are replaced. When ``RANK`` or
    ``LOCAL_RANK`` is set and ``path`` has no ``{rank}``, ``_rank{rank}`` is put before the
    suffix (``snapshot.pickle`` becomes ``snapshot_rank3.pickle``), so ranks do not overwrite
    each other's files.
    """
    text = os.fspath(path)
    if "{rank}" not in text and _distributed():
        head, tail = os.path.split(text)
        stem, dot, suffix = tail.partition(".")
        text = os.path.join(head, f"{stem}_rank{{rank}}{dot}{suffix}")
    local = os.environ.get("LOCAL_RANK", "").strip() or "0"
    return text.replace("{rank}", str(rank())).replace("{local_rank}", local).replace(
        "{pid}", str(os.getpid()))


def _start_history(max_entries: int, stacks: str, context: str) -> None:
    torch = _torch()
    torch.cuda.memory._record_memory_history(
        enabled="all", context=context, stacks=stacks, max_entries=max_entries)


def _stop_history() -> None:
    torch = _torch()
    torch.cuda.memory._record_memory_history(enabled=None)


def dump(path: str | os.PathLike[str] = "snapshot.pickle") -> str:
    """Write the memory snapshot now (``torch.cuda.memory._dump_snapshot``) and return its name.

    ``path`` is expanded as in :func:`snapshot_path`; missing directories are created.
    """
    return _dump(snapshot_path(path))


def _dump(target: str) -> str:
    parent = os.path.dirname(target)
    if parent:
        os.makedirs(parent, exist_ok=True)
    _torch().cuda.memory._dump_snapshot(target)
    return target


def _print_report(path: str, timeout: float | None) -> bool:
    """snapscan's text report of ``path`` on stderr; a warning instead when that fails."""
    try:
        from snapscan import report_text

        text = report_text(path, timeout=timeout)
    except BaseException as e:  # noqa: BLE001 - a failing report must not end the run
        _warn(f"could not report on {path} ({type(e).__name__}: {e}); "
              f"the snapshot is kept: run `snapscan report {path}`")
        return False
    try:
        err = sys.stderr
        err.write(text if text.endswith("\n") else text + "\n")
        err.flush()
    except Exception:
        pass
    return True


def _cuda_ready(what: str) -> bool:
    torch = _torch()
    try:
        available = bool(torch.cuda.is_available())
    except Exception:
        available = False
    if not available:
        _warn(f"{what}: CUDA is not available, no memory snapshot is recorded")
    return available


class Recording:
    """The context manager :func:`record` returns; ``path`` is the file it writes."""

    def __init__(self, path: str | os.PathLike[str] = "snapshot.pickle",
                 max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python", *,
                 context: str = "all", report: bool = False,
                 timeout: float | None = 120.0) -> None:
        self.path = snapshot_path(path)
        self.max_entries = max_entries
        self.stacks = stacks
        self.context = context
        self.report = report
        self.timeout = timeout
        #: whether the snapshot was written
        self.dumped = False
        self._active = False

    def __enter__(self) -> Recording:
        if _cuda_ready("record()"):
            _start_history(self.max_entries, self.stacks, self.context)
            self._active = True
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if not self._active:
            return
        self._active = False
        failing = exc is not None
        try:
            try:
                _dump(self.path)
                self.dumped = True
            except Exception as e:
                if not failing:
                    raise
                # The block already failed (an OOM, say): its exception is the one to see.
                _warn(f"could not write {self.path} ({type(e).__name__}: {e})")
        finally:
            # Keep recording when on_oom() wants the history of the whole run.
            if not (_hook is not None and _hook.enabled and _hook.history):
                try:
                    _stop_history()
                except Exception as e:
                    if not failing and self.dumped:
                        raise
                    _warn(f"could not stop recording ({type(e).__name__}: {e})")
        if self.dumped and self.report:
            _print_report(self.path, self.timeout)


def record(path: str | os.PathLike[str] = "snapshot.pickle",
           max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python", *,
           context: str = "all", report: bool = False,
           timeout: float | None = 120.0) -> Recording:
    """Record the CUDA allocator's history for a block and write the snapshot when it ends.

    ::

        with snapscan.torch.record("snapshot.pickle") as rec:
            train()
        print(snapscan.report(rec.path)["files"][0]["devices"][0]["peak"])

    Starts ``torch.cuda.memory._record_memory_history(enabled="all", context=context,
    stacks=stacks, max_entries=max_entries)``; on exit, also when the block raised, writes the
    snapshot (``_dump_snapshot``) and stops recording. An exception from the block is never
    replaced: when the dump fails after it, that is a warning on stderr.

    Args:
        path: the snapshot file, expanded as in :func:`snapshot_path` (rank in the name under
            torchrun).
        max_entries: trace entries kept (a ring buffer: the last ones win).
        stacks: ``"python"`` (cheap) or ``"all"`` (also C++ frames, slow).
        context: what to record stacks for: ``"all"``, ``"alloc"``, ``"state"``.
        report: also print snapscan's text report of the snapshot to stderr.
        timeout: seconds the report may take.

    Without CUDA it warns and records nothing.
    """
    return Recording(path, max_entries, stacks, context=context, report=report, timeout=timeout)


class OomHook:
    """What :func:`on_oom` installed; one per process (calling ``on_oom`` again updates it)."""

    def __init__(self) -> None:
        self.dir = "."
        self.report = True
        self.history = True
        self.timeout: float | None = DEFAULT_OOM_TIMEOUT
        #: snapshots written at most (``None``: no limit); later OOMs are counted only
        self.max_files: int | None = DEFAULT_MAX_FILES
        #: reports running or waiting at most; an OOM beyond them gets no report, only its file
        self.max_reports = DEFAULT_MAX_REPORTS
        #: False after :meth:`disable`: the observer stays attached but does nothing.
        self.enabled = True
        #: snapshots written at OOMs so far
        self.paths: List[str] = []
        #: OOMs seen while enabled
        self.ooms = 0
        #: OOMs that wrote no snapshot because ``max_files`` were written already
        self.skipped_files = 0
        #: snapshots written but not reported because ``max_reports`` were running or waiting
        self.skipped_reports = 0
        # Snapshot files tried so far: the n of the next file name is this plus one.
        self._tried = 0
        # The process the counts and the report thread belong to (a forked child starts anew).
        self._pid = os.getpid()
        self._lock: threading.Lock | None = None
        # The reports to print, the one running first, and the thread printing them.
        self._pending: Deque[str] | None = None
        self._worker: threading.Thread | None = None

    @property
    def path(self) -> str:
        """The file the next OOM writes: ``{dir}/oom_rank{RANK}_{pid}_{n}.pickle``.

        ``n`` counts this process's OOM snapshots from 1, so no OOM overwrites another's file.
        """
        return self._path(self._tried + 1)

    def _path(self, n: int) -> str:
        return os.path.join(self.dir, f"oom_rank{rank()}_{os.getpid()}_{n}.pickle")

    def disable(self) -> None:
        """Stop dumping and reporting at OOMs (the observer cannot be detached from torch)."""
        self.enabled = False

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the reports started so far have been printed; False if some still run.

        Never needed at exit: the interpreter waits for them (each at most ``timeout``
        seconds of :func:`on_oom`).
        """
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            worker = self._worker
            if worker is None or not worker.is_alive():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            worker.join(left)

    def __call__(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        # Called by the caching allocator after a failed allocation, before it raises
        # OutOfMemoryError, with the device's total (or allowed) and free bytes. Whatever is
        # raised here would replace that error: nothing may be.
        try:
            self._handle(device, alloc, device_total, device_free)
        except BaseException as e:  # noqa: BLE001
            _warn(f"the out-of-memory hook failed ({type(e).__name__}: {e})")

    def _handle(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        if not self.enabled:
            return
        if self._lock is None or self._pid != os.getpid():
            self._fresh_process()
        what = (f"CUDA out of memory on rank {rank()} (device {device}: {_size(alloc)} "
                f"requested, {_size(device_free)} free of {_size(device_total)})")
        with self._lock:
            self.ooms += 1
            full = self.max_files is not None and self._tried >= self.max_files
            if full:
                self.skipped_files += 1
                first_skipped = self.skipped_files == 1
            else:
                self._tried += 1
                path = self._path(self._tried)
        if full:
            # One line when it stops, not one per OOM: a retry loop may run out of memory
            # a thousand times.
            if first_skipped:
                _warn(f"{what}; no snapshot written: this process has made its "
                      f"max_files={self.max_files} snapshots already, and its later OOMs are "
                      "not written or reported either")
            return
        _warn(f"{what}; writing {path}")
        try:
            if self.dir:
                os.makedirs(self.dir, exist_ok=True)
            # The snapshot must be taken here, while the allocator's state is the OOM's.
            _torch().cuda.memory._dump_snapshot(path)
        except BaseException as e:  # noqa: BLE001
            _warn(f"could not write {path} ({type(e).__name__}: {e})")
            return
        self.paths.append(path)
        if self.report:
            self._queue_report(path)

    def _fresh_process(self) -> None:
        """New counts, lock and report queue: the first OOM, or the first in a forked child,
        which has its parent's counts but not its report thread (and maybe a held lock)."""
        import collections
        import threading

        if self._pid != os.getpid():
            self._pid = os.getpid()
            self.paths = []
            self.ooms = self.skipped_files = self.skipped_reports = self._tried = 0
        self._lock = threading.Lock()
        self._pending = collections.deque()
        self._worker = None

    def _queue_report(self, path: str) -> None:
        """Has the report printed after the observer returns, by a thread of its own.

        The allocator is waiting for the observer to raise its error (and a retry loop for
        that error to retry), so the report, a run of the binary, is not made here. The
        thread is not a daemon: at exit the interpreter waits for it to print.
        """
        import threading

        assert self._lock is not None and self._pending is not None
        with self._lock:
            if len(self._pending) >= self.max_reports:
                self.skipped_reports += 1
                skipped, running = self.skipped_reports, len(self._pending)
            else:
                skipped = 0
                self._pending.append(path)
                if self._worker is None:
                    self._worker = threading.Thread(
                        target=self._print_reports, name="snapscan-oom-report", daemon=False)
                    # Started under the lock, so no other OOM sees a thread not yet running
                    # (the thread's first step waits for the lock).
                    self._worker.start()
        if skipped:
            _warn(f"{path} is not reported: {running} reports are still running or waiting "
                  f"(max_reports={self.max_reports}; {skipped} skipped so far); "
                  f"run `snapscan report {path}`")

    def _print_reports(self) -> None:
        """The reports, one after the other, until none is left."""
        assert self._lock is not None and self._pending is not None
        pending = self._pending
        try:
            while True:
                with self._lock:
                    if not pending:
                        self._worker = None
                        return
                    path = pending[0]
                try:
                    _print_report(path, self.timeout)
                finally:
                    with self._lock:
                        pending.popleft()
        except BaseException as e:  # noqa: BLE001 - a thread's error would only be printed
            with self._lock:
                pending.clear()
                self._worker = None
            _warn(f"the out-of-memory report failed ({type(e).__name__}: {e})")


def _size(n: Any) -> str:
    try:
        value = float(n)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(n)  # pragma: no cover


_hook: OomHook | None = None


def on_oom(dir: str | os.PathLike[str] = ".", report: bool = True, *, history: bool = True,
           max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python",
           timeout: float | None = DEFAULT_OOM_TIMEOUT,
           max_files: int | None = DEFAULT_MAX_FILES,
           max_reports: int = DEFAULT_MAX_REPORTS) -> OomHook:
    """When CUDA runs out of memory, write the snapshot and print why to stderr.

    ::

        import snapscan.torch
        snapscan.torch.on_oom()

    Attaches an observer to the caching allocator
    (``torch._C._cuda_attach_out_of_memory_observer``). At an OOM it writes
    ``{dir}/oom_rank{RANK}_{pid}_{n}.pickle``, where ``n`` counts the process's OOM snapshots
    from 1 (a second OOM never overwrites the first's file), and returns: torch raises its
    ``OutOfMemoryError`` as always. The hook never replaces that error, and a failing dump or
    report is a warning line.

    With ``report``, snapscan's text report of the snapshot (the verdict, what filled the
    memory, what to change first) is printed to stderr by a background thread, after the
    observer has returned, so the failed run's log says why it failed (after torch's traceback
    when the error ends the run: the interpreter waits for the report before it exits). Only
    the dump runs inside the observer: it must, the allocator's state is the OOM's only there.

    A loop that catches OOMs and retries (a batch-size finder) is not stalled by reports and
    does not fill the disk: after ``max_files`` snapshots the process writes no more (one
    warning line says so; :attr:`OomHook.skipped_files` counts the OOMs after it), and while
    ``max_reports`` reports are running or waiting, a new snapshot gets a warning line naming it
    instead of a report (:attr:`OomHook.skipped_reports`).

    Args:
        dir: directory for the snapshots (created when needed).
        report: print the report (else only the file name).
        history: also start recording the allocator's history now
            (``_record_memory_history``), so the snapshot shows the trace up to the OOM, not
            only the final state. It costs a few microseconds per allocation.
        max_entries: trace entries kept when recording.
        stacks: ``"python"`` or ``"all"``.
        timeout: seconds one report may take (the binary is stopped then, with a warning).
        max_files: snapshots one process writes at most (``None``: no limit).
        max_reports: reports running or waiting at once, at most (0: none).

    Returns the process's :class:`OomHook`; calling ``on_oom`` again reconfigures it rather
    than attaching a second observer (its count of files goes on). Without CUDA it warns and
    does nothing.
    """
    global _hook
    hook = _hook if _hook is not None else OomHook()
    hook.dir = os.fspath(dir)
    hook.report = report
    hook.history = history
    hook.timeout = timeout
    hook.max_files = max_files
    hook.max_reports = max_reports
    hook.enabled = True
    if not _cuda_ready("on_oom()"):
        return hook
    torch = _torch()
    if _hook is None:
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            _warn("on_oom(): this torch has no out-of-memory observer "
                  "(torch._C._cuda_attach_out_of_memory_observer); nothing is installed")
            hook.enabled = False
            return hook
        attach(hook)
        _hook = hook
    if history:
        try:
            _start_history(max_entries, stacks, "all")
        except Exception as e:
            _warn(f"on_oom(): could not start recording the history ({type(e).__name__}: {e}); "
                  "snapshots will hold the final state only")
    return hook
