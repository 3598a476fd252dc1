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

def oom_file(tmp_path, rank):
    return tmp_path / f"oom_rank{rank}_{os.getpid()}.pickle"


def test_on_oom_dumps_reports_and_keeps_the_oom(fake_torch, tmp_path, capsys):
    import snapscan.torch as st

    hook = st.on_oom(tmp_path / "oom")
    assert len(fake_torch._fake.state.observers) == 1
    assert fake_torch._fake.state.recording, "history is recorded from on_oom() on"
    with pytest.raises(fake_torch.cuda.OutOfMemoryError, match="Tried to allocate"):
        fake_torch._fake.simulate_oom(device=0)
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
    assert oom_file(tmp_path, 7).exists()


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
    st.on_oom(tmp_path)
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
    err = capsys.readouterr().err
    assert "could not report" in err and oom_file(tmp_path, 0).exists()


def test_on_oom_survives_a_missing_binary(fake_torch, tmp_path, capsys, monkeypatch):
    import snapscan.torch as st

    monkeypatch.setenv("SNAPSCAN_BIN", str(tmp_path / "missing"))
    st.on_oom(tmp_path)
    with pytest.raises(fake_torch.cuda.OutOfMemoryError):
        fake_torch._fake.simulate_oom()
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
