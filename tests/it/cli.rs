//! The command line: exit codes, formats, inputs (gzip, stdin, directories), golden reports.

use predicates::prelude::*;

use crate::common::{self, snapscan};

/// Compares with a golden file, or rewrites it when SNAPSCAN_BLESS=1.
pub fn golden(rel_path: &str, actual: &[u8]) {
    let path = common::root().join("tests/golden").join(rel_path);
    if std::env::var_os("SNAPSCAN_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&path)
        .unwrap_or_else(|_| panic!("missing golden {rel_path}; run with SNAPSCAN_BLESS=1"));
    if expected != actual {
        let got = common::root()
            .join("target")
            .join(format!("{}.actual", rel_path.replace('/', "_")));
        let _ = std::fs::write(&got, actual);
        panic!(
            "{rel_path} differs from the golden file (actual output written to {})",
            got.display()
        );
    }
}

fn run_ok(args: &[&str]) -> Vec<u8> {
    let out = snapscan()
        .current_dir(common::root())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

const GOLDEN_FIXTURES: [(&str, &str); 3] = [
    (
        "train-oom-forward",
        "fixtures/synth/train-oom-forward.pickle",
    ),
    ("fragmented", "fixtures/synth/fragmented.pickle"),
    (
        "magma27",
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ),
];

#[test]
fn golden_text_and_markdown_reports() {
    for (name, file) in GOLDEN_FIXTURES {
        golden(&format!("report/{name}.txt"), &run_ok(&["report", file]));
        golden(
            &format!("report/{name}.md"),
            &run_ok(&["report", "--format", "markdown", file]),
        );
    }
}

#[test]
fn a_long_steps_table_keeps_the_rows_asked_for_and_the_json_every_step() {
    let file = "fixtures/real/ZidongLiu__DeComFL__memory.pickle";
    let json: serde_json::Value =
        serde_json::from_slice(&run_ok(&["report", "--format", "json", file])).unwrap();
    let dev = &json["files"][0]["devices"][0];
    assert_eq!(dev["steps"].as_array().unwrap().len(), 7);
    let peak_step = dev["peak"]["step"].as_u64().unwrap().to_string();
    let table = |top: &str| -> (String, Vec<Vec<String>>) {
        let text = String::from_utf8(run_ok(&["report", "--top", top, file])).unwrap();
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Training steps"))
            .take_while(|l| !l.starts_with("Alive at the peak") && !l.starts_with("Across steps"))
            .collect();
        let rows = section
            .iter()
            .skip_while(|l| !l.trim_start().starts_with("step "))
            .skip(1)
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect();
        (section.join(" "), rows)
    };
    // The default eight rows hold all seven steps.
    let (title, rows) = table("8");
    assert!(title.starts_with("Training steps (peak of each"), "{title}");
    assert_eq!(rows.len(), 7);
    // Four rows asked for: the first step, the peak's, the last two, and the one step between
    // the peak's and those (a one-step gap shows the step); the two before the peak's are cut.
    let (title, rows) = table("4");
    assert!(
        title.starts_with("Training steps (5 of 7: the first, those around the peak and the last;"),
        "{title}"
    );
    let first: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(first, ["0", "…", "3", "4", "5", "6"], "{rows:?}");
    assert_eq!(rows[1][1..], ["2", "steps"]);
    assert!(
        first.contains(&peak_step.as_str()),
        "peak step {peak_step}: {rows:?}"
    );
}

#[test]
fn md_is_short_for_markdown() {
    let file = "fixtures/captured/oom_backward.pickle";
    assert_eq!(
        run_ok(&["report", "--format", "md", file]),
        run_ok(&["report", "--format", "markdown", file])
    );
}

#[test]
fn golden_stats() {
    golden(
        "stats/verl.txt",
        &run_ok(&[
            "stats",
            "fixtures/real/volcengine__verl__mem_mempools.pickle",
        ]),
    );
}

#[test]
fn stats_json_contract() {
    let out = run_ok(&[
        "stats",
        "--format",
        "json",
        "fixtures/synth/load-oom-2dev.pickle",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["schema_version"], snapscan::report::SCHEMA_VERSION);
    let f = &v["files"][0];
    assert_eq!(f["path"], "fixtures/synth/load-oom-2dev.pickle");
    assert_eq!(f["devices"].as_array().unwrap().len(), 2);
    for key in [
        "segments",
        "reserved_bytes",
        "requested_bytes",
        "free_internal_bytes",
        "free_external_bytes",
    ] {
        assert!(f["devices"][1]["final"][key].is_u64(), "{key}");
    }
    let only1 = run_ok(&[
        "stats",
        "--format",
        "json",
        "--device",
        "1",
        "fixtures/synth/load-oom-2dev.pickle",
    ]);
    let v1: serde_json::Value = serde_json::from_slice(&only1).unwrap();
    assert_eq!(v1["files"][0]["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v1["files"][0]["devices"][0]["device"], 1);
}

#[test]
fn gzip_stdin_and_plain_inputs_give_the_same_report() {
    let plain = run_ok(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle",
    ]);
    let gz = run_ok(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle.gz",
    ]);
    let stdin = snapscan()
        .current_dir(common::root())
        .args(["report", "--format", "json", "-"])
        .pipe_stdin(common::fixture("synth/truncated.pickle.gz"))
        .unwrap()
        .output()
        .unwrap();
    assert!(stdin.status.success());
    let devices = |b: &[u8]| {
        let v: serde_json::Value = serde_json::from_slice(b).unwrap();
        v["files"][0]["devices"].clone()
    };
    assert_eq!(devices(&plain), devices(&gz));
    assert_eq!(devices(&plain), devices(&stdin.stdout));
}

#[test]
fn several_files_get_a_rank_table_with_the_outlier_flagged() {
    let out = run_ok(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/train.pickle",
        "fixtures/synth/truncated.pickle",
        "fixtures/synth/load-oom.pickle",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let rows = v["ranks"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(v["files"].as_array().unwrap().len(), 3);
    // load-oom holds ~20 GiB against ~4 GiB for the other two: the outlier, and the only OOM.
    let load = rows
        .iter()
        .find(|r| r["path"].as_str().unwrap().contains("load-oom"))
        .unwrap();
    // The names carry no rank number: not ranks of one job, so no outlier…
    assert_eq!(load["outlier"], false);
    assert_eq!(load["oom"], true);
    // … unless --ranks says they are.
    let out = run_ok(&[
        "report",
        "--format",
        "json",
        "--ranks",
        "fixtures/synth/train.pickle",
        "fixtures/synth/truncated.pickle",
        "fixtures/synth/load-oom.pickle",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let load = v["ranks"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"].as_str().unwrap().contains("load-oom"))
        .unwrap()
        .clone();
    assert_eq!(load["outlier"], true);
    let text = run_ok(&[
        "report",
        "fixtures/synth/train.pickle",
        "fixtures/synth/load-oom.pickle",
        "fixtures/synth/truncated.pickle",
    ]);
    let text = String::from_utf8(text).unwrap();
    assert!(text.starts_with("3 files, median peak"), "{}", &text[..200]);
}

#[test]
fn directories_expand_to_the_snapshots_inside() {
    let dir = std::env::temp_dir().join(format!("snapscan-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["rank0.pickle", "rank1.pickle"] {
        std::fs::copy(common::fixture("synth/tiny.pickle"), dir.join(name)).unwrap();
    }
    std::fs::write(dir.join("notes.txt"), "not a snapshot").unwrap();
    let out = snapscan()
        .args(["report", "--format", "json", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ranks: Vec<u64> = v["ranks"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, vec![0, 1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_2_with_the_file_named() {
    snapscan()
        .args(["report", "does-not-exist.pickle"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("does-not-exist.pickle"));
    let dir = std::env::temp_dir().join(format!("snapscan-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.pickle");
    let data = std::fs::read(common::fixture("synth/tiny.pickle")).unwrap();
    std::fs::write(&cut, &data[..5000]).unwrap();
    snapscan()
        .args(["stats", cut.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("cut.pickle: truncated at byte")
                .and(predicate::str::contains("of 5000")),
        );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    snapscan().args(["report"]).assert().code(2);
    snapscan()
        .args(["--help"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("Exit codes"));
    snapscan()
        .args(["report", "--help"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("Examples:"));
}

#[test]
fn output_file_option_writes_the_report_there() {
    let dir = std::env::temp_dir().join(format!("snapscan-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("r.md");
    snapscan()
        .current_dir(common::root())
        .args([
            "report",
            "--format",
            "markdown",
            "-o",
            out.to_str().unwrap(),
            "fixtures/synth/load-oom.pickle",
        ])
        .assert()
        .code(0)
        .stdout(predicate::str::is_empty());
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.starts_with("# snapscan report"));
    assert!(md.contains("Verdict: FULL"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Text and Markdown describe only what their tables show (the lists are capped at
/// max(--top, 100)), and say the same as with `--full`, counts in titles included.
#[test]
fn capped_text_and_markdown_reports_equal_full_ones() {
    let report = |args: &[&str], path: &std::path::Path| -> Vec<u8> {
        let out = common::snapscan()
            .arg("report")
            .args(args)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", path.display());
        out.stdout
    };
    for path in common::snapshot_fixtures() {
        for args in [
            &["--format", "text"][..],
            &["--format", "markdown"],
            &["--format", "text", "--top", "150"],
        ] {
            let full: Vec<&str> = args.iter().copied().chain(["--full"]).collect();
            assert!(
                report(args, &path) == report(&full, &path),
                "{} {args:?}: differs from --full",
                path.display()
            );
        }
    }
}

/// Default JSON reports stay small (≤ 1 MB for every real fixture): long lists keep 100 entries
/// and sum the rest beside them; `--full` keeps everything, and the two agree.
#[test]
fn default_json_reports_are_capped_and_full_keeps_everything() {
    let json = |args: &[&str], path: &std::path::Path| -> (usize, serde_json::Value) {
        let out = common::snapscan()
            .args(["report", "--format", "json"])
            .args(args)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success());
        (
            out.stdout.len(),
            serde_json::from_slice(&out.stdout).unwrap(),
        )
    };
    let sum = |v: &serde_json::Value, key: &str| -> u64 {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x[key].as_u64().unwrap())
            .sum()
    };
    let mut capped_any = 0;
    for path in common::snapshot_fixtures() {
        if !common::rel(&path).starts_with("fixtures/real/") {
            continue;
        }
        let (size, small) = json(&[], &path);
        assert!(size <= 1_000_000, "{}: {size} bytes", path.display());
        let (_, full) = json(&["--full"], &path);
        let devices = full["files"][0]["devices"].as_array().unwrap();
        for (d, dev) in devices.iter().enumerate() {
            let cut = &small["files"][0]["devices"][d];
            let all = dev["live_at_peak"].as_array().unwrap();
            let kept = cut["live_at_peak"].as_array().unwrap();
            assert_eq!(kept[..], all[..all.len().min(100)], "{}", path.display());
            if all.len() > 100 {
                capped_any += 1;
                let o = &cut["live_at_peak_omitted"];
                assert_eq!(o["count"].as_u64().unwrap() as usize, all.len() - 100);
                assert_eq!(
                    sum(&cut["live_at_peak"], "requested_bytes")
                        + o["requested_bytes"].as_u64().unwrap(),
                    sum(&dev["live_at_peak"], "requested_bytes")
                );
            } else {
                assert!(cut["live_at_peak_omitted"].is_null());
            }
            let segs = dev["segments"].as_array().unwrap();
            let kept = cut["segments"].as_array().unwrap();
            assert!(kept.iter().all(|s| segs.contains(s)));
            if segs.len() > 100 {
                let o = &cut["segments_omitted"];
                assert_eq!(kept.len(), 100);
                assert_eq!(o["count"].as_u64().unwrap() as usize, segs.len() - 100);
                assert_eq!(
                    sum(&cut["segments"], "free_bytes") + o["free_bytes"].as_u64().unwrap(),
                    sum(&dev["segments"], "free_bytes")
                );
                let with_holes = |l: &serde_json::Value| {
                    l.as_array()
                        .unwrap()
                        .iter()
                        .filter(|s| s["free_bytes"].as_u64().unwrap() > 0)
                        .count() as u64
                };
                assert_eq!(
                    with_holes(&cut["segments"]) + o["count_with_free_bytes"].as_u64().unwrap(),
                    with_holes(&dev["segments"])
                );
                // The kept ones have the most free bytes.
                let least_kept = kept.iter().map(|s| s["free_bytes"].as_u64().unwrap()).min();
                let dropped_max = segs
                    .iter()
                    .filter(|s| !kept.contains(s))
                    .map(|s| s["free_bytes"].as_u64().unwrap())
                    .max();
                assert!(dropped_max <= least_kept);
            }
        }
    }
    assert!(
        capped_any > 0,
        "no real fixture has more than 100 live allocations"
    );
}

/// `input::decompress_bytes`, which the file reader runs on a file's bytes (and the fuzz target
/// `compressed_report` on its input), gives what the file reader gives: gzip, gzip members one
/// after another, zstd and a zstd frame after a skippable frame decompress to the pickle;
/// a plain pickle is `None`; a cut stream is an error naming the input, and with salvage the
/// part before the cut with a note saying so.
#[test]
fn decompress_bytes_gives_what_the_file_reader_gives() {
    use snapscan::input::{self, Compression};
    use snapscan::progress::Loading;

    // Big enough for several zstd blocks (at most 128 KiB each), so a cut keeps some whole.
    let plain = std::fs::read(common::fixture("synth/train.pickle")).unwrap();
    let gzip = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, b).unwrap();
        e.finish().unwrap()
    };
    let zst = zstd::bulk::compress(&plain, 3).unwrap();
    let mut members = gzip(&plain[..1000]);
    members.extend(gzip(&plain[1000..]));
    // A skippable frame (magic 0x184D2A50, 4 bytes of content) before the zstd frame.
    let mut skippable = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
    skippable.extend(&zst);
    let dir = std::env::temp_dir().join(format!("snapscan-decompress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes, compression) in [
        ("one.pickle.gz", gzip(&plain), Compression::Gzip),
        ("members.pickle.gz", members, Compression::Gzip),
        ("one.pickle.zst", zst.clone(), Compression::Zstd),
        ("skippable.pickle.zst", skippable, Compression::Zstd),
    ] {
        let d = input::decompress_bytes(name, &bytes, &mut Loading::hidden(), false)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: not seen as compressed"));
        assert!(d.bytes == plain, "{name}: other bytes");
        assert_eq!(d.compression, compression, "{name}");
        assert!(d.note.is_none(), "{name}: {:?}", d.note);
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        let (read, read_compression) = input::read_input(&path).unwrap();
        assert!(
            *read == *plain && read_compression == compression,
            "{name}: the file reader"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        input::decompress_bytes("plain", &plain, &mut Loading::hidden(), false)
            .unwrap()
            .is_none()
    );

    let cut = &zst[..zst.len() * 3 / 4];
    let err = input::decompress_bytes("cut.zst", cut, &mut Loading::hidden(), false)
        .expect_err("a cut stream")
        .to_string();
    assert!(
        err.starts_with("cut.zst: zstd data is corrupt") && err.contains("--salvage"),
        "{err}"
    );
    let kept = input::decompress_bytes("cut.zst", cut, &mut Loading::hidden(), true)
        .unwrap()
        .unwrap();
    assert!(!kept.bytes.is_empty() && plain.starts_with(&kept.bytes));
    let note = kept.note.expect("a note");
    assert!(note.contains("the zstd stream breaks off"), "{note}");
}
