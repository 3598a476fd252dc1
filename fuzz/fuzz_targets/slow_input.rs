//! Slow inputs: any bytes through both readers and the whole report, with the parallel reader
//! cut into 4 KiB chunks so that a small input has as many cross-chunk memo references as a
//! big dump (the shape that once made the reader walk a chunk per reference). Run with a short
//! `-timeout` and a small `-rss_limit_mb` (fuzz/README.md): an input that takes longer or more
//! memory is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::input::Compression;
use snapscan::snapshot::{self, LoadedSnapshot, Snapshot};

fn report(snapshot: Snapshot) {
    let loaded = LoadedSnapshot {
        name: "fuzz".into(),
        decoded_bytes: 0,
        compression: Compression::None,
        snapshot,
    };
    let r = file_report(&loaded, &ReportOptions::default());
    let _ = snapscan::render::json(&r);
}

fuzz_target!(|data: &[u8]| {
    if let Some(s) = snapshot::load_bytes_parallel_chunked(data, 4096) {
        report(s);
    }
    if let Ok(s) = snapshot::load_bytes("fuzz", data) {
        report(s);
    }
});
