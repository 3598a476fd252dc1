//! The CI and terminal workflow: `check` budgets and exit codes, `diff` of two runs, `merge` of
//! JSON reports, compressed / stdin / glob inputs, completions, help, closed pipes, and clean
//! stdout when it is not a terminal.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use predicates::prelude::*;

use crate::common::{self, snapscan};

const TRAIN: &str = "fixtures/synth/train.pickle";
const EVAL_PEAK: &str = "fixtures/synth/eval-peak.pickle";
const LOAD_OOM: &str = "fixtures/synth/load-oom.pickle";
const FRAGMENTED: &str = "fixtures/synth/fragmented.pickle";
const OOM_FORWARD: &str = "fixtures/synth/train-oom-forward.pickle";

/// A command run from the repository root with a clean environment for colour and progress:
/// whatever the machine running the tests has set, stdout and stderr are pipes here.
fn cmd() -> assert_cmd::Command {
    let mut c = snapscan();
    c.current_dir(common::root())
        .env_remove("NO_COLOR")
        .env_remove("CI")
        .env("TERM", "xterm-256color");
    c
}

fn run(args: &[&str]) -> std::process::Output {
    cmd().args(args).output().expect("run snapscan")
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-wf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

// ------------------------------------------------------------------------------------------
// check

#[test]
fn check_exits_0_when_every_budget_holds() {
    let out = run(&[
        "check",
        "--max-peak",
        "30GiB",
        "--max-reserved",
        "5GB",
        "--max-fragmentation",
        "0.9",
        "--fail-on-oom",
        TRAIN,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.starts_with("ok: 1 file, 1 device within budgets: max-peak 30.0GiB, max-reserved 4.7GiB, max-fragmentation 0.900, fail-on-oom"), "{text}");
    assert_eq!(text.lines().count(), 1);
    assert!(out.stderr.is_empty());
}

#[test]
fn check_exits_1_for_each_budget_kind_with_one_line_per_violation() {
    // train.pickle: peak 4058353800 requested, 4355784704 reserved, fragmentation 0.582 at the
    // peak, no OOM.
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["--max-peak", "3GiB", TRAIN],
            "max-peak",
            "FAIL fixtures/synth/train.pickle device 0 max-peak: 3.8GiB (4058353800 bytes) > 3.0GiB (3221225472 bytes) (peak of requested bytes, event ",
        ),
        (
            &["--max-reserved", "4e9", TRAIN],
            "max-reserved",
            "FAIL fixtures/synth/train.pickle device 0 max-reserved: 4.1GiB (4355784704 bytes) > 3.7GiB (4000000000 bytes) (peak of reserved bytes, event ",
        ),
        (
            &["--max-fragmentation", "50%", TRAIN],
            "max-fragmentation",
            "FAIL fixtures/synth/train.pickle device 0 max-fragmentation: 0.582 > 0.500 (fragmentation at the peak, event ",
        ),
        (
            &["--fail-on-oom", LOAD_OOM],
            "fail-on-oom",
            "FAIL fixtures/synth/load-oom.pickle device 0 fail-on-oom: 1 OOM event > 0 OOM events (first OOM, event ",
        ),
    ];
    for (args, budget, line) in cases {
        let out = cmd().arg("check").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{budget}");
        let text = stdout(&out);
        assert_eq!(text.lines().count(), 1, "{budget}: {text}");
        assert!(text.starts_with(line), "{budget}: {text}");
        assert!(out.stderr.is_empty(), "{budget}");
    }
    // Several budgets crossed on several files: one line each, files in argument order.
    let out = run(&[
        "check",
        "--max-peak",
        "512MB",
        "--fail-on-oom",
        TRAIN,
        LOAD_OOM,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("train.pickle device 0 max-peak"));
    assert!(lines[1].contains("load-oom.pickle device 0 max-peak"));
    assert!(lines[2].contains("load-oom.pickle device 0 fail-on-oom"));
}

#[test]
fn check_fragmentation_is_the_worst_of_the_peak_and_every_oom() {
    // fragmented.pickle: the 64 MiB request fails with free memory scattered in holes.
    let out = run(&[
        "check",
        "--max-fragmentation",
        "0.99",
        "--format",
        "json",
        FRAGMENTED,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(v["schema_version"], snapscan::report::SCHEMA_VERSION);
    assert_eq!(v["passed"], false);
    let viol = &v["violations"][0];
    assert_eq!(viol["budget"], "max-fragmentation");
    assert_eq!(viol["at"], "oom");
    assert!(viol["measured"].as_f64().unwrap() > 0.99);
    assert_eq!(viol["limit"].as_f64(), Some(0.99));
    assert!(viol["event_index"].is_u64());
    // The per-device figures are there for dashboards, whether or not a budget failed.
    let dev = &v["files"][0]["devices"][0];
    assert_eq!(dev["oom_events"], 1);
    assert!(dev["peak_requested_bytes"].is_i64());
}

#[test]
fn check_json_round_trips_and_sizes_accept_every_notation() {
    let out = run(&[
        "check",
        "--max-peak",
        "1.5e9",
        "--max-reserved",
        "512MB",
        "--format",
        "json",
        TRAIN,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r: snapscan::report::CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.budgets.max_peak_bytes, Some(1_500_000_000));
    assert_eq!(r.budgets.max_reserved_bytes, Some(512_000_000));
    assert_eq!(r.violations.len(), 2);
    assert_eq!(
        r.violations[0].measured,
        snapscan::report::Amount::Int(4058353800)
    );
    let md = run(&[
        "check",
        "--max-peak",
        "1.5e9",
        "--format",
        "markdown",
        TRAIN,
    ]);
    assert_eq!(md.status.code(), Some(1));
    assert!(stdout(&md).starts_with("## snapscan check: 1 budget crossed\n"));
}

#[test]
fn check_exits_2_when_a_file_cannot_be_analysed() {
    cmd()
        .args(["check", "--max-peak", "20GiB", "does-not-exist.pickle"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("does-not-exist.pickle"));
    let dir = temp_dir("check-bad");
    let cut = dir.join("cut.pickle");
    let data = std::fs::read(common::fixture("synth/tiny.pickle")).unwrap();
    std::fs::write(&cut, &data[..5000]).unwrap();
    // One good file and one bad one: still 2, not a budget verdict.
    cmd()
        .args(["check", "--max-peak", "20GiB", TRAIN, cut.to_str().unwrap()])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("cut.pickle: truncated at byte"));
    // Usage errors (no budget at all, a size that is not one) are 2 as well.
    cmd().args(["check", TRAIN]).assert().code(2);
    cmd()
        .args(["check", "--max-peak", "lots", TRAIN])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a size"));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------------------
// diff

#[test]
fn diff_of_a_regression_fails_on_growth() {
    // eval-peak.pickle: the eval batch makes a higher peak than plain training.
    let out = run(&[
        "diff",
        "--format",
        "json",
        "--fail-on-growth",
        "5%",
        TRAIN,
        EVAL_PEAK,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(v["schema_version"], snapscan::report::SCHEMA_VERSION);
    assert_eq!(v["failed"], true);
    assert_eq!(v["fail_on_growth"].as_f64(), Some(0.05));
    let d = &v["devices"][0];
    assert_eq!(d["peak"]["base"], 4058353800i64);
    assert_eq!(d["peak"]["new"], 5020987524i64);
    assert_eq!(d["peak"]["delta"], 5020987524i64 - 4058353800);
    let ratio = d["peak"]["ratio"].as_f64().unwrap();
    assert!((ratio - 0.2372).abs() < 0.001, "{ratio}");
    assert_eq!(d["oom"]["change"], "none");
    // The call sites that grew most come first; the eval-only ones are new.
    let sites = d["call_sites_at_peak"].as_array().unwrap();
    assert_eq!(sites[0]["change"], "grew");
    assert!(sites
        .iter()
        .any(|s| s["change"] == "new" && s["key"] == "experiments/sft/train.py:128:evaluate"));
    let deltas: Vec<i64> = sites
        .iter()
        .map(|s| s["delta_bytes"].as_i64().unwrap())
        .collect();
    assert!(deltas.windows(2).all(|w| w[0] >= w[1]), "{deltas:?}");
    // The JSON reads back into the output struct.
    let back: snapscan::report::DiffReport = serde_json::from_slice(&out.stdout).unwrap();
    assert!(back.failed);

    // Same threshold written as a fraction; a threshold above the growth passes.
    assert_eq!(
        run(&["diff", "--fail-on-growth", "0.05", TRAIN, EVAL_PEAK])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        run(&["diff", "--fail-on-growth", "30%", TRAIN, EVAL_PEAK])
            .status
            .code(),
        Some(0)
    );
    // Without --fail-on-growth a diff is information: 0.
    let text = run(&["diff", TRAIN, EVAL_PEAK]);
    assert_eq!(text.status.code(), Some(0));
    let t = stdout(&text);
    assert!(
        t.starts_with("snapscan diff: peak +918.0MiB (+23.7%)\n"),
        "{t}"
    );
    assert!(t.contains("Call sites new or grown at the peak"));
}

#[test]
fn diff_of_an_improvement_passes_and_renders_markdown_for_a_pr() {
    let out = run(&[
        "diff",
        "--format",
        "markdown",
        "--fail-on-growth",
        "5%",
        EVAL_PEAK,
        TRAIN,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let md = stdout(&out);
    assert!(
        md.starts_with("## snapscan diff: peak -918.0MiB (-19.2%)\n"),
        "{md}"
    );
    assert!(md.contains("`fixtures/synth/eval-peak.pickle` → `fixtures/synth/train.pickle`"));
    assert!(md.contains("| peak (requested) | 4.7GiB | 3.8GiB | -918.0MiB (-19.2%) |"));
    assert!(md.contains("Within --fail-on-growth 5.0%"));
    assert!(md.contains("**Call sites shrunk or gone at the peak"));
    assert!(!md.contains('\x1b'));
}

#[test]
fn diff_reports_an_oom_that_appeared_or_disappeared() {
    let appeared = json(&run(&["diff", "--format", "json", TRAIN, OOM_FORWARD]));
    assert_eq!(appeared["devices"][0]["oom"]["change"], "appeared");
    assert_eq!(appeared["devices"][0]["oom"]["verdict"], "full");
    let gone = json(&run(&["diff", "--format", "json", OOM_FORWARD, TRAIN]));
    assert_eq!(gone["devices"][0]["oom"]["change"], "disappeared");
    let text = stdout(&run(&["diff", TRAIN, OOM_FORWARD]));
    assert!(
        text.contains("Device 0: OOM appeared (1 event, verdict full)."),
        "{text}"
    );
}

#[test]
fn diff_takes_a_stored_json_report_as_baseline() {
    let dir = temp_dir("diff-baseline");
    let baseline = dir.join("baseline.json");
    let report = run(&["report", "--format", "json", TRAIN]);
    assert!(report.status.success());
    std::fs::write(&baseline, &report.stdout).unwrap();
    let from_json = json(&run(&[
        "diff",
        "--format",
        "json",
        baseline.to_str().unwrap(),
        EVAL_PEAK,
    ]));
    let from_pickle = json(&run(&["diff", "--format", "json", TRAIN, EVAL_PEAK]));
    assert_eq!(from_json["devices"], from_pickle["devices"]);
    cmd()
        .args(["diff", TRAIN, "missing.pickle"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("missing.pickle"));
    cmd()
        .args(["diff", "--fail-on-growth", "5", TRAIN, EVAL_PEAK])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("ambiguous"));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------------------
// inputs

#[test]
fn gzip_zstd_stdin_and_glob_inputs_give_the_same_report() {
    let devices = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["files"].as_array().unwrap().len(), 1);
        v["files"][0]["devices"].clone()
    };
    let base = "fixtures/synth/truncated.pickle";
    let plain = devices(run(&["report", "--format", "json", base]));
    let gz = devices(run(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle.gz",
    ]));
    let zst = devices(run(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle.zst",
    ]));
    let stdin_zst = devices(
        cmd()
            .args(["report", "--format", "json", "-"])
            .pipe_stdin(common::fixture("synth/truncated.pickle.zst"))
            .unwrap()
            .output()
            .unwrap(),
    );
    // A quoted pattern, expanded by snapscan itself.
    let glob = devices(run(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle.z*",
    ]));
    assert_eq!(plain, gz);
    assert_eq!(plain, zst);
    assert_eq!(plain, stdin_zst);
    assert_eq!(plain, glob);
    let stats = json(&run(&[
        "stats",
        "--format",
        "json",
        "fixtures/synth/truncated.pickle.zst",
    ]));
    assert_eq!(stats["files"][0]["compression"], "zstd");
}

#[test]
fn glob_patterns_expand_sorted_and_an_empty_match_is_an_error() {
    let out = run(&[
        "report",
        "--format",
        "json",
        "fixtures/synth/load-oom*.pickle",
    ]);
    assert!(out.status.success());
    let v = json(&out);
    let paths: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec![
            "fixtures/synth/load-oom-2dev.pickle",
            "fixtures/synth/load-oom-protocol5.pickle",
            "fixtures/synth/load-oom.pickle",
        ]
    );
    assert_eq!(v["ranks"]["rows"].as_array().unwrap().len(), 3);
    cmd()
        .args([
            "check",
            "--fail-on-oom",
            "fixtures/synth/nothing-here-*.pickle",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no file matches this pattern"));
    // Ranks from names, through a glob over a directory of rank files.
    let dir = temp_dir("glob-ranks");
    for r in [0, 1, 2] {
        std::fs::copy(
            common::fixture("synth/tiny.pickle"),
            dir.join(format!("snap_rank{r}.pickle")),
        )
        .unwrap();
    }
    let pattern = dir.join("snap_rank*.pickle");
    let v = json(&run(&[
        "report",
        "--format",
        "json",
        pattern.to_str().unwrap(),
    ]));
    let ranks: Vec<u64> = v["ranks"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, vec![0, 1, 2]);
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------------------
// merge

#[test]
fn merge_combines_json_reports_into_the_rank_table() {
    let dir = temp_dir("merge");
    // Two nodes, each with its own report; the snapshot names carry no rank, the report
    // names do.
    for (rank, file) in [(0, TRAIN), (1, LOAD_OOM)] {
        let out = run(&["report", "--format", "json", file]);
        assert!(out.status.success());
        std::fs::write(dir.join(format!("rank{rank}.json")), &out.stdout).unwrap();
    }
    let pattern = dir.join("*.json");
    let out = run(&["merge", "--format", "json", pattern.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let m: snapscan::report::MergeReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m.schema_version, snapscan::report::SCHEMA_VERSION);
    assert_eq!(m.inputs.len(), 2);
    let rows = &m.ranks.rows;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].rank, Some(0));
    assert_eq!(rows[0].peak_requested_bytes, 4058353800);
    assert!(!rows[0].oom);
    assert_eq!(rows[1].rank, Some(1));
    assert!(rows[1].oom);
    // The same table as `report` over the snapshots themselves.
    let direct = json(&run(&["report", "--format", "json", TRAIN, LOAD_OOM]));
    assert_eq!(
        direct["ranks"]["median_peak_requested_bytes"],
        m.ranks.median_peak_requested_bytes
    );
    let text = stdout(&run(&["merge", dir.to_str().unwrap()]));
    assert!(
        text.starts_with("snapscan merge: 2 files from 2 reports, median peak"),
        "{text}"
    );
    assert!(text.contains("OOM on: rank 1."), "{text}");
    // A snapshot is not a report.
    cmd()
        .args(["merge", TRAIN])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("snapscan report --format json"));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------------------
// terminal manners

/// Every subcommand with arguments that make it write to stdout (`merge` reads a report
/// written into `dir`), and the exit code each should give.
static DATABASES: AtomicU32 = AtomicU32::new(0);

fn stdout_commands(dir: &std::path::Path) -> Vec<(Vec<String>, i32)> {
    let report = dir.join("rank0.json");
    let out = run(&["report", "--format", "json", TRAIN]);
    assert!(out.status.success());
    std::fs::write(&report, &out.stdout).unwrap();
    let report = report.to_string_lossy().to_string();
    // A new database each time the list is made (sql refuses to overwrite one).
    let database = dir.join(format!(
        "snap-{}.db",
        DATABASES.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&database);
    let database = database.to_string_lossy().to_string();
    let v = |args: &[&str], code: i32| (args.iter().map(|a| a.to_string()).collect(), code);
    vec![
        v(&["report", OOM_FORWARD], 0),
        v(&["report", "--format", "json", TRAIN], 0),
        v(&["stats", TRAIN], 0),
        v(&["replay", OOM_FORWARD], 0),
        v(&["whatif", OOM_FORWARD], 0),
        v(&["timeline", "fixtures/synth/tiny.pickle", "-o", "-"], 0),
        v(&["segments", "fixtures/synth/tiny.pickle", "-o", "-"], 0),
        v(&["view", "fixtures/synth/tiny.pickle", "-o", "-"], 0),
        v(
            &["explain", "fixtures/oom-logs/oom-01-v10-cached-kib.log"],
            0,
        ),
        v(&["check", "--fail-on-oom", OOM_FORWARD], 1),
        v(&["diff", TRAIN, OOM_FORWARD], 0),
        v(&["merge", &report], 0),
        v(&["completions", "bash"], 0),
        v(&["sql", TRAIN, "-o", &database], 0),
        v(&["query", TRAIN, "SELECT * FROM devices"], 0),
        // Its stdin closed at once: the client left before a word.
        v(&["mcp"], 0),
    ]
}

/// The subcommands `snapscan --help` lists.
fn subcommands() -> Vec<String> {
    let help = stdout(&run(&["--help"]));
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn every_subcommand_has_examples_and_the_exit_codes_are_documented() {
    let commands = subcommands();
    for c in ["report", "check", "diff", "merge", "completions"] {
        assert!(commands.iter().any(|x| x == c), "{c} in {commands:?}");
    }
    for c in &commands {
        let out = run(&[c, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{c}");
        assert!(
            stdout(&out).contains("Example"),
            "{c} --help has no example"
        );
    }
    let top = stdout(&run(&["--help"]));
    assert!(top.contains("Exit codes: 0 = analysed; 1 = a budget or finding was crossed"));
    for c in ["check", "diff", "merge"] {
        assert!(
            stdout(&run(&[c, "--help"])).contains("Exit codes:"),
            "{c} --help"
        );
    }
}

#[test]
fn completions_for_the_usual_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = stdout(&out);
        assert!(script.contains("snapscan"), "{shell}");
        assert!(script.contains("fail-on-growth"), "{shell}");
    }
    cmd().args(["completions", "tcsh"]).assert().code(2);
}

#[test]
fn a_closed_pipe_exits_0_silently_for_every_subcommand() {
    let dir = temp_dir("closed-pipe");
    let commands = stdout_commands(&dir);
    for c in subcommands() {
        assert!(
            commands.iter().any(|(args, _)| args[0] == c),
            "subcommand {c} is not in the closed-pipe test"
        );
    }
    for (args, expected) in commands {
        // `snapscan … | head -c0`: the reader is gone before snapscan writes.
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("snapscan"))
            .current_dir(common::root())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(expected), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nothing_but_the_report_reaches_stdout_when_it_is_not_a_terminal() {
    let dir = temp_dir("pipe");
    for (args, _) in stdout_commands(&dir) {
        for quiet in [false, true] {
            let mut c = cmd();
            if quiet {
                c.arg("--quiet");
            }
            if args[0] == "sql" {
                let _ = std::fs::remove_file(args.last().unwrap());
            }
            let out = c.args(&args).output().unwrap();
            assert!(
                !out.stdout.contains(&0x1b),
                "{args:?}: colour codes on a pipe"
            );
            assert!(
                !out.stderr.contains(&0x1b),
                "{args:?}: escape codes on stderr"
            );
            assert!(
                !out.stderr.contains(&b'\r'),
                "{args:?}: progress bar on stderr"
            );
            assert!(
                out.stderr.is_empty(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // The text report on a pipe is byte for byte what `-o FILE` writes.
    let file = dir.join("r.txt");
    let piped = run(&["report", OOM_FORWARD]);
    cmd()
        .args(["report", "-o", file.to_str().unwrap(), OOM_FORWARD])
        .assert()
        .code(0)
        .stdout(predicate::str::is_empty());
    assert_eq!(piped.stdout, std::fs::read(&file).unwrap());
    assert!(stdout(&piped).contains("OUT OF MEMORY"));
    let _ = std::fs::remove_dir_all(&dir);
}
