//! The snapshots captured on a GPU with their ground truth (`fixtures/captured/MANIFEST.json`,
//! written by the capture run itself from `torch.cuda.memory_stats` with the peaks reset at
//! each phase start, the parameter and optimizer-state bytes, and the caught
//! `OutOfMemoryError`). Every figure the truth gives and the report also states is compared,
//! with the expectation read from the manifest.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::snapshot;

use crate::common;

/// The report's phase vocabulary for a phase name the capture script used, where one applies
/// (`prefill` and `decode` run under `no_grad`; `fill`, `capture` and the like are not phases
/// of a training or inference run, so nothing is claimed for them).
fn report_phase(capture_phase: &str) -> Option<&'static str> {
    match capture_phase {
        "load" => Some("load"),
        "forward" => Some("forward"),
        "backward" => Some("backward"),
        "optimizer" => Some("optimizer"),
        "eval" | "prefill" | "decode" => Some("eval"),
        _ => None,
    }
}

fn u64_of(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[test]
fn captured_snapshots_match_the_truth_their_run_recorded() {
    let text = std::fs::read_to_string(common::fixture("captured/MANIFEST.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let scenarios = manifest["scenarios"].as_object().unwrap();
    assert_eq!(scenarios.len(), 8, "the capture run's eight scenarios");
    let mut failures = Vec::new();
    let mut checked = 0;
    // Categories checked against the parameter and optimizer bytes.
    let mut sized = 0;
    for (name, scenario) in scenarios {
        let path = common::fixture(&format!("captured/{}", scenario["file"].as_str().unwrap()));
        let loaded = snapshot::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let report = file_report(&loaded, &ReportOptions::default());
        let dev = &report.devices[0];
        let truth = &scenario["truth"];
        let mut check = |ok: bool, what: String| {
            checked += 1;
            if !ok {
                failures.push(format!("{name}: {what}"));
            }
        };

        // The peak of requested bytes: memory_stats counts every allocation, so it equals the
        // trace's peak whenever the trace holds the whole recording (no ring-buffer wrap).
        if !scenario["checks"]["truncated"].as_bool().unwrap_or(false) {
            let want = u64_of(&truth["peak_requested_while_recording"]);
            check(
                dev.peak.requested_bytes as u64 == want,
                format!(
                    "peak requested {} B, truth {want} B",
                    dev.peak.requested_bytes
                ),
            );
            // The phase whose own peak is that peak.
            let phases = truth["phases"].as_array().unwrap();
            let at_peak = phases
                .iter()
                .filter(|p| p["recording"].as_bool() == Some(true))
                .find(|p| u64_of(&p["peak_requested"]) == want)
                .and_then(|p| p["name"].as_str())
                .unwrap();
            if let Some(phase) = report_phase(at_peak) {
                check(
                    dev.peak.phase == phase,
                    format!("peak phase {}, truth {at_peak}", dev.peak.phase),
                );
            }
        }

        // The weights and the Adam state at the peak, where the report is sure of them: the
        // parameters' and the optimizer's bytes as the run counted them, within 0.1 % (a step
        // counter or a buffer made with the model is counted with them).
        for (category, key) in [
            ("weights", "param_bytes"),
            ("optimizer_state", "adam_state_bytes"),
        ] {
            let Some(want) = truth.get(key).and_then(|v| v.as_u64()) else {
                continue;
            };
            let sure = dev.category_confidence_at_peak.get(category);
            if sure.map(String::as_str) != Some("high") {
                continue;
            }
            sized += 1;
            let got = dev.categories_at_peak.get(category).copied().unwrap_or(0);
            check(
                got.abs_diff(want) * 1000 <= want,
                format!("{category} at the peak {got} B, truth {key} {want} B"),
            );
        }

        // The OOM as the caught exception and memory_stats saw it.
        if let Some(oom) = truth.get("oom").filter(|o| o.is_object()) {
            let Some(got) = dev.oom.last() else {
                check(false, "no OOM reported".into());
                continue;
            };
            let allocated = u64_of(&oom["allocated_at_except"]);
            let reserved = u64_of(&oom["reserved_at_except"]);
            check(
                got.allocated_bytes == allocated,
                format!("OOM allocated {}, truth {allocated}", got.allocated_bytes),
            );
            check(
                got.reserved_bytes == reserved,
                format!("OOM reserved {}, truth {reserved}", got.reserved_bytes),
            );
            if let Some(want) = oom.get("request_bytes").and_then(|v| v.as_u64()) {
                check(
                    got.requested_bytes == want,
                    format!("OOM request {}, truth {want}", got.requested_bytes),
                );
            }
            if let Some(phase) = oom["phase"].as_str().and_then(report_phase) {
                check(
                    got.phase == phase,
                    format!("OOM phase {}, truth {phase}", got.phase),
                );
            }
            if let Some(before) = truth.get("before_request").filter(|b| b.is_object()) {
                let verdict = before["expected_verdict"].as_str().unwrap();
                check(
                    got.verdict == verdict,
                    format!("OOM verdict {}, truth {verdict}", got.verdict),
                );
                let hole = u64_of(&before["largest_inactive_block"]);
                check(
                    got.largest_free_block_bytes == hole,
                    format!(
                        "largest hole {}, truth {hole}",
                        got.largest_free_block_bytes
                    ),
                );
                let cached = u64_of(&before["reserved_but_unallocated"]);
                check(
                    got.reserved_unallocated_bytes == cached,
                    format!(
                        "reserved but unallocated {}, truth {cached}",
                        got.reserved_unallocated_bytes
                    ),
                );
            }
        } else {
            check(
                dev.oom.is_empty(),
                format!("{} OOMs reported, none happened", dev.oom.len()),
            );
        }

        // Call sites name the script's own Python lines or an autograd node, never a shared
        // object, the interpreter binary or an unresolved `??` frame (`stacks="all"`).
        for site in &dev.live_at_peak_by_call_site {
            let s = site.call_site.as_str();
            let readable = s.starts_with('<') || s.starts_with("autograd: ") || s.contains(".py:");
            check(readable, format!("call site {s:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{checked} checks:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 40, "only {checked} checks ran");
    assert!(sized >= 6, "only {sized} category sizes checked");
}
