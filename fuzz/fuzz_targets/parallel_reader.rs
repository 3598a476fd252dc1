//! The parallel pickle reader against the sequential one: whenever the parallel reader returns
//! a snapshot, the sequential reader must accept the same bytes and give the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::input::Compression;
use snapscan::snapshot::{self, LoadedSnapshot, Snapshot};

fn report_json(snapshot: Snapshot) -> Vec<u8> {
    let loaded = LoadedSnapshot {
        name: "fuzz".into(),
        decoded_bytes: 0,
        compression: Compression::None,
        snapshot,
    };
    snapscan::render::json(&file_report(&loaded, &ReportOptions::default()))
}

fuzz_target!(|data: &[u8]| {
    let Some(parallel) = snapshot::load_bytes_parallel(data) else {
        return;
    };
    let sequential = match snapshot::load_bytes_sequential("fuzz", data) {
        Ok(s) => s,
        Err(e) => panic!("the parallel reader accepted what the sequential one refuses: {e}"),
    };
    let (a, b) = (report_json(parallel), report_json(sequential));
    assert!(
        a == b,
        "reports differ:\nparallel:   {}\nsequential: {}",
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b)
    );
});
