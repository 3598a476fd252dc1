//! Tests of `snapscan explain`: every log in fixtures/oom-logs/ against expected.json (real
//! messages from public issue threads, see SOURCES.md), and the command line.

use std::path::PathBuf;

use serde_json::Value;
use snapscan::explain::{self, Verdict};

use crate::common::{fixture, snapscan};

/// The fields of the JSON contract, in order.
const CONTRACT: [&str; 10] = [
    "line",
    "gpu",
    "requested_bytes",
    "capacity_bytes",
    "free_bytes",
    "process_in_use_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "reserved_unallocated_bytes",
    "verdict",
];

fn expected() -> serde_json::Map<String, Value> {
    let path = fixture("oom-logs/expected.json");
    let text = std::fs::read_to_string(&path).expect("expected.json");
    let doc: Value = serde_json::from_str(&text).expect("expected.json is JSON");
    doc["files"].as_object().expect("files").clone()
}

fn logs() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fixture("oom-logs"))
        .expect("oom-logs dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    out.sort();
    out
}

/// Only the contract fields of a message, as JSON.
fn contract(message: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in CONTRACT {
        out.insert(
            key.to_owned(),
            message.get(key).cloned().unwrap_or(Value::Null),
        );
    }
    Value::Object(out)
}

fn name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn every_fixture_gives_exactly_the_expected_messages() {
    let expected = expected();
    let logs = logs();
    assert!(logs.len() >= 40, "only {} logs", logs.len());
    let names: Vec<String> = logs.iter().map(|p| name(p)).collect();
    for key in expected.keys() {
        assert!(
            names.contains(key),
            "expected.json names {key}, which is missing"
        );
    }
    let mut failures = Vec::new();
    for log in &logs {
        let file = name(log);
        let want = expected
            .get(&file)
            .unwrap_or_else(|| panic!("{file} is not in expected.json"));
        let found = explain::scan_path(log).expect("read log");
        let got = serde_json::to_value(&found).expect("serialise");
        assert_eq!(got["schema_version"], 1);
        let got: Vec<Value> = got["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(contract)
            .collect();
        let want: Vec<Value> = want
            .as_array()
            .expect("list")
            .iter()
            .map(contract)
            .collect();
        if got != want {
            failures.push(format!(
                "{file}:\n  want {}\n  got  {}",
                serde_json::to_string(&want).unwrap_or_default(),
                serde_json::to_string(&got).unwrap_or_default()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn at_least_eight_real_messages_from_different_wordings() {
    let mut wordings = std::collections::BTreeSet::new();
    let mut count = 0;
    for log in logs() {
        for m in explain::scan_path(&log).expect("read").messages {
            count += 1;
            wordings.insert(format!("{:?}", m.wording));
        }
    }
    assert!(count >= 8, "{count}");
    assert!(wordings.len() >= 3, "{wordings:?}");
}

#[test]
fn advice_fits_the_verdict_and_never_offers_empty_cache() {
    for log in logs() {
        for m in explain::scan_path(&log).expect("read").messages {
            let file = name(&log);
            assert!(
                (2..=4).contains(&m.advice.len()),
                "{file}: {} actions",
                m.advice.len()
            );
            let all: String = m
                .advice
                .iter()
                .map(|a| format!("{} {}", a.action, a.reason))
                .collect();
            assert!(!all.contains("empty_cache"), "{file}: {all}");
            match m.verdict {
                Verdict::Fragmentation => assert!(
                    all.contains("expandable_segments:True") || all.contains("max_split_size_mb"),
                    "{file}: {all}"
                ),
                Verdict::OtherProcesses => assert!(all.contains("nvidia-smi"), "{file}: {all}"),
                Verdict::Full => assert!(
                    all.contains("batch") && all.contains("checkpointing"),
                    "{file}: {all}"
                ),
                Verdict::Unknown => {}
            }
        }
    }
}

#[test]
fn overflowing_figure_is_null_with_a_note() {
    let found =
        explain::scan_path(&fixture("oom-logs/oom-26-v2x-nvml-garbage-warning.log")).expect("read");
    let m = &found.messages[0];
    assert_eq!(m.process_in_use_bytes, None);
    assert!(
        m.notes.iter().any(|n| n.contains("17179869184.00 GiB")),
        "{:?}",
        m.notes
    );
}

#[test]
fn cli_json_from_stdin() {
    let log = std::fs::read(fixture("oom-logs/oom-22-v25-two-messages.log")).expect("log");
    let out = snapscan()
        .args(["explain", "--format", "json"])
        .write_stdin(log)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: Value = serde_json::from_slice(&out).expect("JSON");
    assert_eq!(doc["schema_version"], 1);
    let messages = doc["messages"].as_array().expect("messages");
    let want = expected()["oom-22-v25-two-messages.log"].clone();
    let want: Vec<Value> = want
        .as_array()
        .expect("list")
        .iter()
        .map(contract)
        .collect();
    let got: Vec<Value> = messages.iter().map(contract).collect();
    assert_eq!(got, want);
    assert!(messages[0]["advice"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    // The explicit `-` reads stdin too.
    let again = snapscan()
        .args(["explain", "--format", "json", "-"])
        .write_stdin(std::fs::read(fixture("oom-logs/oom-22-v25-two-messages.log")).expect("log"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(again, out);
}

#[test]
fn cli_text_on_a_file() {
    let path = fixture("oom-logs/oom-12-v21-capacty-fragmentation.log");
    let out = snapscan()
        .arg("explain")
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.starts_with("fragmentation  (line 1, GPU 0)"), "{text}");
    for needle in [
        "3.00 GiB",
        "23.65 GiB",
        "4.84 GiB",
        "expandable_segments:True",
        "first actions",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    assert!(!text.contains("empty_cache"), "{text}");
}

#[test]
fn cli_markdown_to_a_file() {
    let dir = std::env::temp_dir().join(format!("snapscan-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let target = dir.join("oom.md");
    snapscan()
        .arg("explain")
        .arg(fixture("oom-logs/oom-19-v25-three-processes.log"))
        .args(["--format", "markdown", "-o"])
        .arg(&target)
        .assert()
        .success()
        .stdout("");
    let md = std::fs::read_to_string(&target).expect("written");
    assert!(md.contains("## Line 5, GPU 0: other_processes"), "{md}");
    assert!(md.contains("| requested | 86.00 MiB | 90177536 |"), "{md}");
    assert!(md.contains("PID 2797307"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_not_oom_log_gives_an_empty_list() {
    let path = fixture("oom-logs/not-oom-06-cuda-error-driver.log");
    let out = snapscan()
        .args(["explain", "--format", "json"])
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: Value = serde_json::from_slice(&out).expect("JSON");
    assert_eq!(
        doc,
        serde_json::json!({"schema_version": 1, "messages": []})
    );
    snapscan()
        .arg("explain")
        .arg(&path)
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "no CUDA out-of-memory message found",
        ));
}

#[test]
fn cli_unreadable_log_exits_2() {
    snapscan()
        .args(["explain", "no/such/file.log"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no/such/file.log"));
}

#[test]
fn large_log_streams() {
    // 200k lines of noise around two messages: read in one pass, found with their line numbers.
    let msg = std::fs::read_to_string(fixture("oom-logs/oom-16-v22-expandable-this-process.log"))
        .expect("log");
    let mut log = String::new();
    for i in 0..100_000 {
        log.push_str(&format!("step {i} loss 0.{i:05} out of memory? no\n"));
    }
    log.push_str(&msg);
    for i in 0..100_000 {
        log.push_str(&format!("step {i}\r\n"));
    }
    log.push_str(&msg);
    let found = explain::scan(log.as_bytes()).expect("read");
    let lines: Vec<u64> = found.messages.iter().map(|m| m.line).collect();
    assert_eq!(lines, vec![100_001, 200_002]);
    assert_eq!(found.lines, 200_002);
}

#[test]
fn hip_messages_are_explained_like_cuda_ones() {
    let e = explain::scan_str(
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
         capacity of 63.98 GiB of which 1.00 GiB is free. Of the allocated memory 60.00 GiB is \
         allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated.",
    );
    assert_eq!(e.messages.len(), 1);
    let m = &e.messages[0];
    assert_eq!(m.device_type, "hip");
    assert_eq!(m.requested_bytes, 2 << 30);
    assert_eq!(m.verdict, Verdict::Full);
    let cuda = explain::scan_str("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 1.00 GiB total capacity; 0 bytes already allocated; 0 bytes free; 0 bytes reserved in total by PyTorch)");
    assert_eq!(cuda.messages[0].device_type, "cuda");
}

#[test]
fn a_lost_closing_parenthesis_keeps_the_reserved_figure() {
    for tail in [
        " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.",
        "\nTraceback (most recent call last):",
        "",
    ] {
        let log = format!(
            "RuntimeError: CUDA out of memory. Tried to allocate 256.00 MiB (GPU 0; 23.69 GiB \
             total capacity; 20.10 GiB already allocated; 101.69 MiB free; 22.80 GiB reserved \
             in total by PyTorch{tail}"
        );
        let e = explain::scan_str(&log);
        assert_eq!(e.messages.len(), 1, "{log}");
        let m = &e.messages[0];
        assert_eq!(
            m.reserved_bytes,
            Some(24481313587),
            "{log}: reserved 22.80 GiB"
        );
        assert_eq!(m.verdict, Verdict::Fragmentation, "{log}");
    }
}

#[test]
fn process_entries_without_this_process_line_count_as_other_processes() {
    // In containers the message names processes by PID only.
    let e = explain::scan_str(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a \
         total capacity of 23.65 GiB of which 1.06 GiB is free. Process 4821 has 9.10 GiB memory \
         in use. Process 5120 has 12.40 GiB memory in use. Of the allocated memory 11.80 GiB is \
         allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated.",
    );
    let m = &e.messages[0];
    // 12.40 GiB is this process (11.80 + 0.12 GiB reserved and its context); 9.10 GiB is another.
    assert_eq!(m.verdict, Verdict::OtherProcesses, "{}", m.reason);
    let alone = explain::scan_str(
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.77 GiB \
         of which 312.00 MiB is free. Process 4821 has 9.10 GiB memory in use. Of the allocated \
         memory 5.90 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but \
         unallocated.",
    );
    assert_eq!(alone.messages[0].verdict, Verdict::OtherProcesses);
    // The only process listed is this one: the device is full.
    let own = explain::scan_str(
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.77 GiB \
         of which 312.00 MiB is free. Process 4821 has 15.40 GiB memory in use. Of the allocated \
         memory 14.70 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but \
         unallocated.",
    );
    assert_eq!(own.messages[0].verdict, Verdict::Full);
}
