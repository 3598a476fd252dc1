"""snapscan: answers from PyTorch CUDA memory snapshots, from Python.

The wheel carries the ``snapscan`` binary; this package finds it and runs it::

    import snapscan

    rep = snapscan.report("snapshot.pickle")        # the JSON report as a dict
    for dev in rep["files"][0]["devices"]:
        print(dev["device"], dev["peak"]["requested_bytes"], len(dev["oom"]))

    for msg in snapscan.explain(open("train.log").read()):
        print(msg["verdict"], msg["reason"])

To make a training run explain its own out-of-memory error in its log::

    import snapscan.torch
    snapscan.torch.on_oom()

Importing this package is cheap: it imports neither torch nor ``subprocess``/``json`` until a
function needs them.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    import subprocess
    from typing import Any, Dict, List, Sequence, Union

    PathLike = Union[str, "os.PathLike[str]"]

__all__ = [
    "SnapscanError",
    "BinaryNotFoundError",
    "find_bin",
    "report",
    "report_text",
    "explain",
    "run",
]


class SnapscanError(Exception):
    """snapscan could not analyse its input (exit code 2), or another failure of the binary.

    ``str(error)`` is snapscan's own message (its stderr), which names the file and the byte
    offset or field that was wrong.
    """

    def __init__(self, message: str, *, returncode: int | None = None, stderr: str = "",
                 args: Sequence[str] = ()) -> None:
        super().__init__(message)
        #: the binary's exit status (``None`` when it did not run)
        self.returncode = returncode
        #: everything the binary wrote to stderr
        self.stderr = stderr
        #: the command line that was run
        self.cmd = list(args)


class BinaryNotFoundError(SnapscanError, FileNotFoundError):
    """The ``snapscan`` binary is not where the wheel installs it, nor on PATH."""


def _exe_name() -> str:
    return "snapscan.exe" if sys.platform == "win32" else "snapscan"


def find_bin() -> str:
    """Path of the ``snapscan`` binary this package runs.

    In this order: the ``SNAPSCAN_BIN`` environment variable; the scripts directory of the
    environment this package is installed in (where ``pip`` puts the wheel's binary, also for
    ``--user`` and ``--target`` installs); ``snapscan`` on ``PATH``.

    Raises:
        BinaryNotFoundError: none of them has the binary.
    """
    override = os.environ.get("SNAPSCAN_BIN")
    if override:
        if os.path.isfile(override):
            return override
        raise BinaryNotFoundError(f"SNAPSCAN_BIN={override!r} is not a file")
    exe = _exe_name()
    candidates = []
    # A venv or a system install: <prefix>/bin next to the interpreter's environment.
    scripts = "Scripts" if sys.platform == "win32" else "bin"
    candidates.append(os.path.join(sys.prefix, scripts, exe))
    here = os.path.dirname(os.path.abspath(__file__))
    # `pip install --target DIR`: DIR/snapscan/ and DIR/bin/.
    candidates.append(os.path.join(os.path.dirname(here), scripts, exe))
    # `pip install --user` and other schemes: ask sysconfig (imported only here, it is slow).
    try:
        import sysconfig

        candidates.append(os.path.join(sysconfig.get_path("scripts"), exe))
        user_scheme = sysconfig.get_preferred_scheme("user") if hasattr(
            sysconfig, "get_preferred_scheme") else ("nt_user" if os.name == "nt" else "posix_user")
        candidates.append(os.path.join(sysconfig.get_path("scripts", scheme=user_scheme), exe))
    except Exception:  # pragma: no cover - a broken sysconfig is not our problem
        pass
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    import shutil

    found = shutil.which(exe)
    if found:
        return found
    raise BinaryNotFoundError(
        "the snapscan binary was not found (looked in "
        + ", ".join(dict.fromkeys(candidates))
        + " and on PATH); reinstall the wheel (pip install --force-reinstall snapscan) "
        "or set SNAPSCAN_BIN"
    )


def run(args: Sequence[str], *, input: bytes | None = None, timeout: float | None = None,
        check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run the bundled binary with ``args`` (without the program name), capturing its output.

    Returns the :class:`subprocess.CompletedProcess` (``stdout`` and ``stderr`` as bytes).

    Raises:
        SnapscanError: the exit status was 2 (could not analyse, usage error), or any other
            non-zero status when ``check`` is true. Exit status 1 (a crossed budget of
            ``check``, growth in ``diff``) raises only when ``check`` is true.
        BinaryNotFoundError: the binary is missing.
    """
    import subprocess

    cmd = [find_bin(), *[os.fspath(a) for a in args]]
    proc = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, check=False)
    if proc.returncode == 2 or (check and proc.returncode != 0):
        stderr = proc.stderr.decode("utf-8", "replace")
        message = stderr.strip() or f"snapscan exited with status {proc.returncode}"
        if message.startswith("snapscan: error: "):
            message = message[len("snapscan: error: "):]
        raise SnapscanError(message, returncode=proc.returncode, stderr=stderr, args=cmd)
    return proc


def _report_args(paths: PathLike | Sequence[PathLike], options: Dict[str, Any]) -> List[str]:
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        files = [os.fsdecode(os.fspath(paths))]
    else:
        files = [os.fsdecode(os.fspath(p)) for p in paths]
    if not files:
        raise ValueError("report() needs at least one path")
    args: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    # `--` keeps a file named like an option a file.
    return args + ["--", *files]


def report(path: PathLike | Sequence[PathLike], *, device: int | None = None,
           top: int | None = None, stacks: bool = False, salvage: bool = False,
           timeout: float | None = None, **options: Any) -> Dict[str, Any]:
    """Analyse one snapshot (or several: the ranks of one job) and return the JSON report.

    This is ``snapscan report --format json PATH...`` (the schema is docs/json-schema.md in the
    repository): ``{"schema_version": 2, "files": [{"path": ..., "devices": [{"device": 0,
    "peak": {...}, "oom": [...], ...}]}], "ranks": ...}``.

    Args:
        path: a snapshot file (pickle, gzip/zstd compressed pickle, or its JSON form), a
            directory of them, a glob pattern, or a list of those.
        device: only this device.
        top: rows per table (affects the call-site and largest-allocation lists).
        stacks: whole stacks for the call sites.
        salvage: recover what is complete from a pickle cut short.
        timeout: seconds before the binary is killed (:class:`subprocess.TimeoutExpired`).
        **options: any other ``snapscan report`` option, ``name_with_underscores=value``
            (``True`` for a flag, ``None``/``False`` to leave it out).

    Raises:
        SnapscanError: the file could not be analysed; the message is snapscan's, e.g.
            ``x.pickle: not a memory snapshot: expected a pickle ...``.
    """
    import json

    for name in ("format", "output"):
        if name in options:
            raise TypeError(f"report() returns the JSON report; {name}= is not an option "
                            "(report_text() gives text or Markdown)")
    options = dict(options, device=device, top=top, stacks=stacks, salvage=salvage)
    args = ["report", "--format", "json", "--quiet", *_report_args(path, options)]
    proc = run(args, timeout=timeout)
    result: Dict[str, Any] = json.loads(proc.stdout)
    return result


def report_text(path: PathLike | Sequence[PathLike], *, format: str = "text",
                timeout: float | None = None, **options: Any) -> str:
    """The report as text (``format="text"``) or Markdown (``format="markdown"``).

    Same arguments and errors as :func:`report`.
    """
    args = ["report", "--format", format, "--quiet", *_report_args(path, options)]
    proc = run(args, timeout=timeout)
    return proc.stdout.decode("utf-8", "replace")


def explain(text: str | bytes, *, timeout: float | None = None) -> List[Dict[str, Any]]:
    """Find CUDA out-of-memory messages in log text and explain each.

    This is ``snapscan explain --format json``: one dict per message found, in the order of the
    log, with ``line``, ``gpu``, ``requested_bytes``, ``capacity_bytes``, ``free_bytes``,
    ``allocated_bytes``, ``reserved_bytes``, ``verdict`` (``"fragmentation"``,
    ``"other_processes"``, ``"full"`` or ``"unknown"``), ``reason``, ``advice`` (a list of
    ``{"action", "reason"}``) and ``text`` (the message itself). An empty list when the text
    holds no such message.

    Args:
        text: the log (not a file name: pass ``open(path).read()``).
        timeout: seconds before the binary is killed.
    """
    import json

    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    proc = run(["explain", "--format", "json", "--quiet", "-"], input=data, timeout=timeout)
    messages: List[Dict[str, Any]] = json.loads(proc.stdout)["messages"]
    return messages


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("snapscan")
    raise AttributeError(f"module 'snapscan' has no attribute {name!r}")
