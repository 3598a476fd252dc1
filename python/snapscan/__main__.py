"""``python -m snapscan ...``: the bundled binary, with the same arguments and exit status."""

from __future__ import annotations

import os
import sys


def main() -> int:
    from snapscan import BinaryNotFoundError, find_bin

    try:
        exe = find_bin()
    except BinaryNotFoundError as e:
        print(f"snapscan: error: {e}", file=sys.stderr)
        return 2
    argv = [exe, *sys.argv[1:]]
    if sys.platform == "win32":
        import subprocess

        return subprocess.call(argv)
    # Replace this process: signals, the terminal (progress bar, colour) and the exit status
    # are the binary's own.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
