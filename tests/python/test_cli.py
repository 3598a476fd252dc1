"""The wheel's binary: on PATH, and through `python -m snapscan`."""

import os
import subprocess
import sys

from conftest import fixture

OOM = fixture("synth", "train-oom-forward.pickle")


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_binary_is_installed_with_the_package(snapscan_exe):
    # The wheel puts the binary in this environment's scripts directory.
    assert os.path.realpath(snapscan_exe).startswith(os.path.realpath(sys.prefix))
    import snapscan

    assert os.path.samefile(snapscan.find_bin(), snapscan_exe)


def test_version_matches_the_package(snapscan_exe):
    import snapscan

    out = run([snapscan_exe, "--version"], check=True).stdout.decode()
    assert out.strip() == f"snapscan {snapscan.__version__}"


def test_report_from_path(snapscan_exe):
    proc = run([snapscan_exe, "report", OOM], check=True)
    assert b"OUT OF MEMORY" in proc.stdout


def test_python_m_runs_the_same_binary(snapscan_exe):
    direct = run([snapscan_exe, "report", OOM], check=True)
    via_python = run([sys.executable, "-m", "snapscan", "report", OOM], check=True)
    assert via_python.stdout == direct.stdout
    assert b"OUT OF MEMORY" in via_python.stdout


def test_python_m_keeps_the_exit_status_and_message(tmp_path):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a snapshot")
    proc = run([sys.executable, "-m", "snapscan", "report", str(bad)])
    assert proc.returncode == 2
    assert b"bad.pickle" in proc.stderr and b"not a memory snapshot" in proc.stderr
    proc = run([sys.executable, "-m", "snapscan", "check", "--max-peak", "1MiB", OOM])
    assert proc.returncode == 1
    assert b"FAIL" in proc.stdout


def test_python_m_reads_stdin():
    log = open(fixture("oom-logs", "oom-03-v15-reserved.log"), "rb").read()
    proc = run([sys.executable, "-m", "snapscan", "explain", "-"], input=log, check=True)
    assert b"full" in proc.stdout.lower()
