//! `stats` and `report` figures against independent expectations: the reference script's numbers
//! (PyTorch's `_memory_viz stats` and the memory_viz timeline peak) and snapgen's truth JSON.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::analysis::stats::file_stats;
use snapscan::report::FileReport;
use snapscan::snapshot;

use crate::common;

fn reference() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(common::root().join("tests/expected/reference.json")).unwrap(),
    )
    .unwrap()
}

fn report_of(path: &std::path::Path) -> FileReport {
    let loaded = snapshot::load(path).unwrap_or_else(|e| panic!("{e}"));
    file_report(&loaded, &ReportOptions::default())
}

#[test]
fn stats_equal_memory_viz_stats_on_every_fixture() {
    let reference = reference();
    let files = reference["files"].as_array().unwrap();
    assert_eq!(files.len(), common::snapshot_fixtures().len());
    for expected in files {
        let path = common::root().join(expected["path"].as_str().unwrap());
        let loaded = snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let stats = file_stats(&loaded, None);
        for want in expected["devices"].as_array().unwrap() {
            let device = want["device"].as_i64().unwrap();
            let got = stats
                .devices
                .iter()
                .find(|d| d.device == device)
                .unwrap_or_else(|| panic!("{}: no device {device}", path.display()));
            let f = &got.final_state;
            let ctx = format!("{} device {device}", path.display());
            assert_eq!(f.segments, want["segments"].as_u64().unwrap(), "{ctx}");
            assert_eq!(
                f.reserved_bytes,
                want["reserved_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                f.requested_bytes,
                want["requested_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                f.free_internal_bytes,
                want["free_internal_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                f.free_external_bytes,
                want["free_external_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            let by_state: serde_json::Value = serde_json::to_value(&got.blocks_by_state).unwrap();
            assert_eq!(by_state, want["blocks_by_state"], "{ctx}");
            let by_action: serde_json::Value =
                serde_json::to_value(&got.trace_entries_by_action).unwrap();
            assert_eq!(by_action, want["trace_entries_by_action"], "{ctx}");
        }
    }
}

#[test]
fn report_peak_equals_memory_viz_peak_with_the_start_level() {
    for expected in reference()["files"].as_array().unwrap() {
        let path = common::root().join(expected["path"].as_str().unwrap());
        let report = report_of(&path);
        for want in expected["devices"].as_array().unwrap() {
            let device = want["device"].as_i64().unwrap();
            let got = report.devices.iter().find(|d| d.device == device).unwrap();
            assert_eq!(
                got.peak.requested_bytes,
                want["peak_requested_bytes"].as_i64().unwrap(),
                "{} device {device}",
                path.display()
            );
            // `final` in the report is the same as in `stats`.
            assert_eq!(
                got.final_state.reserved_bytes,
                want["reserved_bytes"].as_u64().unwrap()
            );
        }
    }
}

#[test]
fn reported_peak_beats_the_viewer_where_the_peak_is_at_window_start() {
    // memory_viz samples only after each action and misses these peaks (snapshot-format §13).
    for (name, viewer, truth) in [
        (
            "real/LfieLike__SketchKV2__my_snapshot.pickle",
            16380108168i64,
            16380108176i64,
        ),
        (
            "real/Yiyi-philosophy__LLM-inference__1.3b_snapshot.pickle",
            3872498160,
            3881394672,
        ),
    ] {
        let dev = &report_of(&common::fixture(name)).devices[0];
        assert_eq!(dev.peak.requested_bytes, truth);
        assert!(dev.peak.requested_bytes > viewer);
        assert_eq!(dev.peak.event_index, None, "peak held at window start");
    }
}

fn truth(pickle: &std::path::Path) -> serde_json::Value {
    let name = pickle.to_string_lossy().replace(".pickle", ".truth.json");
    serde_json::from_str(&std::fs::read_to_string(name).unwrap()).unwrap()
}

#[test]
fn synthetic_scenarios_match_the_simulators_truth() {
    let mut checked_ooms = 0;
    for path in common::snapshot_fixtures() {
        let p = path.to_string_lossy().to_string();
        let has_truth = std::path::Path::new(&p.replace(".pickle", ".truth.json")).exists();
        if !p.contains("/synth/") || !p.ends_with(".pickle") || !has_truth {
            continue;
        }
        let truth = truth(&path);
        let report = report_of(&path);
        for dev in &report.devices {
            let t = &truth["devices"][dev.device.to_string()];
            let ctx = format!("{p} device {}", dev.device);
            assert_eq!(
                dev.peak.requested_bytes,
                t["peak_requested_bytes"].as_i64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.peak.event_index.map(|e| e as u64),
                t["peak_requested_event"].as_u64(),
                "{ctx}"
            );
            assert_eq!(
                dev.peak_reserved.bytes,
                t["peak_reserved_bytes"].as_i64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.window.allocations_before_window,
                t["allocations_before_window"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.window.requested_at_start_bytes,
                t["requested_at_window_start"].as_i64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.window.reserved_at_start_bytes,
                t["reserved_at_window_start"].as_i64().unwrap(),
                "{ctx}"
            );
            // The live set at the peak: same allocations (address + birth event).
            let mut ours: Vec<(u64, Option<u64>)> = dev
                .live_at_peak
                .iter()
                .map(|a| (a.address, a.alloc_event.map(|e| e as u64)))
                .collect();
            let mut theirs: Vec<(u64, Option<u64>)> = t["live_at_peak"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (a["address"].as_u64().unwrap(), a["alloc_event"].as_u64()))
                .collect();
            ours.sort_unstable();
            theirs.sort_unstable();
            assert_eq!(ours, theirs, "{ctx}");
            // The allocated-bytes curve is an estimate for blocks that died in the window
            // (no block sizes in the trace): it stays within 1% of the truth.
            let alloc_truth = t["peak_allocated_bytes"].as_i64().unwrap() as f64;
            let alloc_ours = dev.peak_allocated.bytes as f64;
            assert!(
                (alloc_ours - alloc_truth).abs() / alloc_truth < 0.01,
                "{ctx}: {alloc_ours} vs {alloc_truth}"
            );
            // OOM figures and verdicts.
            let t_oom = t["oom"].as_array().unwrap();
            assert_eq!(dev.oom.len(), t_oom.len(), "{ctx}");
            for (o, w) in dev.oom.iter().zip(t_oom) {
                assert_eq!(
                    o.event_index as u64,
                    w["event_index"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(
                    o.requested_bytes,
                    w["requested_bytes"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(
                    o.device_free_bytes,
                    w["device_free_bytes"].as_u64(),
                    "{ctx}"
                );
                assert_eq!(
                    o.reserved_bytes,
                    w["reserved_bytes"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(
                    o.allocated_bytes,
                    w["allocated_bytes"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(
                    o.reserved_unallocated_bytes,
                    w["reserved_unallocated_bytes"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(
                    o.largest_free_block_bytes,
                    w["largest_free_block_bytes"].as_u64().unwrap(),
                    "{ctx}"
                );
                assert_eq!(o.verdict, w["verdict"].as_str().unwrap(), "{ctx}");
                checked_ooms += 1;
            }
            // `final` equals the dump figures of the simulator.
            let f = &t["final"];
            assert_eq!(
                dev.final_state.reserved_bytes,
                f["reserved_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.final_state.allocated_bytes,
                f["allocated_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                dev.final_state.requested_bytes,
                f["requested_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
        }
    }
    assert!(checked_ooms >= 6, "only {checked_ooms} OOMs checked");
}

#[test]
fn fragmentation_and_full_verdicts_are_told_apart() {
    let frag = report_of(&common::fixture("synth/fragmented.pickle"));
    assert_eq!(frag.devices[0].oom[0].verdict, "fragmentation");
    let full = report_of(&common::fixture("synth/load-oom.pickle"));
    assert_eq!(full.devices[0].oom[0].verdict, "full");
}

#[test]
fn truncated_traces_are_detected() {
    let t = report_of(&common::fixture("synth/truncated.pickle"));
    assert!(t.devices[0].truncated);
    assert!(t.devices[0].notes.iter().any(|n| n.contains("max_entries")));
    let full = report_of(&common::fixture("synth/train.pickle"));
    assert!(!full.devices[0].truncated);
}

#[test]
fn json_report_round_trips_through_serde() {
    for name in [
        "synth/train-oom-forward.pickle",
        "real/volcengine__verl__mem_mempools.pickle",
    ] {
        let report = snapscan::report::Report {
            schema_version: snapscan::report::SCHEMA_VERSION,
            files: vec![report_of(&common::fixture(name))],
            ranks: None,
            unreadable: Vec::new(),
        };
        let bytes = snapscan::render::json(&report);
        let back: snapscan::report::Report = serde_json::from_slice(&bytes).unwrap();
        assert!(back == report, "{name}: JSON did not round-trip");
        // The contract's field names.
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let d = &v["files"][0]["devices"][0];
        for key in [
            "final",
            "peak",
            "live_at_peak",
            "oom",
            "segments",
            "truncated",
        ] {
            assert!(!d[key].is_null(), "{key} missing");
        }
        for key in [
            "requested_bytes",
            "allocated_bytes",
            "event_index",
            "time_us",
        ] {
            assert!(d["peak"].get(key).is_some(), "peak.{key} missing");
        }
    }
}

#[test]
fn one_thread_and_many_threads_give_identical_reports() {
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            common::snapshot_fixtures()
                .iter()
                .map(|p| snapscan::render::json(&report_of(p)))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(run(1), run(4));
}

/// The MCP server's layouts at a moment come from each segment's life, made once; they equal
/// the layouts found by undoing the trace's segment events from the dump, at every moment tried
/// (real captures with expandable segments, with an OOM and segments freed, with MemPools).
#[test]
fn layouts_from_segment_lives_equal_the_undone_ones() {
    use snapscan::analysis::layout::{
        layout_from_lifetimes, layout_with, segment_lifetimes, Detail, Moment,
    };
    for rel in [
        "captured/expandable.pickle",
        "captured/fragmentation_oom.pickle",
        "captured/cuda_graph.pickle",
        "real/volcengine__verl__mem_mempools.pickle",
        "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
    ] {
        let loaded = snapshot::load(&common::fixture(rel)).unwrap_or_else(|e| panic!("{e}"));
        let snap = &loaded.snapshot;
        for device in snap.devices() {
            let replay = snapscan::analysis::lifetimes::replay_device(snap, device);
            let lives = segment_lifetimes(snap, &replay);
            let n = snap.trace(device).len() as u32;
            let mut moments = vec![Moment::WindowStart, Moment::End];
            // Around every segment event (where the segments change) and spread over the trace.
            for &i in replay.segment_events.iter().step_by(7) {
                moments.extend([Moment::After(i.saturating_sub(1)), Moment::After(i)]);
            }
            moments.extend((0..n).step_by((n as usize / 13).max(1)).map(Moment::After));
            let mut changed = 0;
            for m in moments {
                let want = layout_with(snap, &replay, m, Detail::BLOCKS);
                let got = layout_from_lifetimes(snap, &replay, &lives, m, Detail::BLOCKS);
                assert_eq!(got, want, "{rel} device {device} at {m:?}");
                changed += usize::from(want.len() != snap.segments_of(device).count());
            }
            assert!(
                changed > 0 || replay.segment_events.is_empty(),
                "{rel}: no moment had other segments than the dump"
            );
        }
    }
}
