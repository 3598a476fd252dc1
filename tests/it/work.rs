//! Work grows linearly with the input, whatever its memo structure: the work the reader and the
//! analysis count (opcodes stepped, memo values looked up across chunks, events replayed; see
//! `snapscan::work`) per input byte stays within 1.5x across 1, 2 and 8 copies of a real trace.
//! Counted, not timed: timings are too noisy to judge this, counts are exact.

use crate::common;
use crate::replica;

/// The counters `SNAPSCAN_WORK=1` prints: work units and generic document values.
fn counters(path: &std::path::Path) -> (u64, u64) {
    let (units, values, _) = all_counters(path);
    (units, values)
}

/// [`counters`] and the opcodes the chunk machines ran one by one.
fn all_counters(path: &std::path::Path) -> (u64, u64, u64) {
    let out = common::snapscan()
        .env("SNAPSCAN_WORK", "1")
        .args(["report", "--format", "json"])
        .arg(path)
        .output()
        .expect("snapscan runs");
    assert!(out.status.success(), "report of {} failed", path.display());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let find = |prefix: &str, suffix: &str| -> u64 {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} line in {stderr:?}"))
    };
    (
        find("work: ", " units"),
        find("document: ", " values"),
        find("machine: ", " opcodes"),
    )
}

/// `fixture`'s trace repeated `reps` times, written into `dir`: its path and length.
fn replica_file(
    dir: &std::path::Path,
    fixture: &str,
    reps: usize,
    name: &str,
) -> (std::path::PathBuf, u64) {
    let src = std::fs::read(common::fixture(fixture)).expect("fixture");
    let bytes = replica::replicate(&src, reps);
    let path = dir.join(format!("{name}-x{reps}.pickle"));
    std::fs::write(&path, &bytes).expect("write replica");
    (path, bytes.len() as u64)
}

fn work_units(path: &std::path::Path) -> u64 {
    counters(path).0
}

/// Segments and trace entries of current-layout snapshots become typed rows in the chunks: the
/// generic document handed to the decoder holds the skeleton only, whatever the file's size.
/// (Segments going through generic containers, as before, give one value per 60 bytes.)
#[test]
fn segments_and_entries_of_real_dumps_skip_the_generic_document() {
    let dir = tempfile_dir();
    for (fixture, reps) in [
        (
            "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
            2,
        ),
        (
            "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
            8,
        ),
        ("real/volcengine__verl__mem_mempools.pickle", 1),
        ("real/ZidongLiu__DeComFL__memory.pickle", 1),
    ] {
        let (path, len) = replica_file(&dir, fixture, reps, "doc");
        let (_, values) = counters(&path);
        let bound = len / 1024 + 1000;
        eprintln!("{fixture} x{reps}: {len} bytes, {values} document values");
        assert!(
            values <= bound,
            "{fixture} x{reps}: {values} generic values for {len} bytes (bound {bound})"
        );
    }
}

/// The dicts of real dumps (trace entries, segments, their blocks and frames) are read whole,
/// not opcode by opcode by the chunk machines: only the first appearance of each key, string
/// and frame goes through the stack machine, and the few dicts a FRAME header cuts. (The
/// segments' dicts opcode by opcode gave one opcode per 2 bytes of segments: notHanmin x8 ran
/// 559,657. Keys and frames stored by the same chunk, as all are in the first, took the
/// general path until the reader took them whole too: notHanmin as is ran 45,253, x8 69,813,
/// MAGMA27 x8 8,970.)
#[test]
fn dicts_of_real_dumps_are_read_whole() {
    let dir = tempfile_dir();
    for fixture in [
        "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
        "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ] {
        for reps in [1, 8] {
            let (path, len) = replica_file(&dir, fixture, reps, "whole");
            let (_, _, opcodes) = all_counters(&path);
            let bound = len / 1024 + 5_000;
            eprintln!("{fixture} x{reps}: {len} bytes, {opcodes} opcodes one by one");
            assert!(
                opcodes <= bound,
                "{fixture} x{reps}: {opcodes} opcodes run one by one for {len} bytes (bound {bound})"
            );
        }
    }
}

#[test]
fn work_per_byte_does_not_grow_with_copies_of_a_real_trace() {
    let dir = tempfile_dir();
    for fixture in [
        "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
        "real/ZidongLiu__DeComFL__memory.pickle",
        "real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle",
    ] {
        let src = std::fs::read(common::fixture(fixture)).expect("fixture");
        let mut per_byte = Vec::new();
        for reps in [1, 2, 8] {
            let bytes = replica::replicate(&src, reps);
            let path = dir.join(format!("x{reps}.pickle"));
            std::fs::write(&path, &bytes).expect("write replica");
            let units = work_units(&path);
            per_byte.push((reps, bytes.len(), units as f64 / bytes.len() as f64));
        }
        let lo = per_byte.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
        let hi = per_byte.iter().map(|p| p.2).fold(0.0, f64::max);
        eprintln!("{fixture}: (copies, bytes, units per byte) {per_byte:?}");
        assert!(
            hi <= 1.5 * lo,
            "{fixture}: work per byte grows with the copies: {per_byte:?}"
        );
    }
}

/// A pickle nested deeper than the chunk machines follow goes to the sequential reader as soon
/// as a machine meets the depth, on one thread or several: it is stepped over about once, not
/// by the in-order machines, then the parallel ones, then the sequential reader (three times
/// the bytes, which on a busy machine took a million nested lists past the 2 s budget).
#[test]
fn input_nested_too_deep_for_the_chunk_machines_is_read_about_once() {
    let dir = tempfile_dir();
    // [[[[…]]]] 200,000 deep: MARK/EMPTY_LIST pairs closed by APPENDS.
    let n = 200_000;
    let mut bytes = b"\x80\x04]".to_vec();
    bytes.extend(b"(]".repeat(n));
    bytes.extend(b"e".repeat(n));
    bytes.push(b'.');
    let path = dir.join("nested.pickle");
    std::fs::write(&path, &bytes).expect("write nested");
    for threads in ["1", "2", "4"] {
        let out = common::snapscan()
            .env("SNAPSCAN_WORK", "1")
            .env("RAYON_NUM_THREADS", threads)
            .arg("report")
            .arg(&path)
            .output()
            .expect("snapscan runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("expected dict, found list"), "{stderr}");
        let units: u64 = stderr
            .lines()
            .find_map(|l| {
                l.strip_prefix("work: ")?
                    .strip_suffix(" units")?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no work line in {stderr:?}"));
        let len = bytes.len() as u64;
        assert!(
            units <= len + len / 10,
            "{threads} threads: {units} work units for {len} bytes"
        );
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("snapscan-work-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
