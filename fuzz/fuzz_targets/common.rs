//! Shared by the targets that go all the way to a report.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::input::Compression;
use snapscan::report::{Report, SCHEMA_VERSION};
use snapscan::snapshot::{self, LoadedSnapshot, Snapshot};

/// Decodes `data` as the CLI does (pickle or JSON by its first bytes) and analyses it.
#[allow(dead_code)]
pub fn report(data: &[u8]) {
    match snapshot::load_bytes("fuzz", data) {
        Ok(snapshot) => analyse(snapshot, data.len()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The report of every device, rendered as text and as JSON.
pub fn analyse(snapshot: Snapshot, len: usize) {
    let loaded = LoadedSnapshot {
        name: "fuzz".into(),
        decoded_bytes: len as u64,
        compression: Compression::None,
        snapshot,
    };
    let stats = snapscan::report::StatsOutput {
        schema_version: SCHEMA_VERSION,
        files: vec![snapscan::analysis::stats::file_stats(&loaded, None)],
    };
    assert!(!snapscan::render::stats_text::render(&stats).is_empty());
    let file = file_report(&loaded, &ReportOptions::default());
    assert!(file.devices.len() <= loaded.snapshot.devices().len());
    let report = Report {
        schema_version: SCHEMA_VERSION,
        files: vec![file],
        ranks: None,
        unreadable: Vec::new(),
    };
    let view = snapscan::render::report_text::View {
        top: 5,
        stacks: true,
        python_only: false,
        full: false,
        all_devices: false,
    };
    let text = snapscan::render::report_text::text(&report, &view);
    assert!(!text.is_empty());
    let json = snapscan::render::json(&report);
    assert!(!json.is_empty());
    let budgets = snapscan::report::Budgets {
        max_peak_bytes: Some(1 << 30),
        max_reserved_bytes: Some(1 << 30),
        max_fragmentation_ratio: Some(0.5),
        fail_on_oom: true,
    };
    let _ = snapscan::analysis::check::check(&report, &budgets);
    // The allocator model: the exact replay and a what-if of the first devices.
    let s = &loaded.snapshot;
    let (settings, _) = snapscan::allocator::Settings::from_snapshot(s);
    for d in s.devices().into_iter().take(4) {
        let sim = snapscan::allocator::simulate(s, d, &settings, &Default::default());
        assert!(sim.placed <= sim.allocs);
        let request = snapscan::analysis::whatif::Request {
            set: Some("expandable_segments:True".to_owned()),
            ..Default::default()
        };
        let _ = snapscan::analysis::whatif::whatif_device(s, d, &request);
    }
}
