//! Cut and corrupted inputs never panic: each gives an error or a report.

use std::panic::{catch_unwind, AssertUnwindSafe};

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::snapshot::{self, LoadedSnapshot};

use crate::common;

/// Decodes and, when that works, analyses; panics propagate to the caller.
fn decode_and_report(bytes: &[u8]) -> bool {
    match snapshot::load_bytes("mutant", bytes) {
        Ok(snap) => {
            let loaded = LoadedSnapshot {
                name: "mutant".into(),
                decoded_bytes: bytes.len() as u64,
                compression: snapscan::input::Compression::None,
                snapshot: snap,
            };
            let report = file_report(&loaded, &ReportOptions::default());
            assert!(report.devices.len() <= loaded.snapshot.devices().len());
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

fn must_not_panic(bytes: &[u8], what: &str) {
    let result = catch_unwind(AssertUnwindSafe(|| decode_and_report(bytes)));
    assert!(result.is_ok(), "panic on {what}");
}

fn tiny() -> Vec<u8> {
    std::fs::read(common::fixture("synth/tiny.pickle")).unwrap()
}

#[test]
fn tiny_fixture_cut_at_every_byte_never_panics() {
    let data = tiny();
    assert!(decode_and_report(&data), "the whole file must load");
    for cut in 0..data.len() {
        must_not_panic(&data[..cut], &format!("cut at {cut}"));
    }
}

#[test]
fn tiny_fixture_with_single_bytes_changed_never_panics() {
    let data = tiny();
    let mut rng = 0x9e3779b97f4a7c15u64;
    for pos in 0..data.len() {
        let mut values = vec![data[pos] ^ 0xff];
        if pos % 5 == 0 {
            // xorshift: a seeded, reproducible random byte
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            values.push((rng & 0xff) as u8);
        }
        for value in values {
            let mut m = data.clone();
            m[pos] = value;
            must_not_panic(&m, &format!("byte {pos} set to {value:#04x}"));
        }
    }
}

#[test]
fn truncation_error_names_the_offset_and_the_length() {
    let data = tiny();
    let err = snapshot::load_bytes("tiny.pickle", &data[..1000])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("tiny.pickle: truncated at byte "), "{err}");
    assert!(err.contains(&format!(" of {}", 1000)), "{err}");
}

#[test]
fn every_fixture_cut_at_64_points_and_mutated_never_panics() {
    use rayon::prelude::*;
    for path in common::snapshot_fixtures() {
        let (bytes, _) = snapscan::input::read_input(&path).unwrap();
        let data = bytes.to_vec();
        (1..64).into_par_iter().for_each(|k| {
            let cut = data.len() * k / 64;
            must_not_panic(&data[..cut], &format!("{} cut at {cut}", path.display()));
        });
        // 256 seeded random single-byte changes (the seed depends only on the file's length, so
        // a failure names a reproducible position and value).
        let mut rng = 0x2545f4914f6cdd1du64 ^ data.len() as u64;
        let changes: Vec<(usize, u8)> = (0..256)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                ((rng % data.len() as u64) as usize, (rng >> 32) as u8)
            })
            .collect();
        changes.par_iter().for_each(|&(pos, value)| {
            let mut m = data.clone();
            m[pos] = value;
            must_not_panic(
                &m,
                &format!("{} byte {pos} set to {value:#04x}", path.display()),
            );
        });
    }
}

#[test]
fn inputs_that_are_not_snapshots_get_clear_errors() {
    let cases: [(&[u8], &str); 6] = [
        (b"", "the file is empty"),
        (
            b"PK\x03\x04rest-of-a-zip",
            "zip archive (as torch.save writes)",
        ),
        (
            b"hello, this is a log file\n",
            "not a memory snapshot: expected a pickle",
        ),
        (
            br#"{"not": "a snapshot"}"#,
            "segments: missing required key",
        ),
        (b"[1, 2, 3]", "segments[0]: expected dict, found int"),
        (b"\x80\x04\x8c\x02\xff\xfe\x94.", "invalid UTF-8"),
    ];
    for (bytes, want) in cases {
        let err = snapshot::load_bytes("in", bytes).unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
}

#[test]
fn deep_nesting_and_memo_bombs_stay_bounded() {
    // A million nested MARK/EMPTY_LIST: no recursion in the reader, so no stack overflow.
    let mut p = vec![0x80, 0x04];
    for _ in 0..1_000_000 {
        p.extend_from_slice(b"(]");
    }
    p.push(b'.');
    let start = std::time::Instant::now();
    must_not_panic(&p, "deep nesting");
    // A list memoized once and referenced a million times: references, not copies.
    let mut p = vec![0x80, 0x04, b']', 0x94, b']', b'('];
    for _ in 0..1_000_000 {
        p.extend_from_slice(&[b'h', 0]);
    }
    p.extend_from_slice(b"e.");
    let doc = snapscan::pickle::parse(&p).unwrap();
    assert_eq!(doc.seqs.len(), 2, "the memoized list exists once");
    assert!(start.elapsed().as_secs() < 10);
}
