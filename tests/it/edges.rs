//! The edges a CI pipeline meets: checks and diffs that would check nothing, empty folders, and
//! one unreadable file among several.

use predicates::prelude::*;

use crate::common::{self, snapscan};

const TRAIN: &str = "fixtures/synth/train.pickle";
const LOAD_OOM: &str = "fixtures/synth/load-oom.pickle";

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-edges-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `{"segments": [], "device_traces": []}` as CPython's pickler writes it.
const EMPTY_SNAPSHOT: &[u8] = b"\x80\x04\x95\x24\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94u.";

#[test]
fn check_and_diff_that_check_nothing_exit_2_and_say_why() {
    let dir = temp_dir("nothing");
    let empty = dir.join("empty.pickle");
    std::fs::write(&empty, EMPTY_SNAPSHOT).unwrap();
    let empty_dir = dir.join("artifacts");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let root = common::root();
    let cases: [(Vec<&std::ffi::OsStr>, &str); 4] = [
        (
            vec![
                "check".as_ref(),
                "--device".as_ref(),
                "7".as_ref(),
                "--max-peak".as_ref(),
                "1GiB".as_ref(),
                "--fail-on-oom".as_ref(),
                TRAIN.as_ref(),
            ],
            "no device 7",
        ),
        (
            vec![
                "check".as_ref(),
                "--max-peak".as_ref(),
                "1GiB".as_ref(),
                empty_dir.as_os_str(),
            ],
            "no snapshot in this directory",
        ),
        (
            vec![
                "check".as_ref(),
                "--max-peak".as_ref(),
                "1GiB".as_ref(),
                empty.as_os_str(),
            ],
            "an empty snapshot",
        ),
        (
            vec![
                "diff".as_ref(),
                "--device".as_ref(),
                "3".as_ref(),
                TRAIN.as_ref(),
                TRAIN.as_ref(),
            ],
            "no device 3",
        ),
    ];
    for (args, why) in cases {
        snapscan()
            .current_dir(&root)
            .args(&args)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains(why));
    }
    // A folder with no snapshot is an error for report too; a valid empty snapshot is not.
    snapscan()
        .arg("report")
        .arg(&empty_dir)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no snapshot in this directory"));
    snapscan()
        .arg("report")
        .arg(&empty)
        .assert()
        .success()
        .stdout(predicate::str::contains("nothing to report"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_unreadable_file_does_not_hide_the_others() {
    let dir = temp_dir("unreadable");
    let cut = dir.join("rank1.pickle");
    let whole = std::fs::read(common::fixture("synth/truncated.pickle")).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let root = common::root();
    let out = snapscan()
        .current_dir(&root)
        .args(["report", LOAD_OOM])
        .arg(&cut)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("OUT OF MEMORY"),
        "the readable file is reported: {stdout}"
    );
    assert!(stdout.contains("Could not read") && stdout.contains("rank1.pickle"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank1.pickle"));

    let out = snapscan()
        .current_dir(&root)
        .args(["report", "--format", "json", LOAD_OOM])
        .arg(&cut)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["files"].as_array().unwrap().len(), 1);
    assert_eq!(v["files"][0]["path"], LOAD_OOM);
    let bad = &v["unreadable"][0];
    assert!(bad["path"].as_str().unwrap().ends_with("rank1.pickle"));
    assert!(bad["error"].as_str().unwrap().contains("truncated"));

    // Alone, the same file is an error as before.
    snapscan().arg("report").arg(&cut).assert().code(2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--stacks=python` shows only the Python frames of stacks that have C++ frames too (verl's
/// vLLM KV-cache blocks); a bare `--stacks` before the file still takes no value.
#[test]
fn stacks_python_shows_python_frames_only() {
    let file = common::fixture("real/volcengine__verl__mem_mempools.pickle");
    let run = |flag: &str| {
        let out = snapscan()
            .args(["report", "--top", "3", flag])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}");
        String::from_utf8(out.stdout).unwrap()
    };
    let all = run("--stacks");
    let python = run("--stacks=python");
    let kept: Vec<&str> = python.lines().collect();
    let removed: Vec<&str> = all.lines().filter(|l| !kept.contains(l)).collect();
    assert!(
        !removed.is_empty(),
        "C++ frames were shown and are now left out"
    );
    for l in &removed {
        let file = l.trim().split(':').next().unwrap();
        assert!(!file.ends_with(".py"), "a Python frame was left out: {l}");
    }
    assert!(kept.iter().all(|l| all.lines().any(|a| a == *l)));
    assert!(python.contains("vllm/worker/cache_engine.py:83:_allocate_kv_cache"));
}

fn stdout_of(args: &[&str]) -> String {
    let out = snapscan()
        .current_dir(common::root())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// "1 events", "1 frees", "1 allocations", "1 sites" and the like, in every report and stats
/// text of the fixtures (LfieLike's trace is one lone free; load-oom has one call site).
#[test]
fn counts_agree_with_their_nouns() {
    let plurals = [
        "events",
        "frees",
        "allocations",
        "sites",
        "holes",
        "segments",
        "blocks",
        "entries",
    ];
    for path in common::snapshot_fixtures() {
        let f = path.to_str().unwrap();
        for text in [stdout_of(&["report", f]), stdout_of(&["stats", f])] {
            let flat = text.replace('\n', " ");
            for noun in plurals {
                for lead in [" ", "(", "of "] {
                    let bad = format!("{lead}1 {noun}");
                    assert!(!flat.contains(&bad), "{f}: `{bad}` in {flat}");
                }
            }
        }
    }
    let lfie = stdout_of(&[
        "report",
        "fixtures/real/LfieLike__SketchKV2__my_snapshot.pickle",
    ]);
    assert!(lfie.contains("Trace: 1 event over"), "{lfie}");
    assert!(lfie
        .replace('\n', " ")
        .contains("1 free of allocations made before the first event"));
}

/// No "0.0B sits in holes smaller than the largest request (0.0B)" without a request.
#[test]
fn no_unusable_hole_figure_without_a_request() {
    for f in [
        "fixtures/real/ZijianDu__Attention__memory.pickle",
        "fixtures/real/LfieLike__SketchKV2__my_snapshot.pickle",
        "fixtures/real/volcengine__verl__mem_mempools.pickle",
    ] {
        let text = stdout_of(&["report", f]).replace('\n', " ");
        assert!(text.contains("Fragmentation at the peak:"), "{f}");
        assert!(
            !text.contains("smaller than the largest request"),
            "{f}: {text}"
        );
    }
    // With requests it stays.
    let text = stdout_of(&["report", "fixtures/synth/fragmented.pickle"]).replace('\n', " ");
    assert!(text.contains("sits in holes smaller than the largest request (64.0MiB)"));
}

/// A device with no segments and no trace entries (ZijianDu's second, empty trace list) is named
/// in one line by report and stats alike, and listed in the JSON summary.
#[test]
fn an_empty_device_is_named_in_one_line_everywhere() {
    let f = "fixtures/real/ZijianDu__Attention__memory.pickle";
    let line = "Device 1: nothing recorded (no segments, no trace entries).";
    let report = stdout_of(&["report", f]);
    let stats = stdout_of(&["stats", f]);
    assert_eq!(report.matches(line).count(), 1, "{report}");
    assert_eq!(stats.matches(line).count(), 1, "{stats}");
    assert!(!stats.contains("\ndevice 1\n"), "{stats}");
    assert!(!report.contains("— device 1"));
    let v: serde_json::Value =
        serde_json::from_str(&stdout_of(&["report", "--format", "json", f])).unwrap();
    assert_eq!(
        v["files"][0]["summary"]["empty_devices"],
        serde_json::json!([1])
    );
    assert_eq!(v["files"][0]["devices"].as_array().unwrap().len(), 1);
}

/// A device in one run only is never "unchanged" (here: the new run's device 1 has a zero peak).
#[test]
fn diff_of_a_device_in_one_run_only_is_not_unchanged() {
    let dir = temp_dir("one-sided");
    let mut v: serde_json::Value = serde_json::from_str(&stdout_of(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/load-oom-2dev.pickle",
    ]))
    .unwrap();
    v["files"][0]["devices"][1]["peak"]["requested_bytes"] = 0.into();
    let new = dir.join("new.json");
    // A stored report starts with its schema_version (serde_json's Value sorts the keys).
    let stored = format!(
        "{{\"schema_version\": 1, \"files\": {}, \"ranks\": null}}",
        v["files"]
    );
    std::fs::write(&new, stored).unwrap();
    let text = stdout_of(&["diff", TRAIN, new.to_str().unwrap()]);
    let line = text
        .lines()
        .find(|l| l.starts_with("Device 1 (only in the new run)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!line.contains("unchanged"), "{line}");
    assert!(
        line.ends_with("the base run has no such device, so nothing to compare."),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// MAGMA27 holds 13.2 GiB reserved and 1.3 GiB allocated at the dump: remarked on.
#[test]
fn mostly_cached_reserved_memory_is_remarked_on() {
    let text = stdout_of(&[
        "report",
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ])
    .replace('\n', " ");
    assert!(
        text.contains("most of the reserved memory is cached and unused: 13.2GiB reserved, 1.3GiB allocated at the dump, so 11.9GiB (90%)"),
        "{text}"
    );
    let zijian = stdout_of(&["report", "fixtures/real/ZijianDu__Attention__memory.pickle"]);
    assert!(
        !zijian.contains("cached and unused"),
        "48% cached is not most"
    );
}
