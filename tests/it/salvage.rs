//! Cut pickles (a dump killed while writing): a clear error that says where and suggests
//! `--salvage`; with it, every segment and trace entry complete before the cut, as in the whole
//! file, and a warning that says what is missing.

use snapscan::snapshot::{self, LoadOptions, Snapshot};

use crate::common;
use crate::parallel::{canonical, entry_lines, read, segment_lines};

const SALVAGE: LoadOptions = LoadOptions {
    salvage: true,
    hint_salvage: false,
};

/// What was recovered is a prefix of the whole file's segments and of each device's trace.
fn check_prefix(name: &str, cut: usize, part: &Snapshot, whole: &Snapshot) {
    let (ps, ws) = (segment_lines(part), segment_lines(whole));
    assert!(ps.len() <= ws.len(), "{name} cut at {cut}: more segments");
    assert_eq!(ps, ws[..ps.len()], "{name} cut at {cut}: segments differ");
    assert!(part.device_traces.len() <= whole.device_traces.len());
    for d in 0..part.device_traces.len() {
        let (pe, we) = (entry_lines(part, d), entry_lines(whole, d));
        assert!(pe.len() <= we.len(), "{name} cut at {cut}: more entries");
        assert_eq!(
            pe,
            we[..pe.len()],
            "{name} cut at {cut}: entries of device {d} differ"
        );
    }
    let s = part.salvaged.as_ref().expect("marked as salvaged");
    assert!(s.offset <= cut as u64 && s.len == cut as u64, "{s:?}");
}

#[test]
fn cut_fixtures_salvage_the_complete_segments_and_entries() {
    let mut recovered_entries = 0;
    let mut salvaged = 0;
    for path in common::snapshot_fixtures() {
        let data = read(&path);
        if data.first() != Some(&0x80) {
            continue;
        }
        let name = common::rel(&path);
        let whole = snapshot::load_bytes("whole", &data).expect("whole file");
        for k in 1..16 {
            let cut = data.len() * k / 16;
            let bytes = &data[..cut];
            // Without --salvage: an error naming the cut, the same from both readers.
            let err = snapshot::load_bytes("cut", bytes).unwrap_err().to_string();
            let seq = snapshot::load_bytes_sequential("cut", bytes)
                .unwrap_err()
                .to_string();
            assert_eq!(err, seq, "{name} cut at {cut}");
            if err.starts_with("cut: truncated") {
                assert!(err.contains(&format!(" of {cut}")), "{err}");
            }
            // With it: what was complete, the same from both readers.
            let seq = snapshot::load_bytes_sequential_with("cut", bytes, SALVAGE);
            let par = snapshot::load_bytes_parallel_with(bytes, 0, SALVAGE);
            // One frame per chunk too, for some cuts (slower).
            let small = (k % 4 == 0)
                .then(|| snapshot::load_bytes_parallel_with(bytes, 1, SALVAGE))
                .flatten();
            let Ok(seq) = seq else {
                // Cut before `segments` was complete: nothing to recover.
                for p in [par, small].into_iter().flatten() {
                    assert!(
                        p.is_err(),
                        "{name} cut at {cut}: only the parallel reader reads it"
                    );
                }
                continue;
            };
            for p in [par, small].into_iter().flatten() {
                let p = p.unwrap_or_else(|e| panic!("{name} cut at {cut}: {e}"));
                assert!(
                    canonical(&p) == canonical(&seq),
                    "{name} cut at {cut}: readers differ"
                );
            }
            check_prefix(&name, cut, &seq, &whole);
            salvaged += 1;
            recovered_entries += seq.device_traces.iter().map(|t| t.len()).sum::<usize>();
        }
    }
    assert!(salvaged > 40, "only {salvaged} cuts salvaged");
    assert!(
        recovered_entries > 10_000,
        "{recovered_entries} entries recovered"
    );
}

#[test]
fn a_complete_file_is_not_marked_as_salvaged() {
    let data = read(&common::fixture("synth/tiny.pickle"));
    let s = snapshot::load_bytes_with("tiny", &data, SALVAGE).unwrap();
    assert!(s.salvaged.is_none());
}

#[test]
fn the_cli_suggests_salvage_and_salvages() {
    let data = read(&common::fixture("synth/train-oom-forward.pickle"));
    let dir = std::env::temp_dir().join(format!("snapscan-salvage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cut.pickle");
    std::fs::write(&file, &data[..data.len() * 2 / 3]).unwrap();
    let f = file.to_str().unwrap();
    for cmd in ["stats", "report"] {
        let out = common::snapscan().args([cmd, f]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cut.pickle: truncated at byte "), "{err}");
        assert!(err.contains("(inside device_traces[0]"), "{err}");
        assert!(err.trim_end().ends_with("; try --salvage"), "{err}");
        assert_eq!(err.matches("truncated at byte").count(), 1, "{err}");
    }
    let out = common::snapscan()
        .args(["report", "--salvage", "--format", "json", f])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("salvaged from a cut pickle"),
        "{err}"
    );
    assert!(
        err.contains("missing: the rest of device_traces[0]"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = report["files"][0]["devices"][0]["notes"].to_string();
    assert!(notes.contains("salvaged from a cut pickle"), "{notes}");
    let out = common::snapscan()
        .args(["stats", "--salvage", f])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cut `.gz` and a cut `.zst` of a three-device dump, cut inside device 1's trace: salvaged
/// from what decompressed, the cut trace named per device, and the device whose trace was cut
/// (or never arrived) says so instead of "memory history was not recorded".
#[test]
fn cut_gz_and_zst_salvage_what_arrived_and_name_each_cut_trace() {
    use std::io::Write;
    let data = read(&common::fixture("synth/three-devices.pickle"));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&data).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::stream::encode_all(&data[..], 1).unwrap();
    let dir = std::env::temp_dir().join(format!("snapscan-salvage-z-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, whole, what) in [
        ("cut.pickle.gz", gz, "gzip"),
        ("cut.pickle.zst", zst, "zstd"),
    ] {
        let file = dir.join(name);
        std::fs::write(&file, &whole[..whole.len() * 45 / 100]).unwrap();
        let f = file.to_str().unwrap();
        let out = common::snapscan().args(["report", f]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name} without --salvage");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{what} data is corrupt")) && err.contains("try --salvage"),
            "{name} without --salvage: {err}"
        );
        let out = common::snapscan()
            .args(["report", "--salvage", "--format", "json", f])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {err}");
        assert!(
            err.contains(&format!("the {what} stream breaks off")),
            "{err}"
        );
        assert!(
            err.contains("device_traces[1] (device 1's trace, cut after "),
            "{err}"
        );
        assert!(
            err.contains("device_traces[2] (device 2's trace, not reached)"),
            "{err}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let devices = v["files"][0]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 3, "{name}");
        assert!(devices[0].get("trace_cut").is_none());
        assert_eq!(devices[1]["trace_cut"], "cut");
        assert_eq!(devices[2]["trace_cut"], "not_reached");
        let notes = |d: &serde_json::Value| d["notes"].to_string();
        assert!(notes(&devices[1]).contains("this device's trace was cut after"));
        assert!(notes(&devices[2]).contains("cut off before it began"));
        assert!(!notes(&devices[2]).contains("memory history was not recorded"));
        let out = common::snapscan()
            .args(["report", "--salvage", f])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let first = |dev: &str| {
            let at = text.find(&format!("— device {dev}\n")).unwrap();
            text[at..].lines().nth(1).unwrap().to_owned()
        };
        assert!(first("1")
            .starts_with("No OOM in the part of the trace that arrived (the trace was cut)."));
        assert!(first("2").starts_with("No trace arrived (the file was cut before it)"));
        assert!(!text.contains("No trace was recorded"), "{name}");
        let out = common::snapscan()
            .args(["report", "--salvage", "--brief", f])
            .output()
            .unwrap();
        let brief = String::from_utf8_lossy(&out.stdout);
        assert!(
            brief
                .trim_end()
                .ends_with("[salvaged: device 1 trace cut, device 2 trace not reached]"),
            "{brief}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
