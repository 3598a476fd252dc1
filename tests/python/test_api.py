"""snapscan.report(), snapscan.explain() and their errors."""

import json
import os
import subprocess

import pytest

import snapscan
from conftest import FIXTURES, fixture

OOM = fixture("synth", "train-oom-forward.pickle")


def cli_json(exe, *args):
    out = subprocess.run([exe, *args], stdout=subprocess.PIPE, check=True).stdout
    return json.loads(out)


def test_report_equals_the_cli_json(snapscan_exe):
    got = snapscan.report(OOM)
    assert got == cli_json(snapscan_exe, "report", "--format", "json", OOM)
    dev = got["files"][0]["devices"][0]
    assert dev["oom"], "the fixture ran out of memory"
    assert dev["peak"]["requested_bytes"] > 0


def test_report_takes_path_objects_lists_and_options(snapscan_exe):
    from pathlib import Path

    two = [Path(OOM), fixture("synth", "load-oom-2dev.pickle")]
    got = snapscan.report(two)
    assert [f["path"] for f in got["files"]] == [str(p) for p in two]
    assert got == cli_json(snapscan_exe, "report", "--format", "json", *map(str, two))
    one = snapscan.report(two[1], device=1, stacks=True)
    assert [d["device"] for d in one["files"][0]["devices"]] == [1]
    assert one == cli_json(snapscan_exe, "report", "--format", "json", "--device", "1",
                           "--stacks", two[1])


def test_report_salvages_a_cut_dump(tmp_path):
    data = open(OOM, "rb").read()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(snapscan.SnapscanError) as info:
        snapscan.report(cut)
    assert "salvage" in str(info.value)
    assert snapscan.report(cut, salvage=True)["files"][0]["devices"]


def test_report_text_and_markdown():
    assert "OUT OF MEMORY" in snapscan.report_text(OOM)
    assert snapscan.report_text(OOM, format="markdown").lstrip().startswith("#")


def test_bad_file_raises_with_snapscans_message(tmp_path):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"r" * 64)
    with pytest.raises(snapscan.SnapscanError) as info:
        snapscan.report(bad)
    err = info.value
    assert err.returncode == 2
    assert "bad.pickle" in str(err) and "not a memory snapshot" in str(err)
    assert "not a memory snapshot" in err.stderr
    assert err.cmd[0] == snapscan.find_bin()


def test_missing_file_raises(tmp_path):
    with pytest.raises(snapscan.SnapscanError) as info:
        snapscan.report(tmp_path / "nothing-here.pickle")
    assert info.value.returncode == 2
    assert "nothing-here.pickle" in str(info.value)


def test_a_file_named_like_an_option_is_a_file():
    with pytest.raises(snapscan.SnapscanError) as info:
        snapscan.report("--version")
    assert "--version" in str(info.value)


def test_report_refuses_other_formats():
    with pytest.raises(TypeError, match="report_text"):
        snapscan.report(OOM, format="text")


def test_explain_matches_the_expected_figures():
    expected = json.load(open(fixture("oom-logs", "expected.json")))["files"]
    for name in ("oom-03-v15-reserved.log", "oom-22-v25-two-messages.log",
                 "not-oom-04-prose-quoted.log"):
        text = open(os.path.join(FIXTURES, "oom-logs", name), encoding="utf-8").read()
        got = snapscan.explain(text)
        want = expected[name]
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert {k: g[k] for k in w} == w, name
            assert g["reason"] and isinstance(g["advice"], list)


def test_explain_takes_bytes_and_finds_nothing_in_plain_text():
    assert snapscan.explain(b"epoch 1 loss 0.3\n") == []
    assert snapscan.explain("") == []


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SNAPSCAN_BIN", str(tmp_path / "no-such-binary"))
    with pytest.raises(snapscan.BinaryNotFoundError) as info:
        snapscan.report(OOM)
    assert "SNAPSCAN_BIN" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
