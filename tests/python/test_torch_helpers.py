"""snapscan.torch against the stand-in torch (tests/python/fake_torch)."""

import os

import pytest


def calls(torch, name):
    return [c for c in torch._fake.state.calls if c[0] == name]


# record() ------------------------------------------------------------------------------------

def test_record_starts_dumps_and_stops(fake_torch, tmp_path):
    import snapscan.torch as st

    path = tmp_path / "snap.pickle"
    with st.record(path, max_entries=1234, stacks="all") as rec:
        assert fake_torch._fake.state.recording
        assert not path.exists()
    assert rec.path == str(path) and rec.dumped and path.exists()
    assert not fake_torch._fake.state.recording
    hist = calls(fake_torch, "_record_memory_history")
    assert hist[0][2] == dict(enabled="all", context="all", stacks="all", max_entries=1234)
    assert hist[-1][2]["enabled"] is None
    names = [c[0] for c in fake_torch._fake.state.calls if c[0] != "is_available"]
    assert names == ["_record_memory_history", "_dump_snapshot", "_record_memory_history"]
    # The dump is a snapshot snapscan reads.
    import snapscan

    assert snapscan.report(path)["files"][0]["devices"]


def test_record_defaults(fake_torch, tmp_path, monkeypatch):
    import snapscan.torch as st

    monkeypatch.chdir(tmp_path)
    with st.record():
        pass
    assert (tmp_path / "snapshot.pickle").exists()
    start = calls(fake_torch, "_record_memory_history")[0][2]
    assert start["stacks"] == "python" and start["max_entries"] == 100_000


@pytest.mark.parametrize("env, name", [
    ({"RANK": "3", "LOCAL_RANK": "1"}, "snapshot_rank3.pickle"),
    ({"LOCAL_RANK": "2"}, "snapshot_rank2.pickle"),
    ({}, "snapshot.pickle"),
])
def test_record_puts_the_rank_in_the_name(fake_torch, tmp_path, monkeypatch, env, name):
    import snapscan.torch as st

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with st.record(tmp_path / "snapshot.pickle") as rec:
        pass
    assert os.path.basename(rec.path) == name and os.path.exists(rec.path)


def test_record_expands_placeholders(fake_torch, tmp_path, monkeypatch):
    import snapscan.torch as st

    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    rec = st.record(str(tmp_path / "r{rank}-l{local_rank}-{pid}.pickle"))
    assert os.path.basename(rec.path) == f"r5-l1-{os.getpid()}.pickle"


def test_record_dumps_when_the_block_raises_and_keeps_its_exception(fake_torch, tmp_path):
    import snapscan.torch as st

    path = tmp_path / "snap.pickle"
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        with st.record(path):
            fake_torch._fake.simulate_oom()
    assert path.exists()
    assert not fake_torch._fake.state.recording


def test_a_failing_dump_does_not_hide_the_oom(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    fake_torch._fake.state.dump_error = OSError("disk full")
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        with st.record(tmp_path / "snap.pickle"):
            fake_torch._fake.simulate_oom()
    assert "disk full" in capsys.readouterr().err
    assert not fake_torch._fake.state.recording


def test_a_failing_dump_without_an_exception_raises(fake_torch, tmp_path):
    import snapscan.torch as st

    fake_torch._fake.state.dump_error = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        with st.record(tmp_path / "snap.pickle"):
            pass
    assert not fake_torch._fake.state.recording


def test_record_report_prints_the_report(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    with st.record(tmp_path / "snap.pickle", report=True):
        pass
    assert "OUT OF MEMORY" in capsys.readouterr().err


def test_record_survives_a_failing_report(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"garbage")
    fake_torch._fake.state.snapshot = str(garbage)
    with st.record(tmp_path / "snap.pickle", report=True) as rec:
        pass
    err = capsys.readouterr().err
    assert rec.dumped and "could not report" in err and "not a memory snapshot" in err


def test_record_without_cuda_warns_and_records_nothing(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    fake_torch._fake.state.cuda_available = False
    with st.record(tmp_path / "snap.pickle") as rec:
        pass
    assert not rec.dumped and not (tmp_path / "snap.pickle").exists()
    assert "CUDA is not available" in capsys.readouterr().err
    assert not calls(fake_torch, "_record_memory_history")


# on_oom() ------------------------------------------------------------------------------------

def oom_file(tmp_path, rank, n=1):
    return tmp_path / f"oom_rank{rank}_{os.getpid()}_{n}.pickle"


def oom(torch, hook=None):
    """One simulated OOM; then, with ``hook``, wait for its report (printed by a thread)."""
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch._fake.simulate_oom()
    if hook is not None:
        assert hook.wait(60), "the report did not finish"


def test_on_oom_dumps_reports_and_keeps_the_oom(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path / "oom")
    assert len(fake_torch._fake.state.observers) == 1
    assert fake_torch._fake.state.recording, "history is recorded from on_oom() on"
    with pytest.raises(fake_torch.cuda.OutOfMemoryError, match="Tried to allocate"):
        fake_torch._fake.simulate_oom(device=0)
    assert hook.wait(60)
    path = oom_file(tmp_path / "oom", 0)
    assert path.exists() and hook.paths == [str(path)]
    err = capsys.readouterr().err
    assert f"writing {path}" in err
    assert "OUT OF MEMORY" in err and "Verdict" in err


def test_on_oom_uses_rank_then_local_rank(fake_torch, tmp_path, monkeypatch):
    import snapscan.torch as st

    monkeypatch.setenv("LOCAL_RANK", "1")
    st.on_oom(tmp_path, report=False)
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert oom_file(tmp_path, 1).exists()
    monkeypatch.setenv("RANK", "7")
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert oom_file(tmp_path, 7, n=2).exists()


def test_on_oom_without_report_only_names_the_file(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    st.on_oom(tmp_path, report=False, history=False)
    assert not calls(fake_torch, "_record_memory_history")
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    err = capsys.readouterr().err
    assert "OUT OF MEMORY" not in err and str(oom_file(tmp_path, 0)) in err


def test_on_oom_survives_a_failing_report(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x80\x02garbage")
    fake_torch._fake.state.snapshot = str(garbage)
    hook = st.on_oom(tmp_path)
    oom(fake_torch, hook)
    err = capsys.readouterr().err
    assert "could not report" in err and oom_file(tmp_path, 0).exists()


def test_on_oom_survives_a_missing_binary(fake_torch, tmp_path, capsys, monkeypatch):
    import snapscan.torch as st

    monkeypatch.setenv("SNAPSCAN_BIN", str(tmp_path / "missing"))
    hook = st.on_oom(tmp_path)
    oom(fake_torch, hook)
    assert "could not report" in capsys.readouterr().err


def test_on_oom_survives_a_failing_dump(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    fake_torch._fake.state.dump_error = RuntimeError("CUDA error: an illegal memory access")
    hook = st.on_oom(tmp_path)
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert "illegal memory access" in capsys.readouterr().err
    assert hook.paths == []


def test_on_oom_survives_an_unwritable_dir(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    blocker = tmp_path / "file"
    blocker.write_text("x")
    st.on_oom(blocker / "sub")
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert "could not write" in capsys.readouterr().err


def test_on_oom_twice_attaches_once_and_disable(fake_torch, tmp_path):
    import snapscan.torch as st

    first = st.on_oom(tmp_path / "a")
    second = st.on_oom(tmp_path / "b", report=False)
    assert first is second and len(fake_torch._fake.state.observers) == 1
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert oom_file(tmp_path / "b", 0).exists() and not (tmp_path / "a").exists()
    second.disable()
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert second.paths == [str(oom_file(tmp_path / "b", 0))]


def test_on_oom_without_cuda_does_nothing(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    fake_torch._fake.state.cuda_available = False
    st.on_oom(tmp_path)
    assert not fake_torch._fake.state.observers
    assert "CUDA is not available" in capsys.readouterr().err


def test_on_oom_with_a_torch_without_the_observer(fake_torch, tmp_path, capsys, monkeypatch):
    import snapscan.torch as st

    monkeypatch.delattr(fake_torch._C, "_cuda_attach_out_of_memory_observer")
    hook = st.on_oom(tmp_path)
    assert not hook.enabled
    assert "no out-of-memory observer" in capsys.readouterr().err


def test_record_keeps_on_oom_history(fake_torch, tmp_path):
    import snapscan.torch as st

    st.on_oom(tmp_path)
    with st.record(tmp_path / "snap.pickle"):
        pass
    assert fake_torch._fake.state.recording, "on_oom() still wants the history"
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    assert oom_file(tmp_path, 0).exists()


# on_oom() in a loop that retries ---------------------------------------------------------

FAKE_REPORT = """\
import os, sys, time
with open(os.environ["FAKE_REPORT_LOG"], "a") as f:
    f.write("start\\n")
# Runs until the test creates the release file (at most 30 s).
deadline = time.monotonic() + 30
while not os.path.exists(os.environ["FAKE_REPORT_RELEASE"]) and time.monotonic() < deadline:
    time.sleep(0.01)
print("FAKE REPORT of " + sys.argv[-1])
"""


@pytest.fixture
def slow_report(tmp_path, monkeypatch):
    """SNAPSCAN_BIN is a stand-in binary that reports only once ``release()`` was called; the
    lines of ``started()`` count the reports it began."""
    import sys
    import types

    exe = tmp_path / "fake-snapscan"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_REPORT)
    exe.chmod(0o755)
    log = tmp_path / "report.log"
    release = tmp_path / "release"
    monkeypatch.setenv("SNAPSCAN_BIN", str(exe))
    monkeypatch.setenv("FAKE_REPORT_LOG", str(log))
    monkeypatch.setenv("FAKE_REPORT_RELEASE", str(release))
    yield types.SimpleNamespace(
        started=lambda: log.read_text().count("start") if log.exists() else 0,
        release=lambda: release.write_text(""),
    )
    release.write_text("")


def test_two_ooms_give_two_files(fake_torch, tmp_path):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path, report=False)
    assert hook.path == str(oom_file(tmp_path, 0, 1))
    oom(fake_torch)
    oom(fake_torch)
    assert hook.paths == [str(oom_file(tmp_path, 0, 1)), str(oom_file(tmp_path, 0, 2))]
    assert all(os.path.exists(p) for p in hook.paths)
    assert hook.path == str(oom_file(tmp_path, 0, 3)) and hook.ooms == 2


def test_the_observer_returns_before_the_report_ends(fake_torch, tmp_path, capsys, slow_report):
    import time

    import snapscan.torch as st

    hook = st.on_oom(tmp_path)
    t = time.monotonic()
    oom(fake_torch)
    returned = time.monotonic() - t
    # The report cannot have finished: the stand-in binary waits for the release file.
    assert not hook.wait(0)
    assert "FAKE REPORT" not in capsys.readouterr().err
    assert oom_file(tmp_path, 0).exists()
    slow_report.release()
    assert hook.wait(60)
    err = capsys.readouterr().err
    assert f"FAKE REPORT of {oom_file(tmp_path, 0)}" in err
    assert returned < 10, returned


def test_a_report_past_its_timeout_is_a_warning(fake_torch, tmp_path, capsys, slow_report):
    import snapscan.torch as st

    assert st.DEFAULT_OOM_TIMEOUT <= 10 and st.OomHook().timeout == st.DEFAULT_OOM_TIMEOUT
    hook = st.on_oom(tmp_path, timeout=0.5)
    oom(fake_torch, hook)
    err = capsys.readouterr().err
    assert "could not report" in err and "TimeoutExpired" in err
    assert f"snapscan report {oom_file(tmp_path, 0)}" in err


def test_reports_in_flight_are_bounded(fake_torch, tmp_path, capsys, slow_report):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path, max_files=10, max_reports=2)
    for _ in range(6):
        oom(fake_torch)
    assert len(hook.paths) == 6 and hook.skipped_reports == 4
    err = capsys.readouterr().err
    assert err.count("is not reported: 2 reports are still running or waiting") == 4
    assert "4 skipped so far" in err and f"run `snapscan report {oom_file(tmp_path, 0, 6)}`" in err
    slow_report.release()
    assert hook.wait(60)
    assert slow_report.started() == 2
    err = capsys.readouterr().err
    assert err.count("FAKE REPORT") == 2
    assert f"FAKE REPORT of {oom_file(tmp_path, 0, 1)}" in err
    assert f"FAKE REPORT of {oom_file(tmp_path, 0, 2)}" in err
    # Room again: the next OOM's report runs.
    oom(fake_torch, hook)
    assert slow_report.started() == 3 and hook.skipped_reports == 4


def test_a_thousand_ooms_write_max_files_and_start_few_reports(fake_torch, tmp_path, capsys,
                                                               slow_report):
    import time

    import snapscan.torch as st

    hook = st.on_oom(tmp_path)
    t = time.monotonic()
    for _ in range(1000):
        oom(fake_torch)
    took = time.monotonic() - t
    n = st.DEFAULT_MAX_FILES
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("oom_")) == sorted(
        os.path.basename(oom_file(tmp_path, 0, i)) for i in range(1, n + 1))
    assert hook.ooms == 1000 and hook.skipped_files == 1000 - n and len(hook.paths) == n
    assert hook.skipped_reports == n - st.DEFAULT_MAX_REPORTS
    err = capsys.readouterr().err
    assert err.count("no snapshot written") == 1
    assert f"this process has made its max_files={n} snapshots already" in err
    assert err.count("CUDA out of memory") == n + 1
    slow_report.release()
    assert hook.wait(60)
    assert slow_report.started() == st.DEFAULT_MAX_REPORTS
    assert took < 30, took


def test_max_files_none_and_zero(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path / "a", report=False, max_files=None)
    for _ in range(st.DEFAULT_MAX_FILES + 2):
        oom(fake_torch)
    assert len(hook.paths) == st.DEFAULT_MAX_FILES + 2 and hook.skipped_files == 0
    st.on_oom(tmp_path / "b", report=False, max_files=0)
    oom(fake_torch)
    assert not (tmp_path / "b").exists() and hook.skipped_files == 1
    assert "no snapshot written" in capsys.readouterr().err


def test_a_forked_child_counts_its_own_files(fake_torch, tmp_path):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path, report=False)
    oom(fake_torch)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            oom(fake_torch)
            ok = hook.paths == [str(oom_file(tmp_path, 0, 1))] and hook.ooms == 1
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert (tmp_path / f"oom_rank0_{pid}_1.pickle").exists()
    oom(fake_torch)
    assert hook.paths == [str(oom_file(tmp_path, 0, 1)), str(oom_file(tmp_path, 0, 2))]
